#!/bin/bash
#SBATCH --job-name=bert-squad
#SBATCH --gres=gpu:a100:1
#SBATCH -c 32
#SBATCH --mem=64G
#SBATCH --time=04:00:00
#SBATCH -o %x-%j.out
#SBATCH -e %x-%j.err
#SBATCH --open-mode=append
#SBATCH --requeue
#SBATCH --signal=B:USR1@300
# job_ft3.sh: fine-tune BERT on SQuAD on one GPU of FinisTerrae III (CESGA), or any SLURM cluster.
#
#   sbatch job_ft3.sh                                   # configs/reference.json
#   sbatch job_ft3.sh configs/baseline_a100.json        # another config
#   sbatch job_ft3.sh configs/reference.json --output_dir runs/ref2 --seed 7   # + run_qa.py arguments
#   sbatch --time=01:00:00 -J ref-short --export=ALL,CONFIG=configs/subset_10k.json job_ft3.sh
#   sbatch --array=1-5 -o %x-%A_%a.out -e %x-%A_%a.err job_ft3.sh configs/fast.json   # logs bert-squad-ARRAY_TASK
#
# The 1 node x 1 process case of jobs/launch.sh, the launcher of job_ddp.sh too. Every #SBATCH line
# is a default that an sbatch option overrides; the logs and a relative output_dir land in the
# submit folder. Nodes smaller than -c 32 --mem=64G: the job pends forever (squeue: PartitionConfig);
# pass what they have (sinfo -p PARTITION -o '%c %m'), e.g. sbatch -c 2 --mem=6G; --check names it.
# ENV_FILE defaults to $STORE/venvs/bert-squad.env.sh: after a VENV_DIR=.venv setup, export
# ENV_FILE=$REPO_DIR/.venv.env.sh. Array logs are named on the sbatch line above, as %a would name a
# plain job's logs ...-4294967294. Arguments, variables (REPO_DIR, ENV_FILE, CONFIG, OUTPUT_DIR,
# RUN_ARGS, GLOBAL_BATCH, ...) and what happens at the time limit: docs/slurm.md.

# sbatch runs a copy of this file from its spool folder, so the repository is named, not derived.
REPO_DIR=${REPO_DIR:-${SLURM_SUBMIT_DIR:-$(dirname "$0")}}
[[ -f $REPO_DIR/run_qa.py ]] || {
  echo "job_ft3.sh: error: no run_qa.py in $REPO_DIR: submit from the repository or set REPO_DIR=/path/to/it" >&2
  exit 1
}
source "$REPO_DIR/jobs/launch.sh"
jl_main job_ft3.sh 1x1 "$@"
