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
# that starts one run_qa.py process per GPU SLURM granted on that node (c10d rendezvous).
#
#   sbatch job_ddp.sh                                       # 1 node x 2 A100, configs/reference.json
#   sbatch -N 2 job_ddp.sh                                  # 2 nodes x 2 A100 = 4 processes
#   sbatch -N 2 --gres=gpu:a100:1 job_ddp.sh configs/baseline_a100.json --output_dir runs/b2x1
#   sbatch -N 4 --export=ALL,STRATEGY=fsdp,GLOBAL_BATCH=96 job_ddp.sh
#
# Runs jobs/launch.sh over every node of the job. Every #SBATCH line is a default that an sbatch
# option overrides; keep --ntasks-per-node=1 (torchrun starts the per-GPU processes); -c and --mem
# are per node, and nodes with fewer leave the job pending forever (PartitionConfig): pass theirs,
# e.g. sbatch -c 2 --mem=6G (sinfo -p PARTITION -o '%c %m'; --check says what fits). Jobs source
# ENV_FILE [$STORE/venvs/bert-squad.env.sh]: after a VENV_DIR=.venv setup, export
# ENV_FILE=$REPO_DIR/.venv.env.sh. Arguments, variables (REPO_DIR, STRATEGY, NPROC_PER_NODE, NCCL_*,
# ...), failures and the time limit: docs/slurm.md.

# sbatch runs a copy of this file from its spool folder, so the repository is named, not derived.
REPO_DIR=${REPO_DIR:-${SLURM_SUBMIT_DIR:-$(dirname "$0")}}
[[ -f $REPO_DIR/run_qa.py ]] || {
  echo "job_ddp.sh: error: no run_qa.py in $REPO_DIR: submit from the repository or set REPO_DIR=/path/to/it" >&2
  exit 1
}
source "$REPO_DIR/jobs/launch.sh"
jl_main job_ddp.sh granted "$@"
