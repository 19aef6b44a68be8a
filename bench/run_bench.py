#!/usr/bin/env python
"""Training speed: the reference configuration, the same in bf16, and the fast path, on the
same machine, the same data and the same model shape, in one invocation.

    python bench/run_bench.py --size gpu      # bert-base shape, 384/128, on a GPU node
    python bench/run_bench.py --size cpu      # small shape, 128/32, a few minutes on 2 cores

Variants (each a fresh `run_qa.py` process through bench/timed_run.py, which adds the benchmark's
own timed window and stops training when it closes; every figure comes from the code users run:
the Trainer with the project's features, collator, sampler, and the run's own telemetry, whose
counts the window reads at its edges (bench_window.json: the counts and seconds compared here):

- `reference`: what the well-known Hugging Face example does: every feature padded to
  max_seq_length, batch 12, lr 3e-5, fp32 (TF32 left at torch's default, off), the library's
  default attention kernel and optimizer;
- `reference_bf16`: the same with `--bf16 true`;
- `fast`: configs/fast.json's switches (on a CPU without TF32 and, unless --cpu_compile, without
  torch.compile, whose compilation takes minutes there);
- `fast_no_instruments`: `fast` with every instrument off (telemetry, time to accuracy, the
  preemption agreement, the console's log printer): what they cost, from the benchmark's own
  window (steps/s), beside `fast` in the same run and repeats (`instruments_off` in the report);
- opt-in (`--variants`): `fast_no_compile`; `fast_static64` (lengths padded to multiples of
  64, one static graph per length: the alternative to dynamic-shape compilation); `fast_cudagraphs`
  (`fast_whole_model` with torch.compile's reduce-overhead mode: CUDA graphs replay each step's kernels,
  against the host overhead the GPU profile showed); `fast_b128`,
  `fast_b256` (larger batches, the lr by the square-root rule); `fast_whole_model` (the whole model compiled as
  one graph instead of each encoder layer, over six fixed widths and full batches: fewer compiled calls, and their
  guards, per step).

The model is randomly initialised (the bert-base shape costs exactly what the pretrained model
costs; no download). Each variant trains WARMUP steps (compilation, DataLoader start-up, cuDNN
and allocator warm-up), then a timed window of steps that covers the same number of samples
for every variant, and lasts at least `window_min_s` seconds where the size sets one (GPU: 20 s;
a faster variant's window then holds more samples). A compiled variant compiles every batch
shape before its first step (--compile_warmup); the compilations that happen inside a window
anyway are counted (`compiles_in_window`, per variant and per repeat) and such a window is
marked, its ratios not reported. Reported per variant: samples/s (features = windows, as the Trainer
counts), real (non-padding) tokens/s, MFU on real tokens (6 x non-embedding parameters FLOPs
per real token, the issue's definition, against the device's dense bf16 peak for every variant,
one yardstick; null on a CPU unless --peak_tflops), peak memory, the projected time of 2 epochs
of SQuAD v1.1 (88,524 training features at 384/128) at the measured real-token rate, and the
fast/reference ratios (other fast variants also against fast); with `--profile_steps N`, the share of
the N steps before the window in which the GPU was busy, and the shares of their host time spent waiting
for the device and for the next batch, from torch.profiler's trace.
Results: bench/results/bench-<size>-<device>-<time>.json and .md.
"""
import argparse
import json
import math
import os
import platform
import shlex
import shutil
import statistics
import subprocess
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

from dev_set import require_squad_dev, squad_dev_path  # the script beside this one
from qa.arguments import to_flags
from qa.errors import command
from qa.io import atomic_write_json, atomic_write_text, read_json
from qa.model import build_random_bert
from qa.training.flops import mfu, model_flops, peak_flops

REPO = Path(__file__).resolve().parents[1]

RESULTS = REPO / "bench" / "results"
FAST_CONFIG = REPO / "configs" / "fast.json"

SQUAD_TRAIN_QUESTIONS = 87_599
SQUAD_TRAIN_FEATURES_384 = 88_524  # at max_seq_length 384, doc_stride 128, bert-base-uncased vocabulary
EPOCHS = 2

# window_min_s: each timed window lasts at least this long (it stays open past its samples; the
# run then stops). On a GPU the fast path's 7,200 samples take about 2 s, too short to read
# reliably; the fp32 reference needs tens of seconds for them anyway, so it is not made longer.
SIZES = {
    "gpu": dict(model=dict(hidden_size=768, num_hidden_layers=12, num_attention_heads=12, intermediate_size=3072),
                max_seq_length=384, doc_stride=128, max_query_length=64, max_train_samples=None,
                warmup_steps=30, timed_samples=7200, window_min_s=20.0, repeat=1),
    "cpu": dict(model=dict(hidden_size=128, num_hidden_layers=2, num_attention_heads=2, intermediate_size=512),
                max_seq_length=128, doc_stride=32, max_query_length=32, max_train_samples=600,
                warmup_steps=2, timed_samples=192, window_min_s=None, repeat=3),
}
# With a minimum window duration, --max_steps only bounds the run (it stops when its window
# closes): room for this many times the window's steps.
MIN_S_STEP_ROOM = 50

REFERENCE = {"per_device_train_batch_size": 12, "learning_rate": 3e-5, "pad_to_max_length": True}
# Keys of configs/fast.json that describe the job rather than how fast it runs.
JOB_KEYS = {"_comment", "model_name_or_path", "dataset_name", "train_file", "validation_file", "do_train", "do_eval",
            "do_predict", "output_dir", "num_train_epochs", "max_steps", "save_strategy", "save_steps",
            "save_total_limit", "logging_steps", "eval_strategy", "report_to", "max_seq_length", "doc_stride",
            "max_query_length", "per_device_eval_batch_size", "seed"}
DEFAULT_VARIANTS = ("reference", "reference_bf16", "fast", "fast_no_instruments")
# Every instrument off (no --eval_every either): the run as a bare Trainer would train it.
NO_INSTRUMENTS = {"telemetry": False, "checkpoint_on_sigterm": False, "log_lines": False}
# Larger batches: fast computes about 8k real tokens a step, little for an H100. The learning rate
# follows the square-root rule (Malladi et al. 2022) from fast's measured point (batch 48, lr 1e-4).
BATCH_VARIANTS = {"fast_b128": 128, "fast_b256": 256}
# Fixed widths: one CUDA graph recorded for each (pytorch#188150: a graph per new shape) from one compiled graph with
# symbolic lengths; the 6 widths in multiples of 16 that compute the fewest tokens on SQuAD dev (bench/bench_widths.py:
# 12.6% padding, 1.10x the tokens of fast.json's multiples of 8)
STATIC_WIDTHS = [128, 160, 192, 224, 288, 384]
WHOLE_MODEL_STATIC = dict(length_buckets=STATIC_WIDTHS, compile_regional=False)
EXTRA_VARIANTS = ("fast_no_compile", "fast_static64", "fast_cudagraphs", "fast_whole_model", *BATCH_VARIANTS)


def sqrt_rule_lr(batch: int, base_batch: int, base_lr: float) -> float:
    return float(f"{base_lr * math.sqrt(batch / base_batch):.2g}")


def data_source(path) -> str:
    """The training data as a report names it: the file's name and the start of its SHA-256 (the
    same data wherever it lies; the folder is this machine's business), or 'synthetic'."""
    if path is None:
        return "synthetic"
    import hashlib

    digest = hashlib.sha256(Path(path).read_bytes()).hexdigest()[:16]
    return f"{Path(path).name} (sha256 {digest}...)"


def fast_switches() -> dict:
    config = read_json(FAST_CONFIG)
    return {k: v for k, v in config.items() if k not in JOB_KEYS}


def variant_settings(name: str, on_gpu: bool, cpu_compile: bool) -> tuple:
    """-> (run_qa settings of the variant, notes on what was changed for this device)."""
    notes = []
    if name == "reference":
        return dict(REFERENCE), notes
    if name == "reference_bf16":
        return {**REFERENCE, "bf16": True}, notes
    settings = fast_switches()
    if name == "fast_no_compile":
        settings.update(torch_compile=False)
        settings.pop("compile_warmup", None)
    elif name == "fast_static64":
        settings.update(pad_to_multiple_of=64, compile_dynamic="false")
    elif name == "fast_cudagraphs":  # CUDA graphs need static shapes; per-layer graphs overwrite each other's outputs
        settings.update(WHOLE_MODEL_STATIC, torch_compile_mode="reduce-overhead")
    elif name == "fast_whole_model":
        settings.update(WHOLE_MODEL_STATIC)
    elif name == "fast_no_instruments":
        settings.update(NO_INSTRUMENTS)
    elif name in BATCH_VARIANTS:
        batch = BATCH_VARIANTS[name]
        settings.update(per_device_train_batch_size=batch, learning_rate=sqrt_rule_lr(
            batch, settings["per_device_train_batch_size"], settings["learning_rate"]))
    elif name != "fast":
        raise SystemExit(f"unknown variant {name!r}: choose from {DEFAULT_VARIANTS + EXTRA_VARIANTS}")
    if not on_gpu:
        if settings.pop("tf32", None):
            notes.append("tf32 dropped (no TF32 on a CPU)")
        if settings.get("torch_compile") and not cpu_compile:
            settings["torch_compile"] = False
            settings.pop("compile_warmup", None)
            notes.append("torch_compile off on CPU (pass --cpu_compile to include its minutes of compilation)")
        if (settings.get("dataloader_num_workers") or 0) > 1 and (os.cpu_count() or 1) <= 4:
            settings["dataloader_num_workers"] = 1
            notes.append("dataloader_num_workers 1 (few CPU cores, shared with the model)")
    return settings, notes


def fit_widths(settings: dict, longest: int) -> None:
    """A variant's fixed widths at a size's max_seq_length: those below it, and it."""
    if settings.get("length_buckets"):
        settings["length_buckets"] = [b for b in settings["length_buckets"] if b < longest] + [longest]


def _device_name():
    import torch

    if torch.cuda.is_available():
        return torch.cuda.get_device_name(0), True
    return f"CPU {platform.processor() or platform.machine()} x{os.cpu_count()}", False


def _slug(text: str) -> str:
    return "".join(c if c.isalnum() else "-" for c in text.lower()).strip("-").replace("--", "-")[:40]


def run_variant(name, args, size, model_dir, work, on_gpu, peak, log, extra_args=()):
    settings, notes = variant_settings(name, on_gpu, args.cpu_compile)
    fit_widths(settings, size["max_seq_length"])
    # every variant sets its batch (REFERENCE, configs/fast.json): nothing falls back to a default
    batch = int(settings["per_device_train_batch_size"]) * int(settings.get("gradient_accumulation_steps", 1))
    timed = max(1, math.ceil(args.timed_samples / batch))
    steps = f"{args.warmup_steps}:{args.warmup_steps + timed}"
    profile, max_steps = [], args.warmup_steps + timed
    if args.window_min_s:
        steps += f":{args.window_min_s:g}"
        max_steps = args.warmup_steps + timed * MIN_S_STEP_ROOM
    if args.profile_steps and settings.get("telemetry") is not False:  # the steps just before the window
        profile = ["--profile", "true", "--profile_wait", str(args.warmup_steps - args.profile_steps - 1),
                   "--profile_warmup", "1", "--profile_active", str(args.profile_steps), "--profile_repeat", "1"]
    out = work / "runs" / name
    shutil.rmtree(out, ignore_errors=True)
    data = (["--train_file", str(args.train_file)] if args.train_file else ["--dataset_name", args.dataset_name])
    if args.max_train_samples:
        data += ["--max_train_samples", str(args.max_train_samples)]
    if args.dataset_name == "synthetic" and not args.train_file:
        data += ["--synthetic_train_examples", str(args.synthetic_examples)]
    argv = [
        "--model_name_or_path", str(model_dir), *data, "--do_train",
        "--max_seq_length", str(size["max_seq_length"]), "--doc_stride", str(size["doc_stride"]),
        "--max_query_length", str(size["max_query_length"]),
        "--max_steps", str(max_steps), *profile,
        "--output_dir", str(out), "--resume", "never",
        "--report_to", "none", "--save_strategy", "no", "--logging_steps", "100000", "--disable_tqdm", "true",
        "--seed", "42", "--features_cache_dir", str(work / "features"),
        *to_flags(settings), *extra_args,
    ]
    if peak:  # one yardstick for every variant: the device's dense bf16 peak
        argv += ["--peak_tflops", f"{peak / 1e12:g}"]
    if not on_gpu:
        argv += ["--use_cpu", "true"]
    env = dict(os.environ, HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1", PYTHONUNBUFFERED="1")
    if not on_gpu and args.cpu_threads:
        env["OMP_NUM_THREADS"] = str(args.cpu_threads)
    log(f"[{name}] {args.warmup_steps} warm-up + {timed} timed steps of {batch}"
        f"{f' (at least {args.window_min_s:g} s)' if args.window_min_s else ''}: "
        f"python bench/timed_run.py {steps} {' '.join(shlex.quote(a) for a in argv)}")
    started = time.perf_counter()
    with open(work / f"log-{name}.txt", "w") as logfile:
        proc = subprocess.run([sys.executable, str(REPO / "bench" / "timed_run.py"), steps, *argv], cwd=REPO, env=env,
                              stdout=logfile, stderr=subprocess.STDOUT)
    wall = time.perf_counter() - started
    results_file, window_file = out / "all_results.json", out / "bench_window.json"
    if proc.returncode != 0 or not results_file.exists():
        raise VariantFailed(f"exit status {proc.returncode}", work / f"log-{name}.txt")
    if not window_file.exists():
        raise VariantFailed("it ended before its timed window closed", work / f"log-{name}.txt")
    results = {**read_json(results_file), **read_json(window_file)}  # the run's figures and its window's
    if settings.get("torch_compile") and results.get("compiled") != "yes":  # eager figures under a compiled name
        raise VariantFailed(f"torch.compile {results.get('compiled') or 'not recorded'}", work / f"log-{name}.txt")
    environment = read_json(out / "environment.json")
    for f in out.glob("*.safetensors"):  # the trained weights are of no use here
        f.unlink()
    return {"settings": settings, "notes": notes, "run_qa_args": argv, "results": results,
            "environment": environment, "threads": env.get("OMP_NUM_THREADS"), "process_wall_s": round(wall, 1)}


class VariantFailed(Exception):
    """A variant that gave no figure: why, and its log (the report keeps the log's tail)."""

    def __init__(self, why, log_file):
        super().__init__(why)
        self.record = {"why": why, "log_tail": Path(log_file).read_text(errors="replace")[-3000:]}


def window_rate(raw) -> float:
    r = raw["results"]
    return r["train_window_samples"] / r["train_window_seconds"]


def window_compiles(raw):
    """Compilations inside the run's timed window (None: not counted)."""
    return raw["results"].get("train_window_compiles")


def median_run(runs: list) -> tuple:
    """-> (index of the run to report, why). The median by samples/s of the runs whose window
    compiled nothing; of all runs when every window compiled (the report marks them)."""
    rate = [window_rate(r) for r in runs]
    clean = [i for i, r in enumerate(runs) if window_compiles(r) == 0]
    pool = clean or list(range(len(runs)))
    pick = sorted(pool, key=rate.__getitem__)[len(pool) // 2]
    if len(clean) == len(runs):
        return pick, "median of all runs"
    if clean:
        return pick, f"median of the {len(clean)} of {len(runs)} runs without compilation in the window"
    return pick, "every run compiled inside its window"


def device_of(raw) -> dict:
    """The device a variant ran on, from its environment.json."""
    devices = raw["environment"]["devices"]
    if devices["gpus"]:
        gpu = devices["gpus"][0]
        return {"kind": "cuda", "name": gpu["name"], "memory_gib": gpu["memory_gib"], "count": devices["gpu_count"]}
    return {"kind": "cpu", "name": f"CPU: {devices['processor']}", "cores": devices["cpu_count"],
            "torch_threads": raw["threads"]}


def model_of(results) -> dict:
    return {"non_embedding_params": results["train_non_embedding_params"],
            "params": results["train_trainable_params"], "layers": results["train_layers"],
            "hidden": results["train_hidden_size"]}


def summarise(name, raw, size, peak_flops_per_s):
    res = raw["results"]
    s = res["train_window_seconds"]
    m = model_of(res)
    real, sum_sq = res["train_window_real_tokens"], res["train_window_sum_sq_lengths"]
    real_per_s = real / s
    mean_real = res.get("train_mean_real_tokens")
    features, questions = res.get("train_features"), res.get("train_examples")
    if size["max_seq_length"] == 384 and size["doc_stride"] == 128:
        train_features, basis = SQUAD_TRAIN_FEATURES_384, "88,524 features (384/128)"
    else:
        train_features = round(SQUAD_TRAIN_QUESTIONS * features / questions)
        basis = (f"{train_features:,} features: 87,599 questions x {features / questions:.3f} windows per question "
                 f"at {size['max_seq_length']}/{size['doc_stride']} (as in the benchmark data)")
    projected = EPOCHS * train_features * mean_real / real_per_s if mean_real else None
    # The project's target is MFU on real tokens at 6 FLOPs per non-embedding parameter; the run's
    # telemetry also counts the attention scores (12 L H s per token).
    flops_6n = model_flops(m["non_embedding_params"], m["layers"], m["hidden"], real, 0)
    flops_attn = model_flops(m["non_embedding_params"], m["layers"], m["hidden"], real, sum_sq)
    mfu_6n, mfu_attn = mfu(flops_6n, s, peak_flops_per_s), mfu(flops_attn, s, peak_flops_per_s)
    setup = res.get("train_setup") or {}
    return {
        "samples_per_second": round(res["train_window_samples"] / s, 2),
        "real_tokens_per_second": round(real_per_s, 1),
        # The timed window of a length-grouped run can hold longer (or shorter) features than the
        # data's average (the first group of batches is sorted longest first): samples/s at the
        # data's mean length is the comparable figure.
        "samples_per_second_at_mean_length": round(real_per_s / mean_real, 2) if mean_real else None,
        "token_positions_per_second": round(res["train_window_batch_tokens"] / s, 1),
        "padding_fraction": round(1 - real / res["train_window_batch_tokens"], 4),
        "tflops_per_second_real_6n": round(flops_6n / s / 1e12, 3),
        "mfu_real": None if mfu_6n is None else round(mfu_6n, 4),
        "mfu_real_with_attention": None if mfu_attn is None else round(mfu_attn, 4),
        "peak_memory_gib": res.get("train_window_peak_memory_gib"),
        "peak_rss_gib": res.get("train_window_peak_rss_gib"),
        "projected_2_epochs_s": round(projected, 1) if projected else None,
        "projection_basis": basis,
        "timed_steps": res["train_window_steps"], "timed_samples": res["train_window_samples"],
        "timed_seconds": round(s, 3), "warmup_steps": res["train_window_first_step"] - 1,
        # the window's clock starts at the first step: a compile warm-up before it is added
        "warmup_s": res.get("train_window_warmup_s", 0) + res.get("compile_warmup_s", 0),
        "first_step_s": res.get("train_first_step_s"),
        "process_wall_s": raw["process_wall_s"],
        "wall_clock_breakdown": res.get("wall_clock_breakdown"),
        "device_busy_share": res.get("train_profile_device_busy_share"),
        "host_waits": res.get("train_profile_host_waits"),
        "compile": setup.get("compile"),
        "compiled": res.get("compiled"),  # the run's own verdict from dynamo's counters (None: not compiled)
        "cuda_graphs": res.get("cuda_graphs"),  # whether the CUDA graphs asked for ran (None: not asked)
        "compiles_in_window": res.get("train_window_compiles"),
        "recompiles_in_window": res.get("train_window_recompiles"),
        "compile_warmup_s": res.get("compile_warmup_s"),
        "window_min_s": res.get("train_window_min_s"),
        "repeat_samples_per_second": raw.get("repeat_samples_per_second"),
        "repeat_compiles_in_window": raw.get("repeat_compiles_in_window"),
        "reported_run": raw.get("reported_run"),
        "used": setup,
        "settings": raw["settings"], "notes": raw["notes"],
        "data": {"train_questions": questions, "train_features": features, "mean_real_tokens": mean_real},
    }


def instruments_off(runs: dict):
    """What the instruments cost: steps/s of `fast` with and without them, both from the
    benchmark's own window (bench/timed_run.py), median of the repeats; None unless both ran."""
    if not (runs.get("fast") and runs.get("fast_no_instruments")):
        return None
    rates = {name: [round(r["results"]["train_window_steps"] / r["results"]["train_window_seconds"], 3)
                    for r in runs[name]]
             for name in ("fast", "fast_no_instruments")}
    on, off = (statistics.median(rates[name]) for name in ("fast", "fast_no_instruments"))
    return {"steps_per_second_with": on, "steps_per_second_without": off, "without_over_with": round(off / on, 3),
            "repeat_steps_per_second_with": rates["fast"],
            "repeat_steps_per_second_without": rates["fast_no_instruments"],
            "instruments_off": sorted(NO_INSTRUMENTS)}


def compiled_in_window(variant: dict) -> bool:
    """Whether the reported window timed a compilation (or could not tell): not a training speed."""
    return variant.get("compiles_in_window") != 0


def ratios(variants: dict) -> dict:
    """fast*/reference* speed ratios; `compiled_in_window` marks a pair of which either window
    timed a compilation: such a ratio is no result."""
    out = {}
    for fast in [v for v in variants if v.startswith("fast") and v != "fast_no_instruments"]:
        for ref in ("reference", "reference_bf16", *(("fast",) if fast != "fast" else ())):
            if ref in variants:
                a, b = variants[fast], variants[ref]
                out[f"{fast}/{ref}"] = {
                    "compiled_in_window": compiled_in_window(a) or compiled_in_window(b),
                    "samples_per_second": round(a["samples_per_second"] / b["samples_per_second"], 3),
                    "real_tokens_per_second": round(a["real_tokens_per_second"] / b["real_tokens_per_second"], 3),
                    "samples_per_second_at_mean_length": round(
                        a["real_tokens_per_second"] / b["real_tokens_per_second"], 3),
                }
    return out


def build_report(runs: dict, failed: dict, c: dict) -> dict:
    """The report of what has run so far: the variants with figures, the failed ones with why."""
    import torch
    import transformers

    args, size = c["args"], c["size"]
    raw = {}
    for name, rs in runs.items():
        if name == "fast_no_instruments" or not rs:  # no telemetry: only the benchmark's own window (instruments_off)
            continue
        pick, why = median_run(rs)
        raw[name] = {**rs[pick], "repeat_samples_per_second": [round(window_rate(r), 2) for r in rs],
                     "repeat_compiles_in_window": [window_compiles(r) for r in rs],
                     "reported_run": {"index": pick, "why": why}}
    summaries = {name: summarise(name, r, size, c["peak"]) for name, r in raw.items()}
    first = next(iter(raw.values()), None)
    env = first["environment"] if first else {}
    return {
        "benchmark": "bench/run_bench.py",
        "size": args.size,
        "command": c["command"],
        "date_utc": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "host": platform.node(),
        "device": device_of(first) if first else {"kind": "cuda" if c["on_gpu"] else "cpu", "name": _device_name()[0]},
        "gpu_available": c["on_gpu"],
        "peak": {"tflops": c["peak"] / 1e12 if c["peak"] else None, "source": c["peak_source"], "precision": "bf16"},
        "versions": {"python": platform.python_version(), "torch": torch.__version__,
                     "transformers": transformers.__version__, "cuda": torch.version.cuda,
                     **{k: v for k, v in env.get("versions", {}).items() if k not in ("python", "torch", "transformers")}},
        "git_commit": env.get("git_commit"),
        "load_avg": {"before": [round(x, 2) for x in c["load_before"]],
                     "after": [round(x, 2) for x in os.getloadavg()]},
        "model": {**model_of(first["results"]), "random_init": True} if first else None,
        "data": {"source": data_source(args.train_file),
                 "max_seq_length": size["max_seq_length"], "doc_stride": size["doc_stride"],
                 "max_query_length": size["max_query_length"],
                 **(summaries[next(iter(summaries))]["data"] if summaries else {})},
        "variants": summaries,
        "failed": failed,
        "window": {"warmup_steps": args.warmup_steps, "timed_samples": args.timed_samples,
                   "min_s": args.window_min_s or None},
        "ratios": ratios(summaries),
        "instruments_off": instruments_off(runs),
    }


def failed_lines(report: dict) -> list:
    return [f"- **{name} failed**: {r['why']} (no figure; the log's tail is in the JSON)"
            for name, r in (report.get("failed") or {}).items()]


def markdown(report: dict) -> str:
    v = report["variants"]
    if not v:
        return "\n".join([f"# Training speed: {report['size']} size on {report['device']['name']}", "",
                          f"{report['date_utc']}; `{report['command']}`: no variant has a figure yet.", "",
                          *failed_lines(report), ""])

    def f(x, fmt="{:,.1f}", none="n/a"):
        return none if x is None else fmt.format(x)

    def host_waits(w):
        if not w or "why" in w:
            return "-"
        return (f"{w['device_wait_share']:.0%} / {w['data_wait_share']:.0%}, {w['launches_per_step']:,.0f}, "
                f"{w['step_ms']:,.1f} ms")

    lines = [f"# Training speed: {report['size']} size on {report['device']['name']}", "",
             f"{report['date_utc']} on `{report['host']}`; "
             f"torch {report['versions'].get('torch')}, transformers {report['versions'].get('transformers')}, "
             f"CUDA {report['versions'].get('cuda') or '-'}; git {report.get('git_commit') or 'n/a'}.", "",
             f"Command: `{report['command']}`", "",
             f"Model: random {report['model']['layers']}-layer BERT, hidden {report['model']['hidden']} "
             f"({report['model']['non_embedding_params'] / 1e6:.1f} M non-embedding parameters); data: "
             f"{report['data']['source']} ({report['data']['train_questions']} questions, "
             f"{report['data']['train_features']} features, mean {f(report['data']['mean_real_tokens'])} real tokens of "
             f"{report['data']['max_seq_length']}); MFU against {report['peak']['source']}.", "",
             "| variant | samples/s (window) | samples/s at mean length | real tokens/s | padding | MFU (real, 6N) | "
             "peak memory | 2 epochs projected | warm-up (incl. compile) | compiles in window | GPU busy (profiled) | "
             "host waits for device / data, launches a step, step (profiled) | "
             "x reference | x bf16 reference | x fast |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]

    def ratio(name, ref):
        pair = report["ratios"].get(f"{name}/{ref}")
        if not pair:
            return ""
        if pair.get("compiled_in_window"):
            return "no result (compiled in window)"
        return f(pair.get("real_tokens_per_second"), "{:.2f}x", "")

    for name, r in v.items():
        mem = r["peak_memory_gib"] if r["peak_memory_gib"] is not None else r["peak_rss_gib"]
        mem_label = "GiB" if r["peak_memory_gib"] is not None else "GiB RSS"
        at_mean = r.get("samples_per_second_at_mean_length")
        if at_mean is None and r["data"].get("mean_real_tokens"):
            at_mean = r["real_tokens_per_second"] / r["data"]["mean_real_tokens"]
        marked = f"**{name}** (compiled in its window)" if compiled_in_window(r) else name
        lines.append(
            f"| {marked} | {f(r['samples_per_second'])} | {f(at_mean)} | {f(r['real_tokens_per_second'], '{:,.0f}')} | "
            f"{f(r['padding_fraction'] * 100, '{:.0f}%')} | {f(r['mfu_real'], '{:.1%}')} | {f(mem, '{:.2f}')} {mem_label} | "
            f"{f(r['projected_2_epochs_s'], '{:,.0f} s')} | {f(r['warmup_s'], '{:.1f} s')} | "
            f"{f(r.get('compiles_in_window'), '{:d}', 'not counted')} | {f(r.get('device_busy_share'), '{:.0%}', '-')} | "
            f"{host_waits(r.get('host_waits'))} | "
            f"{ratio(name, 'reference')} | {ratio(name, 'reference_bf16')} | {ratio(name, 'fast')} |")
    lines += ["", *failed_lines(report)] if report.get("failed") else []
    marked = [name for name, r in v.items() if compiled_in_window(r)]
    if marked:
        lines += ["", f"**Not results: {', '.join(marked)}.** Their timed window included graph compilations "
                  "(torch's counters, read at both ends of the window): the figures mix compile time with training "
                  "time, and their ratios are left out."]
    if any(len(r.get("repeat_samples_per_second") or []) > 1 for r in v.values()):
        lines += ["", "Each variant ran " + str(len(next(iter(v.values()))["repeat_samples_per_second"])) +
                  " times, interleaved; the table shows the median run (of the runs whose window compiled "
                  "nothing, when some did). samples/s of every run: " +
                  "; ".join(f"{name} {r['repeat_samples_per_second']}" for name, r in v.items()) +
                  "; compilations in each run's window: " +
                  "; ".join(f"{name} {r.get('repeat_compiles_in_window')}" for name, r in v.items()) + "."]
    lines += ["", "What each variant used (read from the live Trainer objects by the run's telemetry, "
              "`train_setup` in its results):", "",
              "| variant | attention | optimizer | sampler | collator | matmuls | compiled | batch | workers | notes |",
              "|---|---|---|---|---|---|---|---|---|---|"]
    for name, r in v.items():
        u = r["used"] or {}
        comp = r.get("compile") or {}
        graphs = comp.get("unique_graphs") or 0
        compiled = (f"{r.get('compiled')}, {graphs} graphs, {comp.get('graph_breaks', 0)} breaks"
                    if u.get("torch_compile") else "no")
        lines.append(f"| {name} | {u.get('attn_implementation')} | {u.get('optimizer')}"
                     f"{' (fused)' if u.get('optimizer_fused') else ''} | {u.get('sampler')} | {u.get('collator')} | "
                     f"{u.get('matmul_precision')} | {compiled} | {u.get('per_device_train_batch_size')} | "
                     f"{u.get('dataloader_num_workers')} | {'; '.join(r['notes']) or ''} |")
    lines += ["", "Notes:", "",
              "- samples = features (windows), as the Trainer counts them; real tokens exclude padding. "
              "The ratio columns compare real tokens/s, which equals comparing samples/s at the data's mean "
              "length: a length-grouped window can hold longer or shorter features than average (its first "
              "group of batches is sorted longest first), which the window's raw samples/s does not correct.",
              "- Timed window: the same number of samples for every variant, after the warm-up steps" +
              (f", and at least {report['window']['min_s']:g} s (a faster variant's window holds more samples)"
               if report.get("window", {}).get("min_s") else "") +
              "; the device is synchronised at both ends, and torch's compile counters are read there: a window "
              "with compilations is marked and its ratios are not reported. A compiled variant runs one batch of "
              "every shape before its first step (--compile_warmup). Projection: 2 epochs x " +
              next(iter(v.values()))['projection_basis'] +
              " x mean real tokens / real tokens per second; start-up, compilation and evaluation not included "
              "(see the warm-up column and the JSON for those).",
              "- MFU counts 6 x non-embedding parameters FLOPs per real token (attention scores excluded: "
              "`mfu_real_with_attention` in the JSON adds them), against one peak for every variant.",
              ]
    off = report.get("instruments_off")
    if off:
        lines += [f"- Instruments ({', '.join(off['instruments_off'])}, no --eval_every): fast runs "
                  f"{off['steps_per_second_with']:g} steps/s with them, {off['steps_per_second_without']:g} without "
                  f"({off['without_over_with']:.3f}x; the benchmark's own window, median of the repeats: with "
                  f"{off['repeat_steps_per_second_with']}, without {off['repeat_steps_per_second_without']})."]
    if report["device"]["kind"] == "cpu":
        lines += ["- **CPU run**: no GPU was available. These figures say that every variant runs through the real "
                  "training code and how the switches behave on a CPU; they say nothing about GPU speed "
                  "(bf16, fused attention kernels and compilation pay off very differently there). "
                  f"{report['device'].get('torch_threads')} torch thread(s) per run (--cpu_threads). "
                  f"Load average during the run (other jobs share this machine): {report.get('load_avg')}."]
    lines.append("")
    return "\n".join(lines)


@command
def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--size", choices=sorted(SIZES), default="gpu")
    parser.add_argument("--variants", default=",".join(DEFAULT_VARIANTS),
                        help=f"comma-separated, from {', '.join(DEFAULT_VARIANTS + EXTRA_VARIANTS)}; 'all' for every one")
    parser.add_argument("--train_file", type=Path, default=squad_dev_path(),
                        help="SQuAD JSON to train on (default: the dev set, whose lengths are the real distribution)")
    parser.add_argument("--dataset_name", default=None, choices=["synthetic"],
                        help="'synthetic' for generated data instead of --train_file (never chosen by itself)")
    parser.add_argument("--synthetic_examples", type=int, default=3000)
    parser.add_argument("--max_train_samples", type=int, default=None, help="questions kept (default: by size)")
    parser.add_argument("--max_seq_length", type=int, default=None, help="default: by size (gpu 384, cpu 128)")
    parser.add_argument("--doc_stride", type=int, default=None, help="default: by size (gpu 128, cpu 32)")
    parser.add_argument("--max_query_length", type=int, default=None, help="default: by size (gpu 64, cpu 32)")
    parser.add_argument("--warmup_steps", type=int, default=None, help="untimed steps first (default: by size)")
    parser.add_argument("--timed_samples", type=int, default=None,
                        help="samples in each variant's timed window (default: by size)")
    parser.add_argument("--window_min_s", type=float, default=None,
                        help="each timed window lasts at least this many seconds (default: by size, gpu 20, cpu none; "
                        "0 for none)")
    parser.add_argument("--repeat", type=int, default=None,
                        help="runs of each variant, interleaved; the median is reported (default: gpu 1, cpu 3)")
    parser.add_argument("--peak_tflops", type=float, default=None,
                        help="peak dense bf16 TFLOP/s of the device for MFU (default: from the GPU's name)")
    parser.add_argument("--cpu_compile", action="store_true", help="keep torch.compile in the fast path on a CPU")
    parser.add_argument("--cpu_threads", type=int, default=1,
                        help="on a CPU: OMP_NUM_THREADS of the variants (0: torch's default). One thread by default: "
                        "on a shared machine, OpenMP threads that wait on each other under contention make steps "
                        "several times slower and erratic (measured here: 0.3 s/step with 1 thread, 1-5 s with 2)")
    parser.add_argument("--out", type=Path, default=RESULTS, help="where the JSON and Markdown go")
    parser.add_argument("--work", type=Path, default=RESULTS / "tmp", help="scratch: model, features, run folders")
    parser.add_argument("--compile_cache_dir", type=Path, default=None,
                        help="run_qa.py's compile cache for every variant (default: its own, in WORK); one shared by "
                        "several benchmarks compiles a variant they have in common once (compile_warmup_s then warm)")
    parser.add_argument("--keep", action="store_true", help="keep the scratch run folders")
    parser.add_argument("--profile_steps", type=int, default=0,
                        help="profile this many steps just before each window (GPU busy share, the host's waits; "
                             "outside the window)")
    args = parser.parse_args(argv)

    size = dict(SIZES[args.size])
    for key in ("max_seq_length", "doc_stride", "max_query_length"):
        if getattr(args, key) is not None:
            size[key] = getattr(args, key)
    if args.dataset_name:
        args.train_file = None
    else:
        args.train_file = require_squad_dev(args.train_file, "--train_file", synthetic=True)
    for key in ("warmup_steps", "timed_samples", "max_train_samples", "repeat", "window_min_s"):
        if getattr(args, key) is None:
            setattr(args, key, size[key])
    if args.warmup_steps < 1 or args.timed_samples < 1:
        parser.error("--warmup_steps and --timed_samples must be at least 1 (the window opens at the end of a step)")
    if args.profile_steps and args.warmup_steps < args.profile_steps + 1:
        parser.error(f"--profile_steps {args.profile_steps} needs --warmup_steps {args.profile_steps + 1} or more "
                     "(one traced step is discarded; the profiled steps end before the window)")
    variants = list(DEFAULT_VARIANTS + EXTRA_VARIANTS) if args.variants == "all" else args.variants.split(",")
    for name in variants:
        variant_settings(name, True, False)  # unknown names fail before anything runs

    device_name, on_gpu = _device_name()
    peak, peak_source = peak_flops(device_name if on_gpu else None, "bf16", args.peak_tflops)
    work = args.work
    work.mkdir(parents=True, exist_ok=True)
    shape = size["model"]
    model_dir = build_random_bert(work / "models" / ("bert-" + "-".join(str(v) for v in shape.values())), shape)
    log = lambda msg: print(msg, file=sys.stderr, flush=True)  # noqa: E731
    load_before = os.getloadavg()
    started = datetime.now(timezone.utc)
    stem = f"bench-{args.size}-{_slug(device_name)}-{started.strftime('%Y%m%dT%H%M%SZ')}"
    command = "python bench/run_bench.py " + " ".join(shlex.quote(a) for a in (sys.argv[1:] if argv is None else argv))
    context = dict(args=args, size=size, peak=peak, peak_source=peak_source, on_gpu=on_gpu, command=command.strip(),
                   load_before=load_before)
    args.out.mkdir(parents=True, exist_ok=True)
    # Repeats run interleaved (every variant once, then again), so that a machine that gets busier
    # or quieter in between affects all variants alike; each variant reports its median run. The report
    # is written again after every variant, so a run stopped at a time limit keeps what it finished.
    runs, failed = {name: [] for name in variants}, {}
    cache = ["--compile_cache_dir", str(args.compile_cache_dir)] if args.compile_cache_dir else []
    for _ in range(args.repeat):
        for name in variants:
            if name in failed:
                continue
            try:
                runs[name].append(run_variant(name, args, size, model_dir, work, on_gpu, peak, log, cache))
            except VariantFailed as err:
                failed[name] = err.record
                log(f"[{name}] failed: {err.record['why']}")
            report = build_report(runs, failed, context)
            atomic_write_json(args.out / f"{stem}.json", report, indent=1)
            atomic_write_text(args.out / f"{stem}.md", markdown(report))
    for name, s in report["variants"].items():
        log(f"[{name}] {s['samples_per_second']} samples/s, {s['real_tokens_per_second']} real tokens/s, "
            f"padding {s['padding_fraction']:.0%}, MFU {s['mfu_real']}")
    if not args.keep:
        shutil.rmtree(work / "runs", ignore_errors=True)
    print(json.dumps({"json": str(args.out / f"{stem}.json"), "markdown": str(args.out / f"{stem}.md"),
                      "ratios": report["ratios"], "failed": sorted(failed)}))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
