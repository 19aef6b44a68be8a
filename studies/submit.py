"""bert-squad-study: the sbatch line(s) that run a study file, one array task per cell; printed, or submitted.

    bert-squad-study STUDY.json [--submit] [--parallel N] [--script JOB] [SBATCH OPTIONS...] [-- RUN_QA ARGS...]

A study of recipes and seeds is one array (`--array=1-N`, `%N` with --parallel: at most N at once) of job_ft3.sh
(--script job_ddp.sh for several GPUs per task). A scaling study (shapes) is one array per shape: its 1x1 cells
with job_ft3.sh, the others with job_ddp.sh on NODES nodes of GPUS GPUs, all with --no-requeue (a resumed run's
training time covers its last part only). Logs go to OUTPUT/logs/; options not listed go to sbatch as they are,
what follows `--` to every run. Then: bert-squad-compare OUTPUT."""
import argparse
import os
import shlex
import subprocess
import sys
from itertools import groupby

from qa.arguments import last_value
from qa.errors import InputError, command
from studies.study import REPO, load


def ranges(tasks) -> str:
    """1,2,3,7 -> '1-3,7' (SLURM's own spelling of an array's task ids)."""
    runs = [[t for _, t in g] for _, g in groupby(enumerate(sorted(tasks)), lambda p: p[1] - p[0])]
    return ",".join(f"{r[0]}-{r[-1]}" if len(r) > 1 else str(r[0]) for r in runs)


def commands(study, script, parallel=None, sbatch=(), run=()) -> list:
    out = os.path.abspath(last_value(list(run), "output_dir", study.output_dir))
    shapes = {}
    for cell in study.cells:
        shapes.setdefault((cell.nodes, cell.gpus_per_node) if study.scaling else None, []).append(cell.task)
    lines = []
    for shape, tasks in shapes.items():
        array = ranges(tasks) + (f"%{parallel}" if parallel else "")
        opts, job = [], script
        if shape is not None:
            nodes, per = shape
            job = "job_ft3.sh" if nodes * per == 1 else "job_ddp.sh"
            opts = ["-N", str(nodes), f"--gres=gpu:a100:{per}", "--no-requeue"]
        lines.append(["sbatch", f"--array={array}", "-J", os.path.splitext(os.path.basename(study.path))[0],
                      f"--output={out}/logs/%x-%A_%a.out", f"--error={out}/logs/%x-%A_%a.err", *opts, *sbatch,
                      str(REPO / job), study.path, *run])
    return lines


@command
def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    run = argv[argv.index("--") + 1:] if "--" in argv else []
    parser = argparse.ArgumentParser(prog="bert-squad-study", description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    parser.add_argument("study", help="the study file (JSON)")
    parser.add_argument("--submit", action="store_true", help="submit, not only print")
    parser.add_argument("--parallel", type=int, help="at most this many tasks of an array at once (%%N)")
    parser.add_argument("--script", default="job_ft3.sh", choices=["job_ft3.sh", "job_ddp.sh"])
    args, sbatch = parser.parse_known_args(argv[:len(argv) - len(run) - bool(run)])
    study = load(args.study)
    lines = commands(study, args.script, args.parallel, sbatch, run)
    out = os.path.abspath(last_value(run, "output_dir", study.output_dir))
    for line in lines:
        if not args.submit:
            print(shlex.join(line))
            continue
        os.makedirs(os.path.join(out, "logs"), exist_ok=True)  # sbatch does not make the folder of --output
        done = subprocess.run([line[0], "--parsable", *line[1:]], capture_output=True, text=True)
        if done.returncode != 0:
            raise InputError(shlex.join(line), f"sbatch failed: {done.stderr.strip()}", "fix the options and rerun")
        print(f"array job {done.stdout.strip().split(';')[0]}: {line[1]} -> {out}")
    print(f"{len(study.cells)} cells; the report: bert-squad-compare {out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
