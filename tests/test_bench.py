"""bench/run_bench.py --size cpu: every variant runs through run_qa.py and the report has every
field, with sane values (no timing thresholds: this machine's speed says nothing)."""
import json
import os
import subprocess
import sys

import pytest

from bench.dev_set import URL as SQUAD_DEV_URL
from tests.helpers import DEV_SET, REPO, bench_module

VARIANT_FIELDS = ("samples_per_second", "real_tokens_per_second", "padding_fraction", "mfu_real", "peak_rss_gib",
                  "peak_memory_gib", "projected_2_epochs_s", "timed_steps", "timed_samples", "timed_seconds",
                  "warmup_s", "used", "settings")


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("bench")
    env = dict(os.environ, HF_HOME=str(tmp / "hf_home"), PYTHONUNBUFFERED="1")
    data = [] if DEV_SET.exists() else ["--dataset_name", "synthetic", "--synthetic_examples", "200"]
    proc = subprocess.run([sys.executable, str(REPO / "bench" / "run_bench.py"), "--size", "cpu", *data,
                           "--max_train_samples", "200", "--warmup_steps", "1", "--timed_samples", "48", "--repeat", "1",
                           "--out", str(tmp / "results"), "--work", str(tmp / "work")],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-4000:]
    paths = json.loads(proc.stdout.strip().splitlines()[-1])
    return json.loads(open(paths["json"]).read()), open(paths["markdown"]).read()


@pytest.mark.slow
def test_report_has_every_variant_and_field(report):
    r, _ = report
    assert list(r["variants"]) == ["reference", "reference_bf16", "fast"]
    # fast with every instrument off, timed by the benchmark's own window beside fast with them
    off = r["instruments_off"]
    assert off["instruments_off"] == ["checkpoint_on_sigterm", "log_lines", "telemetry"]
    assert off["steps_per_second_with"] > 0 and off["steps_per_second_without"] > 0
    assert off["without_over_with"] == pytest.approx(off["steps_per_second_without"] / off["steps_per_second_with"],
                                                     rel=1e-2)
    assert len(off["repeat_steps_per_second_with"]) == len(off["repeat_steps_per_second_without"]) == 1
    for key in ("device", "versions", "date_utc", "command", "host", "model", "data", "peak", "ratios", "load_avg"):
        assert key in r, key
    assert r["size"] == "cpu" and r["versions"]["torch"] and r["versions"]["transformers"]
    assert r["command"].startswith("python bench/run_bench.py --size cpu")
    # the data named by file and content, not by where it lies on the machine that ran it
    source = r["data"]["source"]
    assert source == "synthetic" if not DEV_SET.exists() else (source.startswith("dev-v1.1.json.gz (sha256 ")
                                                               and "/" not in source)
    for name, v in r["variants"].items():
        for key in VARIANT_FIELDS:
            assert key in v, (name, key)


@pytest.mark.slow
def test_values_are_sane(report):
    r, _ = report
    for name, v in r["variants"].items():
        assert v["samples_per_second"] > 0 and v["real_tokens_per_second"] > 0, name
        assert 0 <= v["padding_fraction"] < 1 and v["projected_2_epochs_s"] > 0, name
        assert v["timed_samples"] >= 48 and v["timed_seconds"] > 0, name
        assert v["first_step_s"] > 0 and v["warmup_s"] >= v["first_step_s"] and v["warmup_steps"] == 1, name
        # real tokens/s = samples/s x mean real tokens of the timed batches (at most max_seq_length)
        assert v["real_tokens_per_second"] <= v["samples_per_second"] * r["data"]["max_seq_length"] * 1.0001, name
        if not r["gpu_available"]:
            assert v["mfu_real"] is None and v["peak_memory_gib"] is None and v["peak_rss_gib"] > 0, name
    assert set(r["ratios"]) == {"fast/reference", "fast/reference_bf16"}
    for name, v in r["variants"].items():  # counted for every variant and repeat: nothing compiles here
        assert v["compiles_in_window"] == 0 and v["repeat_compiles_in_window"] == [0], name
    assert not any(pair["compiled_in_window"] for pair in r["ratios"].values())
    ratio = r["ratios"]["fast/reference"]["samples_per_second"]
    assert ratio == pytest.approx(r["variants"]["fast"]["samples_per_second"]
                                  / r["variants"]["reference"]["samples_per_second"], rel=1e-2)


@pytest.mark.slow
def test_each_variant_used_what_it_says(report):
    r, _ = report
    ref, bf16, fast = (r["variants"][k]["used"] for k in ("reference", "reference_bf16", "fast"))
    assert ref["matmul_precision"] == "fp32" and bf16["matmul_precision"] == fast["matmul_precision"] == "bf16"
    assert ref["per_device_train_batch_size"] == 12 and fast["per_device_train_batch_size"] == 48
    assert fast["sampler"] == "LengthGroupedSampler" and fast["collator"] == "BucketPaddingCollator"
    assert fast["attn_implementation"] == "sdpa" and fast["optimizer_fused"]
    if not r["gpu_available"]:
        assert any("tf32" in n for n in r["variants"]["fast"]["notes"])


@pytest.mark.slow
def test_markdown_names_device_versions_command(report):
    r, md = report
    assert r["device"]["name"] in md and r["versions"]["torch"] in md and "bench/run_bench.py" in md
    assert "- Instruments (checkpoint_on_sigterm, log_lines, telemetry, no --eval_every): fast runs" in md
    for name in r["variants"]:
        assert f"| {name} |" in md
    if not r["gpu_available"]:
        assert "no GPU was available" in md


@pytest.mark.parametrize("script, option", [("run_bench.py", "--train_file"), ("parity.py", "--dev"),
                                            ("bench_features.py", "--dev"), ("bench_postprocess.py", "--dev"),
                                            ("bench_input.py", "--dev")])
def test_a_missing_dev_set_is_one_line_not_a_substitute(script, option, tmp_path):
    """No generated data stands in for a dev set that is not there (run_bench.py takes it only
    when asked by name, --dataset_name synthetic), and no traceback: one line, exit 2."""
    missing = tmp_path / "dev-v1.1.json"
    out = [] if script == "bench_postprocess.py" else ["--out", str(tmp_path / "results")]  # it prints its result
    proc = subprocess.run([sys.executable, str(REPO / "bench" / script), option, str(missing), *out], cwd=REPO,
                          capture_output=True, text=True, timeout=300,
                          env=dict(os.environ, HF_HOME=str(tmp_path / "hf")))
    assert proc.returncode == 2, proc.stderr[-3000:]
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"error: {option} {missing}: "), lines
    assert "Fix:" in lines[0] and ("--dataset_name synthetic" in lines[0]) == (script == "run_bench.py")
    assert SQUAD_DEV_URL in lines[0] and "SQUAD_DEV=" in lines[0]  # how to get it, and where to say it is
    assert not (tmp_path / "results").exists()


def _bench_module():
    return bench_module("run_bench")


@pytest.mark.slow
def test_a_window_with_compilations_is_marked_and_its_ratios_left_out(report):
    """The Markdown of the fixture's report, with the fast variant's window made to hold two
    compilations: the row is marked, its ratios are not printed as results, nor flagged as such
    in the JSON; the clean variants keep theirs."""
    import copy

    bench = _bench_module()
    r, md = report
    assert "compiles in window" in md and "no result" not in md and "Not results" not in md
    compiled = copy.deepcopy(r)
    compiled["variants"]["fast"]["compiles_in_window"] = 2
    compiled["ratios"] = bench.ratios(compiled["variants"])
    assert compiled["ratios"]["fast/reference"]["compiled_in_window"] is True
    text = bench.markdown(compiled)
    row = next(line for line in text.splitlines() if line.startswith("| **fast**"))
    assert "(compiled in its window)" in row and row.count("no result (compiled in window)") == 2
    assert "x" not in row.rsplit("|", 3)[1] and "**Not results: fast.**" in text
    reference_row = next(line for line in text.splitlines() if line.startswith("| reference |"))
    assert "compiled" not in reference_row


def test_the_reported_run_is_the_median_of_those_that_compiled_nothing():
    bench = _bench_module()

    def run(rate, compiles):
        return {"results": {"train_window_samples": rate, "train_window_seconds": 1.0,
                            "train_window_compiles": compiles}}

    assert bench.median_run([run(10, 0), run(30, 0), run(20, 0)]) == (2, "median of all runs")
    pick, why = bench.median_run([run(10, 0), run(99, 3), run(20, 0), run(15, 0)])
    assert pick == 3 and "3 of 4" in why  # 99 samples/s compiled: not among the candidates
    assert bench.median_run([run(10, 1), run(30, 2), run(20, 1)])[0] == 2  # all compiled: marked in the report


@pytest.mark.skipif(not DEV_SET.exists(), reason="needs the SQuAD v1.1 dev set (bench/dev_set.py)")
def test_bench_input_runs_at_a_tiny_size(tmp_path):
    """bench/bench_input.py on 200 questions, in-process and one worker: both results files, every figure
    filled, the projection from the one-worker run (no timing thresholds: this machine's speed says nothing)."""
    proc = subprocess.run([sys.executable, str(REPO / "bench" / "bench_input.py"), "--max_train_samples", "200",
                           "--workers", "0", "1", "--repeat", "1", "--epochs", "2",
                           "--features_cache_dir", str(tmp_path / "features"), "--out", str(tmp_path / "results")],
                          cwd=REPO, env=dict(os.environ, HF_HOME=str(tmp_path / "hf")), capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    paths = json.loads(proc.stdout.strip().splitlines()[-1])
    r, md = json.loads(open(paths["json"]).read()), open(paths["markdown"]).read()
    assert paths["json"].rsplit("/", 1)[1].startswith("input-cpu-") and paths["meets"] == r["summary"]["meets"]
    for key in ("versions", "date_utc", "command", "host", "cpu", "cores", "load_avg"):
        assert r[key], key
    assert r["command"].startswith("python bench/bench_input.py --max_train_samples 200")
    assert r["batch"] == 48 and r["in_process"]["collator"] == "BucketPaddingCollator"
    assert r["in_process"]["sampler"] == "LengthGroupedSampler" and r["features"] >= 200
    (inline,), (one,) = r["runs"]["0"], r["runs"]["1"]
    assert inline["windows"] == one["windows"] == r["features"]  # one timed epoch: every window once
    assert inline["workers_cpu_ms_per_batch"] is None and one["workers_cpu_ms_per_batch"] >= 0
    s = r["summary"]
    assert s["per_worker_basis_workers"] == 1 and s["config_workers"] == 4 and s["target"] == 5902
    assert s["projected"] == min(4 * s["per_worker"], s["main_process_ceiling"])
    assert "Projection, not a measurement" in md and "| 1 | " in md and r["versions"]["torch"] in md
