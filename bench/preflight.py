#!/usr/bin/env python
"""The GPU proof's preflight: each path that only a GPU takes, once, in well under a minute, before anything
long; and the machine's measured bf16 matmul rate, the yardstick for the achieved TFLOP/s.

    python bench/preflight.py OUT.json          # on a GPU; on a CPU the same checks at tiny size

Checks (each recorded with ok, seconds and what it found; one that fails does not stop the others):
  matmul_bf16     an 8192^3 bf16 product on random data, timed with CUDA events: TFLOP/s
  window_peak     the benchmark's timed window (bench/timed_run.py) reports its own peak memory, not the
                  warm-up's, and the run's telemetry keeps the run's
  profiler_keys   torch.profiler's table sorted by self_device_time_total (and memory)
  cuda_rng        the random generators put back by qa.evaluation.time_to_accuracy.rng_kept, CUDA's included
  sdpa_mask_bf16  sdpa_with_mask (a boolean mask, always passed) in bf16 at widths that are multiples of 8 and
                  not of 16, forward and backward, against eager attention
  eval_compile    a compiled BERT's evaluation graphs (no_grad, dynamic widths), cold, and the compile outcome
"""
import json
import sys
import tempfile
import time
import traceback
from datetime import datetime, timezone
from pathlib import Path
from types import SimpleNamespace

import torch

from qa.io import atomic_write_json

CUDA = torch.cuda.is_available()
DEVICE = torch.device("cuda" if CUDA else "cpu")


def sync():
    if CUDA:
        torch.cuda.synchronize()


def matmul_bf16():
    n = 8192 if CUDA else 512
    a, b = (torch.randn(n, n, device=DEVICE, dtype=torch.bfloat16) for _ in range(2))  # not zeros: they run faster
    for _ in range(3):
        a @ b
    sync()
    reps, started = 20 if CUDA else 3, time.perf_counter()
    if CUDA:
        begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        begin.record()
    for _ in range(reps):
        a @ b
    if CUDA:
        end.record()
        end.synchronize()
        seconds = begin.elapsed_time(end) / 1e3
    else:
        seconds = time.perf_counter() - started
    return {"size": n, "repeats": reps, "tflops": round(2 * n ** 3 * reps / seconds / 1e12, 3)}


def window_peak():
    from timed_run import TimedWindow  # the script beside this one
    from qa.training.telemetry import TelemetryCallback, _Counts

    # the benchmark's window on the run's telemetry, driven by hand: the steps' bookkeeping is tested on a CPU
    t = TelemetryCallback()
    t._cuda, t.counts, t.peak_before_reset, t.peak, t.world_size = CUDA, _Counts(), 0, None, 1
    t.shape = {"non_embedding_params": 1, "layers": 1, "hidden": 1}
    w = TimedWindow(2, 3, file=None)
    w.telemetry, w.began = t, time.perf_counter()
    args, control = SimpleNamespace(device=DEVICE), SimpleNamespace(should_training_stop=False)
    big = torch.empty(256 * 2**20, dtype=torch.uint8, device=DEVICE)  # the warm-up's 256 MiB
    del big
    w.on_step_end(args, SimpleNamespace(global_step=2), control)  # opens
    small = torch.empty(16 * 2**20, dtype=torch.uint8, device=DEVICE)
    w.on_step_end(args, SimpleNamespace(global_step=3), control)  # closes
    del small
    window = w.record["train_window_peak_memory_gib"]
    run = t._memory().get("peak_mem_gib")
    ok = not CUDA or (window < 0.2 and run >= 0.25)
    return {"window_peak_gib": window, "run_peak_gib": run, "ok": ok}


def profiler_keys():
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if CUDA else [])
    x = torch.randn(512, 512, device=DEVICE)
    with profile(activities=activities, profile_memory=True) as prof:
        (x @ x).relu().sum()
        sync()
    averages = prof.key_averages()
    time_key = "self_device_time_total" if CUDA else "self_cpu_time_total"
    memory_key = "self_device_memory_usage" if CUDA else "self_cpu_memory_usage"
    table = averages.table(sort_by=time_key, row_limit=5)
    averages.table(sort_by=memory_key, row_limit=5)
    device_us = sum(getattr(e, time_key) for e in averages)
    return {"sort_keys": [time_key, memory_key], "total_us": round(device_us, 1), "ok": device_us > 0,
            "table_head": table.splitlines()[:4]}


def cuda_rng():
    from qa.evaluation.time_to_accuracy import rng_kept

    with rng_kept():
        first = torch.rand(4, device=DEVICE)
    again = torch.rand(4, device=DEVICE)
    return {"ok": bool(torch.equal(first, again)), "device": DEVICE.type}


def _tiny_bert(attn):
    from transformers import BertConfig, BertForQuestionAnswering

    torch.manual_seed(0)
    config = BertConfig(vocab_size=512, hidden_size=128, num_hidden_layers=2, num_attention_heads=2,
                        intermediate_size=256, max_position_embeddings=512, attn_implementation=attn)
    return BertForQuestionAnswering(config).to(DEVICE)


def _batch(width, batch=4):
    ids = torch.randint(5, 500, (batch, width), device=DEVICE)
    mask = torch.ones_like(ids)
    mask[1:, width // 2:] = 0  # padding in all but the first row
    return {"input_ids": ids, "attention_mask": mask, "token_type_ids": torch.zeros_like(ids)}


def sdpa_mask_bf16():
    from qa.training.compile import keep_mask_when_compiled

    found, ok = {}, True
    dtype = torch.bfloat16
    for width in (40, 104, 200):  # multiples of 8, not of 16
        outs = []
        for attn in ("eager", "sdpa"):
            model = _tiny_bert(attn)
            if attn == "sdpa":
                keep_mask_when_compiled(model)
            batch = _batch(width)
            with torch.autocast(DEVICE.type, dtype=dtype):
                out = model(**batch, start_positions=torch.zeros(4, dtype=torch.long, device=DEVICE),
                            end_positions=torch.ones(4, dtype=torch.long, device=DEVICE))
            out.loss.backward()
            grad = model.bert.embeddings.word_embeddings.weight.grad
            outs.append((out.start_logits.float(), grad.float()))
        logits_err = ((outs[0][0] - outs[1][0]).norm() / outs[0][0].norm()).item()
        grad_err = ((outs[0][1] - outs[1][1]).norm() / outs[0][1].norm()).item()
        finite = all(torch.isfinite(t).all().item() for pair in outs for t in pair)
        found[width] = {"logits_rel_err": round(logits_err, 5), "grad_rel_err": round(grad_err, 5)}
        ok = ok and finite and logits_err < 5e-2 and grad_err < 1e-1  # bf16 against bf16: rounding, not a bug
    return {"widths": found, "ok": ok}


def eval_compile():
    from qa.training.compile import compile_outcome, configure_compile, fall_back_when_compile_fails
    from qa.training.compile import keep_mask_when_compiled

    cold = tempfile.mkdtemp(prefix="preflight-compile-")  # a compile cache of its own: this check compiles cold
    configure_compile(SimpleNamespace(compile_dynamic="true", compile_regional=False, compile_cache_dir=cold), cold)
    fall_back_when_compile_fails()
    model = _tiny_bert("sdpa").eval()
    keep_mask_when_compiled(model)
    # inductor on a GPU; on a CPU dynamo's own path alone (inductor's C++ takes most of a minute there)
    compiled = torch.compile(model, dynamic=True, backend="inductor" if CUDA else "aot_eager")
    seconds = []
    with torch.no_grad(), torch.autocast(DEVICE.type, dtype=torch.bfloat16):
        for width in (64, 136, 64):
            started = time.perf_counter()
            compiled(**_batch(width))
            sync()
            seconds.append(round(time.perf_counter() - started, 2))
    outcome = compile_outcome()
    return {"seconds_per_call": seconds, "compiled": outcome, "ok": outcome == "yes"}


CHECKS = {"matmul_bf16": matmul_bf16, "window_peak": window_peak, "profiler_keys": profiler_keys,
          "cuda_rng": cuda_rng, "sdpa_mask_bf16": sdpa_mask_bf16, "eval_compile": eval_compile}


def main(argv) -> int:
    out = Path(argv[0])
    import transformers

    record = {"date_utc": datetime.now(timezone.utc).isoformat(timespec="seconds"),
              "device": torch.cuda.get_device_name(0) if CUDA else "cpu",
              "versions": {"torch": torch.__version__, "cuda": torch.version.cuda,
                           "transformers": transformers.__version__, "python": sys.version.split()[0]},
              "checks": {}}
    for name, check in CHECKS.items():
        started = time.perf_counter()
        try:
            found = check()
            found.setdefault("ok", True)
        except Exception as err:  # recorded, and the other checks still run: finding these is the point
            found = {"ok": False, "error": f"{type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''}"[:400],
                     "traceback": traceback.format_exc()[-2000:]}
        found["seconds"] = round(time.perf_counter() - started, 2)
        record["checks"][name] = found
        print(f"[preflight] {name}: {'ok' if found['ok'] else 'FAILED'} {json.dumps(found)[:300]}", flush=True)
        atomic_write_json(out, record, indent=1)
    record["ok"] = all(c["ok"] for c in record["checks"].values())
    record["matmul_bf16_tflops"] = record["checks"]["matmul_bf16"].get("tflops")
    atomic_write_json(out, record, indent=1)
    return 0 if record["ok"] else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
