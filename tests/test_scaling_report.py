"""The scaling study: tools/scaling_submit.sh (dry run; a fake sbatch that records what it was
given) and tools/scaling_report.py on a study folder whose runs are written by qa/results/records.py's
own functions (a manifest with completed, missing, failed, wrong-shape and unfinished runs).
The table's medians, speedups and efficiencies are recomputed here from the raw numbers.
Last, when the job scripts and configs/smoke_tiny.json exist, a tiny real study on the local SLURM
cluster (tests/slurm_fixture.py)."""
import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers import REPO

SUBMIT = REPO / "tools" / "scaling_submit.sh"


def _report_module():
    spec = importlib.util.spec_from_file_location("scaling_report", REPO / "tools" / "scaling_report.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


report = _report_module()


def median(values):   # independent of statistics.median
    v = sorted(values)
    n = len(v)
    return v[n // 2] if n % 2 else (v[n // 2 - 1] + v[n // 2]) / 2


# ---------------------------------------------------------------------------------------------
# A study folder as the runs leave it

GLOBAL_BATCH = 48
# name -> (job id, train_runtime, F1) or a marker for what went wrong. Repeats r1..r3.
RUNS = {
    "ddp-1x1-r1": (101, 1000.0, 88.1), "ddp-1x1-r2": (108, 1010.0, 88.5), "ddp-1x1-r3": (115, 990.0, 88.3),
    "ddp-1x2-r1": (102, 600.0, 88.2), "ddp-1x2-r2": (109, 610.0, 88.4), "ddp-1x2-r3": (116, "resumed"),
    "fsdp-1x2-r1": (103, 580.0, 88.2), "fsdp-1x2-r2": (110, 570.0, 88.2), "fsdp-1x2-r3": (117, "never_started"),
    "ddp-2x1-r1": (104, 640.0, 88.0), "ddp-2x1-r2": (111, "world1"), "ddp-2x1-r3": (118, "no_train"),
    "ddp-2x2-r1": (105, 370.0, 87.9), "ddp-2x2-r2": (112, 365.0, 88.1), "ddp-2x2-r3": (119, 380.0, 88.6),
    "fsdp-2x2-r1": (106, 340.0, 88.0), "fsdp-2x2-r2": (113, 345.0, 88.3), "fsdp-2x2-r3": (120, "failed"),
}
SAMPLES = 88_641 * 2   # features x epochs: samples/s = SAMPLES / train_runtime
GPU = {"name": "NVIDIA A100-SXM4-40GB", "memory_gib": 39.4}


def _shape(name):
    strategy, shape, rep = name.split("-")
    nodes, per_node = map(int, shape.split("x"))
    return strategy, nodes, per_node, int(rep[1:])


def write_run(out: Path, name, job, runtime, f1, world=None, train=True, finish=True, restarts=0):
    """A run folder written by qa/results/records.py itself (environment_record with the slurm and
    torchrun variables a job would have; torch, git and versions stubbed to stay fast)."""
    from qa.results import records

    strategy, nodes, per_node, rep = _shape(name)
    world = world or nodes * per_node
    env_vars = {"SLURM_JOB_ID": str(job), "SLURM_NNODES": str(nodes), "SLURM_NTASKS": str(nodes),
                "SLURM_JOB_NODELIST": "c7-[3-4]" if nodes == 2 else "c7-3", "SLURM_GPUS_ON_NODE": str(per_node),
                "WORLD_SIZE": str(world), "RANK": "0", "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": str(per_node),
                "SLURM_RESTART_COUNT": str(restarts)}
    config = {"model_name_or_path": "google-bert/bert-base-uncased", "dataset_name": "rajpurkar/squad",
              "num_train_epochs": 2.0, "max_seq_length": 384, "per_device_train_batch_size": GLOBAL_BATCH // world,
              "gradient_accumulation_steps": 1, "output_dir": str(out),
              "fsdp": ["full_shard"] if strategy == "fsdp" else []}
    with pytest.MonkeyPatch.context() as mp:
        for k in records.SLURM_VARS + records.DIST_VARS:
            mp.delenv(k, raising=False)
        for k, v in env_vars.items():
            mp.setenv(k, v)
        mp.setattr(records, "_git_commit", lambda: "0123abcd")
        mp.setattr(records, "_versions", lambda: {"python": "3.11.7", "torch": "2.7.1", "transformers": "4.56.0",
                                                  "datasets": "3.6.0", "accelerate": "1.8.1"})
        mp.setattr(records, "_devices", lambda: {"cuda_available": True, "torch_cuda": "12.8", "cudnn": 90100,
                                                 "gpu_count": per_node, "gpus": [GPU] * per_node,
                                                 "cpu_count": 64, "processor": "x86_64"})
        mp.setattr(records.socket, "gethostname", lambda: "c7-3")
        env = records.environment_record(config)
    records.write_environment(out, env)
    if train:
        records.save_split_metrics(out, "train", {
            "train_runtime": runtime, "train_samples_per_second": SAMPLES / runtime,
            "train_steps_per_second": 7387 / runtime, "train_loss": 1.02, "epoch": 2.0,
            "train_examples": 87_599, "train_features": 88_641, "train_mean_real_tokens": 171.3,
            "train_features_padding_fraction": 0.554, "train_real_tokens_per_second": SAMPLES / runtime * 171.3,
            **(telemetry(runtime, nodes, per_node) if runtime else {})})
    if f1 is not None:
        records.save_split_metrics(out, "eval", {"eval_exact_match": f1 - 7.2, "eval_f1": f1, "eval_loss": 1.1,
                                                 "eval_runtime": 41.0, "epoch": 2.0})
    if finish:
        records.finish_run(out, runtime + 95.0 if runtime else 60.0, env)


# What the telemetry and the communication measurement of a run record (qa/training/telemetry.py,
# scaling/comm_measure.py): step times and, on more than one GPU, the bus bandwidth and a step
# with and without gradient synchronisation.
BUSBW = {(1, 2): 20.0, (2, 1): 11.0, (2, 2): 10.5}
PARAMS = 108_893_186


def telemetry(runtime, nodes, per_node):
    step = runtime * 0.9 / 7387   # the rest of train_runtime: logging, evaluation, saving
    out = {"train_step_time_mean_s": step, "train_step_time_total_s": runtime * 0.9,
           "train_data_time_total_s": runtime * 0.02, "train_trainable_params": PARAMS,
           "train_grad_dtype": "float32", "train_grad_bytes": 4 * PARAMS}
    if nodes * per_node > 1:
        out.update({"comm_world_size": nodes * per_node, "comm_nodes": nodes,
                    "comm_allreduce_busbw_GBps": BUSBW[(nodes, per_node)], "comm_step_nosync_s": 0.6 * step,
                    "comm_exposed_s": 0.25 * step, "comm_step_sync_s": 0.85 * step})
        if nodes > 1 and per_node > 1:
            out["comm_intranode_busbw_GBps"] = 19.0
    return out


def make_study(root: Path, runs=RUNS) -> Path:
    study = root / "study"
    study.mkdir()
    entries = []
    for name, spec in runs.items():
        strategy, nodes, per_node, rep = _shape(name)
        job, what = spec[0], spec[1]
        out = study / name
        entries.append({"name": name, "job_id": str(job), "strategy": strategy, "nodes": nodes,
                        "gpus_per_node": per_node, "gpus": nodes * per_node, "repeat": rep,
                        "output_dir": str(out), "submitted_utc": "2025-06-02T09:00:00Z"})
        if what == "missing":       # no folder at all
            continue
        out.mkdir()                 # tools/scaling_submit.sh makes it at submission
        if what == "never_started":
            continue
        if what == "crashed_early":  # the job script stopped before run_qa.py started
            (out / f"slurm-{job}.err").write_text("job_ddp.sh: error: environment file /x/env.sh not found\n")
            continue
        if what == "failed":        # crashed during training: only environment.json, and the logs
            write_run(out, name, job, None, None, train=False, finish=False)
            (out / f"slurm-{job}.out").write_text("[rank0]: step 40\n")
            (out / f"slurm-{job}.err").write_text("Traceback (most recent call last):\n  ...\n"
                                                  "[rank3]: torch.OutOfMemoryError: CUDA out of memory | x\n\n")
        elif what == "world1":      # the job started 1 process instead of 2
            write_run(out, name, job, 700.0, 88.0, world=1)
        elif what == "resumed":     # hit the time limit, requeued, resumed: runtime of the last part
            write_run(out, name, job, 150.0, 88.0, restarts=1)
        elif what == "no_train":    # evaluation only: no train_runtime
            write_run(out, name, job, None, 88.0, train=False)
        else:
            write_run(out, name, job, what, spec[2])
    manifest = {"study": str(study), "created_utc": "2025-06-02T09:00:00Z", "submit_host": "login7",
                "config": "configs/reference.json", "global_batch": GLOBAL_BATCH, "job_script": "job_ddp.sh",
                "repeats": 3, "baseline": {"strategy": "ddp", "nodes": 1, "gpus_per_node": 1},
                "sbatch_args": ["--time=02:00:00"], "run_args": [], "runs": entries}
    (study / "manifest.json").write_text(json.dumps(manifest, indent=2))
    return study


@pytest.fixture(scope="module")
def study(tmp_path_factory):
    return make_study(tmp_path_factory.mktemp("scaling"))


@pytest.fixture(scope="module")
def built(study):
    """The report with --no-slurm (its text, its summary)."""
    assert report.main([str(study), "--no-slurm"]) == 0
    return (study / report.REPORT).read_text(), json.loads((study / report.SUMMARY).read_text())


def table_rows(text):
    """(strategy, 'NxG') -> cells of the scaling table."""
    section = text.split("## Scaling", 1)[1].split("\n## ", 1)[0]
    rows = {}
    for line in section.splitlines():
        if line.startswith("| ") and not line.startswith("| strategy"):
            cells = [c.strip() for c in line.strip("|").split("|")]
            rows[(cells[0], cells[1].split()[0])] = cells
    return rows


def problem_rows(text):
    section = text.split("## Failed, incomplete and missing runs", 1)[1].split("\n## ", 1)[0]
    return {c[0]: c for c in ([x.strip() for x in line.strip("|").split("|")]
                              for line in section.splitlines() if line.startswith("| ")) if c[0] != "run"}


def _ok_times(prefix):
    return [spec[1] for name, spec in RUNS.items() if name.startswith(prefix + "-r") and isinstance(spec[1], float)]


# ---------------------------------------------------------------------------------------------
# The report


def test_table_numbers(built):
    text, _ = built
    rows = table_rows(text)
    assert set(rows) == {("ddp", "1×1"), ("ddp", "1×2"), ("fsdp", "1×2"), ("ddp", "2×1"), ("ddp", "2×2"),
                         ("fsdp", "2×2")}
    base = median(_ok_times("ddp-1x1"))
    assert base == 1000.0
    for (strategy, shape), cells in rows.items():
        nodes, per_node = map(int, shape.split("×"))
        prefix = f"{strategy}-{nodes}x{per_node}"
        times = _ok_times(prefix)
        f1s = [RUNS[n][2] for n in RUNS if n.startswith(prefix + "-r") and isinstance(RUNS[n][1], float)]
        (_, _, gpus, ok, batch, t_med, t_spread, wall, sps, speedup, eff, f1) = cells
        assert int(gpus) == nodes * per_node
        assert ok == f"{len(times)} / 3"
        assert batch == str(GLOBAL_BATCH)
        assert float(t_med.replace(",", "")) == pytest.approx(median(times), abs=0.05)
        assert t_spread == f"{min(times):,.1f}–{max(times):,.1f}"
        assert float(wall.replace(",", "")) == pytest.approx(median([t + 95.0 for t in times]), abs=0.05)
        assert float(sps.replace(",", "")) == pytest.approx(median([SAMPLES / t for t in times]), abs=0.05)
        s = base / median(times)
        assert float(speedup) == pytest.approx(s, abs=0.005)
        assert float(eff.rstrip(" %")) == pytest.approx(100 * s / (nodes * per_node), abs=0.05)
        f1_text = f"{median(f1s):.2f}" + (f" ({min(f1s):.2f}–{max(f1s):.2f})" if min(f1s) != max(f1s) else "")
        assert f1 == f1_text
    assert "(baseline)" in rows[("ddp", "1×1")][1]
    assert rows[("ddp", "1×1")][9] == "1.00" and rows[("ddp", "1×1")][10] == "100.0 %"
    # spot checks against hand-computed figures
    assert rows[("fsdp", "1×2")][9] == "1.74"         # 1000 / 575 (median of two)
    assert rows[("ddp", "2×2")][10] == "67.6 %"       # 1000 / 370 / 4
    assert rows[("fsdp", "2×2")][5] == "342.5"
    assert rows[("fsdp", "2×2")][11] == "88.15 (88.00–88.30)"
    assert rows[("fsdp", "1×2")][11] == "88.20"       # both repeats equal: no range


def test_measured_beside_predicted(built, study):
    """Every multi-GPU cell: its measured step time and parts beside the model's prediction, which
    starts from the median baseline run and takes the cell's own measured bandwidth and batch."""
    from scaling.model import Baseline, Settings, WhatIf, predict, ring_busbw

    text, summary = built
    entries = {(e["strategy"], e["nodes"], e["gpus_per_node"]): e for e in summary["predictions"]}
    assert set(entries) == {("ddp", 1, 2), ("fsdp", 1, 2), ("ddp", 2, 1), ("ddp", 2, 2), ("fsdp", 2, 2)}
    step = 1000.0 * 0.9 / 7387   # ddp-1x1-r1: the median of the baseline's step times
    base = Baseline(compute_s=step, data_s=1000.0 * 0.02 / 7387, batch=GLOBAL_BATCH, params=PARAMS)
    for (strategy, nodes, per), e in entries.items():
        times = _ok_times(f"{strategy}-{nodes}x{per}")
        measured = median([t * 0.9 / 7387 for t in times])
        # (the results files keep 6 decimals: hence the tolerances)
        assert e["step_s"] == pytest.approx(measured, rel=1e-4)
        intra, inter = (BUSBW[(nodes, per)], 12.0) if nodes == 1 else (19.0 if per > 1 else 20.0, BUSBW[(nodes, per)])
        expected = predict(base, nodes, per, strategy, WhatIf(batch_mult=1 / (nodes * per)),
                           ring_busbw(nodes, per, intra, inter), Settings())
        assert e["busbw_GBps"] == ring_busbw(nodes, per, intra, inter) and e["busbw_source"] == "measured"
        assert e["predicted_step_s"] == pytest.approx(expected["step_s"], rel=1e-4)
        assert e["predicted_speedup"] == pytest.approx(expected["speedup"], rel=1e-4)
        assert e["departure"] == pytest.approx(measured / expected["step_s"] - 1, abs=1e-3)
        assert e["flagged"] == (abs(e["departure"]) > summary["prediction_margin"])
        assert e["compute_s"] == pytest.approx(0.6 * measured, rel=1e-4)
        assert e["exposed_s"] == pytest.approx(0.25 * measured, rel=1e-4)
        assert e["rest_s"] == pytest.approx(0.15 * measured, rel=1e-3)
    assert any(e["flagged"] for e in entries.values()) and not all(e["flagged"] for e in entries.values())
    section = text.split("## Measured and predicted", 1)[1].split("\n## ", 1)[0]
    assert section.count("| ddp |") == 3 and section.count("| fsdp |") == 2
    assert "departs by more than 25%" in section and "Baseline for the model: ddp-1x1-r1" in section


def test_summary_json_unrounded(built):
    _, summary = built
    rows = {(r["strategy"], r["nodes"], r["gpus_per_node"]): r for r in summary["rows"]}
    assert summary["baseline"] == {"strategy": "ddp", "nodes": 1, "gpus_per_node": 1}
    assert rows[("ddp", 1, 2)]["speedup"] == pytest.approx(1000 / 605)
    assert rows[("ddp", 2, 2)]["efficiency"] == pytest.approx(1000 / 370 / 4)
    assert rows[("ddp", 2, 2)]["repeat_speedups"] == pytest.approx([1000 / 370, 1000 / 365, 1000 / 380])
    assert rows[("ddp", 2, 1)]["ok"] == 1 and rows[("ddp", 2, 1)]["expected"] == 3
    assert [r["strategy"] + str(r["gpus"]) for r in summary["rows"]][0] == "ddp1"   # baseline first


def test_failed_missing_and_wrong_shape_listed(built):
    text, summary = built
    problems = problem_rows(text)
    assert set(problems) == {"fsdp-1x2-r3", "fsdp-2x2-r3", "ddp-2x1-r2", "ddp-2x1-r3", "ddp-1x2-r3"}
    name, job, status, reason = problems["fsdp-1x2-r3"]
    assert (job, status) == ("117", "missing") and "output folder empty: the job never started" in reason
    _, job, status, reason = problems["fsdp-2x2-r3"]
    assert (job, status) == ("120", "no results")
    assert "environment.json written" in reason and "no all_results.json" in reason
    assert "SLURM not asked" in reason
    assert reason.endswith("last line of slurm-120.err: `[rank3]: torch.OutOfMemoryError: CUDA out of memory "
                           "&#124; x`")
    assert problems["ddp-2x1-r2"][2] == "mismatch" and "WORLD_SIZE=1" in problems["ddp-2x1-r2"][3]
    assert problems["ddp-1x2-r3"][2] == "resumed" and "after 1 requeue" in problems["ddp-1x2-r3"][3]
    assert problems["ddp-2x1-r3"][2] == "no results" and "no train_runtime" in problems["ddp-2x1-r3"][3]
    statuses = {r["name"]: r["status"] for r in summary["runs"]}
    assert len(statuses) == len(RUNS) and sum(s == "ok" for s in statuses.values()) == 13
    # every completed run has its own line
    done = text.split("## Completed runs", 1)[1]
    assert all(f"| {n} |" in done for n, s in statuses.items() if s == "ok")


def test_header_records_machine_versions_dates(built):
    text, _ = built
    head = text.split("## Scaling", 1)[0]
    assert "| GPUs | NVIDIA A100-SXM4-40GB (39.4 GiB) |" in head
    assert "3.11.7 / 2.7.1 / 12.8" in head and "4.56.0" in head
    assert "0123abcd" in head and "c7-[3-4]" in head and "configs/reference.json" in head
    assert "runs started |" in head and "2025-06-02T09:00:00Z" in head
    assert "bert-base-uncased / rajpurkar/squad" in head


def test_plot_is_a_png(built, study):
    from PIL import Image

    data = (study / report.PLOT).read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 10_000
    with Image.open(study / report.PLOT) as im:
        im.verify()
    with Image.open(study / report.PLOT) as im:
        assert im.format == "PNG" and im.size[0] > 500 and im.size[1] > 400
    assert f"]({report.PLOT})" in built[0]


def _fake_scontrol(folder: Path, body: str) -> Path:
    folder.mkdir(exist_ok=True)
    path = folder / "scontrol"
    path.write_text("#!/bin/bash\necho call >> \"$(dirname \"$0\")/calls\"\n" + body)
    path.chmod(0o755)
    return folder


def test_job_states_from_scontrol(study, tmp_path, monkeypatch):
    bin_dir = _fake_scontrol(tmp_path / "bin", """id=$4
case $id in
  117) echo "JobId=117 JobName=scal-fsdp-1x2-r3 JobState=PENDING Reason=Priority Dependency=(null) ExitCode=0:0";;
  120) echo "JobId=120 JobName=scal-fsdp-2x2-r3 JobState=FAILED Reason=NonZeroExitCode ExitCode=1:0";;
  *) echo "slurm_load_jobs error: Invalid job id specified" >&2; exit 1;;
esac
""")
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    monkeypatch.setattr(shutil, "which", lambda cmd: str(bin_dir / cmd) if cmd == "scontrol" else None)
    out = tmp_path / "out"
    assert report.main([str(study), "--out", str(out)]) == 0
    problems = problem_rows((out / report.REPORT).read_text())
    _, _, status, reason = problems["fsdp-1x2-r3"]
    assert status == "incomplete" and reason.startswith("job 117 PENDING (Priority)")
    _, _, status, reason = problems["fsdp-2x2-r3"]
    assert status == "failed" and reason.startswith("job 120 FAILED, exit code 1:0 (NonZeroExitCode)")
    _, _, status, reason = problems["ddp-2x1-r3"]   # purged job, no sacct
    assert status == "no results" and "job unknown to SLURM" in reason
    assert (out / report.PLOT).is_file()


def test_unreachable_slurm_asked_once(study, tmp_path, monkeypatch):
    bin_dir = _fake_scontrol(tmp_path / "bin", 'echo "slurm_load_jobs error: Unable to contact slurm controller '
                                               '(connect failure)" >&2; exit 1\n')
    monkeypatch.setattr(shutil, "which", lambda cmd: str(bin_dir / cmd) if cmd == "scontrol" else None)
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    out = tmp_path / "out"
    assert report.main([str(study), "--out", str(out)]) == 0
    text = (out / report.REPORT).read_text()
    assert problem_rows(text)["fsdp-2x2-r3"][2] == "no results"
    assert "SLURM not reachable" in problem_rows(text)["fsdp-2x2-r3"][3]
    assert (bin_dir / "calls").read_text().count("call") == 1


@pytest.mark.parametrize("strategy, nodes, per_node, env, why", [
    ("ddp", 1, 2, {"distributed": {"WORLD_SIZE": "2"}, "slurm": {"SLURM_NNODES": "1"}}, None),
    ("ddp", 1, 1, {"distributed": {}, "slurm": {}, "config": {"fsdp": []}}, None),   # plain python: no WORLD_SIZE
    ("ddp", 2, 2, {"distributed": {"WORLD_SIZE": "2"}}, "WORLD_SIZE=2, the shape asks for 4"),
    ("ddp", 2, 1, {"distributed": {"WORLD_SIZE": "2"}, "slurm": {"SLURM_NNODES": "1"}}, "ran on 1 node(s)"),
    ("fsdp", 1, 2, {"distributed": {"WORLD_SIZE": "2"}, "config": {"fsdp": ""}}, "but the strategy is fsdp"),
    ("ddp", 1, 2, {"distributed": {"WORLD_SIZE": "2"}, "config": {"fsdp": ["full_shard"]}}, "strategy is ddp"),
    ("ddp", 1, 2, {"distributed": {"WORLD_SIZE": "2"}, "slurm": {"SLURM_RESTART_COUNT": "2"}}, "after 2 requeue"),
    ("ddp", 1, 2, {"distributed": {"WORLD_SIZE": "2"}, "slurm": {"SLURM_JOB_ID": "6"}}, "from job 6, not from"),
])
def test_mismatch(strategy, nodes, per_node, env, why):
    run = {"strategy": strategy, "nodes": nodes, "gpus_per_node": per_node, "gpus": nodes * per_node, "env": env,
           "job_id": "7"}
    got = report.mismatch(run)
    assert got is None if why is None else why in got


def test_run_in_two_parts_is_not_counted(tmp_path):
    study = make_study(tmp_path, {k: v for k, v in RUNS.items() if k.startswith(("ddp-1x1", "ddp-1x2-r1"))})
    lines = [{"job_id": "102", "restart": 0, "outcome": "interrupted"}, {"job_id": "102", "restart": 0,
                                                                        "outcome": "completed"}]
    (study / "ddp-1x2-r1" / "job_time.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    assert report.main([str(study), "--no-slurm"]) == 0
    _, _, status, reason = problem_rows((study / report.REPORT).read_text())["ddp-1x2-r1"]
    assert status == "resumed" and "ran in 2 parts" in reason and "job 102 interrupted" in reason


def test_a_refused_duplicate_job_is_not_a_part_of_the_run(tmp_path):
    """A second job submitted into the same folder is refused by the run's lock (exit 2) and leaves
    its own line in job_time.jsonl: the run still counts, in one part."""
    study = make_study(tmp_path, {k: v for k, v in RUNS.items() if k.startswith(("ddp-1x1", "ddp-1x2-r1"))})
    lines = [{"job_id": "102", "restart": 0, "outcome": "completed"},
             {"job_id": "140", "restart": 0, "exit_code": 2, "outcome": "refused"}]
    (study / "ddp-1x2-r1" / "job_time.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    assert report.main([str(study), "--no-slurm"]) == 0
    summary = json.loads((study / report.SUMMARY).read_text())
    assert {r["name"]: r["status"] for r in summary["runs"]}["ddp-1x2-r1"] == "ok"


def test_global_batch_mismatch_is_flagged(tmp_path):
    runs = {k: v for k, v in RUNS.items() if k.startswith(("ddp-1x1", "ddp-1x2"))}
    study = make_study(tmp_path, runs)
    cfg = json.loads((study / "ddp-1x2-r1" / "environment.json").read_text())
    cfg["config"]["per_device_train_batch_size"] = GLOBAL_BATCH   # this repeat ran with batch 96
    (study / "ddp-1x2-r1" / "environment.json").write_text(json.dumps(cfg))
    assert report.main([str(study), "--no-slurm"]) == 0
    text = (study / report.REPORT).read_text()
    assert table_rows(text)[("ddp", "1×2")][4] == "48/96"
    assert "The global batch differs between rows" in text


def test_no_baseline_still_reports(tmp_path):
    study = make_study(tmp_path, {k: v for k, v in RUNS.items() if k.startswith("ddp-2x2")})
    assert report.main([str(study), "--no-slurm"]) == 0
    text = (study / report.REPORT).read_text()
    assert "No completed 1×1 baseline run" in text and table_rows(text)[("ddp", "2×2")][9] == "—"
    assert not (study / report.PLOT).exists()


@pytest.mark.parametrize("case", ["no folder", "no manifest", "bad manifest", "no usable run"])
def test_errors(case, tmp_path, capsys):
    study = tmp_path / "study"
    if case in ("no manifest", "bad manifest"):
        study.mkdir()
    if case == "bad manifest":
        (study / "manifest.json").write_text("{not json")
    if case == "no usable run":
        study = make_study(tmp_path, {"ddp-1x1-r1": (1, "crashed_early"), "ddp-1x2-r1": (2, "missing")})
    assert report.main([str(study), "--no-slurm"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and err.count("\n") == 1, err
    expected = {"no folder": "no such folder", "no manifest": "no manifest.json",
                "bad manifest": "unreadable", "no usable run": "none of the 2 runs"}[case]
    assert expected in err
    if case == "no usable run":
        assert "1 missing" in err and "1 no results" in err
        assert report.main([str(study), "--no-slurm", "--out", str(tmp_path / "x")]) == 2
        runs = [report.read_run(study, e) for e in json.loads((study / "manifest.json").read_text())["runs"]]
        assert runs[0]["problem"] == "the job started (slurm-1.err) but run_qa.py wrote nothing"
        assert runs[0]["log_tail"] == ("; last line of slurm-1.err: "
                                       "`job_ddp.sh: error: environment file /x/env.sh not found`")
        assert runs[1]["problem"] == "no output folder" and runs[1]["missing"]
    assert not (study / report.REPORT).exists()


def test_cli_one_line_summary(study, tmp_path):
    r = subprocess.run([sys.executable, str(REPO / "tools" / "scaling_report.py"), str(study), "--no-slurm",
                        "--out", str(tmp_path)], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith("13/18 runs usable -> ") and (tmp_path / report.REPORT).is_file()


# ---------------------------------------------------------------------------------------------
# The submit script


def _submit(*args, env=None, cwd=REPO):
    return subprocess.run(["bash", str(SUBMIT), *args], capture_output=True, text=True, timeout=60,
                          cwd=cwd, env={**os.environ, **(env or {})})


def test_submit_dry_run(tmp_path):
    study = tmp_path / "s"
    r = _submit("--dry-run", "--study", str(study), "--partition", "gpu", "--time=02:00:00", "--",
                "--num_train_epochs", "1")
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert len(lines) == 5 * 7   # (1x1 once + 3 shapes x 2 strategies) x 5 repeats
    assert not study.exists()
    first = lines[0]
    assert first.startswith("sbatch --parsable -J scal-ddp-1x1-r1 -N 1 --gres=gpu:a100:1 ")
    assert f"OUTPUT_DIR={study}/ddp-1x1-r1" in first and "STRATEGY=ddp" in first and "NPROC_PER_NODE=1" in first
    assert f"CONFIG={REPO}/configs/reference.json" in first and "GLOBAL_BATCH" not in first
    assert f"--output={study}/ddp-1x1-r1/slurm-%j.out --error={study}/ddp-1x1-r1/slurm-%j.err " in first
    assert " --no-requeue " in first
    # the baseline is what a user's `sbatch job_ft3.sh` runs; every other cell is job_ddp.sh
    assert re.search(f" --partition gpu --time=02:00:00 {re.escape(str(REPO))}/job_ft3\\.sh --num_train_epochs 1 "
                     f"--output_dir {re.escape(str(study))}/ddp-1x1-r1$", first), first
    # every multi-GPU cell measures its communication (the study's opt-in); the baseline has one process
    assert all(re.search(f" {re.escape(str(REPO))}/job_ddp\\.sh --measure_communication true --num_train_epochs 1 "
                         "--output_dir ", x) for x in lines if "-1x1-" not in x)
    assert sum("job_ft3.sh" in x for x in lines) == 5
    assert any(" -N 2 --gres=gpu:a100:2 " in x and "STRATEGY=fsdp" in x and "fsdp-2x2-r5" in x for x in lines)
    assert [x.split()[3] for x in lines[:7]] == ["scal-ddp-1x1-r1", "scal-ddp-1x2-r1", "scal-fsdp-1x2-r1",
                                                 "scal-ddp-2x1-r1", "scal-fsdp-2x1-r1", "scal-ddp-2x2-r1",
                                                 "scal-fsdp-2x2-r1"]
    assert "dry run: 35 job(s)" in r.stderr


def _fake_sbatch(tmp_path, fail_at=0):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "sbatch").write_text(f"""#!/bin/bash
n=$(( $(cat "{bin_dir}/n" 2>/dev/null || echo 0) + 1 )); echo $n > "{bin_dir}/n"
[ $n = {fail_at} ] && {{ echo "sbatch: error: Batch job submission failed" >&2; exit 1; }}
printf '%s\\n' "$@" > "{bin_dir}/args-$n"
echo "$((500 + n));cluster"
""")
    (bin_dir / "sbatch").chmod(0o755)
    return bin_dir, {"PATH": f"{bin_dir}:{os.environ['PATH']}"}


def test_submit_writes_manifest(tmp_path):
    bin_dir, env = _fake_sbatch(tmp_path)
    study = tmp_path / "study"
    envfile = tmp_path / "env.sh"
    envfile.write_text("true\n")
    job = tmp_path / "job.sh"
    job.write_text("#!/bin/bash\n")
    r = _submit("--job-script", str(job), "--shapes", "1x1 2x2", "--strategies", "fsdp", "--repeats", "2",
                "--study", str(study),
                "--global-batch", "48", "--env-file", str(envfile), "--account", "xyz", env=env)
    assert r.returncode == 0, r.stderr
    manifest = json.loads((study / "manifest.json").read_text())
    runs = manifest["runs"]
    assert [x["name"] for x in runs] == ["ddp-1x1-r1", "fsdp-2x2-r1", "ddp-1x1-r2", "fsdp-2x2-r2"]
    assert [x["job_id"] for x in runs] == ["501", "502", "503", "504"]
    assert runs[1] | {"submitted_utc": None} == {
        "name": "fsdp-2x2-r1", "job_id": "502", "strategy": "fsdp", "nodes": 2, "gpus_per_node": 2, "gpus": 4,
        "repeat": 1, "output_dir": str(study / "fsdp-2x2-r1"), "submitted_utc": None}
    assert runs[1]["submitted_utc"].endswith("Z")
    assert manifest["global_batch"] == 48 and manifest["sbatch_args"] == ["--account", "xyz"]
    assert manifest["env_file"] == str(envfile) and manifest["repeats"] == 2
    assert all((study / x["name"]).is_dir() for x in runs)
    assert (bin_dir / "args-1").read_text().splitlines()[-3:] == [str(REPO / "job_ft3.sh"), "--output_dir",
                                                                   str(study / "ddp-1x1-r1")]
    args = (bin_dir / "args-2").read_text().splitlines()
    assert args[:6] == ["--parsable", "-J", "scal-fsdp-2x2-r1", "-N", "2", "--gres=gpu:a100:2"]
    assert f"--export=ALL,STRATEGY=fsdp,CONFIG={REPO}/configs/reference.json,NPROC_PER_NODE=2," \
           f"OUTPUT_DIR={study}/fsdp-2x2-r1,GLOBAL_BATCH=48,ENV_FILE={envfile}" in args
    assert args[-5:] == [str(job), "--measure_communication", "true", "--output_dir", str(study / "fsdp-2x2-r1")]
    assert manifest["job_script"] == str(job) and manifest["baseline_job_script"] == str(REPO / "job_ft3.sh")
    assert not list(study.glob(".manifest.*"))   # no temporary left behind
    # a second submission into the same study is refused
    again = _submit("--study", str(study), "--job-script", str(job), env=env)
    assert again.returncode == 2 and "exists" in again.stderr


def test_submit_failure_keeps_what_was_submitted(tmp_path):
    _, env = _fake_sbatch(tmp_path, fail_at=3)
    study = tmp_path / "study"
    r = _submit("--repeats", "1", "--study", str(study), "--job-script", "tools/slurm_local.sh", env=env)
    assert r.returncode != 0 and "sbatch failed for fsdp-1x2-r1" in r.stderr
    runs = json.loads((study / "manifest.json").read_text())["runs"]
    assert [x["name"] for x in runs] == ["ddp-1x1-r1", "ddp-1x2-r1"]


@pytest.mark.parametrize("args, message", [
    (["--repeats", "0"], "--repeats"), (["--shapes", "2-2"], "bad shape"),
    (["--strategies", "zero"], "unknown strategy"),
    (["--config", "nope.json"], "config not found"), (["--env-file", "/nope"], "env file not found")])
def test_submit_bad_arguments(args, message, tmp_path):
    r = _submit("--dry-run", "--study", str(tmp_path / "s"), *args)
    assert r.returncode == 2 and message in r.stderr


# ---------------------------------------------------------------------------------------------
# A real tiny study on the local SLURM cluster

try:
    from tests.slurm_fixture import slurm_cluster  # noqa: F401,E402
except ImportError:  # pragma: no cover
    from slurm_fixture import slurm_cluster  # noqa: F401,E402


@pytest.mark.slow
def test_tiny_study_on_local_slurm(request, tmp_path):
    for who in ("job_ft3.sh", "job_ddp.sh", "configs/smoke_tiny.json"):
        if not (REPO / who).exists():   # checked before the cluster starts: skipping costs nothing
            pytest.skip(f"{who} does not exist yet (being written alongside); the study needs it")
    slurm_cluster = request.getfixturevalue("slurm_cluster")
    env_file = tmp_path / "env.sh"
    env_file.write_text(f"source {sys.prefix}/bin/activate\nexport HF_HOME={tmp_path / 'hf_home'}\n"
                        "export HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 TRANSFORMERS_OFFLINE=1\n"
                        "export OMP_NUM_THREADS=1\n")   # 2 shared cores: more threads only oversubscribe
    study = tmp_path / "study"
    # sbatch options pass through: -c/--mem (job_ddp.sh's -c 32 --mem=64G do not fit the test
    # nodes), and one job after the other (same name + singleton): both nodes are this machine,
    # and first runs at once in an empty HF_HOME can race to build bundled:tiny-bert.
    r = subprocess.run(["bash", str(SUBMIT), "--shapes", "1x1 1x2", "--strategies", "ddp", "--repeats", "1",
                        "--config", "configs/smoke_tiny.json", "--env-file", str(env_file), "--study", str(study),
                        "--global-batch", "8", "--target-f1", "2", "--eval-every", "0.5", "-c", "2", "--mem=3G",
                        "--time=15", "-J", "scal-tiny", "--dependency=singleton"],
                       capture_output=True, text=True, timeout=60, cwd=REPO, env=slurm_cluster.env)
    assert r.returncode == 0, r.stderr
    runs = json.loads((study / "manifest.json").read_text())["runs"]
    assert [x["name"] for x in runs] == ["ddp-1x1-r1", "ddp-1x2-r1"]
    for run in runs:
        info = slurm_cluster.wait(run["job_id"], timeout=600, poll=1)
        log = "".join(p.read_text()[-3000:] for p in sorted((study / run["name"]).glob("slurm-*")))
        assert info["JobState"] == "COMPLETED", f"{run['name']}: {info}\n{log}"
    r = subprocess.run([sys.executable, str(REPO / "tools" / "scaling_report.py"), str(study)],
                       capture_output=True, text=True, timeout=120, env=slurm_cluster.env)
    assert r.returncode == 0, r.stderr
    summary = json.loads((study / report.SUMMARY).read_text())
    assert [x["status"] for x in summary["runs"]] == ["ok", "ok"], summary["runs"]
    rows = {(x["nodes"], x["gpus_per_node"]): x for x in summary["rows"]}
    assert rows[(1, 1)]["speedup"] == pytest.approx(1.0) and rows[(1, 2)]["speedup"] > 0
    assert rows[(1, 1)]["global_batch"] == rows[(1, 2)]["global_batch"] == [8]   # GLOBAL_BATCH reached the job
    for run in runs:   # logs beside the results, none left in the submit folder
        assert list((study / run["name"]).glob(f"slurm-{run['job_id']}.out")), run
    assert not list(REPO.glob("scal-tiny-*"))
    for run, script, world in zip(runs, ("job_ft3.sh", "job_ddp.sh"), (1, 2)):   # the baseline: job_ft3.sh's path
        line = json.loads((study / run["name"] / "job_time.jsonl").read_text())
        assert (line["script"], line["world_size"], line["job_id"]) == (script, world, run["job_id"]), line
    env = json.loads((study / "ddp-1x2-r1" / "environment.json").read_text())
    assert env["distributed"]["WORLD_SIZE"] == "2" and env["slurm"]["SLURM_JOB_ID"] == runs[1]["job_id"]
    # measured beside predicted: the 1x2 cell's own bandwidth, and the model's step from the baseline's
    (entry,) = summary["predictions"]
    assert (entry["nodes"], entry["gpus_per_node"], entry["busbw_source"]) == (1, 2, "measured")
    assert entry["busbw_GBps"] > 0 and entry["step_s"] > 0 and entry["predicted_step_s"] > 0
    assert entry["compute_s"] > 0 and entry["exposed_s"] >= 0 and entry["predicted_speedup"] > 0
    section = (study / report.REPORT).read_text().split("## Measured and predicted", 1)[1].split("\n## ", 1)[0]
    assert "| ddp | 1×2 |" in section and "(measured)" in section
    assert (study / report.PLOT).read_bytes()[:4] == b"\x89PNG"
    # time to the target F1 beside the throughput speedup: the target reached every run through the job
    assert json.loads((study / "manifest.json").read_text())["target_f1"] == 2
    for key in ((1, 1), (1, 2)):
        assert rows[key]["target_f1"] == [2.0] and rows[key]["target_reached"] == 1, rows[key]
        assert rows[key]["target_speedup"] > 0 and isinstance(rows[key]["target_disagrees"], bool)
    assert rows[(1, 1)]["target_speedup"] == pytest.approx(1.0)
    section = (study / report.REPORT).read_text().split("## Time to F1 2", 1)[1].split("\n## ", 1)[0]
    assert "| ddp | 1×1 (baseline) | 1 | 1 / 1 |" in section and "| ddp | 1×2 | 2 | 1 / 1 |" in section
    assert "speedup to target" in section


def test_time_to_target_beside_throughput(tmp_path):
    """Runs that evaluated during training (--eval_every, --target_f1): the training time leaves
    the evaluations out, each cell gets its median time to the target over the repeats that
    reached it, and a cell whose two speedups part by more than 10% is flagged."""
    from qa.results import records

    runs = {"ddp-1x1-r1": (1, 1000.0, 88.4), "ddp-1x1-r2": (2, 1000.0, 88.6),
            "ddp-2x2-r1": (3, 300.0, 87.0), "ddp-2x2-r2": (4, 300.0, 87.2), "ddp-2x2-r3": (5, 300.0, 86.0)}
    # name -> (training seconds without evaluations, seconds to F1 88, or None: never reached)
    clock = {"ddp-1x1-r1": (900.0, 400.0), "ddp-1x1-r2": (900.0, 420.0),
             "ddp-2x2-r1": (270.0, 250.0), "ddp-2x2-r2": (270.0, 270.0), "ddp-2x2-r3": (270.0, None)}
    study = make_study(tmp_path, runs)
    for name, (seconds, to_target) in clock.items():
        records.save_split_metrics(study / name, "train", {
            "train_seconds_excluding_evaluation": seconds, "target_f1": 88.0,
            "train_seconds_to_target_f1": to_target})
    assert report.main([str(study), "--no-slurm"]) == 0
    summary = json.loads((study / report.SUMMARY).read_text())
    rows = {(r["nodes"], r["gpus_per_node"]): r for r in summary["rows"]}
    base, cell = rows[(1, 1)], rows[(2, 2)]
    assert base["train_runtime"]["median"] == 900.0          # evaluations out of the training time
    assert cell["speedup"] == pytest.approx(900.0 / 270.0)
    assert (base["target_reached"], cell["target_reached"]) == (2, 2)  # r3 never got there
    assert cell["time_to_target"]["median"] == 260.0
    assert cell["target_speedup"] == pytest.approx(410.0 / 260.0)
    assert cell["target_disagrees"] is True and base["target_disagrees"] is False
    text = (study / report.REPORT).read_text()
    section = text.split("## Time to F1 88", 1)[1].split("\n## ", 1)[0]
    assert "| ddp | 2×2 | 4 | 2 / 3 | 260.0 | 250.0–270.0 | 1.58 | 3.33 | **differ by more than 10%** |" in section
    assert "not reached" in text.split("## Completed runs", 1)[1]
