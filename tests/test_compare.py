"""bert-squad-compare (studies/compare.py) on folders written by qa/results/records.py's own functions and by the
launcher's job_time.jsonl format; the means, deviations and verdicts are worked out here by hand. Also the study
file (studies/study.py), an array task's seed and folder (studies/task.py) and the submit helper's lines
(studies/submit.py), none of which needs SLURM."""
import csv
import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

from studies import compare, study, submit, task
from tests.helpers import REPO

CONFIG = str(REPO / "configs" / "smoke_tiny.json")


def write_run(out: Path, lr, seed, f1=None, wall=100.0, outcome=None, reason=None, recipe=None, world=1):
    """A run folder as a job leaves it: environment.json (records.environment_record), the results when it
    finished, a job_time.jsonl line as jobs/launch.sh writes it, task.json as studies/task.py writes it."""
    from qa.results import records

    with pytest.MonkeyPatch.context() as mp:
        for k in records.SLURM_VARS + records.DIST_VARS:
            mp.delenv(k, raising=False)
        mp.setenv("SLURM_JOB_ID", f"{seed}{int(lr * 1e4)}")
        mp.setenv("WORLD_SIZE", str(world))
        mp.setattr(records, "_git_commit", lambda: "0123abcd")
        mp.setattr(records, "_versions", lambda: {"python": "3.11"})
        mp.setattr(records, "_devices", lambda: {"gpus": [], "cpu_count": 2})
        env = records.environment_record({"learning_rate": lr, "seed": seed, "output_dir": str(out)})
    records.write_environment(out, env)
    job = env["slurm"]["SLURM_JOB_ID"]
    if recipe:
        (out / "task.json").write_text(json.dumps({"recipe": recipe, "seed": seed, "job_id": job}))
    if f1 is not None:
        records.save_split_metrics(out, "train", {"train_runtime": wall - 20, "train_samples_per_second": 30.0})
        records.save_split_metrics(out, "eval", {"eval_f1": f1, "eval_exact_match": f1 - 10})
        records.finish_run(out, wall - 5, env)
    if outcome:
        line = {"job_id": job, "restart": 0, "seconds": wall, "exit_code": 0 if outcome == "completed" else 2,
                "outcome": outcome, "reason": reason}
        (out / "job_time.jsonl").write_text(json.dumps(line) + "\n")


A = {1: 50.0, 2: 52.0, 3: 57.0}   # lr 1e-3: mean 53, std sqrt((9 + 1 + 16) / 2) = sqrt(13)
B = {1: 55.0, 2: 60.0}            # lr 3e-3: mean 57.5, std sqrt(2 * 2.5**2 / 1) = 3.5355...
C = {1: 70.0, 2: 71.0}            # lr 1e-2: above both ranges


@pytest.fixture
def runs(tmp_path):
    folder = tmp_path / "study"
    for lr, f1s, name in ((1e-3, A, "a"), (3e-3, B, "b"), (1e-2, C, "c")):
        for seed, f1 in f1s.items():
            write_run(folder / f"task-{name}-seed{seed}", lr, seed, f1, wall=100.0 + seed, outcome="completed",
                      recipe=f"lr-{name}")
    write_run(folder / "task-b-seed9", 3e-3, 9, outcome="refused", recipe="lr-b",
              reason="max_seq_length=0: must be at least 1 (tokens per feature). Fix: use e.g. 384")
    write_run(folder / "task-a-seed4", 1e-3, 4, recipe="lr-a")   # started, no outcome yet
    (folder / "study.json").write_text(json.dumps({"cells": [
        {"task": 9, "recipe": "lr-c", "seed": 3, "folder": "task-c-seed3"}]}))
    return folder


def test_report_against_hand_computed_figures(runs, tmp_path):
    summary = compare.build([runs], tmp_path, use_slurm=False)
    rows = {r["recipe"]: r for r in summary["recipes"]}
    a, b, c = rows["lr-a"], rows["lr-b"], rows["lr-c"]
    assert a["f1"]["mean"] == pytest.approx(53.0) and a["f1"]["std"] == pytest.approx(math.sqrt(13))
    assert (a["f1"]["min"], a["f1"]["max"]) == (50.0, 57.0)
    assert a["em"]["mean"] == pytest.approx(43.0) and a["em"]["std"] == pytest.approx(math.sqrt(13))
    assert b["f1"]["mean"] == pytest.approx(57.5) and b["f1"]["std"] == pytest.approx(2.5 * math.sqrt(2))
    assert a["wall_s"]["median"] == 102.0 and b["windows_per_s"]["median"] == 30.0
    assert a["training_s"]["median"] == pytest.approx(82.0)
    # counts: a has one run still going, b one refused, c one cell never started (no SLURM asked: not known to fail)
    assert (a["finished"], a["failed"], a["running"]) == (3, 0, 1)
    assert (b["finished"], b["failed"], b["running"]) == (2, 1, 0)
    assert (c["finished"], c["running"] + c["failed"]) == (2, 1)
    assert a["speedup"] is None   # one world size: no scaling columns
    status = {r["name"]: (r["status"], r["reason"]) for r in summary["runs"]}
    assert status["task-b-seed9"] == ("failed", "refused, exit code 2: max_seq_length=0: must be at least 1 "
                                                "(tokens per feature). Fix: use e.g. 384")
    assert status["task-a-seed4"][0] == "running" and "SLURM not asked" in status["task-a-seed4"][1]
    assert status["task-c-seed3"][1].startswith("never started")
    text = (tmp_path / "compare.md").read_text()
    assert "| lr-a | 3 / 0 / 1 | 53.00 ± 3.61 (50.00–57.00) |" in text
    assert "**lr-b** and **lr-a**: within seed noise" in text
    assert "**lr-c** and **lr-b**: lr-c is ahead by 13.00 F1 (the ranges do not overlap)" in text
    for name in ("task-b-seed9", "task-a-seed4", "task-c-seed3"):
        assert f"{name}`: **" in text.split("## Runs not finished")[1].split("## Every run")[0]
    rows_csv = list(csv.DictReader((tmp_path / "compare.csv").open()))
    assert len(rows_csv) == 10 and {r["recipe"] for r in rows_csv} == {"lr-a", "lr-b", "lr-c"}
    assert json.loads((tmp_path / "compare.json").read_text())["recipes"][0]["f1"]["n"] >= 2
    assert (tmp_path / "compare.png").read_bytes()[:4] == b"\x89PNG"
    assert not list(tmp_path.glob(".tmp-*"))


def test_command_line_and_no_run(runs, tmp_path, capsys):
    r = subprocess.run([sys.executable, "-m", "studies.compare", str(runs / "task-a-seed1"), str(runs / "task-b-seed1"),
                        "--out", str(tmp_path), "--no-slurm"], capture_output=True, text=True, timeout=120, cwd=REPO)
    assert r.returncode == 0 and r.stdout.startswith("2 runs, 2 recipe(s): 2 finished"), r
    assert compare.main([str(tmp_path / "empty"), "--no-slurm"]) == 2
    assert capsys.readouterr().err.startswith("error: ")


def test_scaling_columns(tmp_path):
    write_run(tmp_path / "one", 1e-3, 1, 50.0, wall=100.0, outcome="completed")
    write_run(tmp_path / "two", 1e-3, 1, 50.0, wall=60.0, outcome="completed", world=2)
    rows = {r["world_size"]: r for r in compare.build([tmp_path], tmp_path, use_slurm=False)["recipes"]}
    assert rows[2]["speedup"] == pytest.approx(80.0 / 40.0) and rows[2]["efficiency"] == pytest.approx(1.0)
    assert "| speedup | efficiency |" in (tmp_path / "compare.md").read_text()


def _study(tmp_path, **spec):
    path = tmp_path / "s.json"
    path.write_text(json.dumps({"output_dir": str(tmp_path / "out"), "configs": [CONFIG], **spec}))
    return path


def test_study_cells_go_repeat_by_repeat(tmp_path):
    cells = study.load(_study(tmp_path, overrides={"lo": {}, "hi": {"learning_rate": 3e-3}}, seeds=[1, 2])).cells
    assert [(c.task, c.recipe, c.seed, c.args) for c in cells] == [
        (1, "lo", 1, []), (2, "hi", 1, ["--learning_rate", "0.003"]), (3, "lo", 2, []),
        (4, "hi", 2, ["--learning_rate", "0.003"])]
    scaling = study.load(_study(tmp_path, shapes=["1x1", "1x2"], strategies=["ddp", "fsdp"], repeats=1)).cells
    assert [(c.recipe, c.seed, c.nodes, c.gpus_per_node) for c in scaling] == [
        ("smoke_tiny-ddp-1x1", 43, 1, 1), ("smoke_tiny-ddp-1x2", 43, 1, 2), ("smoke_tiny-fsdp-1x2", 43, 1, 2)]
    assert scaling[1].args == ["--measure_communication", "true"]
    for bad in ({"seeds": [1], "repeats": 2}, {"seeds": [-1]}, {"seeds": [1], "nope": 1},
                {"seeds": [1], "configs": ["no.json"]}, {"seeds": [1], "shapes": ["2-2"]}):
        with pytest.raises(task.InputError):
            study.load(_study(tmp_path, **bad))


def test_array_task_seed_and_folder(tmp_path):
    env = {"SLURM_ARRAY_TASK_ID": "3", "SLURM_ARRAY_JOB_ID": "70", "SLURM_JOB_ID": "73"}
    strategy, config, args = task.resolve(CONFIG, ["--output_dir", str(tmp_path)], env)
    assert (strategy, config, args[-4:]) == ("", CONFIG, ["--seed", "45", "--output_dir", str(tmp_path / "task3-seed45")])
    record = json.loads((tmp_path / "task3-seed45" / "task.json").read_text())
    assert (record["array_job_id"], record["array_task_id"], record["seed"], record["recipe"]) == ("70", 3, 45, "smoke_tiny")
    assert task.resolve(CONFIG, ["--seed", "7", "--output_dir", str(tmp_path)], env)[2][-3:] == [
        "7", "--output_dir", str(tmp_path / "task3-seed7")]        # --seed given: kept, in the name too
    assert task.resolve(CONFIG, ["--x"], {}) == ("", CONFIG, ["--x"])   # not an array: untouched
    path = _study(tmp_path, overrides={"lo": {}, "hi": {"learning_rate": 3e-3}}, seeds=[1, 2])
    assert task.resolve(str(path), [], env)[2] == ["--seed", "2", "--output_dir", str(tmp_path / "out" / "task3-lo-seed2")]
    assert len(json.loads((tmp_path / "out" / "study.json").read_text())["cells"]) == 4
    for environ in ({}, {**env, "SLURM_ARRAY_TASK_ID": "5"}):   # no array, a task past the last cell
        with pytest.raises(task.InputError):
            task.resolve(str(path), [], environ)


def test_submit_lines(tmp_path):
    path = _study(tmp_path, seeds=[1, 2, 3])
    (line,) = submit.commands(study.load(path), "job_ft3.sh", 2, ["--time=15"], ["--max_steps", "3"])
    assert line[:3] == ["sbatch", "--array=1-3%2", "-J"] and line[-5:] == [
        "--time=15", str(REPO / "job_ft3.sh"), str(path), "--max_steps", "3"]
    scaling = study.load(_study(tmp_path, shapes=["1x1", "2x1"], repeats=2))
    lines = submit.commands(scaling, "job_ft3.sh")
    assert [(x[1], x[-2].split("/")[-1]) for x in lines] == [("--array=1,3", "job_ft3.sh"), ("--array=2,4", "job_ddp.sh")]
    assert "-N" in lines[1] and "--no-requeue" in lines[1]
    assert submit.ranges([1, 2, 3, 7, 9, 10]) == "1-3,7,9-10"
