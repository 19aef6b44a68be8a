"""The scaling study as a study: configs/studies/scaling.json's cells and sbatch lines, and bert-squad-compare on a
study folder laid out as its array tasks leave it (study.json, a task<i>-<recipe>-seed<s> folder per cell with
task.json, environment.json and results written by qa/results/records.py's own functions): finished, resumed,
wrong-shape, failed and never-started cells. Medians, speedups, efficiencies, the model's predictions and the
time-to-target speedups are worked out here from the raw numbers. The real thing on the local SLURM cluster is in
tests/test_slurm_arrays.py."""
import json
from pathlib import Path

import pytest

from studies import compare, scaling, study, submit, task
from tests.helpers import REPO

GLOBAL_BATCH = 48
GPU = {"name": "NVIDIA A100-SXM4-40GB", "memory_gib": 39.4}
SAMPLES = 88_641 * 2   # features x epochs: samples/s = SAMPLES / training time
STEPS = 7387
PARAMS = 108_893_186
BUSBW = {(1, 2): 20.0, (2, 1): 11.0, (2, 2): 10.5}
# (strategy, nodes, gpus per node) -> training seconds (or what went wrong) of repeats 1, 2, 3; F1 = 88 + seconds/1e4
RUNS = {
    ("ddp", 1, 1): [1000.0, 1010.0, 990.0],
    ("ddp", 1, 2): [600.0, 610.0, "resumed"],
    ("fsdp", 1, 2): [580.0, 570.0, None],          # None: the cell never started
    ("ddp", 2, 1): [640.0, "world1", "failed"],
    ("fsdp", 2, 1): [None, None, None],
    ("ddp", 2, 2): [370.0, 365.0, 380.0],
    ("fsdp", 2, 2): [340.0, 345.0, "failed"],
}


def median(values):   # independent of statistics.median
    v = sorted(values)
    n = len(v)
    return v[n // 2] if n % 2 else (v[n // 2 - 1] + v[n // 2]) / 2


def telemetry(seconds, nodes, per):
    """What the telemetry and the communication measurement record (qa/training/telemetry.py,
    scaling/comm_measure.py): step times and, on more than one GPU, the bandwidth and a step with and without
    gradient synchronisation."""
    step = seconds * 0.9 / STEPS
    out = {"train_step_time_mean_s": step, "train_step_time_total_s": seconds * 0.9,
           "train_data_time_total_s": seconds * 0.02, "train_trainable_params": PARAMS,
           "train_grad_dtype": "float32", "train_grad_bytes": 4 * PARAMS}
    if nodes * per > 1:
        out.update({"comm_world_size": nodes * per, "comm_nodes": nodes,
                    "comm_allreduce_busbw_GBps": BUSBW[(nodes, per)], "comm_step_nosync_s": 0.6 * step,
                    "comm_exposed_s": 0.25 * step, "comm_step_sync_s": 0.85 * step})
        if nodes > 1 and per > 1:
            out["comm_intranode_busbw_GBps"] = 19.0
    return out


def write_run(out: Path, cell, what, job, world=None):
    """A cell's folder as its array task leaves it."""
    from qa.results import records

    world = world or cell.nodes * cell.gpus_per_node
    out.mkdir(parents=True)
    variables = {"SLURM_JOB_ID": str(job), "SLURM_NNODES": str(cell.nodes), "WORLD_SIZE": str(world),
                 "SLURM_JOB_NODELIST": "c7-[3-4]" if cell.nodes == 2 else "c7-3"}
    config = {"model_name_or_path": "google-bert/bert-base-uncased", "num_train_epochs": 2.0, "seed": cell.seed,
              "per_device_train_batch_size": GLOBAL_BATCH // world, "gradient_accumulation_steps": 1,
              "output_dir": str(out), "fsdp": ["full_shard"] if cell.strategy == "fsdp" else []}
    with pytest.MonkeyPatch.context() as mp:
        for k in records.SLURM_VARS + records.DIST_VARS:
            mp.delenv(k, raising=False)
        for k, v in variables.items():
            mp.setenv(k, v)
        mp.setattr(records, "_git_commit", lambda: "0123abcd")
        mp.setattr(records, "_versions", lambda: {"python": "3.11.7", "torch": "2.7.1"})
        mp.setattr(records, "_devices", lambda: {"gpus": [GPU] * cell.gpus_per_node, "cpu_count": 64})
        env = records.environment_record(config)
    records.write_environment(out, env)
    (out / task.TASK_RECORD).write_text(json.dumps({
        "recipe": cell.recipe, "seed": cell.seed, "nodes": cell.nodes, "gpus_per_node": cell.gpus_per_node,
        "strategy": cell.strategy, "job_id": str(job), "array_job_id": "900", "array_task_id": cell.task}))
    parts = [{"job_id": str(job), "outcome": "requeued"}] * (what == "resumed") + [
        {"job_id": str(job), "seconds": 50.0, "exit_code": 1, "outcome": "failed", "reason": "CUDA out of memory"}
        if what == "failed" else {"job_id": str(job), "seconds": 1100.0, "exit_code": 0, "outcome": "completed"}]
    (out / "job_time.jsonl").write_text("".join(json.dumps(p) + "\n" for p in parts))
    if what == "failed":
        return
    seconds = 150.0 if what in ("resumed", "world1") else what
    records.save_split_metrics(out, "train", {"train_runtime": seconds + 40, "train_seconds_excluding_evaluation":
                                              seconds, "train_samples_per_second": SAMPLES / seconds,
                                              **telemetry(seconds, cell.nodes, cell.gpus_per_node)})
    records.save_split_metrics(out, "eval", {"eval_f1": 88 + seconds / 1e4, "eval_exact_match": 81.0})
    records.finish_run(out, seconds + 95.0, env)


def make_study(root: Path, runs=RUNS, targets=None) -> tuple:
    spec = root / "scaling.json"
    spec.write_text(json.dumps({"output_dir": str(root / "study"), "config": str(REPO / "configs/reference.json"),
                                "shapes": ["1x1", "1x2", "2x1", "2x2"], "strategies": ["ddp", "fsdp"],
                                "repeats": 3}))
    loaded = study.load(spec)
    task.record_study(loaded, loaded.output_dir)
    for cell in loaded.cells:
        repeat = (cell.task - 1) // 7
        what = runs.get((cell.strategy, cell.nodes, cell.gpus_per_node), [None] * 3)[repeat]
        if what is not None:
            folder = Path(cell.folder(loaded.output_dir))
            write_run(folder, cell, what, 100 + cell.task, world=1 if what == "world1" else None)
            if targets and what in targets:
                from qa.results import records

                records.save_split_metrics(folder, "train", {"target_f1": 88.0,
                                                             "train_seconds_to_target_f1": targets[what]})
    return Path(loaded.output_dir), loaded


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    root = tmp_path_factory.mktemp("scaling")
    folder, _ = make_study(root)
    summary = compare.build([folder], folder, use_slurm=False)
    return folder, summary, (folder / compare.OUT["md"]).read_text()


def _rows(summary):
    return {(r["strategy"], r["nodes"], r["world_size"]): r for r in summary["recipes"]}


def _times(key):
    return [t for t in RUNS[key] if isinstance(t, float)]


def test_the_shipped_study_is_the_scaling_matrix():
    """configs/studies/scaling.json: 5 repeats of 1x1 once and 3 shapes x 2 strategies, one array per shape, the
    baseline with job_ft3.sh, the rest with job_ddp.sh measuring their communication, none requeued."""
    loaded = study.load(REPO / "configs/studies/scaling.json")
    assert loaded.scaling and len(loaded.cells) == 5 * 7
    assert [c.recipe for c in loaded.cells[:7]] == ["reference-ddp-1x1", "reference-ddp-1x2", "reference-fsdp-1x2",
                                                    "reference-ddp-2x1", "reference-fsdp-2x1", "reference-ddp-2x2",
                                                    "reference-fsdp-2x2"]
    assert all(c.args == ["--measure_communication", "true"] for c in loaded.cells if c.nodes * c.gpus_per_node > 1)
    lines = submit.commands(loaded, "job_ft3.sh")
    assert [(x[1], x[x.index("-N") + 1], x[x.index("-N") + 2], Path(x[-2]).name) for x in lines] == [
        ("--array=1,8,15,22,29", "1", "--gres=gpu:a100:1", "job_ft3.sh"),
        ("--array=2-3,9-10,16-17,23-24,30-31", "1", "--gres=gpu:a100:2", "job_ddp.sh"),
        ("--array=4-5,11-12,18-19,25-26,32-33", "2", "--gres=gpu:a100:1", "job_ddp.sh"),
        ("--array=6-7,13-14,20-21,27-28,34-35", "2", "--gres=gpu:a100:2", "job_ddp.sh")]
    assert all("--no-requeue" in x for x in lines)


def test_speedups_against_hand_computed_figures(built):
    _, summary, text = built
    rows = _rows(summary)
    base = median(_times(("ddp", 1, 1)))
    assert base == 1000.0
    for (strategy, nodes, per), times in RUNS.items():
        if not _times((strategy, nodes, per)):
            continue
        row = rows[(strategy, nodes, nodes * per)]
        counted = _times((strategy, nodes, per))
        assert row["training_s"]["median"] == pytest.approx(median(counted))
        assert row["training_s"]["n"] == len(counted)   # the resumed and the wrong-shape runs do not count
        assert row["speedup"] == pytest.approx(base / median(counted))
        assert row["efficiency"] == pytest.approx(base / median(counted) / (nodes * per))
        assert row["global_batch"] == GLOBAL_BATCH
        assert row["windows_per_s"]["median"] == pytest.approx(median([SAMPLES / t for t in counted]), rel=1e-5)
    assert rows[("ddp", 1, 2)]["f1"]["n"] == 3   # the resumed run's F1 counts, its times do not
    assert rows[("fsdp", 1, 2)]["speedup"] == pytest.approx(1000 / 575)
    assert "| 48 | 2.70 | 68 % |" in text   # ddp 2x2: 1000 / 370, / 4
    assert "![speedup against processes](compare_speedup.png)" in text
    assert (built[0] / compare.OUT["speedup"]).read_bytes()[:4] == b"\x89PNG"


def test_what_did_not_count_is_listed_with_its_reason(built):
    _, summary, text = built
    status = {r["name"]: (r["status"], r["reason"]) for r in summary["runs"]}
    assert len(status) == 21   # every cell of study.json, started or not
    resumed = status["task16-reference-ddp-1x2-seed45"]
    assert resumed[0] == "finished" and resumed[1].startswith("resumed: ran in 2 parts")
    assert status["task11-reference-ddp-2x1-seed44"] == (
        "failed", "ran with world size 1, its cell asks for 2: not counted")
    assert status["task18-reference-ddp-2x1-seed45"] == ("failed", "failed, exit code 1: CUDA out of memory")
    assert status["task17-reference-fsdp-1x2-seed45"][1].startswith("never started")
    assert sum(s == "finished" for s, _ in status.values()) == 14   # the resumed one among them
    assert "`: **failed**: ran with world size 1" in text.split("## Runs not finished")[1]


def test_measured_beside_predicted(built):
    """Every multi-process recipe: its measured step time and parts beside the model's prediction, which starts
    from the 1-process run of median step time and takes the recipe's own bandwidth and batch."""
    from scaling.model import Baseline, Settings, WhatIf, predict, ring_busbw

    _, summary, text = built
    entries = {(e["strategy"], e["nodes"], e["gpus_per_node"]): e for e in summary["predictions"]}
    assert set(entries) == {("ddp", 1, 2), ("fsdp", 1, 2), ("ddp", 2, 1), ("ddp", 2, 2), ("fsdp", 2, 2)}
    base = Baseline(compute_s=1000.0 * 0.9 / STEPS, data_s=1000.0 * 0.02 / STEPS, batch=GLOBAL_BATCH, params=PARAMS)
    for (strategy, nodes, per), e in entries.items():
        measured = median([t * 0.9 / STEPS for t in _times((strategy, nodes, per))])
        intra, inter = (BUSBW[(nodes, per)], 12.0) if nodes == 1 else (19.0 if per > 1 else 20.0, BUSBW[(nodes, per)])
        expected = predict(base, nodes, per, strategy, WhatIf(batch_mult=1 / (nodes * per)),
                           ring_busbw(nodes, per, intra, inter), Settings())
        assert e["step_s"] == pytest.approx(measured, rel=1e-4)   # results keep 6 decimals
        assert e["busbw_GBps"] == ring_busbw(nodes, per, intra, inter) and e["busbw_source"] == "measured"
        assert e["predicted_step_s"] == pytest.approx(expected["step_s"], rel=1e-4)
        assert e["predicted_speedup"] == pytest.approx(expected["speedup"], rel=1e-4)
        assert e["flagged"] == (abs(measured / expected["step_s"] - 1) > scaling.MARGIN)
        assert (e["compute_s"], e["exposed_s"]) == (pytest.approx(0.6 * measured, rel=1e-4),
                                                    pytest.approx(0.25 * measured, rel=1e-4))
        assert e["rest_s"] == pytest.approx(0.15 * measured, rel=1e-3)
    assert any(e["flagged"] for e in entries.values()) and not all(e["flagged"] for e in entries.values())
    section = text.split("## Measured and predicted", 1)[1].split("\n## ", 1)[0]
    assert "Model baseline: task1-reference-ddp-1x1-seed43" in section and "**beyond 25%**" in section


def test_time_to_target_beside_throughput(tmp_path):
    """Runs that evaluated during training with a target: each recipe's median time to it over the runs that
    reached it, and a recipe whose two speedups part by more than 10% is flagged."""
    runs = {("ddp", 1, 1): [900.0, 900.5, None], ("ddp", 2, 2): [270.0, 270.5, 271.0]}
    folder, _ = make_study(tmp_path, runs, targets={900.0: 400.0, 900.5: 420.0, 270.0: 250.0, 270.5: 270.0})
    rows = _rows(compare.build([folder], tmp_path, use_slurm=False))
    base, cell = rows[("ddp", 1, 1)], rows[("ddp", 2, 4)]
    assert cell["speedup"] == pytest.approx(900.25 / 270.5)
    assert (base["to_target_s"]["n"], cell["to_target_s"]["n"]) == (2, 2)   # 271.0 never got there
    assert cell["target_speedup"] == pytest.approx(410.0 / 260.0)
    assert cell["target_disagrees"] is True and base["target_disagrees"] is False
    section = (tmp_path / compare.OUT["md"]).read_text().split("## Time to F1 88", 1)[1].split("\n## ", 1)[0]
    assert "| reference-ddp-2x2 | 2 / 3 | 260.0 | 1.58 | 3.33 **differ by more than 10%** |" in section
