"""Tests against a real local 2-node SLURM cluster (tools/slurm_local.sh).

Skipped with the reason when not root or slurm-wlm cannot be installed. The requeue test shows
the mechanism the training job uses: trap USR1 in the batch script, `scontrol requeue` itself,
and resume on the second run (SLURM_RESTART_COUNT=1).
"""
import os
import subprocess
import time
from pathlib import Path

import pytest

from bench.local_slurm import SCRIPT, alive, start_cluster
from tests.helpers import require_slurm

pytestmark = [pytest.mark.slow, pytest.mark.slurm]  # jobs on a real local SLURM cluster: minutes


def _out(info: dict) -> str:
    return Path(info["StdOut"]).read_text()


def test_trivial_job_completes(slurm_cluster):
    jobid = slurm_cluster.sbatch("#!/bin/bash\necho hello from $SLURMD_NODENAME\n")
    info = slurm_cluster.wait(jobid, timeout=30)
    assert info["JobState"] == "COMPLETED" and info["ExitCode"] == "0:0"
    assert info["NodeList"] in ("node1", "node2")
    assert _out(info).strip() == f"hello from {info['NodeList']}"


def test_failing_job_reports_exit_code(slurm_cluster):
    info = slurm_cluster.wait(slurm_cluster.sbatch("#!/bin/bash\nexit 7\n"), timeout=30)
    assert info["JobState"] == "FAILED" and info["ExitCode"] == "7:0"


def test_gpu_gres_job_sees_two_a100(slurm_cluster):
    script = ("#!/bin/bash\n#SBATCH --gres=gpu:a100:2\n"
              'echo "gpus=$SLURM_GPUS_ON_NODE cvd=$CUDA_VISIBLE_DEVICES"\n')
    info = slurm_cluster.wait(slurm_cluster.sbatch(script), timeout=30)
    assert info["JobState"] == "COMPLETED", info
    assert _out(info).strip() == "gpus=2 cvd=0,1"


def test_two_node_job_runs_steps_on_both_nodes(slurm_cluster):
    # Fake node names do not resolve: take the rendezvous address from NodeAddr.
    script = """#!/bin/bash
#SBATCH -N 2 --ntasks-per-node=1 --gres=gpu:a100:2
first=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n1)
addr=$(scontrol show node "$first" | grep -o 'NodeAddr=[^ ]*' | cut -d= -f2)
echo "master=$first addr=$addr nnodes=$SLURM_JOB_NUM_NODES"
srun bash -c 'echo "step node=$SLURMD_NODENAME rank=$SLURM_PROCID gpus=$SLURM_GPUS_ON_NODE"'
"""
    info = slurm_cluster.wait(slurm_cluster.sbatch(script), timeout=30)
    assert info["JobState"] == "COMPLETED", info
    assert info["NodeList"] == "node[1-2]"
    lines = _out(info).splitlines()
    assert lines[0] == "master=node1 addr=127.0.0.1 nnodes=2"
    assert sorted(lines[1:]) == ["step node=node1 rank=0 gpus=2", "step node=node2 rank=1 gpus=2"]
    assert slurm_cluster.node("node1")["NodeAddr"] == "127.0.0.1"


REQUEUE_SCRIPT = """#!/bin/bash
#SBATCH --requeue --open-mode=append {extra}
echo "run restart=${{SLURM_RESTART_COUNT:-0}}"
if [ "${{SLURM_RESTART_COUNT:-0}}" -ge 1 ]; then echo "resumed and finished"; exit 0; fi
# The shell runs a trap only between commands: run the work in the background and `wait`.
on_usr1() {{ echo "got USR1"; kill "$child"; scontrol requeue "$SLURM_JOB_ID"; exit 0; }}
trap on_usr1 USR1
sleep 300 & child=$!
touch "{ready}"
wait "$child"
"""


def _check_requeued(info):
    assert info["JobState"] == "COMPLETED" and info["ExitCode"] == "0:0", info
    assert info["Restarts"] == "1"
    out = _out(info)
    assert out.startswith("run restart=0\ngot USR1\n"), out
    assert out.rstrip().endswith("run restart=1\nresumed and finished"), out


def test_usr1_trap_requeues_and_second_run_sees_restart_count(slurm_cluster, tmp_path):
    ready = tmp_path / "ready"
    jobid = slurm_cluster.sbatch(REQUEUE_SCRIPT.format(extra="", ready=ready))
    slurm_cluster.wait_file(ready)  # the trap is installed
    # What --signal=B:USR1@N does at the time limit, without waiting minutes for it.
    slurm_cluster.run("scancel", "--signal=USR1", "--batch", jobid)
    # A requeued job is held until BeginTime = now + cred_expire + 1 (10 s here).
    _check_requeued(slurm_cluster.wait(jobid, timeout=60))


def test_time_limit_signal_requeues(slurm_cluster, tmp_path):
    # --time=1 with USR1 25 s before the end: slurmctld looks at time limits every 30 s and sends a warning due before
    # its next look at once, so 5-35 s after the start (the batch shell sets its trap within the first 5 s).
    script = REQUEUE_SCRIPT.format(extra="--time=1 --signal=B:USR1@25", ready=tmp_path / "r")
    _check_requeued(slurm_cluster.wait(slurm_cluster.sbatch(script), timeout=120))


def _cluster_processes(path: Path) -> list[int]:
    """Any process with a file open under the cluster dir, or its cwd there."""
    found = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit() or int(proc.name) == os.getpid() or not alive(int(proc.name)):
            continue
        try:
            links = [os.readlink(proc / "cwd")]
            links += [os.readlink(fd) for fd in (proc / "fd").iterdir()]
        except OSError:
            continue
        if any(link.startswith(str(path) + "/") or link == str(path) for link in links):
            found.append(int(proc.name))
    return found


def test_start_is_idempotent_and_stop_leaves_nothing(tmp_path):
    """A second, separate cluster (on other ports) with a job still running at stop time."""
    require_slurm()
    cluster = start_cluster(tmp_path / "c2")
    try:
        pids = cluster.pids()
        assert set(pids) == {"munged", "slurmctld", "slurmd-node1", "slurmd-node2"}
        again = subprocess.run(["bash", str(SCRIPT), "start", str(cluster.dir)],
                               capture_output=True, text=True, env=cluster.env, timeout=60)
        assert again.returncode == 0 and f"export SLURM_CONF={cluster.conf}" in again.stdout
        assert cluster.pids() == pids  # no-op on a running cluster
        jobid = cluster.sbatch(f"#!/bin/bash\n#SBATCH -N 2\ntouch {tmp_path}/go\n"
                               "srun sleep 300\n")
        cluster.wait_file(tmp_path / "go")
        assert cluster.job(jobid)["JobState"] == "RUNNING"
    finally:
        t0 = time.monotonic()
        cluster.stop()
        stop_s = time.monotonic() - t0
    assert cluster.pids() == {}, "daemons left running"
    for pid in pids.values():
        assert not alive(pid)
    assert _cluster_processes(cluster.dir) == [], "job/step processes left running"
    assert stop_s < 30
    status = subprocess.run(["bash", str(SCRIPT), "status", str(cluster.dir)],
                            capture_output=True, text=True, timeout=30)
    assert status.returncode == 1 and "slurmctld (slurmctld): stopped" in status.stdout
