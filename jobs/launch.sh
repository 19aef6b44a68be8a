# jobs/launch.sh: the one launcher of job_ft3.sh and job_ddp.sh. Sourced by them (bash), not run.
#
# A job script finds the repository, sources this file (which traps USR1 and TERM at once) and
# calls `jl_main NAME SHAPE [CONFIG.json] [run_qa.py arguments...]`. SHAPE is `1x1` (job_ft3.sh:
# one node, one process) or `granted` (job_ddp.sh: every node of the job, NPROC_PER_NODE or the
# GPUs granted processes on each). Both then take the same path, so a 1-GPU job is the world-size-1
# case of a multi-GPU one:
#   1. checks that need no library, so bad input fails within a second: ENV_FILE, OFFLINE, the config,
#      the SLURM job, the shape, GLOBAL_BATCH (by run_qa.py's rule), STRATEGY;
#   2. the folder run_qa.py will write into (job_time.jsonl goes there too), read from the config
#      and the arguments by `python -m qa.arguments output_dir` (the standard library only: nothing
#      imports transformers before srun). Batch arithmetic and defaults are run_qa.py's own:
#      GLOBAL_BATCH goes to it as --global_batch, and it logs the global batch at start;
#   3. `srun` one task per node, each a `torchrun` starting the node's processes (c10d rendezvous
#      on the first node), in the background while the shell waits;
#   4. USR1 (`--signal=B:USR1@T`) or TERM: SIGTERM to every process of the job's steps, which save
#      a checkpoint and stop; the job requeues itself (a check job never: it would start over and meet
#      the same limit, so it stops not ready and says so); each run of the job writes its wall-clock
#      time and outcome to OUTPUT/job_time.jsonl, at a SIGTERM already (SLURM may kill it before its
#      end): the status rank 0's run_qa.py wrote into QA_OUTCOME_FILE, as torchrun ends with 1
#      whatever its workers' statuses.
# Every variable it reads (and its default) is documented in one place: docs/slurm.md.
set -uo pipefail

REPO_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
JL_T0=$(date +%s)
JL_START_UTC=$(date -u +%Y-%m-%dT%H:%M:%SZ)
JL_SIGNALED=""   # USR1 or TERM once the batch shell got one
JL_CHILD=""      # pid of srun
JL_RECORDED=""   # 1 once this run's line in job_time.jsonl is its last
JL_NAME=${JL_NAME:-job}
# From the start: a USR1 before training starts must not kill the batch shell (its default action).
trap 'jl_on_signal USR1' USR1
trap 'jl_on_signal TERM' TERM

JL_NOTES=()  # lines jl_log_environment logs after its header
jl_note() { JL_NOTES+=("$*"); }
jl_log() { printf '[%s %s] %s\n' "$(date +%H:%M:%S)" "$JL_NAME" "$*"; }
jl_die() { printf '%s: error: %s\n' "$JL_NAME" "$*" >&2; exit 1; }

jl_main() {
  JL_NAME=$1
  local shape=$2
  shift 2
  jl_environment
  jl_arguments "$@"
  [[ -n ${SLURM_JOB_ID:-} ]] ||
    jl_die "not inside a SLURM job: submit with sbatch (on one machine: python run_qa.py CONFIG, or torchrun --standalone --nproc_per_node N run_qa.py CONFIG)"
  jl_task
  jl_shape "$shape"
  jl_global_batch "$JL_WORLD"
  STRATEGY=${STRATEGY:-ddp}
  [[ $STRATEGY == ddp || $STRATEGY == fsdp ]] || jl_die "STRATEGY=$STRATEGY: use ddp or fsdp"
  jl_output
  jl_strategy
  jl_launch
}

# The environment setup_bert.sh wrote (venv, HF_HOME, offline mode, modules).
jl_environment() {
  ENV_FILE=${ENV_FILE:-${STORE:-$HOME}/venvs/bert-squad.env.sh}
  [[ -f $ENV_FILE ]] ||
    jl_die "environment file $ENV_FILE not found: run ./setup_bert.sh on a login node first (it writes it), or set ENV_FILE=/path/to/env.sh"
  set +u  # activate scripts and `module` are not written for `set -u`
  # shellcheck disable=SC1090
  source "$ENV_FILE" || { set -u; jl_die "sourcing $ENV_FILE failed (see above): rerun ./setup_bert.sh"; }
  set -u
  command -v python >/dev/null || jl_die "no python after sourcing $ENV_FILE: rerun ./setup_bert.sh"
  # Compute nodes have no internet: never try the Hub, unless OFFLINE=0 (nodes online). Settled here,
  # after ENV_FILE, as an env file and the submitting shell (sbatch passes its environment) may set them.
  case ${OFFLINE:-1} in
    1) export HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 TRANSFORMERS_OFFLINE=1 ;;
    0) unset HF_HUB_OFFLINE HF_DATASETS_OFFLINE TRANSFORMERS_OFFLINE
       jl_note "OFFLINE=0: HF_HUB_OFFLINE, HF_DATASETS_OFFLINE and TRANSFORMERS_OFFLINE unset, the run may reach the Hub" ;;
    *) jl_die "OFFLINE=$OFFLINE: use 1 (never reach the Hub, the default) or 0 (the job may reach the Hub)" ;;
  esac
  export HF_HOME=${HF_HOME:-${LUSTRE:-${STORE:-$HOME}}/hf_cache}
  export PYTHONUNBUFFERED=1   # log lines reach the .out file as they happen
}

# CONFIG (absolute) and RUN_QA_ARGS: the config is the first argument if it is a .json file, else
# CONFIG, else the reference recipe; then OUTPUT_DIR, RUN_ARGS and the trailing arguments, the last
# one winning as in run_qa.py.
jl_arguments() {
  if [[ $# -gt 0 && $1 == *.json ]]; then CONFIG=$1; shift; fi
  CONFIG=${CONFIG:-configs/reference.json}
  if [[ -f $CONFIG ]]; then CONFIG=$(cd "$(dirname "$CONFIG")" && pwd)/$(basename "$CONFIG")
  elif [[ $CONFIG != /* && -f $REPO_DIR/$CONFIG ]]; then CONFIG=$REPO_DIR/$CONFIG
  else jl_die "config $CONFIG not found (looked in $PWD and $REPO_DIR): pass an existing JSON config as the first argument or CONFIG=configs/NAME.json"
  fi
  local extra=()
  RUN_QA_ARGS=()
  if [[ -n ${OUTPUT_DIR:-} ]]; then RUN_QA_ARGS+=(--output_dir "$OUTPUT_DIR"); fi
  if [[ -n ${RUN_ARGS:-} ]]; then read -r -a extra <<<"$RUN_ARGS"; RUN_QA_ARGS+=("${extra[@]}"); fi
  RUN_QA_ARGS+=("$@")
  if ((${SLURM_RESTART_COUNT:-0} > 0)); then  # a requeued run continues, whatever --resume said
    RUN_QA_ARGS+=(--resume auto)
    jl_note "restart ${SLURM_RESTART_COUNT}: --resume auto (from the last complete checkpoint in the output folder)"
  fi
}

# An array task trains its own seed in its own folder, and a study file's task runs its cell: studies/task.py
# answers (its STRATEGY, the config, all the arguments) and records the task in that folder. A plain job: unchanged.
jl_task() {
  local answer lines
  answer=$(PYTHONPATH="$REPO_DIR${PYTHONPATH:+:$PYTHONPATH}" python -m studies.task "$CONFIG" "${RUN_QA_ARGS[@]}") ||
    exit 2  # it printed the one-line error
  mapfile -t lines <<<"$answer"
  [[ -z ${lines[0]} ]] || STRATEGY=${lines[0]}
  CONFIG=${lines[1]}
  RUN_QA_ARGS=("${lines[@]:2}")
  [[ -z ${SLURM_ARRAY_TASK_ID:-} ]] || jl_note "array job ${SLURM_ARRAY_JOB_ID:-?} task $SLURM_ARRAY_TASK_ID: ${RUN_QA_ARGS[*]: -4}"
}

# NNODES x NPROC processes = JL_WORLD. 1x1 whatever was granted (one GPU is the point of
# job_ft3.sh); `granted`: all the job's nodes, NPROC_PER_NODE or the GPUs SLURM granted per node.
jl_shape() {
  if [[ $1 == 1x1 ]]; then
    NNODES=1 NPROC=1
    ((${SLURM_NNODES:-1} == 1)) || jl_note "warning: $SLURM_NNODES nodes granted, $JL_NAME uses the first (job_ddp.sh uses them all)"
    ((${SLURM_GPUS_ON_NODE:-1} <= 1)) || jl_note "warning: $SLURM_GPUS_ON_NODE GPUs granted, $JL_NAME uses one (job_ddp.sh uses them all)"
    [[ ${NPROC_PER_NODE:-1} == 1 ]] || jl_note "warning: NPROC_PER_NODE=$NPROC_PER_NODE ignored: $JL_NAME runs one process"
  else
    NNODES=${SLURM_NNODES:-1}
    NPROC=${NPROC_PER_NODE:-${SLURM_GPUS_ON_NODE:-}}
    [[ $NPROC =~ ^[1-9][0-9]*$ ]] ||
      jl_die "no GPUs granted on this node (ask sbatch --gres=gpu:a100:N) and NPROC_PER_NODE is not set (set it for CPU runs)"
    if [[ -n ${SLURM_GPUS_ON_NODE:-} && $NPROC != "$SLURM_GPUS_ON_NODE" ]]; then
      jl_note "warning: NPROC_PER_NODE=$NPROC processes per node but SLURM granted $SLURM_GPUS_ON_NODE GPU(s)"
    fi
  fi
  JL_WORLD=$((NNODES * NPROC))
  if [[ -z ${OMP_NUM_THREADS:-} && -n ${SLURM_CPUS_PER_TASK:-} ]]; then
    export OMP_NUM_THREADS=$((SLURM_CPUS_PER_TASK / NPROC > 0 ? SLURM_CPUS_PER_TASK / NPROC : 1))
  fi
}

# OUTPUT: the folder run_qa.py writes into, as it resolves it (qa/arguments.py, which it uses too):
# the last --output_dir of the config and the arguments, else its default.
jl_output() {
  OUTPUT=$(PYTHONPATH="$REPO_DIR${PYTHONPATH:+:$PYTHONPATH}" python -m qa.arguments output_dir "$CONFIG" "${RUN_QA_ARGS[@]}") ||
    exit 1  # it printed the one-line error (a config that is not valid JSON)
  JL_CHECK=$(PYTHONPATH="$REPO_DIR${PYTHONPATH:+:$PYTHONPATH}" python -m qa.arguments check "$CONFIG" "${RUN_QA_ARGS[@]}")
  jl_output_place
}

# A bert-base run keeps about 3 GB of checkpoints and model in its output folder, and a relative one
# lands in the submit folder, often $HOME, whose quota is small: where the cluster has a $LUSTRE for
# jobs to write (FinisTerrae III), a folder under $HOME gets a warning with the fix.
jl_output_place() {
  local where=$OUTPUT
  [[ $where == /* ]] || where=$PWD/$where
  if [[ -n ${LUSTRE:-} && -n ${HOME:-} && $where == "${HOME%/}"/* ]]; then
    jl_note "warning: output folder $where is under \$HOME, whose quota is small (a bert-base run keeps about 3 GB there): set OUTPUT_DIR=\$LUSTRE/runs/NAME, or submit from a folder on \$LUSTRE (cd \$LUSTRE/bert-squad && REPO_DIR=$REPO_DIR sbatch $REPO_DIR/$JL_NAME)"
  fi
}

# Before srun: GLOBAL_BATCH must be a positive integer that divides over the world size, by run_qa.py's
# own rule (qa/arguments.py). It gets it as --global_batch (last, so it wins) and splits it into
# per-device batch x gradient accumulation.
jl_global_batch() {
  [[ -z ${GLOBAL_BATCH:-} ]] && return 0
  [[ $GLOBAL_BATCH =~ ^[1-9][0-9]*$ ]] || jl_die "GLOBAL_BATCH=$GLOBAL_BATCH is not a positive integer"
  PYTHONPATH="$REPO_DIR${PYTHONPATH:+:$PYTHONPATH}" python -m qa.arguments global_batch "$GLOBAL_BATCH" "$1" ||
    exit  # it printed the one-line error
  RUN_QA_ARGS+=(--global_batch "$GLOBAL_BATCH")
}

# ddp needs no argument: run_qa.py's defaults skip DDP's search for unused parameters.
jl_strategy() {
  [[ $STRATEGY == fsdp ]] || return 0
  FSDP_CONFIG=${FSDP_CONFIG:-'{"version": 2, "reshard_after_forward": true, "auto_wrap_policy": "TRANSFORMER_BASED_WRAP", "transformer_layer_cls_to_wrap": ["BertLayer"], "state_dict_type": "FULL_STATE_DICT"}'}
  RUN_QA_ARGS+=(--fsdp --fsdp_config "$FSDP_CONFIG")
  command -v nvidia-smi >/dev/null 2>&1 ||  # accelerate 1.15: FSDP on GPUs only, MULTI_CPU otherwise
    jl_note "warning: no GPU here: accelerate does not shard on CPUs, this runs as plain DDP"
}

jl_launch() {
  # Rendezvous on the first node, by its address: node names need not resolve (NodeAddr does).
  local first addr port
  first=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n1)
  addr=$(scontrol show node "$first" 2>/dev/null | grep -o 'NodeAddr=[^ ]*' | head -n1 | cut -d= -f2)
  addr=${addr:-$first}
  port=${MASTER_PORT:-$((20000 + SLURM_JOB_ID % 10000))}  # below the ephemeral port range
  jl_note "strategy $STRATEGY: $NNODES node(s) x $NPROC process(es) = world size $JL_WORLD; rendezvous $addr:$port ($first)"
  jl_log_environment
  JL_TORCHRUN_LOGS=${TMPDIR:-/tmp}/torchrun-$SLURM_JOB_ID-${SLURM_RESTART_COUNT:-0}
  # Every line a worker prints starts with its global rank ([rank3]: ...); torchrun's own copies
  # of the per-rank logs go to node-local scratch.
  export TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE=${TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE:-'[rank${rank}]: '}
  # Where rank 0 says how it ended (qa/errors.py): in the job's folder, which every node sees, one per run
  export QA_OUTCOME_FILE=$PWD/.outcome-$SLURM_JOB_ID-${SLURM_RESTART_COUNT:-0}.json
  rm -f "$QA_OUTCOME_FILE"
  # torchrun as jobs/torchrun.py starts it: a refusal, a check not ready or a requeue leaves the run's own line
  # in the .err file, not torchrun's traceback of a worker's non-zero exit or of its SIGTERM
  local entry=("$REPO_DIR/run_qa.py")
  [[ -z ${RUN_QA:-} ]] || read -r -a entry <<<"$RUN_QA"
  jl_run srun --kill-on-bad-exit=1 --nodes="$NNODES" --ntasks-per-node=1 --ntasks="$NNODES" \
    ${SLURM_CPUS_PER_TASK:+--cpus-per-task="$SLURM_CPUS_PER_TASK"} \
    python "$REPO_DIR/jobs/torchrun.py" --nnodes="$NNODES" --nproc_per_node="$NPROC" \
    --rdzv_backend=c10d --rdzv_endpoint="$addr:$port" --rdzv_id="$SLURM_JOB_ID" \
    --max_restarts=0 --shutdown_timeout="${SHUTDOWN_TIMEOUT:-120}" --tee=3 \
    --log_dir="$JL_TORCHRUN_LOGS" \
    "${entry[@]}" "$CONFIG" "${RUN_QA_ARGS[@]}"
}

# Where and with what the job runs: goes to the job's .out file.
jl_log_environment() {
  jl_log "job ${SLURM_JOB_ID:-none} (${SLURM_JOB_NAME:-}), restart ${SLURM_RESTART_COUNT:-0}, on $(hostname) [nodes ${SLURM_JOB_NODELIST:-local}], submitted from ${SLURM_SUBMIT_DIR:-$PWD}"
  jl_log "repository $REPO_DIR; config $CONFIG; output $OUTPUT; run dir $PWD"
  jl_log "python $(command -v python) ($(python -c 'import sys; print(sys.version.split()[0])')); ENV_FILE $ENV_FILE"
  if command -v nvidia-smi >/dev/null 2>&1; then
    nvidia-smi || jl_log "nvidia-smi failed"
    nvidia-smi topo -m 2>/dev/null || true
  else
    jl_log "no nvidia-smi on this node (CPU run)"
  fi
  jl_log "environment:"
  env | grep -E '^(SLURM_(JOB|NNODES|NTASKS|CPUS|GPUS|MEM|RESTART|SUBMIT|NODELIST|STEP_GPUS)|CUDA_|NCCL_|TORCH_|OMP_|HF_|TRANSFORMERS_|TOKENIZERS_|VIRTUAL_ENV=|CONFIG=|RUN_ARGS=|OUTPUT_DIR=|GLOBAL_BATCH=|STRATEGY=|NPROC_PER_NODE=|MASTER_)' |
    grep -viE 'token|secret|passw|key=' | sort | sed 's/^/    /'
  local line
  for line in "${JL_NOTES[@]}"; do jl_log "$line"; done
}

# One line per run of the job (a requeued job has several) in OUTPUT/job_time.jsonl, written when the run ends, and
# already at a SIGTERM (jl_record_cut): SLURM kills a job KillWait seconds after the SIGTERM of a requeue, a
# preemption, a cancel or the time limit, often before it ends, and the part it ran must count all the same. A check
# job (--check) leaves no record of a run there, only its check.md and check.json.
jl_record_time() {  # RC OUTCOME [REASON as JSON: the line written at a SIGTERM, which the run's end replaces]
  local rc=$1 outcome=$2 cut=${3:-} t1 dir
  t1=$(date +%s)
  if [[ ${JL_CHECK:-false} == true ]]; then
    jl_log "check job wall clock $((t1 - JL_T0)) s, exit code $rc (0: ready, 2: not ready); the check: $OUTPUT/check.md"
    return
  fi
  # the run's end: from here a SIGTERM (the one `scontrol requeue` sends too) leaves its line as it is
  [[ -n $cut ]] || JL_RECORDED=1
  dir=${OUTPUT:-.}
  mkdir -p "$dir" 2>/dev/null || dir=.
  jl_write_record "$dir/job_time.jsonl" "$(printf '{"job_id": "%s", "job_name": "%s", "script": "%s", "restart": %s, "nodes": "%s", "world_size": %s, "start_utc": "%s", "end_utc": "%s", "seconds": %s, "exit_code": %s, "outcome": "%s", "reason": %s, "array_job_id": "%s", "array_task_id": "%s"}' \
    "${SLURM_JOB_ID:-}" "${SLURM_JOB_NAME:-}" "$JL_NAME" "${SLURM_RESTART_COUNT:-0}" "${SLURM_JOB_NODELIST:-$(hostname)}" \
    "${JL_WORLD:-1}" "$JL_START_UTC" "$(date -u +%Y-%m-%dT%H:%M:%SZ)" "$((t1 - JL_T0))" "$rc" "$outcome" \
    "${cut:-${JL_REASON:-null}}" "${SLURM_ARRAY_JOB_ID:-}" "${SLURM_ARRAY_TASK_ID:-}")"
  if [[ -n $cut ]]; then
    jl_log "job wall clock $((t1 - JL_T0)) s up to the SIGTERM, recorded as $outcome in $dir/job_time.jsonl (the run's end replaces it)"
  else
    jl_log "job wall clock $((t1 - JL_T0)) s, exit code $rc, $outcome (recorded in $dir/job_time.jsonl)"
  fi
}

# This run's line (the same job, script and restart) replaces the one it wrote before, else is appended, in one
# rename; under a lock on the folder where the file system has locks, as a job refused from it writes there too.
jl_write_record() {  # FILE LINE
  local file=$1 line=$2 key=${2%%\"nodes\"*}
  {
    flock -w 10 9 2>/dev/null
    { grep -vF "$key" "$file" 2>/dev/null; printf '%s\n' "$line"; } >"$file.$$.tmp" && mv -f "$file.$$.tmp" "$file"
  } 9<"$(dirname "$file")"
}

# At a SIGTERM the run's line says the seconds so far: a run killed before its end is counted up to the signal,
# where SLURM ends that part too (its EndTime, sacct's Elapsed). `requeued` where SLURM has counted a restart already
# (scontrol requeue, a preemption that requeues), else `interrupted`.
jl_record_cut() {
  [[ -n ${OUTPUT:-} && -z $JL_RECORDED && ${JL_CHECK:-false} != true ]] || return 0
  local restarts outcome=interrupted
  restarts=$(scontrol show job -o "$SLURM_JOB_ID" 2>/dev/null | grep -o 'Restarts=[0-9]*' | cut -d= -f2)
  ((${restarts:-0} > ${SLURM_RESTART_COUNT:-0})) && outcome=requeued
  jl_record_time 143 "$outcome" '"SIGTERM from SLURM, then killed before the run ended: counted up to the SIGTERM"'
}

# The batch shell runs a trap only between commands, so the work runs in the background and the
# shell waits for it; a USR1 (SLURM's warning before the time limit) or TERM then reaches the trap
# at once. SIGTERM goes to every process of the job's steps (torchrun and its workers on each
# node), not to this batch shell; torchrun forwards it too and waits SHUTDOWN_TIMEOUT for them.
jl_on_signal() {
  if [[ -n $JL_SIGNALED ]]; then
    jl_log "SIG$1 again: already stopping"
    [[ $1 == USR1 ]] || jl_record_cut
    return
  fi
  JL_SIGNALED=$1
  if [[ ${JL_CHECK:-false} == true ]]; then jl_log "SIG$1 received: stopping the check, which reports it"
  else jl_log "SIG$1 received: asking training to save a checkpoint and stop"; fi
  [[ $1 == USR1 ]] || jl_record_cut  # first: SLURM kills the job KillWait seconds after a SIGTERM of its own
  if [[ -n $JL_CHILD ]]; then
    # SLURM's own SIGTERM (a requeue, a cancel, the time limit) reached the steps already, and scancel then waits
    # for the job to end: bounded, so that the batch shell goes back to waiting for its run
    timeout 5 scancel --signal=TERM "$SLURM_JOB_ID" 2>/dev/null || kill -TERM "$JL_CHILD" 2>/dev/null
  fi
}

jl_run() {
  local rc=0 outcome
  if [[ -z $JL_SIGNALED ]]; then
    jl_log "running: $*"
    "$@" &
    JL_CHILD=$!
    while :; do  # `wait` returns early when a trapped signal arrives; the command runs on
      wait "$JL_CHILD"
      kill -0 "$JL_CHILD" 2>/dev/null || break
    done
    wait "$JL_CHILD"; rc=$?  # bash keeps the exit status of a reaped child
  else
    rc=143  # the warning came before training started
  fi
  jl_outcome
  if [[ $rc == 0 ]]; then
    jl_record_time 0 completed
    exit 0
  fi
  if [[ $JL_SIGNALED == USR1 && ${REQUEUE:-1} == 1 ]]; then
    if [[ ${JL_CHECK:-false} == true ]]; then
      jl_log "not requeueing a check job: it would start over"
    elif ((${SLURM_RESTART_COUNT:-0} >= ${MAX_RESTARTS:-20})); then
      jl_log "not requeueing: restarted ${SLURM_RESTART_COUNT:-0} times already (MAX_RESTARTS=${MAX_RESTARTS:-20})"
    else
      jl_record_time "$rc" requeued
      jl_log "requeueing job $SLURM_JOB_ID: the next run resumes from the last complete checkpoint in $OUTPUT"
      if scontrol requeue "$SLURM_JOB_ID"; then exit 0; fi  # SLURM ends this run and queues the job again
      jl_log "scontrol requeue failed (job submitted with --no-requeue?): resubmit; it resumes from the last checkpoint"
      exit "$rc"
    fi
  fi
  jl_record_time "$rc" "$outcome"
  exit "$rc"
}

# rc and outcome as rank 0's run_qa.py wrote them into QA_OUTCOME_FILE (torchrun ends with 1 whatever its
# workers' statuses), its reason logged; without that file (run_qa.py never ran, or rank 0 was killed) the
# job failed with the status it got, or was interrupted if a signal came.
jl_outcome() {
  local status name reason
  outcome=failed
  [[ -n $JL_SIGNALED ]] && outcome=interrupted
  [[ -f ${QA_OUTCOME_FILE:-} ]] || return 0
  # the reason a second time as JSON, for job_time.jsonl (JL_REASON), where reports read it
  IFS=$'\t' read -r status name JL_REASON reason < <(python -c 'import json, sys
o = json.load(open(sys.argv[1])); print(o["status"], o["outcome"], json.dumps(o["reason"]), o["reason"], sep="\t")' "$QA_OUTCOME_FILE")
  rm -f "$QA_OUTCOME_FILE"
  [[ ${JL_CHECK:-false} == true && $status == 2 ]] ||  # not ready: the check's verdict said why, once
    jl_log "run_qa.py: $name (status $status): $reason"
  ((rc == 0 || status == 0)) || rc=$status outcome=$name
}
