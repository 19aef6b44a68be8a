"""bench/gpu_proof.py run --cpu: the rehearsal of the prepared GPU call, on a CPU at tiny size. Calls that add up
(a second call runs only what the first left), the budget, what comes back (at most 8 files, each under 16 MiB, at
most 2 folders deep), a compiled variant that fell back reported as failed, and parity.py's smallest size through
it."""
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.helpers import DEV_SET, NO_DEV_SET, REPO, bench_module, needs_dev

PARITY = "parity-reference-42,parity-fast-42,parity-reference-43,parity-fast-43"


def recipe_hash(name):
    """The proof's recipe hash of a piece or variant, with the scripts it reads the recipes from importable."""
    with pytest.MonkeyPatch.context() as mp:
        mp.syspath_prepend(str(REPO / "bench"))
        return bench_module("gpu_proof").recipe_hash(name)


def proof(*args, env=None, timeout=1200):
    env = dict(os.environ, PYTHONUNBUFFERED="1", **(env or {}))
    started = time.monotonic()
    proc = subprocess.run([sys.executable, str(REPO / "bench" / "gpu_proof.py"), *map(str, args)], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=timeout)
    proc.wall_s = time.monotonic() - started
    return proc


def call(tmp, name, results, budget, *flags, env=None):
    """One rehearsed call: its OUT (what would come back), its record, the process."""
    out = tmp / name / "out"
    proc = proof("run", out, "--cpu", "--budget_s", budget, "--results", results, "--work", tmp / name / "work", *flags,
                 env=env)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert proc.wall_s < budget + 10, proc.wall_s  # the budget holds, the process's start up included
    return out, json.loads((out / "call.json").read_text()), proc


def assert_comes_back(out):
    files = [p for p in out.rglob("*") if p.is_file()]
    assert 0 < len(files) <= 8
    for p in files:
        rel = p.relative_to(out)
        assert p.stat().st_size < 16 * 2**20 and len(rel.parts) <= 3, rel
        assert all(c.isalnum() or c in "._-" for c in p.name), rel
    assert sum(p.stat().st_size for p in files) <= 64 * 2**20


@pytest.fixture(scope="module")
def rehearsal(tmp_path_factory):
    if not DEV_SET.exists():
        pytest.skip(NO_DEV_SET)
    tmp = tmp_path_factory.mktemp("proof")
    results = tmp / "results"
    first = call(tmp, "first", results, 800, "--pieces", "bench," + PARITY)
    assert proof("collect", first[0], "--results", results).returncode == 0
    second = call(tmp, "second", results, 1200)
    assert proof("collect", second[0], "--results", results).returncode == 0
    return tmp, results, first, second


def findings(results, piece):
    return json.loads((results / f"{piece}.json").read_text())["findings"]


def assert_no_device_waits(waits, name):
    """A profile's host waits on a CPU: no device to wait for and no kernel launched, the data a share of the step."""
    assert waits["device_wait_share"] == 0 and waits["launches_per_step"] == 0, (name, waits)
    assert 0 <= waits["data_wait_share"] < 1 and waits["step_ms"] > 0, (name, waits)


@pytest.mark.slow
def test_calls_add_up(rehearsal):
    _, results, (_, call1, _), (_, call2, _) = rehearsal
    assert list(call1["pieces"]) == ["preflight", "bench", *PARITY.split(",")]
    assert all(r["status"] == "ok" for r in call1["pieces"].values()), call1["pieces"]
    # the second call runs the preflight and only what the first left
    assert call2["already_done"] == sorted(["bench", *PARITY.split(",")])
    assert list(call2["pieces"]) == ["preflight", "attempts", "train", "train-warm", "check", "variants"]
    assert call2["pieces"]["attempts"]["attempts_run"] == bench_module("gpu_proof").ATTEMPT_VARIANTS  # all fit here
    assert all(r["status"] == "ok" for r in call2["pieces"].values()), call2["pieces"]
    proof_md = (results / "proof.md").read_text()
    assert "not run yet" not in proof_md and "| bench | ok |" in proof_md


@pytest.mark.slow
@pytest.mark.parametrize("piece", ["bench", "attempts", "variants", "train", "train-warm", "check", *PARITY.split(",")])
def test_each_piece_records_where_and_what_it_ran(rehearsal, piece):
    _, results, *_ = rehearsal
    r = json.loads((results / f"{piece}.json").read_text())
    assert r["status"] == "ok" and r["started_utc"] and r["command"]
    assert r["device"].startswith("CPU ") and r["versions"]["torch"], r["device"]  # the rehearsal's device, by name
    assert piece == "attempts" or r["recipe_hash"] == recipe_hash(piece)


@pytest.mark.slow
def test_bench_piece(rehearsal):
    _, results, *_ = rehearsal
    bench = findings(results, "bench")
    assert set(bench["variants"]) == {"reference_bf16", "fast"} and not bench["failed"]
    fast, ref = bench["variants"]["fast"], bench["variants"]["reference_bf16"]
    assert fast["compiled"] == "yes" and fast["compiles_in_window"] == 0
    # the ratio is the two windows' real-token rates, and fast's record carries the same figure
    ratio = bench["ratios"]["fast/reference_bf16"]
    assert ratio["compiled_in_window"] is False, ratio
    assert ratio["real_tokens_per_second"] == pytest.approx(
        fast["real_tokens_per_second"] / ref["real_tokens_per_second"], rel=0.01), (ratio, fast, ref)
    assert fast["x_reference_bf16"] == ratio["real_tokens_per_second"] > 0


@pytest.mark.slow
def test_attempts_piece(rehearsal):
    _, results, *_ = rehearsal
    gp = bench_module("gpu_proof")
    attempts = findings(results, "attempts")
    assert list(attempts["variants"]) == gp.ATTEMPT_VARIANTS  # every attempt in one call, each against its fast
    assert attempts["variants"]["fast_cudagraphs"]["cuda_graphs"] == "skipped"  # none on a CPU, and the record says so
    for variant, figures in attempts["variants"].items():
        assert figures["compiled"] == "yes" and figures["x_fast"] > 0 and figures["x_reference_bf16"] > 0, variant
        assert figures["recipe_hash"] == recipe_hash(variant) and figures["call"] in attempts["calls"]
        # nothing runs on a device: no share of one (not a made-up 0), while the same profile's host side is there
        assert figures["device_busy_share"] is None, (variant, figures["device_busy_share"])
        assert_no_device_waits(figures["host_waits"], variant)
    (call, run), = attempts["calls"].items()
    assert set(run["base"]) == {"reference_bf16", "fast"} and not run["failed"]
    used = json.loads(next((results / "attempts" / call).glob("bench-*.json")).read_text())["variants"]
    assert used["fast"]["used"]["dataloader_non_blocking"] is True  # configs/fast.json's, read from the live accelerator
    assert used["reference_bf16"]["used"]["dataloader_non_blocking"] is False
    assert used["fast_b256"]["used"]["per_device_train_batch_size"] == 256
    # the variants of one call share one compile cache: what fast compiled, fast_b256 finds there (symbolic shapes)
    b256_compile = used["fast_b256"]["compile"]
    assert b256_compile["fxgraph_cache_miss"] == 0 and b256_compile["fxgraph_cache_hit"] > 0, b256_compile


@pytest.mark.slow
def test_variants_piece(rehearsal):
    _, results, *_ = rehearsal
    variants = findings(results, "variants")
    assert set(variants["variants"]) == {"reference", "fast_no_compile", "fast_static64"} and not variants["failed"]
    figures = variants["variants"]
    # only fast_static64 compiles; the others record no compile outcome rather than one they did not have
    assert [figures[v]["compiled"] for v in ("reference", "fast_no_compile", "fast_static64")] == [None, None, "yes"]
    assert set(variants["ratios"]) == {"fast_no_compile/reference", "fast_static64/reference"}
    for name, ratio in variants["ratios"].items():
        a, b = (figures[v]["real_tokens_per_second"] for v in name.split("/"))
        assert not ratio["compiled_in_window"], name
        assert ratio["real_tokens_per_second"] == pytest.approx(a / b, rel=0.01), (name, ratio, a, b)


@pytest.mark.slow
def test_train_piece(rehearsal):
    _, results, *_ = rehearsal
    train = findings(results, "train")
    assert train["compiled"] == "yes" and train["profile_operators"] and train["train_samples_per_second"] > 0
    assert train["fxgraph_cache_miss"] > 0  # a cold cache: train-warm's contrast
    assert train["train_profiled_steps"] and train["train_profile_device_busy_share"] is None
    assert_no_device_waits(train["train_profile_host_waits"], "train")
    for name in ("all_results.json", "results.md", "environment.json", "profile/operators.txt", "logs/train.log"):
        assert (results / "train" / name).stat().st_size > 0, name
    assert train["tensorboard_events"] and all(n > 0 for n in train["tensorboard_events"].values())  # in the archive


@pytest.mark.slow
def test_train_warm_piece(rehearsal):
    _, results, *_ = rehearsal
    train, warm = findings(results, "train"), findings(results, "train-warm")  # the same, from train's compile cache
    assert warm["compiled"] == "yes" and warm["fxgraph_cache_miss"] == 0 and warm["fxgraph_cache_hit"] > 0, warm
    assert warm["compile_warmup_s"] < train["compile_warmup_s"] and warm["wall_clock_breakdown"]["training"] > 0


@pytest.mark.slow
def test_check_piece(rehearsal):
    _, results, *_ = rehearsal
    check = findings(results, "check")  # train's command, --check, same call
    assert check["verdict"] == "ready" and check["predicted"]["total_s"] > 0 and check["checks"]["training"]
    # check and train in one call: the ratio is computed from the two, and judged by the 30%
    predicted, measured = check["predicted"]["total_s"], findings(results, "train")["WALL_CLOCK_SECONDS"]
    target = next(t for t in json.loads((results / "proof.json").read_text())["targets"] if "check job" in t["target"])
    assert target["measured"].startswith(f"{predicted / measured:.2f} (predicted {predicted} s, measured {measured} s)")
    assert target["met"] is (abs(predicted / measured - 1) <= 0.3), target


@pytest.mark.slow
def test_parity_smallest_size_end_to_end(rehearsal):
    """bench/parity.py --size smoke through four pieces: two recipes x two seeds, each a curve of evaluations
    during training, the time to a common target, the spread between seeds, a picture."""
    _, results, *_ = rehearsal
    folder = next((results / "parity").glob("time-to-f1-smoke-*"))
    report = json.loads((folder / "report.json").read_text())
    assert report["model"] == "bundled:tiny-bert"  # the rehearsal's; a GPU call fine-tunes the MiniLM
    assert sorted((r["recipe"], r["seed"]) for r in report["runs"]) == [
        ("fast", 42), ("fast", 43), ("reference", 42), ("reference", 43)]
    for r in report["runs"]:
        assert len(r["curve"]) >= 2 and r["curve"][-1]["train_seconds"] > r["curve"][0]["train_seconds"] > 0
        assert r["eval_examples"] == 189 and r["train_examples"] == 112  # article 42 held out, article 2 trained on
    ref, fast = report["recipes"]["reference"], report["recipes"]["fast"]
    assert ref["batch"] == 12 and fast["batch"] == 48 and ref["final_f1_spread"] >= 0
    # fast against the reference, judged by the larger spread between seeds
    assert fast["seed_spread"] == max(ref["final_f1_spread"], fast["final_f1_spread"])
    assert fast["f1_minus_reference"] == pytest.approx(fast["final_f1_mean"] - ref["final_f1_mean"])
    within = abs(fast["f1_minus_reference"]) <= fast["seed_spread"]
    assert fast["verdict"].startswith("no difference measured" if within else ("lower", "higher")), fast
    assert (folder / "f1_vs_time.png").stat().st_size > 10_000
    f1 = json.loads((results / "proof.json").read_text())["targets"][-1]  # both recipes with both seeds: assessed
    assert f1["met"] is (statistics.mean(ref["final_f1"]) - statistics.mean(fast["final_f1"])
                         <= max(ref["final_f1_spread"], fast["final_f1_spread"])), f1


@pytest.mark.slow
def test_what_comes_back_is_small(rehearsal):
    _, _, (out1, *_), (out2, *_) = rehearsal
    for out in (out1, out2):
        assert_comes_back(out)


@pytest.mark.slow
def test_the_collected_results_hold_no_weights_and_no_folders_of_the_machine(rehearsal):
    tmp, results, *_ = rehearsal
    assert not list(results.rglob("*.safetensors")) and not list(results.rglob("trace*.json"))
    assert not list(results.rglob("events.out.tfevents.*"))  # binary files naming the folders of the machine
    committed = "".join(p.read_text() for p in results.rglob("*") if p.is_file() and p.suffix in (".json", ".md", ".log"))
    for folder in (tmp / "first" / "work", tmp / "second" / "work", REPO):  # they became $WORK and paths in the repo
        assert str(folder) not in committed, folder


@pytest.mark.slow
def test_collect_never_overwrites_a_finished_piece(rehearsal):
    tmp, results, (out1, *_), _ = rehearsal
    before = (results / "bench.json").read_bytes()
    proc = proof("collect", out1, "--results", results)
    assert proc.returncode == 0 and "bench: already done" in proc.stderr
    assert (results / "bench.json").read_bytes() == before


@pytest.mark.slow
@needs_dev
def test_a_compiled_variant_that_fell_back_is_a_failed_piece(tmp_path):
    """Inductor without a C++ compiler: dynamo falls back to eager and the run goes on. The bench piece is failed,
    not a figure."""
    env = {"CXX": str(tmp_path / "no-compiler"), "TORCHINDUCTOR_CACHE_DIR": str(tmp_path / "inductor")}
    out, record, _ = call(tmp_path, "fallback", tmp_path / "results", 300, "--pieces", "bench", env=env)
    bench = record["pieces"]["bench"]
    assert bench["status"] == "failed", bench
    assert bench["findings"]["failed"]["fast"].startswith("torch.compile fell back: "), bench["findings"]
    assert "fast" not in bench["findings"]["variants"]
    assert_comes_back(out)


@needs_dev
def test_a_piece_that_does_not_fit_waits(tmp_path):
    out, record, proc = call(tmp_path, "short", tmp_path / "results", 25, "--pieces", "bench")
    assert [r["status"] for r in record["pieces"].values()] == ["waits", "waits"], record["pieces"]
    assert "waits for a later call" in proc.stdout
    assert_comes_back(out)


def test_estimates_come_from_what_ran():
    gp = bench_module("gpu_proof")
    nowhere = Path("/nonexistent")
    assert gp.estimate("train", "gpu", nowhere, {}) == gp.ESTIMATES["gpu"]["train"]
    est = gp.ESTIMATES["gpu"]
    ran = {"preflight": {"status": "ok", "wall_s": est["preflight"] / 2}, "bench": {"status": "ok", "wall_s": 2 * est["bench"]}}
    # this call's pieces took 0.5x and 2x their estimates: the median scales the next one
    assert gp.estimate("train", "gpu", nowhere, ran) == pytest.approx(gp.ESTIMATES["gpu"]["train"] * 1.25)
    # a piece whose estimate came from its plan (attempts) scales by the estimate it ran with
    ran["attempts"] = {"status": "ok", "wall_s": 650, "estimate_s": 325}
    assert gp.estimate("train", "gpu", nowhere, ran) == pytest.approx(gp.ESTIMATES["gpu"]["train"] * 2)


def test_what_breaks_the_limits_on_what_comes_back(tmp_path):
    gp = bench_module("gpu_proof")
    for i in range(9):
        (tmp_path / f"f{i}.json").write_text("{}")
    (tmp_path / "a" / "b" / "c").mkdir(parents=True)
    (tmp_path / "a" / "b" / "c" / "deep.md").write_text("x")
    with open(tmp_path / "big.tar.gz", "wb") as f:
        f.truncate(16 * 2**20)
    problems = gp.check_packed(tmp_path)
    assert any("11 files" in p for p in problems) and any("big.tar.gz" in p for p in problems)
    assert any("deep.md" in p for p in problems)


def test_an_unknown_piece_is_one_line(tmp_path):
    proc = proof("run", tmp_path / "out", "--cpu", "--results", tmp_path, "--pieces", "bench,warp", timeout=300)
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and len(lines) == 1 and "'warp'" in lines[0] and "--pieces" in lines[0], proc.stderr


def test_the_rehearsals_cheaper_parity_and_check_leave_a_gpu_call_as_it_was(tmp_path, monkeypatch):
    """The rehearsal fine-tunes the tiny BERT in its parity pieces and lets its check read train's compile cache; a
    GPU call's parity fine-tunes parity.py's own model (the MiniLM) and its check compiles cold, alone."""
    monkeypatch.syspath_prepend(str(REPO / "bench"))
    gp = bench_module("gpu_proof")
    import qa.model

    monkeypatch.setattr(qa.model, "build_random_bert", lambda folder, shape: folder)  # bert-base: nothing to build
    work, dev = tmp_path / "work", tmp_path / "dev.json"
    gpu = gp.piece_command("parity-reference-42", "gpu", work, dev)
    assert gpu == [sys.executable, str(REPO / "bench" / "parity.py"), "--size", "gpu", "--dev", str(dev), "--recipes",
                   "reference", "--seeds", "42", "--out", str(work / "parity"), "--work",
                   str(work / "work" / "parity-reference-42")]
    cpu = gp.piece_command("parity-reference-42", "cpu", work, dev)
    assert cpu == [*gpu[:3], "smoke", *gpu[4:], "--model", "bundled:tiny-bert"]

    def cache(mode):
        argv = gp.piece_command("check", mode, work, dev)
        return argv[argv.index("--compile_cache_dir") + 1], argv[argv.index("--features_cache_dir") + 1]

    gpu_cache, features = cache("gpu")
    assert gpu_cache == str(work / "work" / "check-compile") and features == str(work / "work" / "features")
    cpu_cache, features = cache("cpu")
    assert cpu_cache == str(Path(features) / "torch_compile")  # where train's run_qa.py puts its cache by default


@needs_dev
def test_without_a_gpu_it_asks_for_the_rehearsal(tmp_path):
    import torch

    if torch.cuda.is_available():
        pytest.skip("a GPU is visible")
    proc = proof("run", tmp_path / "out", timeout=300)
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and len(lines) == 1 and "--cpu" in lines[0] and "no GPU" in lines[0], proc.stderr
    assert not (tmp_path / "out").exists()


def _run(recipe, seed, f1, curve):
    return {"recipe": recipe, "seed": seed, "eval_f1": f1, "eval_exact_match": f1 - 10,
            "train_seconds_excluding_evaluation": curve[-1][0],
            "settings": {"per_device_train_batch_size": 12, "learning_rate": 3e-5},
            "curve": [{"train_seconds": s, "step": i + 1, "features": 100 * (i + 1), "f1": f}
                      for i, (s, f) in enumerate(curve)]}


def test_a_difference_within_the_seed_spread_is_no_difference():
    parity = bench_module("parity")
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


def _attempts_entry(gp, call, variants, status="ok"):
    """A call's attempts piece as `run` records it: every variant clean, each with its ratios to that call's bases."""
    figures = {v: {"compiles_in_window": 0, "compiled": "yes", "projected_2_epochs_s": 100.0, "device_busy_share": 0.7,
                   "recipe_hash": gp.recipe_hash(v), "x_fast": None if v == "fast" else 1.5} for v in variants}
    return {"status": status, "wall_s": 300, "attempts_run": [v for v in variants if v in gp.ATTEMPT_VARIANTS],
            "findings": {"variants": figures, "failed": {}}}


def test_attempts_add_up_across_calls_and_fit_their_time(tmp_path, monkeypatch):
    monkeypatch.syspath_prepend(str(REPO / "bench"))  # the recipes are read from the scripts beside it
    gp = bench_module("gpu_proof")
    est = gp.VARIANT_ESTIMATES["gpu"]
    plan, need = gp.attempt_plan("gpu", tmp_path, 1000)
    # CUDA graphs first, beside reference_bf16 and fast, within the piece's 8 minutes
    assert plan[0] == "fast_cudagraphs" and need <= gp.ATTEMPTS_S
    assert need == est["setup"] + sum(est[v] for v in gp.BASE_VARIANTS + plan)
    assert gp.attempt_plan("gpu", tmp_path, 100) == ([], est["setup"] + est["reference_bf16"] + est["fast"])

    first = gp.merge_attempts(tmp_path, _attempts_entry(gp, "c1", gp.BASE_VARIANTS + plan), "c1")
    assert first["status"] == "partial" and list(first["findings"]["variants"]) == plan
    (tmp_path / "attempts.json").write_text(json.dumps(first))
    later, _ = gp.attempt_plan("gpu", tmp_path, 1000)
    assert later and not set(later) & set(plan)  # a later call measures what is left
    rest = [v for v in gp.ATTEMPT_VARIANTS if v not in plan]
    second = gp.merge_attempts(tmp_path, _attempts_entry(gp, "c2", gp.BASE_VARIANTS + rest, "failed"), "c2")
    assert second["status"] == "ok" and set(second["findings"]["calls"]) == {"c1", "c2"}
    assert {second["findings"]["variants"][v]["call"] for v in plan} == {"c1"}  # the earlier ones kept
    (tmp_path / "attempts.json").write_text(json.dumps(second))
    assert gp.attempts_left(tmp_path) == [] and "attempts" in gp.finished(tmp_path)

    # an attempt measured with other settings than today's counts as missing again
    second["findings"]["variants"]["fast_b256"]["recipe_hash"] = "0ld"
    (tmp_path / "attempts.json").write_text(json.dumps(second))
    assert gp.attempts_left(tmp_path) == ["fast_b256"] and "attempts" not in gp.finished(tmp_path)
    assert "fast_b256" in gp.older_recipe("attempts", second)


def test_a_piece_of_an_older_recipe_counts_as_missing(tmp_path, monkeypatch):
    monkeypatch.syspath_prepend(str(REPO / "bench"))
    gp = bench_module("gpu_proof")
    record = {"status": "ok", "recipe_hash": gp.recipe_hash("bench")}
    run_bench = sys.modules["run_bench"]  # the module the proof reads its recipes through
    (tmp_path / "bench.json").write_text(json.dumps(record))
    (tmp_path / "parity-reference-42.json").write_text(json.dumps({"status": "ok", "findings": {
        "eval_f1": 60.0}, "recipe_hash": gp.recipe_hash("parity-reference-42")}))
    assert set(gp.finished(tmp_path)) == {"bench", "parity-reference-42"}
    changed = tmp_path / "fast.json"  # fast.json with another learning rate
    changed.write_text(json.dumps({**json.loads(run_bench.FAST_CONFIG.read_text()), "learning_rate": 2e-4}))
    monkeypatch.setattr(run_bench, "FAST_CONFIG", changed)
    assert set(gp.finished(tmp_path)) == {"parity-reference-42"}  # the reference's settings did not change
    assert "today's is" in gp.older_recipe("bench", record)
    report = gp.write_report(tmp_path)
    assert list(report["older_recipe"]) == ["bench"] and "bench" in report["missing"]
    assert "| bench | ok (older recipe: ran recipe " in (tmp_path / "proof.md").read_text()
