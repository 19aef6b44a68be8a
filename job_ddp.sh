#!/bin/bash
#SBATCH --job-name=bert-squad-ddp
#SBATCH --nodes=1
#SBATCH --ntasks-per-node=1
#SBATCH --gres=gpu:a100:2
#SBATCH -c 32
#SBATCH --mem=64G
#SBATCH --time=02:00:00
#SBATCH -o %x-%j.out
#SBATCH -e %x-%j.err
#SBATCH --open-mode=append
#SBATCH --requeue
#SBATCH --signal=B:USR1@300
#
# job_ddp.sh: fine-tune BERT on SQuAD on N nodes x G GPUs: one srun task per node, each a torchrun
# that starts one run_qa.py process per GPU SLURM granted on that node (c10d rendezvous).
#
#   sbatch job_ddp.sh                                       # 1 node x 2 A100, configs/reference.json
#   sbatch -N 2 job_ddp.sh                                  # 2 nodes x 2 A100 = 4 processes
#   sbatch -N 2 --gres=gpu:a100:1 job_ddp.sh configs/baseline_a100.json --output_dir runs/b2x1
#   sbatch -N 4 --export=ALL,STRATEGY=fsdp,GLOBAL_BATCH=96 job_ddp.sh
#
# Every #SBATCH line above is a default that an sbatch option overrides (-N, --gres, -c, --mem,
# --time, -J, -o, -e, --signal, --no-requeue, --partition, ...). Keep --ntasks-per-node=1: torchrun
# starts the per-GPU processes itself. -c and --mem are per node. Logs are %x-%j.out/.err in the
# submit folder (no folder in -o/-e: sbatch does not create it); the job runs in the submit folder.
#
# Arguments: [CONFIG.json] [run_qa.py arguments...], as for job_ft3.sh.
# Environment, [default] (ENV_FILE, CONFIG, OUTPUT_DIR, RUN_ARGS, HF_HOME, OFFLINE, REQUEUE,
# MAX_RESTARTS, REPO_DIR as in job_ft3.sh):
#   STRATEGY          ddp, or fsdp: fully sharded (FSDP2, parameters resharded after forward =
#                     full_shard), each BertLayer its own unit (--fsdp --fsdp_config FSDP_CONFIG) [ddp]
#   FSDP_CONFIG       JSON for --fsdp_config [{"version": 2, "reshard_after_forward": true,
#                     "auto_wrap_policy": "TRANSFORMER_BASED_WRAP", "transformer_layer_cls_to_wrap":
#                     ["BertLayer"], "state_dict_type": "FULL_STATE_DICT"}]
#   GLOBAL_BATCH      keep per-device batch x world size x gradient accumulation at this value
#                     while scaling: the per-device batch is at most the configured one (the
#                     memory limit) and gradient accumulation makes up the rest; an error if it
#                     does not divide by the world size. The learning rate is not changed.
#   NPROC_PER_NODE    processes per node [SLURM_GPUS_ON_NODE: the GPUs granted by --gres]; set it
#                     for CPU runs (no GPUs) or to use fewer GPUs than granted
#   MASTER_PORT       rendezvous port [20000 + job id % 10000]
#   SHUTDOWN_TIMEOUT  seconds torchrun waits for its workers to save a checkpoint after SIGTERM
#                     before SIGKILL [120; keep it below the --signal lead time]
#   OMP_NUM_THREADS   [CPUs per task / processes per node]
#
# NCCL (GPU runs; set with --export or in ENV_FILE), all optional:
#   NCCL_DEBUG=INFO                 log the transport NCCL picked (IB, sockets) and the rings: the first
#                                   thing to look at when multi-node is slow or hangs; WARN otherwise
#   NCCL_SOCKET_IFNAME=ib0          the interface for NCCL's bootstrap and socket traffic when the
#                                   default route is the wrong network (e.g. ib0, or ^lo,docker)
#   NCCL_IB_DISABLE=1               no InfiniBand (tests a suspected IB problem; much slower)
#   NCCL_IB_HCA=mlx5_0              which InfiniBand adapters to use
#   TORCH_NCCL_ASYNC_ERROR_HANDLING=1  (PyTorch's default) a failed or timed-out collective aborts
#                                   the process instead of hanging it; with the timeout below a rank
#                                   stuck in a collective dies, torchrun and srun end the job
#   --ddp_timeout SECONDS (run_qa.py argument) collective timeout [1800]: lower it to fail faster
#
# Failure on any rank: torchrun stops the other processes on its node, exits non-zero, and
# `srun --kill-on-bad-exit=1` ends the tasks on the other nodes; the job ends FAILED.
# Time limit/preemption: as in job_ft3.sh; the USR1 trap sends SIGTERM to the job's steps, every
# torchrun and worker gets it, the ranks agree on one step, save it and stop, the job requeues.
set -uo pipefail

if [[ -z ${REPO_DIR:-} ]]; then  # sbatch runs a copy of this script: find the repository
  REPO_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
  if [[ ! -f $REPO_DIR/jobs/common.sh && -n ${SLURM_JOB_ID:-} ]]; then
    _cmd=$(scontrol show job "$SLURM_JOB_ID" 2>/dev/null | sed -n 's/^ *Command=//p' | head -n1)
    while [[ -n $_cmd && ! -f $_cmd && $_cmd == *" "* ]]; do _cmd=${_cmd% *}; done  # drop the arguments
    if [[ -f $_cmd ]]; then REPO_DIR=$(cd "$(dirname "$_cmd")" && pwd); else REPO_DIR=${SLURM_SUBMIT_DIR:-$PWD}; fi
  fi
fi
if [[ ! -f $REPO_DIR/jobs/common.sh ]]; then
  echo "job_ddp.sh: error: no jobs/common.sh in $REPO_DIR: set REPO_DIR=/path/to/the/repository" >&2
  exit 1
fi
# shellcheck source=jobs/common.sh
source "$REPO_DIR/jobs/common.sh"

jc_init job_ddp.sh "$@"
[[ -n ${SLURM_JOB_ID:-} ]] || jc_die "not inside a SLURM job: submit with sbatch (for one machine: torchrun --standalone --nproc_per_node N run_qa.py CONFIG)"

# Processes per node: the GPUs SLURM granted on this node, unless NPROC_PER_NODE says otherwise.
NNODES=${SLURM_NNODES:-1}
NPROC=${NPROC_PER_NODE:-${SLURM_GPUS_ON_NODE:-}}
[[ $NPROC =~ ^[1-9][0-9]*$ ]] ||
  jc_die "no GPUs granted on this node (ask sbatch --gres=gpu:a100:N) and NPROC_PER_NODE is not set (set it for CPU runs)"
if [[ -n ${SLURM_GPUS_ON_NODE:-} && $NPROC != "$SLURM_GPUS_ON_NODE" ]]; then
  jc_note "warning: NPROC_PER_NODE=$NPROC processes per node but SLURM granted $SLURM_GPUS_ON_NODE GPU(s)"
fi
JC_WORLD=$((NNODES * NPROC))
jc_global_batch "$JC_WORLD"
if [[ -z ${OMP_NUM_THREADS:-} && -n ${SLURM_CPUS_PER_TASK:-} ]]; then
  export OMP_NUM_THREADS=$((SLURM_CPUS_PER_TASK / NPROC > 0 ? SLURM_CPUS_PER_TASK / NPROC : 1))
fi

STRATEGY=${STRATEGY:-ddp}
case $STRATEGY in
  ddp)
    jc_config_has ddp_find_unused_parameters ||  # BERT QA uses every parameter: skip DDP's search
      RUN_QA_ARGS=(--ddp_find_unused_parameters false "${RUN_QA_ARGS[@]}") ;;
  fsdp)
    FSDP_CONFIG=${FSDP_CONFIG:-'{"version": 2, "reshard_after_forward": true, "auto_wrap_policy": "TRANSFORMER_BASED_WRAP", "transformer_layer_cls_to_wrap": ["BertLayer"], "state_dict_type": "FULL_STATE_DICT"}'}
    RUN_QA_ARGS+=(--fsdp --fsdp_config "$FSDP_CONFIG")
    command -v nvidia-smi >/dev/null 2>&1 ||  # accelerate 1.15: FSDP on GPUs only, MULTI_CPU otherwise
      jc_note "warning: no GPU here: accelerate does not shard on CPUs, this runs as plain DDP" ;;
  *) jc_die "STRATEGY=$STRATEGY: use ddp or fsdp" ;;
esac

# Rendezvous on the first node, by its address: node names need not resolve (NodeAddr does).
FIRST_NODE=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n1)
RDZV_ADDR=$(scontrol show node "$FIRST_NODE" 2>/dev/null | grep -o 'NodeAddr=[^ ]*' | head -n1 | cut -d= -f2)
RDZV_ADDR=${RDZV_ADDR:-$FIRST_NODE}
RDZV_PORT=${MASTER_PORT:-$((20000 + SLURM_JOB_ID % 10000))}  # below the ephemeral port range

jc_note "strategy $STRATEGY: $NNODES node(s) x $NPROC process(es) = world size $JC_WORLD; rendezvous $RDZV_ADDR:$RDZV_PORT ($FIRST_NODE)"
jc_log_environment

# Every line a worker prints starts with its global rank ([rank3]: ...); torchrun's own copies
# of the per-rank logs go to node-local scratch.
export TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE=${TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE:-'[rank${rank}]: '}
LOG_DIR=${TMPDIR:-/tmp}/torchrun-$SLURM_JOB_ID-${SLURM_RESTART_COUNT:-0}

# USR1/TERM: SIGTERM to every process of the job's steps (torchrun and its workers on each node),
# not to this batch shell. torchrun forwards it too and waits SHUTDOWN_TIMEOUT for the workers.
jc_forward() { scancel --signal=TERM "$SLURM_JOB_ID" 2>/dev/null || kill -TERM "$JC_CHILD" 2>/dev/null; }
JC_FORWARD=jc_forward
jc_run srun --kill-on-bad-exit=1 --nodes="$NNODES" --ntasks-per-node=1 --ntasks="$NNODES" \
  ${SLURM_CPUS_PER_TASK:+--cpus-per-task="$SLURM_CPUS_PER_TASK"} \
  torchrun --nnodes="$NNODES" --nproc_per_node="$NPROC" \
  --rdzv_backend=c10d --rdzv_endpoint="$RDZV_ADDR:$RDZV_PORT" --rdzv_id="$SLURM_JOB_ID" \
  --max_restarts=0 --shutdown_timeout="${SHUTDOWN_TIMEOUT:-120}" --tee=3 --log_dir="$LOG_DIR" \
  "$REPO_DIR/run_qa.py" "$CONFIG" "${RUN_QA_ARGS[@]}"
