"""The scaling model (scaling/model.py) against hand-computed cases, and the prediction command
(tools/scaling_predict.py) on run folders written by qa/results/records.py's own functions.

Every expected value below is worked out by hand from the formulas in docs/scaling.md,
with round inputs so the arithmetic can be checked on paper: 1e9 bytes of gradients
(250,000,000 fp32 parameters), 10 GB/s, 4 GPUs, a 0.1 s step."""
import json
import os
import subprocess
import sys

import pytest

from scaling.bandwidth import algbw_from_busbw, busbw_from_algbw
from scaling.model import (BERT_BASE_EMBEDDING_PARAMS, BERT_BASE_QA_PARAMS, Baseline, Settings, WhatIf,
                           busbw_for_speedup, parse_shape, parse_what_if, predict, ring_allgather_s, ring_allreduce_s,
                           ring_busbw, ring_reducescatter_s)
from tests.helpers import REPO

SCRIPT = REPO / "tools" / "scaling_predict.py"

# 1e9 bytes of fp32 gradients; a tail small enough never to be the floor unless a test wants it.
BASE = Baseline(compute_s=0.1, data_s=0.0, batch=10, params=250_000_000, grad_dtype_bytes=4, tail_params=1)
NO_LATENCY = Settings(latency_s=0.0, overlap=1.0, backward_share=0.5)


def test_bert_base_counts_match_transformers():
    import torch
    from transformers import BertConfig, BertForQuestionAnswering

    with torch.device("meta"):   # shapes only: no 440 MB of weights
        model = BertForQuestionAnswering(BertConfig())
    params = dict(model.named_parameters())
    assert sum(p.numel() for p in params.values() if p.requires_grad) == BERT_BASE_QA_PARAMS == 108_893_186
    assert sum(p.numel() for k, p in params.items() if k.startswith("bert.embeddings.")) == BERT_BASE_EMBEDDING_PARAMS


# ---------------------------------------------------------------------------------------------
# Collectives


def test_ring_allreduce_hand_computed():
    # 2(n-1) = 6 latencies of 10 us, plus 2*3/4 * 1e9 B / 10e9 B/s = 0.15 s
    assert ring_allreduce_s(1e9, 4, 10, 10e-6) == pytest.approx(0.15006, rel=1e-12)
    # 3 messages pay the latency 3 times: 18 x 10 us
    assert ring_allreduce_s(1e9, 4, 10, 10e-6, messages=3) == pytest.approx(0.15018, rel=1e-12)
    # 2 ranks: 2 * 1/2 * 1e9 / 10e9 = 0.1 s
    assert ring_allreduce_s(1e9, 2, 10) == pytest.approx(0.1)


def test_allgather_and_reducescatter_are_half_an_allreduce():
    # (n-1) = 3 latencies + 3/4 * 1e9 / 10e9 = 0.075 s
    assert ring_allgather_s(1e9, 4, 10, 10e-6) == pytest.approx(0.07503, rel=1e-12)
    assert ring_reducescatter_s(1e9, 4, 10, 10e-6) == pytest.approx(0.07503, rel=1e-12)
    halves = ring_allgather_s(1e9, 4, 10) + ring_reducescatter_s(1e9, 4, 10)
    assert halves == pytest.approx(ring_allreduce_s(1e9, 4, 10))


def test_busbw_algbw_relation():
    # NCCL-tests: busbw = algbw * 2(n-1)/n
    assert busbw_from_algbw(10, 4) == pytest.approx(15)
    assert algbw_from_busbw(15, 4) == pytest.approx(10)
    assert busbw_from_algbw(10, 2) == pytest.approx(10)     # 2 ranks: the same
    assert algbw_from_busbw(10, 1) is None
    # a measured busbw plugs in: the all-reduce takes bytes / algbw
    assert ring_allreduce_s(3e9, 4, 15) == pytest.approx(3e9 / (10 * 1e9))


def test_halving_the_bytes_halves_the_communication_term():
    assert ring_allreduce_s(0.5e9, 8, 12) == pytest.approx(ring_allreduce_s(1e9, 8, 12) / 2)
    none_overlap = Settings(latency_s=0.0, overlap=0.0)
    for strategy in ("ddp", "fsdp"):
        fp32 = predict(BASE, 2, 2, strategy, WhatIf(), 10, none_overlap)
        bf16 = predict(BASE, 2, 2, strategy, WhatIf(bf16=True), 10, none_overlap)
        assert bf16["comm_total_s"] == pytest.approx(fp32["comm_total_s"] / 2)
        assert bf16["comm_exposed_s"] == pytest.approx(fp32["comm_exposed_s"] / 2)
    # DDP by hand: 1.5 * 1e9 / 10e9 = 0.15 s in fp32, 0.075 s in bf16
    assert predict(BASE, 2, 2, "ddp", WhatIf(bf16=True), 10, none_overlap)["comm_exposed_s"] == pytest.approx(0.075)
    # gradients already in bf16 do not shrink again
    half = Baseline(0.1, 0.0, 10, 250_000_000, grad_dtype_bytes=2, tail_params=1)
    assert predict(half, 2, 2, "ddp", WhatIf(bf16=True), 10, none_overlap)["comm_total_s"] == pytest.approx(0.075)


def test_which_link_a_shape_uses():
    assert ring_busbw(1, 1, 20, 12) is None
    assert ring_busbw(1, 2, 20, 12) == 20      # one node: between its GPUs
    assert ring_busbw(2, 1, 20, 12) == 12      # one GPU per node: the network only
    assert ring_busbw(2, 2, 20, 12) == 12      # both: the slower link
    assert ring_busbw(2, 2, 8, 12) == 8


# ---------------------------------------------------------------------------------------------
# Shapes


def test_ddp_hand_computed():
    # n=4, 10 GB/s: all-reduce 0.15 s; window = overlap 1 x backward 0.5 x 0.1 s = 0.05 s; exposed 0.10 s
    r = predict(BASE, 2, 2, "ddp", WhatIf(), 10, NO_LATENCY)
    assert r["comm_total_s"] == pytest.approx(0.15)
    assert r["comm_exposed_s"] == pytest.approx(0.10)
    assert r["step_s"] == pytest.approx(0.20)
    assert r["samples_per_s"] == pytest.approx(40 / 0.2)        # 4 GPUs x 10 samples
    assert r["speedup"] == pytest.approx(2.0)                  # 200 / (10 / 0.1)
    assert r["efficiency"] == pytest.approx(0.5)


def test_fsdp_hand_computed():
    # all-gather 0.075 s twice (forward, backward) + reduce-scatter 0.075 s = 0.225 s,
    # hidden behind the whole 0.1 s step: 0.125 s exposed
    r = predict(BASE, 2, 2, "fsdp", WhatIf(), 10, NO_LATENCY)
    assert r["comm_total_s"] == pytest.approx(0.225)
    assert r["comm_exposed_s"] == pytest.approx(0.125)
    assert r["speedup"] == pytest.approx((40 / 0.225) / 100)


def test_accumulation_divides_the_per_sample_communication_by_k():
    one = predict(BASE, 2, 2, "ddp", WhatIf(), 10, NO_LATENCY)
    four = predict(BASE, 2, 2, "ddp", WhatIf(accum=4), 10, NO_LATENCY)
    per_sample = one["comm_exposed_s"] / one["samples_per_step"]
    assert four["comm_exposed_s"] / four["samples_per_step"] == pytest.approx(per_sample / 4)
    total_per_sample = one["comm_total_s"] / one["samples_per_step"]
    assert four["comm_total_s"] / four["samples_per_step"] == pytest.approx(total_per_sample / 4)
    # by hand: step = 4 x 0.1 + 0.10 = 0.5 s for 160 samples: 320/s, 3.2x
    assert four["step_s"] == pytest.approx(0.5)
    assert four["speedup"] == pytest.approx(3.2)
    # FSDP still gathers the parameters every micro-batch: only the reduce-scatter is shared
    f = predict(BASE, 2, 2, "fsdp", WhatIf(accum=4), 10, NO_LATENCY)
    assert f["comm_total_s"] == pytest.approx(8 * 0.075 + 0.075)


def test_larger_batch_grows_compute_not_communication():
    r = predict(BASE, 2, 2, "ddp", WhatIf(batch_mult=2), 10, NO_LATENCY)
    assert r["comm_total_s"] == pytest.approx(0.15)
    assert r["compute_s"] == pytest.approx(0.2)
    assert r["comm_exposed_s"] == pytest.approx(0.15 - 0.5 * 0.2)
    assert r["speedup"] == pytest.approx((80 / 0.25) / 100)


def test_one_gpu_has_no_communication():
    for strategy in ("ddp", "fsdp"):
        for what in (WhatIf(), WhatIf(bf16=True), WhatIf(accum=3), WhatIf(batch_mult=2)):
            r = predict(Baseline(0.1, 0.02, 10, 250_000_000), 1, 1, strategy, what, None, Settings())
            assert r["comm_total_s"] == r["comm_exposed_s"] == 0
            assert r["speedup"] == pytest.approx(1.0) and r["efficiency"] == pytest.approx(1.0)


def test_efficiency_is_speedup_over_gpus():
    for nodes, per in ((1, 2), (2, 1), (2, 2), (4, 2), (8, 2)):
        r = predict(BASE, nodes, per, "ddp", WhatIf(), 12, Settings())
        assert r["gpus"] == nodes * per
        assert r["efficiency"] == pytest.approx(r["speedup"] / (nodes * per))


def test_data_loading_does_not_shrink():
    # 0.1 s compute + 0.02 s data on one GPU: 10 / 0.12 samples/s; with free communication,
    # n GPUs give exactly n times that
    base = Baseline(0.1, 0.02, 10, 250_000_000, tail_params=1)
    r = predict(base, 1, 2, "ddp", WhatIf(), 1e9, NO_LATENCY)
    assert r["step_s"] == pytest.approx(0.12, rel=1e-6)
    assert r["speedup"] == pytest.approx(2.0, rel=1e-6)


def test_embedding_tail_is_the_floor():
    # a 10 s step hides everything but the all-reduce of the embeddings' gradients, which are
    # complete only when backward ends: 1.5 * 23,837,184 * 4 B / 10e9 B/s
    base = Baseline(10.0, 0.0, 10, 250_000_000, tail_params=BERT_BASE_EMBEDDING_PARAMS)
    r = predict(base, 2, 2, "ddp", WhatIf(), 10, NO_LATENCY)
    assert r["comm_exposed_s"] == pytest.approx(1.5 * 23_837_184 * 4 / 10e9)
    f = predict(base, 2, 2, "fsdp", WhatIf(), 10, NO_LATENCY)   # first all-gather + last reduce-scatter
    assert f["comm_exposed_s"] == pytest.approx(2 * 0.75 * 23_837_184 * 4 / 10e9)


def test_ddp_buckets_pay_the_latency_each():
    # 1e9 B in 25 MiB buckets: ceil(1e9 / 26,214,400) = 39 calls x 6 latencies of 10 us
    r = predict(BASE, 2, 2, "ddp", WhatIf(), 10, Settings(latency_s=10e-6, overlap=0.0))
    assert r["comm_total_s"] == pytest.approx(0.15 + 39 * 6 * 10e-6)


def test_busbw_for_speedup():
    # no overlap: step = 0.1 + 1.5 / bw; speedup 2 needs 0.1 + 1.5/bw = 0.2, bw = 15 GB/s
    s = Settings(latency_s=0.0, overlap=0.0)
    assert busbw_for_speedup(BASE, 2, 2, "ddp", WhatIf(), s, 2.0) == pytest.approx(15, rel=1e-6)
    assert busbw_for_speedup(BASE, 2, 2, "ddp", WhatIf(), s, 4.0) is None     # only infinite bandwidth
    assert busbw_for_speedup(BASE, 1, 1, "ddp", WhatIf(), s, 1.0) is None


def test_parse_shape_and_what_if():
    assert parse_shape("2x2") == (2, 2) and parse_shape(" 8X2 ") == (8, 2)
    for bad in ("2", "2x", "x2", "0x2", "2x0", "2x2x2", "ax2", "-1x2"):
        with pytest.raises(ValueError):
            parse_shape(bad)
    assert parse_what_if("none") == WhatIf()
    assert parse_what_if("bf16+accum=4") == WhatIf(bf16=True, accum=4)
    assert parse_what_if("batch=2").batch_mult == 2 and parse_what_if("batch=2").name == "batch=2"
    assert WhatIf(bf16=True, accum=4, batch_mult=2).name == "bf16+accum=4+batch=2"
    for bad in ("fp8", "accum=0", "accum=x", "batch=0", "bf16=1", "accum"):
        with pytest.raises(ValueError):
            parse_what_if(bad)


# ---------------------------------------------------------------------------------------------
# The command


A100 = {"cuda_available": True, "torch_cuda": "12.8", "cudnn": 90100, "gpu_count": 1,
        "gpus": [{"name": "NVIDIA A100-PCIE-40GB", "memory_gib": 39.4}], "cpu_count": 32, "processor": "x86_64"}


def write_run(out, *, world=1, batch=16, step_mean=0.05, step_total=50.0, data_total=5.0, extra=None,
              model="google-bert/bert-base-uncased", devices=None):
    """A run folder as run_qa.py leaves it: environment.json by qa.results.records.environment_record
    (devices and versions stubbed so no GPU is needed: an A100 unless `devices` says otherwise),
    all_results.json by save_split_metrics with the telemetry callback's key names."""
    from qa.results import records

    config = {"model_name_or_path": model, "dataset_name": "rajpurkar/squad",
              "per_device_train_batch_size": batch, "gradient_accumulation_steps": 1, "bf16": False,
              "fsdp": [], "output_dir": str(out)}
    with pytest.MonkeyPatch.context() as mp:
        for k in records.SLURM_VARS + records.DIST_VARS:
            mp.delenv(k, raising=False)
        if world > 1:
            mp.setenv("WORLD_SIZE", str(world))
        mp.setattr(records, "_git_commit", lambda: "0123abcd")
        mp.setattr(records, "_versions", lambda: {"python": "3.11.7", "torch": "2.7.1"})
        mp.setattr(records, "_devices", lambda: devices or A100)
        env = records.environment_record(config)
    out.mkdir(parents=True, exist_ok=True)
    records.write_environment(out, env)
    metrics = {"train_runtime": 60.0, "train_samples_per_second": 270.0, "train_loss": 1.1, "epoch": 2.0}
    if step_mean is not None:
        metrics.update({"train_step_time_mean_s": step_mean, "train_step_time_total_s": step_total,
                        "train_data_time_total_s": data_total, "train_data_loading_share": 0.09})
    metrics.update(extra or {})
    records.save_split_metrics(out, "train", metrics)
    records.finish_run(out, 70.0, env)
    return out


def predict_cli(*args):
    env = dict(os.environ, PYTHONPATH=str(REPO))
    return subprocess.run([sys.executable, str(SCRIPT), *map(str, args)], capture_output=True, text=True,
                          env=env, cwd=REPO, timeout=120)


def table_rows(stdout):
    return [line for line in stdout.splitlines() if line.startswith("| ") and not line.startswith("| shape")]


def test_cli_prints_a_row_per_shape_strategy_and_what_if(tmp_path):
    run = write_run(tmp_path / "one-gpu")
    res = predict_cli(run, "--shapes", "1x2 2x2", "4x2", "--strategies", "ddp", "fsdp", "--what_if", "none", "bf16",
                      "--intra_busbw", 20, "--inter_busbw", 10, "--json", tmp_path / "pred.json")
    assert res.returncode == 0, res.stderr
    rows = table_rows(res.stdout)
    assert len(rows) == 1 + 3 * 2 * 2          # the 1-GPU baseline, then shapes x strategies x what-ifs
    cells = [[c.strip() for c in row.strip("|").split("|")] for row in rows]
    assert cells[0][:4] == ["1x1", "1", "-", "none"]
    assert {(c[0], c[2], c[3]) for c in cells[1:]} == {(s, st, w) for s in ("1x2", "2x2", "4x2")
                                                       for st in ("ddp", "fsdp") for w in ("none", "bf16")}
    assert "busbw 20 GB/s: given" in res.stdout and "busbw 10 GB/s: given" in res.stdout
    assert "ASSUMPTION intra-node busbw" not in res.stdout and "ASSUMPTION inter-node busbw" not in res.stdout
    assert "ASSUMPTION latency 10 us" in res.stdout     # not given: marked

    pred = json.loads((tmp_path / "pred.json").read_text())
    # 1 GPU: 50 ms step + 5 s data over 1,000 steps = 5 ms; 16 / 0.055 samples/s
    assert pred["baseline"]["samples_per_s"] == pytest.approx(16 / 0.055)
    assert pred["baseline"]["params"] == 108_893_186      # not recorded: bert-base's QA model
    row = next(r for r in pred["rows"] if (r["shape"], r["strategy"], r["what_if"]) == ("2x2", "ddp", "none"))
    # by hand: 435,572,744 B; 17 buckets of 25 MiB; n=4 over 10 GB/s
    total = 1.5 * 435_572_744 / 10e9 + 17 * 6 * 10e-6
    exposed = total - (2 / 3) * 0.05
    step = 0.05 + 0.005 + exposed
    assert row["busbw_GBps"] == 10
    assert row["comm_total_s"] == pytest.approx(total)
    assert row["comm_exposed_s"] == pytest.approx(exposed)
    assert row["speedup"] == pytest.approx((64 / step) / (16 / 0.055))
    assert row["efficiency"] == pytest.approx(row["speedup"] / 4)
    intra = next(r for r in pred["rows"] if r["shape"] == "1x2")
    assert intra["busbw_GBps"] == 20


def test_cli_uses_recorded_gradient_size(tmp_path):
    run = write_run(tmp_path / "one-gpu", extra={"train_trainable_params": 1_000_000, "train_grad_dtype": "bfloat16",
                                                 "train_grad_bytes": 2_000_000})
    res = predict_cli(run, "--shapes", "2x1", "--strategies", "ddp", "--what_if", "none", "--json", tmp_path / "p.json")
    assert res.returncode == 0, res.stderr
    pred = json.loads((tmp_path / "p.json").read_text())
    assert pred["baseline"]["grad_bytes"] == 2_000_000
    row = pred["rows"][0]
    # 2 GPUs over the network, default 12 GB/s: 1 x 2e6 / 12e9 + 2 latencies; 1 bucket
    assert row["comm_total_s"] == pytest.approx(2e6 / 12e9 + 2 * 10e-6)
    assert "ASSUMPTION inter-node busbw 12 GB/s" in res.stdout
    assert "https://github.com/NVIDIA/nccl-tests/issues/29" in res.stdout


def test_cli_calibration_run_gives_the_bandwidths(tmp_path):
    run = write_run(tmp_path / "one-gpu")
    cal = write_run(tmp_path / "ddp-2x2", world=4, extra={
        "comm_world_size": 4, "comm_nodes": 2, "comm_allreduce_bytes": 435_572_744, "comm_allreduce_s": 0.0688,
        "comm_allreduce_algbw_GBps": 6.33, "comm_allreduce_busbw_GBps": 9.5, "comm_intranode_busbw_GBps": 18.0})
    res = predict_cli(run, "--calibration", cal, "--shapes", "1x2 2x2", "--strategies", "ddp", "--what_if", "none")
    assert res.returncode == 0, res.stderr
    cells = [[c.strip() for c in row.strip("|").split("|")] for row in table_rows(res.stdout)]
    assert {c[0]: c[4] for c in cells[1:]} == {"1x2": "18", "2x2": "9.5"}
    assert "measured (comm_allreduce_busbw_GBps" in res.stdout
    assert "ASSUMPTION intra-node busbw" not in res.stdout and "ASSUMPTION inter-node busbw" not in res.stdout


def test_cli_without_a_run_folder():
    res = predict_cli("--samples_per_s", 275, "--batch", 12, "--shapes", "2x2", "--strategies", "ddp",
                      "--what_if", "none", "--target_speedup", 2)
    assert res.returncode == 0, res.stderr
    rows = table_rows(res.stdout)
    assert rows[0].split("|")[6].strip() == "43.6"      # 12 / 275 s
    assert len(rows) == 2 and "busbw for 2x" in res.stdout


@pytest.mark.parametrize("case", ["missing_folder", "no_step_time", "bad_shape", "bad_what_if", "multi_gpu_run",
                                  "run_and_flags", "no_input", "bad_number", "bad_strategy", "bad_calibration"])
def test_cli_bad_input_is_one_error_line(tmp_path, case):
    good = write_run(tmp_path / "good")
    args = {
        "missing_folder": [tmp_path / "nowhere"],
        "no_step_time": [write_run(tmp_path / "untimed", step_mean=None)],
        "bad_shape": [good, "--shapes", "2x2 2by2"],
        "bad_what_if": [good, "--what_if", "fp8"],
        "multi_gpu_run": [write_run(tmp_path / "ddp", world=4)],
        "run_and_flags": [good, "--step_time", 0.1],
        "no_input": [],
        "bad_number": [good, "--inter_busbw", "-3"],
        "bad_strategy": [good, "--strategies", "zero3"],
        "bad_calibration": [good, "--calibration", good],
    }[case]
    res = predict_cli(*args)
    assert res.returncode == 2, (res.stdout, res.stderr)
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), res.stderr
    assert res.stdout == ""
    if case == "bad_shape":
        assert "2by2" in lines[0]
    if case == "no_step_time":
        assert "train_step_time_mean_s" in lines[0]
    if case == "multi_gpu_run":
        assert "WORLD_SIZE" in lines[0]


# ---------------------------------------------------------------------------------------------
# The run's own model and device


def _embedding_block_params(config):
    """The embedding block's parameters as transformers builds the model (shapes only)."""
    import torch
    from transformers import BertModel

    with torch.device("meta"):
        model = BertModel(config)
    return sum(p.numel() for p in model.embeddings.parameters())


def test_embedding_params_from_the_model_config():
    from transformers import BertConfig

    from qa.model import bundled_minilm_dir
    from scaling.baseline import embedding_params

    minilm = json.loads((bundled_minilm_dir() / "config.json").read_text())
    assert embedding_params(minilm) == _embedding_block_params(BertConfig(**minilm)) == 11_918_592
    assert embedding_params(BertConfig().to_dict()) == BERT_BASE_EMBEDDING_PARAMS
    assert embedding_params({"hidden_size": 8}) is None


@pytest.mark.parametrize("where", ["run folder", "bundled model"])
def test_cli_reads_the_embedding_size_of_the_runs_model(tmp_path, where):
    """MiniLM (22.6 M parameters, 11.9 M of them in the embedding block): the tail all-reduced
    after backward is its embedding block, from the config.json the run saved or, without one,
    from the model it started from; not bert-base's 23.8 M, which is more than its whole model."""
    from qa.model import bundled_minilm_dir

    config = bundled_minilm_dir() / "config.json"
    if where == "run folder":
        run = write_run(tmp_path / "run", model="some/hub-id", extra={"train_trainable_params": 22_566_146})
        (run / "config.json").write_text(config.read_text())
    else:
        run = write_run(tmp_path / "run", model="bundled:minilm", extra={"train_trainable_params": 22_566_146})
    res = predict_cli(run, "--shapes", "2x1", "--strategies", "ddp", "--what_if", "none", "--json", tmp_path / "p.json")
    assert res.returncode == 0, res.stderr
    pred = json.loads((tmp_path / "p.json").read_text())
    assert pred["baseline"]["tail_params"] == 11_918_592 and pred["baseline"]["params"] == 22_566_146
    line = next(x for x in pred["inputs"] if x.startswith("embedding gradients"))
    assert "11,918,592" in line and "30,522 words" in line and "x 384" in line, line
    # no config to read: bert-base's block, said to be assumed
    bare = write_run(tmp_path / "bare", extra={"train_trainable_params": 22_566_146})
    res = predict_cli(bare, "--shapes", "2x1", "--strategies", "ddp", "--what_if", "none")
    assert res.returncode == 0, res.stderr
    assert "embedding gradients 23,837,184 parameters: the model's config.json was not found" in res.stdout


CPU = {"cuda_available": False, "torch_cuda": None, "cudnn": None, "gpu_count": 0, "gpus": [], "cpu_count": 2,
       "processor": "x86_64"}


def test_cli_refuses_a_cpu_baseline_unless_asked(tmp_path):
    run = write_run(tmp_path / "cpu", devices=CPU)
    res = predict_cli(run, "--shapes", "2x2", "--strategies", "ddp", "--what_if", "none")
    assert res.returncode == 2 and res.stdout == ""
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"error: {run / 'environment.json'}: the run trained on a CPU")
    assert "--cpu_baseline" in lines[0]

    res = predict_cli(run, "--shapes", "2x2", "--strategies", "ddp", "--what_if", "none", "--cpu_baseline",
                      "--json", tmp_path / "p.json")
    assert res.returncode == 0, res.stderr
    before_table = res.stdout.split("| shape |")[0]
    assert "NOTE: the baseline ran on a CPU (2 cores), not a GPU" in before_table
    assert "1 CPU process:" in res.stdout and "1 GPU:" not in res.stdout
    pred = json.loads((tmp_path / "p.json").read_text())
    assert pred["baseline"]["on_cpu"] is True and pred["notes"][0].startswith("NOTE: the baseline ran on a CPU")
    # a GPU run has no note
    gpu = predict_cli(write_run(tmp_path / "gpu"), "--shapes", "2x2", "--strategies", "ddp", "--what_if", "none")
    assert gpu.returncode == 0 and "NOTE" not in gpu.stdout and "device: NVIDIA A100-PCIE-40GB" in gpu.stdout
