#!/usr/bin/env bash
# Submit the scaling study: every shape x strategy x repeat as its own sbatch job: the 1x1 baseline
# with job_ft3.sh, every other cell with job_ddp.sh.
#
#   tools/scaling_submit.sh [--shapes "1x1 1x2 2x1 2x2"] [--strategies "ddp fsdp"] [--repeats 5]
#       [--config configs/reference.json] [--study runs/scaling/<date>] [--global-batch N]
#       [--target-f1 X [--eval-every E] [--eval-every-questions N]]
#       [--env-file FILE] [--job-script job_ddp.sh] [--dry-run] [SBATCH OPTIONS...] [-- RUN_QA ARGS...]
#
# Shapes are NODESxGPUS_PER_NODE. Any option not listed above goes to sbatch as is (--partition
# gpu, --time=02:00:00, --account X, ...); what follows `--` goes to run_qa.py (via the job).
# --job-script: the script of the multi-GPU cells [job_ddp.sh]; the baseline is always job_ft3.sh.
# --target-f1 X: every run evaluates during training (--eval_every E, a fraction of an epoch or
# steps [0.25]; --eval_every_questions N validation questions [all]) and records its training
# seconds to F1 X; the report gives each cell's time-to-target speedup beside its throughput one.
# Every multi-GPU cell passes run_qa.py --measure_communication true (the study's measurement of
# its bandwidth and exposed communication, scaling/comm_measure.py), before the RUN_QA ARGS.
# Each run writes into STUDY/<strategy>-<nodes>x<gpus>-r<k> (OUTPUT_DIR and --output_dir), and
# STUDY/manifest.json lists every submitted job (rewritten atomically after each submission).
#
# The 1x1 baseline is submitted once per repeat, not once per strategy, with job_ft3.sh and
# STRATEGY=ddp (run name ddp-1x1-rK): exactly what a user's `sbatch job_ft3.sh` runs. job_ft3.sh
# and job_ddp.sh share one launcher (jobs/launch.sh: environment, srun + torchrun, GLOBAL_BATCH,
# requeue), job_ft3.sh being its 1 node x 1 process case, so the speedup measures the parallelism
# and nothing else. With one process DDP has no peer to synchronise with: single-GPU training.
# --no-requeue: a run that hits the time limit and resumes from a checkpoint in a requeued job
# reports the training time of its last part only, so it cannot count (pass --requeue to allow it;
# the report lists such runs as "resumed"). Logs: STUDY/<run>/slurm-<jobid>.out and .err.
# Jobs are submitted repeat by repeat (r1 of every cell, then r2, ...), so a slow hour on the
# cluster does not land on one cell only.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
die() { echo "scaling_submit: $*" >&2; exit 2; }
abspath() { case $1 in /*) echo "$1" ;; *) echo "$PWD/$1" ;; esac; }

shapes="1x1 1x2 2x1 2x2"; strategies="ddp fsdp"; repeats=5; config=configs/reference.json
study=""; global_batch=""; env_file=""; job_script=job_ddp.sh; dry=0; sbatch_extra=(); run_extra=()
target_f1=""; eval_every=0.25; eval_questions=""
baseline_script=$ROOT/job_ft3.sh
while [ $# -gt 0 ]; do
  case $1 in
    --shapes) shapes=$2; shift ;;
    --strategies) strategies=$2; shift ;;
    --repeats) repeats=$2; shift ;;
    --config) config=$2; shift ;;
    --study) study=$2; shift ;;
    --global-batch) global_batch=$2; shift ;;
    --target-f1) target_f1=$2; shift ;;
    --eval-every) eval_every=$2; shift ;;
    --eval-every-questions) eval_questions=$2; shift ;;
    --env-file) env_file=$2; shift ;;
    --job-script) job_script=$2; shift ;;
    --dry-run) dry=1 ;;
    -h | --help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    --) shift; run_extra=("$@"); break ;;
    *) sbatch_extra+=("$1") ;;
  esac
  shift
done

[[ $repeats =~ ^[1-9][0-9]*$ ]] || die "--repeats must be a positive integer, not '$repeats'"
[ -z "$global_batch" ] || [[ $global_batch =~ ^[1-9][0-9]*$ ]] || die "--global-batch must be a positive integer"
num='^[0-9]+([.][0-9]+)?$'  # also valid JSON, for the manifest
[ -z "$target_f1" ] || [[ $target_f1 =~ $num ]] || die "--target-f1 must be a number (an F1 from 0 to 100), not '$target_f1'"
[[ $eval_every =~ $num ]] || die "--eval-every must be a number (below 1: a fraction of an epoch; from 1: steps)"
[ -z "$eval_questions" ] || [[ $eval_questions =~ ^[1-9][0-9]*$ ]] || die "--eval-every-questions must be a positive integer"
if [ -n "$target_f1" ]; then  # the runs evaluate during training and record their time to the target
  run_extra=(--eval_every "$eval_every" --target_f1 "$target_f1" ${eval_questions:+--eval_every_questions "$eval_questions"} "${run_extra[@]}")
fi
for s in $strategies; do [[ $s =~ ^(ddp|fsdp)$ ]] || die "unknown strategy '$s' (ddp, fsdp)"; done
for sh in $shapes; do [[ $sh =~ ^[1-9][0-9]*x[1-9][0-9]*$ ]] || die "bad shape '$sh' (NODESxGPUS, e.g. 2x2)"; done
# Paths the user gave are relative to where they stand; sbatch runs from the repository root.
[ -f "$config" ] && config=$(abspath "$config")
[ -f "$ROOT/$config" ] || [ -f "$config" ] || die "config not found: $config"
[ -z "$env_file" ] || { [ -f "$env_file" ] || die "env file not found: $env_file"; env_file=$(abspath "$env_file"); }
if [ -f "$job_script" ]; then job_script=$(abspath "$job_script")
elif [ -f "$ROOT/$job_script" ]; then job_script=$ROOT/$job_script
else [ $dry = 1 ] || die "job script not found: $job_script"; fi
[[ $dry = 1 || -f $baseline_script || " $shapes " != *" 1x1 "* ]] ||
  die "$baseline_script not found: the 1x1 baseline runs it; restore it or leave 1x1 out of --shapes"
study=$(abspath "${study:-runs/scaling/$(date +%Y-%m-%d_%H%M)}")
manifest=$study/manifest.json
[ $dry = 1 ] || [ ! -e "$manifest" ] || die "$manifest exists: pick a new --study folder"
cd "$ROOT"

# The cells: the 1x1 baseline once (as ddp), every other shape once per strategy.
cells=()
for sh in $shapes; do
  if [ "$sh" = 1x1 ]; then cells+=("ddp 1 1")
  else for s in $strategies; do cells+=("$s ${sh%x*} ${sh#*x}"); done; fi
done

json_str() { local s=${1//\\/\\\\}; s=${s//\"/\\\"}; printf '"%s"' "$s"; }
json_arr() { local out="" a; for a; do out+="${out:+, }$(json_str "$a")"; done; printf '[%s]' "$out"; }
runs_json=""
write_manifest() {  # atomically: a temporary file in the same folder, then rename
  local tmp; tmp=$(mktemp "$study/.manifest.XXXXXX")
  cat >"$tmp" <<EOF
{
  "study": $(json_str "$study"),
  "created_utc": $(json_str "$created"),
  "submit_host": $(json_str "$(hostname)"),
  "repo": $(json_str "$ROOT"),
  "job_script": $(json_str "$job_script"),
  "baseline_job_script": $(json_str "$baseline_script"),
  "config": $(json_str "$config"),
  "global_batch": ${global_batch:-null},
  "target_f1": ${target_f1:-null},
  "env_file": $( [ -n "$env_file" ] && json_str "$env_file" || echo null),
  "shapes": $(json_arr $shapes),
  "strategies": $(json_arr $strategies),
  "repeats": $repeats,
  "baseline": {"strategy": "ddp", "nodes": 1, "gpus_per_node": 1},
  "sbatch_args": $(json_arr "${sbatch_extra[@]}"),
  "run_args": $(json_arr "${run_extra[@]}"),
  "runs": [${runs_json}
  ]
}
EOF
  mv -f "$tmp" "$manifest"
}

show() {  # a command line that can be pasted back into a shell
  local a out=""; for a; do [[ $a =~ ^[[:alnum:]_./=:,%@+-]+$ ]] || a=$(printf '%q' "$a"); out+="${out:+ }$a"; done
  echo "$out"
}
created=$(date -u +%Y-%m-%dT%H:%M:%SZ)
[ $dry = 1 ] || mkdir -p "$study"
n=0
for ((r = 1; r <= repeats; r++)); do
  for cell in "${cells[@]}"; do
    read -r strategy nodes gpus <<<"$cell"
    name=$strategy-${nodes}x$gpus-r$r; out=$study/$name
    exports=ALL,STRATEGY=$strategy,CONFIG=$config,NPROC_PER_NODE=$gpus,OUTPUT_DIR=$out
    [ -z "$global_batch" ] || exports+=,GLOBAL_BATCH=$global_batch
    [ -z "$env_file" ] || exports+=,ENV_FILE=$env_file
    # Every multi-GPU cell measures its communication (scaling/comm_measure.py): an opt-in of run_qa.py.
    script=$job_script; measure=(--measure_communication true)
    [ "${nodes}x$gpus" != 1x1 ] || { script=$baseline_script; measure=(); }
    cmd=(sbatch --parsable -J "scal-$name" -N "$nodes" "--gres=gpu:a100:$gpus" --no-requeue
         "--output=$out/slurm-%j.out" "--error=$out/slurm-%j.err" "--export=$exports" "${sbatch_extra[@]}"
         "$script" "${measure[@]}" "${run_extra[@]}" --output_dir "$out")
    if [ $dry = 1 ]; then show "${cmd[@]}"; continue; fi
    mkdir -p "$out"   # sbatch does not create the folder of --output
    job=$("${cmd[@]}") || die "sbatch failed for $name; $n job(s) submitted so far are in $manifest"
    job=${job%%;*}
    runs_json+="${runs_json:+,}"$'\n    '$(printf '{"name": %s, "job_id": %s, "strategy": "%s", "nodes": %d, ' \
      "$(json_str "$name")" "$(json_str "$job")" "$strategy" "$nodes"
      printf '"gpus_per_node": %d, "gpus": %d, "repeat": %d, "output_dir": %s, "submitted_utc": "%s"}' \
      "$gpus" $((nodes * gpus)) "$r" "$(json_str "$out")" "$(date -u +%Y-%m-%dT%H:%M:%SZ)")
    write_manifest
    n=$((n + 1)); echo "$job $name"
  done
done
if [ $dry = 1 ]; then echo "# dry run: $((${#cells[@]} * repeats)) job(s), nothing submitted" >&2
else echo "submitted $n job(s); manifest: $manifest; report: python tools/scaling_report.py $study" >&2; fi
