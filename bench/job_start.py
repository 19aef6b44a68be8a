#!/usr/bin/env python
"""How long a SLURM job takes from submission to srun, to training and to completion, for two
(or more) checkouts of this repository side by side, on the local SLURM cluster of the tests.

    git worktree add /tmp/before <commit>          # any checkout to compare with
    python bench/job_start.py --repeats 4 before=/tmp/before after=.

Each checkout's `job_ft3.sh configs/smoke_tiny.json` (a tiny BERT, CPU) is submitted in turn,
one job at a time (repeat 1 of every checkout, then repeat 2, ...; a first round warms the
caches and is not counted), polling every 0.1 s for: the batch script running, the launcher's
srun step, run_qa.py's "training from step" line, and completion. Needs what the local cluster
needs (root, Debian's slurm-wlm and munge: tools/slurm_local.sh). Writes the rows and the medians
to bench/results/job-start-<time>.json and .md.
"""
import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

from local_slurm import TERMINAL, start_cluster  # beside this script
from qa.errors import InputError, command
from qa.io import atomic_write_json, atomic_write_text

REPO = Path(__file__).resolve().parents[1]
MARKS = ("batch", "srun", "train", "done")


def _poll(cluster, env, job, folder, started, terminal):
    marks = {}
    while True:
        now = time.time() - started
        state = (cluster.job(job) or {}).get("JobState")
        if "batch" not in marks and state in ("RUNNING", *terminal):
            marks["batch"] = now
        if "srun" not in marks:
            steps = subprocess.run(["squeue", "-h", "-s", "-j", job, "-o", "%i"], capture_output=True, text=True,
                                   env=env).stdout.split()
            if f"{job}.0" in steps:
                marks["srun"] = now
        if "train" not in marks and "training from step" in "".join(
                p.read_text(errors="replace") for p in folder.glob(f"*-{job}.*")):
            marks["train"] = now
        if state in terminal:
            marks["done"] = now
            return state, marks
        time.sleep(0.1)


def measure(checkouts: dict, repeats: int, work: Path) -> list:
    envdir = work / "env"
    envdir.mkdir(parents=True)
    env_file = envdir / "env.sh"
    env_file.write_text(f"source {Path(sys.prefix) / 'bin' / 'activate'}\nexport HF_HOME={envdir / 'hf'}\n"
                        "export HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 TRANSFORMERS_OFFLINE=1\nexport OMP_NUM_THREADS=1\n")
    cluster = start_cluster(work / "slurm")
    env = {k: v for k, v in cluster.env.items() if k not in ("PYTHONPATH", "TENSORBOARD_LOGGING_DIR")}
    rows = []
    try:
        for repeat in range(repeats + 1):  # repeat 0 warms the features and page caches
            for label, checkout in checkouts.items():
                folder = work / f"{label}-r{repeat}"
                folder.mkdir()
                started = time.time()
                job = subprocess.run(
                    ["sbatch", "--parsable", "-c", "2", "--mem=3G", "--time=15", "--gres=gpu:a100:1",
                     "-J", f"{label}-r{repeat}", f"--export=ALL,ENV_FILE={env_file},REPO_DIR={checkout}",
                     f"{checkout}/job_ft3.sh",
                     "configs/smoke_tiny.json", "--output_dir", str(folder / "out")],
                    capture_output=True, text=True, cwd=folder, env=env, check=True).stdout.strip().split(";")[0]
                state, marks = _poll(cluster, env, job, folder, started, TERMINAL)
                row = {"checkout": label, "repeat": repeat, "job": job, "state": state,
                       "load1": round(os.getloadavg()[0], 2), **{k: round(v, 2) for k, v in marks.items()}}
                print(json.dumps(row), file=sys.stderr, flush=True)
                if state != "COMPLETED":
                    raise InputError(f"{label} ({checkout})", f"job {job} ended {state}",
                                     f"see {folder}/{label}-r{repeat}-{job}.err")
                if repeat:
                    rows.append(row)
    finally:
        cluster.stop()
    return rows


def medians(rows, checkouts) -> dict:
    out = {}
    for label in checkouts:
        mine = [r for r in rows if r["checkout"] == label]
        out[label] = {k: {"median": statistics.median(v), "min": min(v), "max": max(v)}
                      for k in MARKS if (v := [r[k] for r in mine if k in r])}
    return out


def markdown(report) -> str:
    lines = [f"# Submission to start of `job_ft3.sh`, {report['date_utc']}", "",
             f"Command: `{report['command']}`. Host `{report['host']}` ({report['machine']}), local SLURM cluster "
             "(tools/slurm_local.sh), `configs/smoke_tiny.json` on CPU; load average during the run "
             f"{report['load_avg']}. Seconds from `sbatch`, median [min–max] of {report['repeats']} repeats "
             "(one warm-up round not counted).", "",
             "| checkout | commit | batch script runs | srun step exists | training starts | job completed |",
             "|---|---|---:|---:|---:|---:|"]
    for label, m in report["medians"].items():
        cells = [f"{m[k]['median']:.1f} [{m[k]['min']:.1f}–{m[k]['max']:.1f}]" if k in m else "—" for k in MARKS]
        lines.append(f"| {label} | {report['commits'].get(label) or '?'} | " + " | ".join(cells) + " |")
    return "\n".join(lines + [""])


def _commit(checkout) -> str:
    r = subprocess.run(["git", "-C", str(checkout), "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
    return r.stdout.strip() if r.returncode == 0 else None


@command
def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("checkouts", nargs="+", help="LABEL=PATH of a checkout of this repository")
    parser.add_argument("--repeats", type=int, default=4)
    parser.add_argument("--work", type=Path, default=REPO / "bench" / "results" / "tmp" / "job-start")
    parser.add_argument("--out", type=Path, default=REPO / "bench" / "results")
    args = parser.parse_args(argv)
    checkouts = {}
    for item in args.checkouts:
        label, _, path = item.partition("=")
        if not path or not (Path(path) / "job_ft3.sh").is_file():
            raise InputError(item, "not LABEL=PATH of a checkout with job_ft3.sh",
                             "give e.g. before=/tmp/before after=. (git worktree add /tmp/before COMMIT)")
        checkouts[label] = str(Path(path).resolve())
    now = datetime.now(timezone.utc)
    work = args.work / now.strftime("%Y%m%dT%H%M%SZ")
    load_before = os.getloadavg()
    rows = measure(checkouts, args.repeats, work)
    report = {"benchmark": "bench/job_start.py", "date_utc": now.isoformat(timespec="seconds"),
              "command": "python bench/job_start.py " + " ".join(sys.argv[1:] if argv is None else argv),
              "host": platform.node(), "machine": f"{platform.machine()}, {os.cpu_count()} cores, no GPU",
              "load_avg": {"before": [round(x, 2) for x in load_before],
                           "after": [round(x, 2) for x in os.getloadavg()]},
              "repeats": args.repeats, "commits": {k: _commit(v) for k, v in checkouts.items()},
              "medians": medians(rows, checkouts), "rows": rows}
    stem = args.out / f"job-start-{now.strftime('%Y%m%dT%H%M%SZ')}"
    atomic_write_json(stem.with_suffix(".json"), report)
    atomic_write_text(stem.with_suffix(".md"), markdown(report))
    print(markdown(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
