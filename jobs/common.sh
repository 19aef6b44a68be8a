# jobs/common.sh: what job_ft3.sh and job_ddp.sh share. Sourced by them (bash), not run.
#
# The job scripts find the repository, source this file (which traps USR1 and TERM at once),
# then call, in this order:
#   jc_init NAME "$@"       the environment (ENV_FILE: venv, HF_HOME; offline mode), the config
#                           (first argument or CONFIG) and the run_qa arguments (OUTPUT_DIR,
#                           RUN_ARGS, trailing arguments) -> CONFIG, RUN_QA_ARGS, OUTPUT, ...
#   jc_global_batch WORLD   the global batch; GLOBAL_BATCH=n fixes it (batch x accumulation)
#   jc_log_environment      node, GPUs (nvidia-smi), environment, the notes above, to the .out log
#   jc_run CMD...           runs CMD in the background and waits; on USR1 (`#SBATCH
#                           --signal=B:USR1@T`) or TERM calls JC_FORWARD to send SIGTERM to the
#                           training processes; requeues the job when training stopped on USR1;
#                           appends the run's wall-clock time to OUTPUT/job_time.jsonl; exits with
#                           CMD's status
# The variables they read are documented in the job scripts' headers.

JC_T0=$(date +%s)
JC_START_UTC=$(date -u +%Y-%m-%dT%H:%M:%SZ)
JC_SIGNALED=""   # USR1 or TERM once the batch shell got one
JC_CHILD=""      # pid of the background command (python, or srun for job_ddp.sh)
JC_NAME=${JC_NAME:-job}
# From the start: a USR1 before training starts must not kill the batch shell (its default action).
trap 'jc_on_signal USR1' USR1
trap 'jc_on_signal TERM' TERM

JC_NOTES=()  # lines jc_log_environment logs after its header
jc_note() { JC_NOTES+=("$*"); }
jc_log() { printf '[%s %s] %s\n' "$(date +%H:%M:%S)" "$JC_NAME" "$*"; }
jc_die() { printf '%s: error: %s\n' "$JC_NAME" "$*" >&2; exit 1; }

# jc_init NAME ARGS...: sets CONFIG (absolute), RUN_QA_ARGS (array), OUTPUT (run_qa's output
# directory), PER_DEVICE_BATCH, GRAD_ACCUM, LEARNING_RATE; activates the environment.
jc_init() {
  JC_NAME=$1; shift
  # 1. The environment: setup_bert.sh wrote it (venv, HF_HOME, offline mode, modules).
  ENV_FILE=${ENV_FILE:-${STORE:-$HOME}/venvs/bert-squad.env.sh}
  [[ -f $ENV_FILE ]] ||
    jc_die "environment file $ENV_FILE not found: run ./setup_bert.sh on a login node first (it writes it), or set ENV_FILE=/path/to/env.sh"
  set +u  # activate scripts and `module` are not written for `set -u`
  # shellcheck disable=SC1090
  source "$ENV_FILE" || { set -u; jc_die "sourcing $ENV_FILE failed (see above): rerun ./setup_bert.sh"; }
  set -u
  command -v python >/dev/null || jc_die "no python after sourcing $ENV_FILE: rerun ./setup_bert.sh"
  # Compute nodes have no internet: never try the Hub (OFFLINE=0 to allow it where nodes are online).
  if [[ ${OFFLINE:-1} == 1 ]]; then export HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 TRANSFORMERS_OFFLINE=1; fi
  export HF_HOME=${HF_HOME:-${LUSTRE:-${STORE:-$HOME}}/hf_cache}
  export PYTHONUNBUFFERED=1   # log lines reach the .out file as they happen

  # 2. The config: first argument if it is a .json file, else CONFIG, else the reference recipe.
  if [[ $# -gt 0 && $1 == *.json ]]; then CONFIG=$1; shift; fi
  CONFIG=${CONFIG:-configs/reference.json}
  if [[ -f $CONFIG ]]; then CONFIG=$(cd "$(dirname "$CONFIG")" && pwd)/$(basename "$CONFIG")
  elif [[ $CONFIG != /* && -f $REPO_DIR/$CONFIG ]]; then CONFIG=$REPO_DIR/$CONFIG
  else jc_die "config $CONFIG not found (looked in $PWD and $REPO_DIR): pass an existing JSON config as the first argument or CONFIG=configs/NAME.json"
  fi

  # 3. run_qa arguments after the config; later ones win: OUTPUT_DIR, RUN_ARGS, trailing arguments.
  local extra=()
  RUN_QA_ARGS=()
  if [[ -n ${OUTPUT_DIR:-} ]]; then RUN_QA_ARGS+=(--output_dir "$OUTPUT_DIR"); fi
  if [[ -n ${RUN_ARGS:-} ]]; then read -r -a extra <<<"$RUN_ARGS"; RUN_QA_ARGS+=("${extra[@]}"); fi
  RUN_QA_ARGS+=("$@")
  if ((${SLURM_RESTART_COUNT:-0} > 0)); then  # a requeued run continues, whatever --resume said
    RUN_QA_ARGS+=(--resume auto)
    jc_note "restart ${SLURM_RESTART_COUNT}: --resume auto (from the last complete checkpoint in the output folder)"
  fi
  jc_read_config
}

# The values run_qa.py will use for output_dir, batch, accumulation and learning rate: the config,
# then the arguments (last one wins), then TrainingArguments' defaults. JSON and argv only: fast.
jc_read_config() {
  local values
  values=$(python - "$CONFIG" "${RUN_QA_ARGS[@]}" <<'PY'
import json, sys
cfg = json.load(open(sys.argv[1]))
args = sys.argv[2:]
for i, a in enumerate(args):
    if a.startswith("--"):
        key, eq, val = a[2:].partition("=")
        if eq:
            cfg[key] = val
        elif i + 1 < len(args) and not args[i + 1].startswith("--"):
            cfg[key] = args[i + 1]
        else:
            cfg[key] = True
print(cfg.get("output_dir", "trainer_output"))
print(cfg.get("per_device_train_batch_size", 8))
print(cfg.get("gradient_accumulation_steps", 1))
print(cfg.get("learning_rate", 5e-5))
print(" ".join(cfg))
PY
  ) || jc_die "cannot read $CONFIG as JSON (see above)"
  { read -r OUTPUT; read -r PER_DEVICE_BATCH; read -r GRAD_ACCUM; read -r LEARNING_RATE; read -r JC_KEYS; } <<<"$values"
}
jc_config_has() { [[ " $JC_KEYS " == *" $1 "* ]]; }  # given in the config or the arguments

# jc_global_batch WORLD: the global batch (logged by jc_log_environment); with GLOBAL_BATCH=n keep
# it at n by choosing the per-device batch (at most the configured one, the memory limit) and
# gradient accumulation. Fails before anything starts if n does not divide by WORLD.
jc_global_batch() {
  local world=$1 per_rank ga b
  if [[ -n ${GLOBAL_BATCH:-} ]]; then
    [[ $GLOBAL_BATCH =~ ^[1-9][0-9]*$ ]] || jc_die "GLOBAL_BATCH=$GLOBAL_BATCH is not a positive integer"
    ((GLOBAL_BATCH % world == 0)) ||
      jc_die "GLOBAL_BATCH=$GLOBAL_BATCH does not divide over $world processes: pick a multiple of $world"
    per_rank=$((GLOBAL_BATCH / world))
    for ((ga = 1; ga <= per_rank; ga++)); do  # fewest accumulation steps with batch <= configured
      b=$((per_rank / ga))
      if ((per_rank % ga == 0 && b <= PER_DEVICE_BATCH)); then break; fi
    done
    JC_NOTES+=("GLOBAL_BATCH=$GLOBAL_BATCH over $world processes: per-device batch $b (configured $PER_DEVICE_BATCH) x gradient accumulation $ga")
    PER_DEVICE_BATCH=$b GRAD_ACCUM=$ga
    RUN_QA_ARGS+=(--per_device_train_batch_size "$b" --gradient_accumulation_steps "$ga")
  fi
  JC_NOTES+=("global batch $((PER_DEVICE_BATCH * world * GRAD_ACCUM)) = per-device $PER_DEVICE_BATCH x world size $world x gradient accumulation $GRAD_ACCUM; learning rate $LEARNING_RATE (not scaled with the batch)")
}

# Where and with what the job runs: goes to the job's .out file.
jc_log_environment() {
  jc_log "job ${SLURM_JOB_ID:-none} (${SLURM_JOB_NAME:-}), restart ${SLURM_RESTART_COUNT:-0}, on $(hostname) [nodes ${SLURM_JOB_NODELIST:-local}], submitted from ${SLURM_SUBMIT_DIR:-$PWD}"
  jc_log "repository $REPO_DIR; config $CONFIG; output $OUTPUT; run dir $PWD"
  jc_log "python $(command -v python) ($(python -c 'import sys; print(sys.version.split()[0])')); ENV_FILE $ENV_FILE"
  if command -v nvidia-smi >/dev/null 2>&1; then
    nvidia-smi || jc_log "nvidia-smi failed"
    nvidia-smi topo -m 2>/dev/null || true
  else
    jc_log "no nvidia-smi on this node (CPU run)"
  fi
  jc_log "environment:"
  env | grep -E '^(SLURM_(JOB|NNODES|NTASKS|CPUS|GPUS|MEM|RESTART|SUBMIT|NODELIST|STEP_GPUS)|CUDA_|NCCL_|TORCH_|OMP_|HF_|TRANSFORMERS_|TOKENIZERS_|VIRTUAL_ENV=|CONFIG=|RUN_ARGS=|OUTPUT_DIR=|GLOBAL_BATCH=|STRATEGY=|NPROC_PER_NODE=|MASTER_)' |
    grep -viE 'token|secret|passw|key=' | sort | sed 's/^/    /'
  local line
  for line in "${JC_NOTES[@]}"; do jc_log "$line"; done
}

# Appends one line per run of the job (a requeued job has several) to OUTPUT/job_time.jsonl.
jc_record_time() {
  local rc=$1 outcome=$2 t1 dir
  t1=$(date +%s)
  dir=$OUTPUT
  mkdir -p "$dir" 2>/dev/null || dir=.
  printf '{"job_id": "%s", "job_name": "%s", "script": "%s", "restart": %s, "nodes": "%s", "world_size": %s, "start_utc": "%s", "end_utc": "%s", "seconds": %s, "exit_code": %s, "outcome": "%s"}\n' \
    "${SLURM_JOB_ID:-}" "${SLURM_JOB_NAME:-}" "$JC_NAME" "${SLURM_RESTART_COUNT:-0}" "${SLURM_JOB_NODELIST:-$(hostname)}" \
    "${JC_WORLD:-1}" "$JC_START_UTC" "$(date -u +%Y-%m-%dT%H:%M:%SZ)" "$((t1 - JC_T0))" "$rc" "$outcome" \
    >>"$dir/job_time.jsonl"
  jc_log "job wall clock $((t1 - JC_T0)) s, exit code $rc, $outcome (recorded in $dir/job_time.jsonl)"
}

# The batch shell runs a trap only between commands, so the work runs in the background and the
# shell waits for it; a USR1 (SLURM's warning before the time limit) or TERM then reaches the trap
# at once, and the trap forwards SIGTERM with JC_FORWARD (a function the job script defines).
jc_on_signal() {
  [[ -n $JC_SIGNALED ]] && { jc_log "SIG$1 again: already stopping"; return; }
  JC_SIGNALED=$1
  jc_log "SIG$1 received: asking training to save a checkpoint and stop"
  if [[ -n $JC_CHILD ]]; then "$JC_FORWARD"; fi
}

jc_run() {
  local rc=0
  if [[ -z $JC_SIGNALED ]]; then
    jc_log "running: $*"
    "$@" &
    JC_CHILD=$!
    while :; do  # `wait` returns early when a trapped signal arrives; the command runs on
      wait "$JC_CHILD"
      kill -0 "$JC_CHILD" 2>/dev/null || break
    done
    wait "$JC_CHILD"; rc=$?  # bash keeps the exit status of a reaped child
  else
    rc=143  # the warning came before training started
  fi
  if [[ $rc == 0 ]]; then
    jc_record_time 0 completed
    exit 0
  fi
  if [[ $JC_SIGNALED == USR1 && ${REQUEUE:-1} == 1 && -n ${SLURM_JOB_ID:-} ]]; then
    if ((${SLURM_RESTART_COUNT:-0} >= ${MAX_RESTARTS:-20})); then
      jc_log "not requeueing: restarted ${SLURM_RESTART_COUNT:-0} times already (MAX_RESTARTS=${MAX_RESTARTS:-20})"
    else
      jc_record_time "$rc" requeued
      jc_log "requeueing job $SLURM_JOB_ID: the next run resumes from the last complete checkpoint in $OUTPUT"
      if scontrol requeue "$SLURM_JOB_ID"; then exit 0; fi  # SLURM ends this run and queues the job again
      jc_log "scontrol requeue failed (job submitted with --no-requeue?): resubmit; it resumes from the last checkpoint"
      exit "$rc"
    fi
  fi
  jc_record_time "$rc" "$([[ -n $JC_SIGNALED ]] && echo interrupted || echo failed)"
  exit "$rc"
}
