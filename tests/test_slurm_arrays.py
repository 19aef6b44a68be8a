"""Array jobs and study files on the local 2-node SLURM cluster (tests/conftest.py), everything on the CPU:

- `sbatch --array=1-3%2 job_ft3.sh configs/smoke_tiny.json`: each task trains the config's seed plus its task id in
  its own folder (task<ID>-seed<SEED>), records the array job and task; task 2, requeued by SLURM mid-training
  (`scontrol requeue`: SIGTERM, then queued again, as a preemption does), resumes from its checkpoint in its own
  folder and finishes; bert-squad-compare counts the three as one recipe, all finished;
- a study of 2 recipes x 2 seeds submitted by bert-squad-study, and one task refused on bad input: the report
  has two recipes of two finished runs each, and the refused one as failed with run_qa.py's reason.
Each round of training takes tens of seconds on 2 shared cores."""
import json
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.helpers import REPO, SBATCH_CPU, job_times, write_job_env_file

CONFIG = "configs/smoke_tiny.json"


def sbatch(cluster, cwd, env_file, *args) -> str:
    cmd = ["sbatch", "--parsable", *SBATCH_CPU, f"--export=ALL,ENV_FILE={env_file},REPO_DIR={REPO}", *args]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=30, cwd=cwd, env=cluster.env)
    assert r.returncode == 0, r.stderr
    return r.stdout.strip().split(";")[0]


def wait_array(cluster, array, timeout=900, on_tick=None):
    """Until no task of the array is queued or running; a tick every 0.2 s for `on_tick`, which may race a run."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if on_tick:
            on_tick()
        r = cluster.run("squeue", "-h", "-r", "-j", array, "-o", "%i %T", check=False)
        if r.returncode == 0 and not r.stdout.strip():
            return
        time.sleep(0.2 if on_tick else 1)
    raise TimeoutError(f"array {array} not done after {timeout} s: {r.stdout}")


def logs(cwd: Path) -> str:
    return "".join(f"--- {p.name}\n{p.read_text(errors='replace')[-3000:]}" for p in sorted(cwd.rglob("*.out")) +
                   sorted(cwd.rglob("*.err")))


def compare(cluster, *folders, out):
    r = subprocess.run([sys.executable, "-m", "studies.compare", *map(str, folders), "--out", str(out)],
                       capture_output=True, text=True, timeout=120, cwd=REPO, env=cluster.env)
    assert r.returncode == 0, r.stderr
    return json.loads((out / "compare.json").read_text())


@pytest.fixture(scope="module")
def env_file(tmp_path_factory):
    return write_job_env_file(tmp_path_factory.mktemp("arrayenv"))


@pytest.mark.slow  # a real local SLURM cluster
@pytest.mark.slurm
@pytest.mark.torchrun
def test_array_tasks_own_seed_and_folder_and_one_requeued(slurm_cluster, env_file, tmp_path):
    out = tmp_path / "runs"
    # 3 epochs: on an idle machine one trains in 2 s, over before a tick could see checkpoint-10
    array = sbatch(slurm_cluster, tmp_path, env_file, "--array=1-3%2", str(REPO / "job_ft3.sh"), CONFIG,
                   "--output_dir", str(out), "--num_train_epochs", "3")
    requeued = []

    def preempt_task_2():   # once task 2 has a checkpoint: SIGTERM and back to the queue, by SLURM itself
        if not requeued and (out / "task2-seed44" / "checkpoint-10" / "checkpoint_complete.json").exists():
            slurm_cluster.run("scontrol", "requeue", f"{array}_2")
            requeued.append(time.monotonic())

    wait_array(slurm_cluster, array, on_tick=preempt_task_2)
    assert requeued, logs(tmp_path)
    folders = sorted(p.name for p in out.iterdir() if p.is_dir())
    assert folders == ["task1-seed43", "task2-seed44", "task3-seed45"], logs(tmp_path)
    for task, folder in enumerate(folders, 1):
        run = out / folder
        assert (run / "all_results.json").is_file(), logs(tmp_path)
        env = json.loads((run / "environment.json").read_text())
        assert env["config"]["seed"] == 42 + task and env["slurm"]["SLURM_ARRAY_TASK_ID"] == str(task)
        record = json.loads((run / "task.json").read_text())
        assert (record["array_job_id"], record["array_task_id"], record["seed"]) == (array, task, 42 + task)
        last = job_times(run)[-1]
        assert (last["outcome"], last["array_job_id"], last["array_task_id"]) == ("completed", array, str(task))
    times = job_times(out / "task2-seed44")
    assert times[-1]["restart"] == 1
    resumed = json.loads((out / "task2-seed44" / "environment.json").read_text())["slurm"]["SLURM_RESTART_COUNT"]
    assert resumed == "1"
    log = logs(tmp_path)
    steps = [int(s) for s in re.findall(r"training from step (\d+);", log)]
    assert any(s >= 10 for s in steps), log   # the requeued task went on from its checkpoint, not from 0
    summary = compare(slurm_cluster, out, out=tmp_path)
    (recipe,) = summary["recipes"]
    assert (recipe["finished"], recipe["failed"], recipe["running"]) == (3, 0, 0) and recipe["f1"]["n"] == 3
    assert {r["seed"] for r in summary["runs"]} == {43, 44, 45}


@pytest.mark.slow  # a real local SLURM cluster
@pytest.mark.slurm
@pytest.mark.torchrun
def test_a_study_of_two_recipes_and_a_refused_task(slurm_cluster, env_file, tmp_path):
    study = tmp_path / "lr.json"
    out = tmp_path / "study"
    study.write_text(json.dumps({"output_dir": str(out), "configs": [CONFIG], "seeds": [1, 2],
                                 "overrides": {"lr1e-3": {}, "lr3e-3": {"learning_rate": 3e-3}}}))
    r = subprocess.run([sys.executable, "-m", "studies.submit", str(study), "--submit", "--parallel", "2",
                        *SBATCH_CPU, f"--export=ALL,ENV_FILE={env_file},REPO_DIR={REPO}", "--", "--max_steps", "12"],
                       capture_output=True, text=True, timeout=60, cwd=tmp_path, env=slurm_cluster.env)
    assert r.returncode == 0, r.stderr
    array = re.match(r"array job (\d+): --array=1-4%2 ", r.stdout).group(1)
    bad = sbatch(slurm_cluster, tmp_path, env_file, "--array=1", str(REPO / "job_ft3.sh"), CONFIG,
                 "--output_dir", str(tmp_path / "bad"), "--max_seq_length", "0")
    wait_array(slurm_cluster, array)
    wait_array(slurm_cluster, bad)
    assert sorted(p.name for p in out.iterdir() if p.name.startswith("task")) == [
        "task1-lr1e-3-seed1", "task2-lr3e-3-seed1", "task3-lr1e-3-seed2", "task4-lr3e-3-seed2"], logs(tmp_path)
    assert list((out / "logs").glob(f"lr-{array}_4.out")), logs(tmp_path)
    summary = compare(slurm_cluster, out, tmp_path / "bad", out=tmp_path)
    rows = {r["recipe"]: r for r in summary["recipes"]}
    assert set(rows) == {"lr1e-3", "lr3e-3", "smoke_tiny --max_seq_length 0"}, rows.keys()
    for name in ("lr1e-3", "lr3e-3"):
        assert (rows[name]["finished"], rows[name]["f1"]["n"]) == (2, 2), summary["runs"]
    (refused,) = [r for r in summary["runs"] if r["status"] != "finished"]
    assert refused["status"] == "failed" and refused["reason"].startswith(
        "refused, exit code 2: max_seq_length=0: must be at least 1"), refused
    lrs = {json.loads((out / f / "environment.json").read_text())["config"]["learning_rate"]
           for f in ("task1-lr1e-3-seed1", "task2-lr3e-3-seed1")}
    assert lrs == {1e-3, 3e-3}
    text = (tmp_path / "compare.md").read_text()
    assert "## Seed noise" in text and "task1-seed43`: **failed**: refused" in text


@pytest.mark.slow  # a real local SLURM cluster
@pytest.mark.slurm
@pytest.mark.torchrun
def test_a_scaling_study_of_two_shapes(slurm_cluster, env_file, tmp_path):
    """The scaling study as a study file: 1x1 (job_ft3.sh) and 1x2 (job_ddp.sh, measuring its communication) with
    GLOBAL_BATCH from the submitting shell and a target F1 for every run; one array after the other (singleton:
    both test nodes are this machine). The report has the speedup, the model beside the measurement, and the time
    to the target."""
    spec = tmp_path / "scal.json"
    out = tmp_path / "study"
    spec.write_text(json.dumps({"output_dir": str(out), "config": CONFIG, "shapes": ["1x1", "1x2"],
                                "strategies": ["ddp"], "repeats": 1}))
    r = subprocess.run([sys.executable, "-m", "studies.submit", str(spec), "--submit", *SBATCH_CPU,
                        "--dependency=singleton",
                        f"--export=ALL,ENV_FILE={env_file},REPO_DIR={REPO},GLOBAL_BATCH=8", "--", "--target_f1", "2",
                        "--eval_every", "0.5"], capture_output=True, text=True, timeout=60, cwd=tmp_path,
                       env=slurm_cluster.env)
    assert r.returncode == 0, r.stderr
    for array in re.findall(r"array job (\d+):", r.stdout):
        wait_array(slurm_cluster, array)
    summary = compare(slurm_cluster, out, out=out)
    rows = {row["world_size"]: row for row in summary["recipes"]}
    assert {w: (row["finished"], row["global_batch"]) for w, row in rows.items()} == {1: (1, 8), 2: (1, 8)}, \
        logs(tmp_path)
    assert rows[1]["speedup"] == pytest.approx(1.0) and rows[2]["speedup"] > 0
    for world, script in ((1, "job_ft3.sh"), (2, "job_ddp.sh")):
        (folder,) = [r["folder"] for r in summary["runs"] if r["figures"]["world_size"] == world]
        (line,) = job_times(Path(folder))
        assert (line["script"], line["world_size"]) == (script, world), line
        assert rows[world]["to_target_s"]["n"] == 1 and rows[world]["target_f1"] == [2.0]
    assert rows[1]["target_speedup"] == pytest.approx(1.0) and rows[2]["target_speedup"] > 0
    (entry,) = summary["predictions"]
    assert (entry["nodes"], entry["gpus_per_node"], entry["busbw_source"]) == (1, 2, "measured")
    assert entry["busbw_GBps"] > 0 and entry["step_s"] > 0 and entry["predicted_step_s"] > 0
    assert entry["compute_s"] > 0 and entry["exposed_s"] >= 0 and entry["predicted_speedup"] > 0
    text = (out / "compare.md").read_text()
    assert "## Measured and predicted" in text and "## Time to F1 2" in text
    assert (out / "compare_speedup.png").read_bytes()[:4] == b"\x89PNG"
