"""What a job requeued by SLURM leaves behind, on the local 2-node SLURM cluster (tests/conftest.py), with KillWait=5
(tools/slurm_local.sh): SLURM kills a job that has not ended 5 s after the SIGTERM of a requeue.

- every part of a job requeued twice by `scontrol requeue` (as a preemption does) is in job_time.jsonl, the two cut
  parts killed before their end too, each with SLURM's own seconds for it, and a report counts them all;
- the job's .err holds the run's own lines and no Python traceback of torchrun's for a refused run and a requeued
  one, while a worker's traceback of a real bug stays.

The workers are small scripts (RUN_QA) that start in a second: a run that ignores SIGTERM (it stops later than
KillWait), one that stops at once on it, one with a bug. The refused run is run_qa.py's own."""
import json
import socket
import time
from datetime import datetime

import pytest

from bench.local_slurm import TERMINAL, parse_kv
from studies.runs import Slurm, read_run
from tests.helpers import job_times, write_job_env_file
from tests.test_slurm_jobs import CONFIG, FT3, _launcher, assert_no_torchrun_traceback, submit

WORKER = '''import os, signal, sys, time
restart = int(os.environ.get("SLURM_RESTART_COUNT") or 0)
print(f"worker: restart {restart}", flush=True)
if restart >= int(os.environ["WORKER_DONE_AT"]):
    sys.exit(0)
if os.environ["WORKER_ON_TERM"] == "ignore":  # still busy when SLURM's KillWait is over
    signal.signal(signal.SIGTERM, lambda *_: print("worker: SIGTERM, still busy", flush=True))
else:  # stops at once, as run_qa.py does once its checkpoint is saved
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
time.sleep(600)
'''
CUT_REASON = "SIGTERM from SLURM, then killed before the run ended: counted up to the SIGTERM"
BUG = '''def train():
    raise ZeroDivisionError("a real bug in the worker")


train()
'''


@pytest.fixture(scope="module")
def env_file(tmp_path_factory):
    return write_job_env_file(tmp_path_factory.mktemp("requeueenv"))


def free_port() -> int:
    """A rendezvous port of the job's own: the launcher's default (20000 + job id) is another cluster's on this
    machine where two test sessions run."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def worker_job(slurm_cluster, env_file, tmp_path, script, **variables):
    path = tmp_path / "worker.py"
    path.write_text(script)
    return submit(slurm_cluster, FT3, tmp_path, env_file, "--gres=gpu:a100:1",
                  args=[CONFIG, "--output_dir", str(tmp_path / "out")], RUN_QA=path, MASTER_PORT=free_port(),
                  **variables)


def wait_for(job, text, timeout=120):
    deadline = time.monotonic() + timeout
    while text not in job.log():
        assert job.state() not in TERMINAL and time.monotonic() < deadline, f"no {text!r}\n{job.tail()}"
        time.sleep(0.2)


def slurm_parts(cluster, jobid) -> list:
    """Seconds of each run of the job as SLURM counts them (jobcomp: one record per requeue and at the end)."""
    records = [parse_kv(line) for line in (cluster.dir / "jobcomp.txt").read_text().splitlines()]
    return [(datetime.fromisoformat(r["EndTime"]) - datetime.fromisoformat(r["StartTime"])).total_seconds()
            for r in records if r.get("JobId") == jobid]


@pytest.mark.slow  # a real local SLURM cluster
@pytest.mark.slurm
@pytest.mark.torchrun
def test_every_part_of_a_job_requeued_twice_is_counted(slurm_cluster, env_file, tmp_path):
    """Requeued twice while its run ignores SIGTERM: SLURM kills the first two parts 5 s after the SIGTERM, before the
    launcher's end. Each still has its line, `requeued` with the seconds up to the SIGTERM, where SLURM ends that part
    too; the last part completes. Each part's seconds match SLURM's within 3 s: both clocks count whole seconds (up to
    1 s off) and the launcher's starts once slurmd has started the batch shell, which SLURM's StartTime precedes by up
    to 2 s on two shared cores (measured: 0-2 s). A report (studies/runs.py, read by bert-squad-compare) counts the
    three parts. Before, only the last part had a line: 5 s of a job that ran 16."""
    kill_wait = slurm_cluster.run("scontrol", "show", "config").stdout
    assert "KillWait                = 5 sec" in kill_wait, kill_wait
    job = worker_job(slurm_cluster, env_file, tmp_path, WORKER, WORKER_DONE_AT=2, WORKER_ON_TERM="ignore")
    for restart in (0, 1):
        wait_for(job, f"[rank0]: worker: restart {restart}")
        slurm_cluster.run("scontrol", "requeue", job.id)
    info = job.wait(timeout=300)
    job.completed()
    assert info["Restarts"] == "2", info
    times = job_times(job.out)
    assert [(t["restart"], t["outcome"], t["exit_code"]) for t in times] == [
        (0, "requeued", 143), (1, "requeued", 143), (2, "completed", 0)], job.tail()
    log = job.log()
    # the cut parts never reached their end: only the last one's end line
    assert log.count("s up to the SIGTERM, recorded as requeued in ") == 2 and log.count("s, exit code ") == 1, log
    assert "worker: SIGTERM, still busy" in log
    slurm = slurm_parts(slurm_cluster, job.id)
    ours = [t["seconds"] for t in times]
    assert len(slurm) == 3 and all(abs(a - b) <= 3 for a, b in zip(ours, slurm)), (ours, slurm)
    print(f"\njob {job.id}: parts {ours} s recorded, SLURM's {slurm}")
    run = read_run(job.out, Slurm(False))
    assert (run["parts"], run["job_seconds"]) == (3, sum(ours)), run


def test_a_run_that_ends_after_its_sigterm_replaces_its_line(tmp_path):
    """The line written at the SIGTERM is the run's until the run ends; then the run's end replaces it, and the lines
    of the job's other runs stay."""
    out = tmp_path / "out"
    out.mkdir()
    earlier = '{"job_id": "7", "job_name": "j", "script": "t", "restart": 0, "nodes": "n", "seconds": 30}\n'
    (out / "job_time.jsonl").write_text(earlier)
    r = _launcher(f"OUTPUT={out}; export SLURM_JOB_ID=7 SLURM_JOB_NAME=j SLURM_RESTART_COUNT=1; jl_on_signal TERM; "
                  f"cp {out}/job_time.jsonl {tmp_path}/at_term.jsonl; sleep 1; jl_run false")
    assert r.returncode == 143, r
    lines = [json.loads(x) for x in (tmp_path / "at_term.jsonl").read_text().splitlines()]
    assert lines[0] == json.loads(earlier) and [(t["restart"], t["outcome"], t["exit_code"], t["reason"]) for t in
                                                lines[1:]] == [(1, "interrupted", 143, CUT_REASON)], lines
    lines = job_times(out)
    assert lines[0] == json.loads(earlier) and [(t["restart"], t["outcome"], t["exit_code"], t["reason"]) for t in
                                                lines[1:]] == [(1, "interrupted", 143, None)], lines
    assert lines[1]["seconds"] >= 1, lines
    assert "s up to the SIGTERM, recorded as interrupted in " in r.stdout and "exit code 143, interrupted" in r.stdout


@pytest.mark.slow  # a real local SLURM cluster
@pytest.mark.slurm
@pytest.mark.torchrun
def test_the_err_of_a_refused_run_and_a_requeued_one_has_no_traceback(slurm_cluster, env_file, tmp_path):
    """A bad argument: run_qa.py's one line, torchrun's one line, status 2. A requeue (the USR1 warning; the run stops
    at once on the SIGTERM that follows, then completes): torchrun's one line for the signal. Neither .err has a
    Python traceback, ChildFailedError or SignalException."""
    refused = submit(slurm_cluster, FT3, tmp_path, env_file, "--gres=gpu:a100:1", MASTER_PORT=free_port(),
                     args=[CONFIG, "--output_dir", str(tmp_path / "refused"), "--max_seq_length", "0"])
    requeued = worker_job(slurm_cluster, env_file, tmp_path, WORKER, WORKER_DONE_AT=1, WORKER_ON_TERM="exit")
    wait_for(requeued, "[rank0]: worker: restart 0")
    slurm_cluster.run("scancel", "--signal=USR1", "--batch", requeued.id)
    info = refused.wait(timeout=300)
    assert info["JobState"] == "FAILED" and info["ExitCode"] == "2:0", f"{info}\n{refused.tail()}"
    err = refused.log("err")
    assert "[rank0]: error: max_seq_length=0: must be at least 1 (tokens per feature). Fix: use e.g. 384\n" in err
    assert "torchrun: run_qa.py exited with code 2 on rank 0 (1 process(es) failed)\n" in err, err
    assert_no_torchrun_traceback(err)
    info = requeued.wait(timeout=300)
    requeued.completed()
    assert info["Restarts"] == "1", info
    assert [t["outcome"] for t in job_times(requeued.out)] == ["requeued", "completed"], requeued.tail()
    err = requeued.log("err")
    assert "torchrun: SIGTERM received, workers stopped\n" in err, err
    assert_no_torchrun_traceback(err)


@pytest.mark.slow  # a real local SLURM cluster
@pytest.mark.slurm
@pytest.mark.torchrun
def test_a_workers_bug_keeps_its_traceback(slurm_cluster, env_file, tmp_path):
    job = worker_job(slurm_cluster, env_file, tmp_path, BUG)
    info = job.wait(timeout=300)
    assert info["JobState"] == "FAILED" and info["ExitCode"] == "1:0", f"{info}\n{job.tail()}"
    err = job.log("err")
    assert "[rank0]: Traceback (most recent call last):" in err and ", in train\n" in err, err
    assert "[rank0]: ZeroDivisionError: a real bug in the worker\n" in err, err
    assert "torchrun: worker.py exited with code 1 on rank 0 (1 process(es) failed)\n" in err, err
    assert err.count("Traceback") == 1 and "ChildFailedError" not in err, err
    assert [t["outcome"] for t in job_times(job.out)] == ["failed"]
