"""bench/gpu_proof.py --cpu: the GPU proof's one command end to end on a CPU (every step, every
output file), bench/parity.py's smallest size through it, and the report's arithmetic."""
import json
import os
import subprocess
import sys

import pytest

from tests.helpers import DEV_SET, REPO, bench_module

needs_dev = pytest.mark.skipif(not DEV_SET.exists(), reason=f"the SQuAD v1.1 dev set is not at {DEV_SET} (SQUAD_DEV)")


def proof(out, *flags, timeout=1800):
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    return subprocess.run([sys.executable, str(REPO / "bench" / "gpu_proof.py"), *flags, str(out)], cwd=REPO,
                          env=env, capture_output=True, text=True, timeout=timeout)


def _module(name):
    return bench_module(name)


@pytest.fixture(scope="module")
def cpu_proof(tmp_path_factory):
    if not DEV_SET.exists():
        pytest.skip(f"the SQuAD v1.1 dev set is not at {DEV_SET} (SQUAD_DEV)")
    out = tmp_path_factory.mktemp("proof")
    proc = proof(out, "--cpu")
    assert proc.returncode == 0, proc.stderr[-4000:]
    return out, json.loads((out / "proof.json").read_text())


@pytest.mark.slow
def test_every_step_runs_and_writes_its_files(cpu_proof):
    out, p = cpu_proof
    assert p["mode"] == "cpu" and list(p["steps"]) == ["bench", "parity", "train", "variants"]
    for step, r in p["steps"].items():
        assert r["status"] == "ok" and r["exit_status"] == 0 and (out / f"{step}.log").stat().st_size > 0, step
        assert r["findings"], step
    for step in ("bench", "variants"):
        assert len(list((out / step).glob("bench-cpu-*.json"))) == 1 and len(list((out / step).glob("bench-cpu-*.md"))) == 1
    bench = p["steps"]["bench"]["findings"]
    assert bench["fast_compiles_in_window"] == 0 and "fast/reference_bf16" in bench["ratios"]
    variants = p["steps"]["variants"]["findings"]
    assert variants["fast_no_compile_samples_per_second"] > 0 and variants["fast_static64_compiles_in_window"] == 0
    train = out / "train"
    for name in ("all_results.json", "train_results.json", "results.md", "environment.json", "profile/operators.txt"):
        assert (train / name).stat().st_size > 0, name
    assert list((train / "runs").rglob("events.out.tfevents.*"))  # TensorBoard
    t = p["steps"]["train"]["findings"]
    assert t["profile_operators"] and t["train_samples_per_second"] > 0 and "train_mfu" in t and t["compile_warmup_s"] > 0
    md = (out / "proof.md").read_text()
    assert all(f"| {step} | ok | 0 |" in md for step in p["steps"])


@pytest.mark.slow
def test_parity_smallest_size_end_to_end(cpu_proof):
    """bench/parity.py --size smoke: two recipes x two seeds, each a curve of evaluations during
    training, the time to a common target, the spread between seeds, a picture."""
    out, p = cpu_proof
    folder = next((out / "parity").glob("time-to-f1-smoke-*"))
    report = json.loads((folder / "report.json").read_text())
    assert sorted((r["recipe"], r["seed"]) for r in report["runs"]) == [
        ("fast", 42), ("fast", 43), ("reference", 42), ("reference", 43)]
    assert sorted(p.name for p in (folder / "runs").iterdir()) == [
        "fast-seed42.json", "fast-seed43.json", "reference-seed42.json", "reference-seed43.json"]
    for r in report["runs"]:
        assert len(r["curve"]) >= 2 and r["curve"][-1]["train_seconds"] > r["curve"][0]["train_seconds"] > 0
        assert r["eval_examples"] == 189 and r["train_examples"] == 112  # article 42 held out, article 2 trained on
    assert report["split"]["validation_articles"] == "42:43"
    ref, fast = report["recipes"]["reference"], report["recipes"]["fast"]
    assert ref["batch"] == 12 and fast["batch"] == 48 and ref["final_f1_spread"] >= 0
    assert all(s is not None for s in ref["train_seconds_to_target"] + fast["train_seconds_to_target"])
    assert "verdict" in fast and (folder / "f1_vs_time.png").stat().st_size > 10_000
    md = (folder / "report.md").read_text()
    assert "seed spread" in md and "python bench/parity.py --size smoke" in md


@pytest.mark.slow
def test_a_second_call_keeps_what_the_first_finished(cpu_proof, tmp_path):
    out, _ = cpu_proof
    before = {p: p.stat().st_mtime_ns for p in out.rglob("*") if p.is_file() and "work" not in p.parts}
    proc = proof(out, "--cpu", "--steps", "train,bench", timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "already finished" in proc.stderr
    changed = [p for p, t in before.items() if p.stat().st_mtime_ns != t and p.name not in ("proof.json", "proof.md")]
    assert changed == []


@needs_dev
def test_without_a_gpu_it_asks_for_cpu_mode(tmp_path):
    import torch

    if torch.cuda.is_available():
        pytest.skip("a GPU is visible: without --cpu the whole proof would run")
    proc = proof(tmp_path / "out", timeout=300)
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and len(lines) == 1 and "--cpu" in lines[0] and "no GPU" in lines[0], proc.stderr
    assert not (tmp_path / "out").exists()


def test_an_unknown_step_is_one_line(tmp_path):
    proc = proof(tmp_path / "out", "--cpu", "--steps", "bench,warp", timeout=300)
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and len(lines) == 1 and "'warp'" in lines[0] and "--steps" in lines[0], proc.stderr


def _run(recipe, seed, f1, curve):
    return {"recipe": recipe, "seed": seed, "eval_f1": f1, "eval_exact_match": f1 - 10,
            "train_seconds_excluding_evaluation": curve[-1][0],
            "settings": {"per_device_train_batch_size": 12, "learning_rate": 3e-5},
            "curve": [{"train_seconds": s, "step": i + 1, "features": 100 * (i + 1), "f1": f}
                      for i, (s, f) in enumerate(curve)]}


def test_a_difference_within_the_seed_spread_is_no_difference():
    parity = _module("parity")
    runs = [_run("reference", 42, 50.0, [(100, 30), (200, 50)]), _run("reference", 43, 47.0, [(100, 20), (200, 47)]),
            _run("fast", 42, 49.0, [(50, 40), (100, 49)]), _run("fast", 43, 48.0, [(50, 40), (100, 48)])]
    target = parity.common_target(runs, None)
    assert target == 42.0  # 90% of the lowest final F1, 47, rounded down
    rec = parity.summarise(runs, target)
    assert rec["reference"]["final_f1_spread"] == 3.0 and rec["fast"]["seed_spread"] == 3.0
    assert rec["fast"]["verdict"].startswith("no difference measured")
    # reference seed 42 crosses 42 between (100 s, 30) and (200 s, 50): 160 s; seed 43 at 47 (200 s) from 20: ~181.5 s
    assert rec["reference"]["train_seconds_to_target"][0] == pytest.approx(160)
    assert rec["fast"]["train_seconds_to_target"] == [pytest.approx(50 + 50 * 2 / 9), pytest.approx(50 + 50 * 2 / 8)]
    assert rec["fast"]["time_to_target_speedup"] > 2.5
    assert rec["reference"]["windows_to_target"][0] == pytest.approx(100 + 100 * 12 / 20)  # the same, on windows
    runs[2]["eval_f1"], runs[3]["eval_f1"] = 40.0, 41.0
    assert parity.summarise(runs, target)["fast"]["verdict"].startswith("lower F1 than the reference")
