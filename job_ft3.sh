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
#
# Every #SBATCH line above is a default: an sbatch option on the command line wins (--gres,
# -c, --mem, --time, -J, -o, -e, --signal, --no-requeue, --partition, --account, ...).
# The logs are %x-%j.out/.err (job name, job id) in the folder you submit from: no folder in
# the default -o/-e, because sbatch fails, or the job dies silently, when that folder is missing.
# The job runs in the submit folder too: a relative output_dir is relative to it.
#
# Arguments: [CONFIG.json] [run_qa.py arguments...]; the arguments override the config.
# Environment (pass with `sbatch --export=ALL,NAME=value,...` or export before sbatch), [default]:
#   ENV_FILE      written by setup_bert.sh: venv, HF_HOME, offline mode, modules
#                 [${STORE:-$HOME}/venvs/bert-squad.env.sh]
#   CONFIG        JSON config, if not given as the first argument [configs/reference.json]
#                 (a relative path is looked up in the submit folder, then in the repository)
#   OUTPUT_DIR    passed as --output_dir (before RUN_ARGS and the arguments, which win); a relative
#                 one, like the configs', is under the submit folder: submit from a folder on $LUSTRE
#                 (a bert-base run keeps about 3 GB there; a folder under $HOME gets a warning)
#   RUN_ARGS      more run_qa.py arguments, split on spaces ("--seed 7 --max_steps 100")
#   GLOBAL_BATCH  keep the global batch at this size: run_qa.py's --global_batch (per-device batch x
#                 gradient accumulation)
#   STRATEGY, FSDP_CONFIG, MASTER_PORT, SHUTDOWN_TIMEOUT, OMP_NUM_THREADS  as in job_ddp.sh
#   HF_HOME       Hugging Face cache [from ENV_FILE, else ${LUSTRE:-${STORE:-$HOME}}/hf_cache]
#   OFFLINE       1: HF_HUB_OFFLINE/HF_DATASETS_OFFLINE/TRANSFORMERS_OFFLINE=1 (compute nodes have no
#                 internet) [1]
#   REQUEUE       1: requeue the job after it checkpointed on the USR1 warning [1]
#   MAX_RESTARTS  stop requeueing after this many restarts [20]
#   REPO_DIR      the repository [found from the submitted script's path]
#
# What runs: jobs/launch.sh, the launcher of job_ddp.sh too, with one node and one process (srun,
# then torchrun starting one run_qa.py): a 1-GPU job is the world-size-1 case of a multi-GPU one,
# and the scaling study's 1x1 point is this script.
#
# Time limit and preemption: SLURM sends USR1 to this shell 300 s (--signal=B:USR1@300) before
# the time limit; the shell sends SIGTERM to the job step (torchrun and run_qa.py); run_qa.py
# finishes the optimizer step, saves a complete checkpoint and exits 143; the job then requeues
# itself (scontrol requeue) and the next run resumes (--resume auto: model, optimizer, scheduler,
# RNG, data position). The lead time must cover one step plus a checkpoint save (bert-base:
# ~1.3 GB). Each run of the job appends its wall-clock time and outcome to OUTPUT_DIR/job_time.jsonl.

# The same lines as in job_ddp.sh: sbatch runs a copy of this file from its spool folder, so what
# finds the repository cannot be in the repository. Looked in: REPO_DIR, this file's folder, the
# submitted file's (scontrol's Command=: its path, then the arguments), the submit folder.
cmd=$([[ -z ${SLURM_JOB_ID:-} ]] || scontrol show job "$SLURM_JOB_ID" 2>/dev/null | sed -n 's/^ *Command=//p')
while [[ $cmd == *" "* && ! -f $cmd ]]; do cmd=${cmd% *}; done
for dir in "${REPO_DIR:-$(dirname "$0")}" "$(dirname "$cmd")" "${SLURM_SUBMIT_DIR:-.}"; do [[ -f $dir/jobs/launch.sh || -n ${REPO_DIR:-} ]] && break; done
[[ -f $dir/jobs/launch.sh ]] && source "$dir/jobs/launch.sh" || { echo "job_ft3.sh: error: no jobs/launch.sh in $dir: set REPO_DIR=/path/to/the/repository" >&2; exit 1; }
jl_main job_ft3.sh 1x1 "$@"
