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
# job_ddp.sh: fine-tune BERT on SQuAD on N nodes x G GPUs: one srun task per node, each a torchrun
# that starts one run_qa.py process per GPU SLURM granted on that node (c10d rendezvous). The
# launcher, jobs/launch.sh, is job_ft3.sh's too: job_ft3.sh is its 1 node x 1 process case.
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
# MAX_RESTARTS, REPO_DIR as in job_ft3.sh; job_ft3.sh reads the ones below too, except NPROC_PER_NODE):
#   STRATEGY          ddp, or fsdp: fully sharded (FSDP2, parameters resharded after forward =
#                     full_shard), each BertLayer its own unit (--fsdp --fsdp_config FSDP_CONFIG) [ddp]
#   FSDP_CONFIG       JSON for --fsdp_config [{"version": 2, "reshard_after_forward": true,
#                     "auto_wrap_policy": "TRANSFORMER_BASED_WRAP", "transformer_layer_cls_to_wrap":
#                     ["BertLayer"], "state_dict_type": "FULL_STATE_DICT"}]
#   GLOBAL_BATCH      keep per-device batch x world size x gradient accumulation at this value
#                     while scaling: an error at once if it does not divide by the world size, then
#                     run_qa.py's --global_batch: the per-device batch is at most the configured one
#                     (the memory limit) and gradient accumulation makes up the rest. The learning
#                     rate is not changed.
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

# The same lines as in job_ft3.sh: sbatch runs a copy of this file from its spool folder, so what
# finds the repository cannot be in the repository. Looked in: REPO_DIR, this file's folder, the
# submitted file's (scontrol's Command=: its path, then the arguments), the submit folder.
cmd=$([[ -z ${SLURM_JOB_ID:-} ]] || scontrol show job "$SLURM_JOB_ID" 2>/dev/null | sed -n 's/^ *Command=//p')
while [[ $cmd == *" "* && ! -f $cmd ]]; do cmd=${cmd% *}; done
for dir in "${REPO_DIR:-$(dirname "$0")}" "$(dirname "$cmd")" "${SLURM_SUBMIT_DIR:-.}"; do [[ -f $dir/jobs/launch.sh || -n ${REPO_DIR:-} ]] && break; done
[[ -f $dir/jobs/launch.sh ]] && source "$dir/jobs/launch.sh" || { echo "job_ddp.sh: error: no jobs/launch.sh in $dir: set REPO_DIR=/path/to/the/repository" >&2; exit 1; }
jl_main job_ddp.sh granted "$@"
