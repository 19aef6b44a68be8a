"""Throughput figures that account for padding: samples (features), real tokens, model FLOPs.

Every formula the run reports lives here, as a small pure function with a unit test on
hand-made numbers (tests/test_telemetry.py). The Trainer callback that measures the raw
counts during training is `qa.callbacks.TelemetryCallback`; it only feeds them through these
functions.

Units: times in seconds, memory in GiB (2**30 bytes), FLOP/s as plain numbers (the peak table
is in TFLOP/s = 1e12 FLOP/s), shares and MFU as fractions in [0, 1] (not percent).
"""
import re

import numpy as np
import pyarrow.compute as pc

GIB = 2 ** 30


def token_stats(features) -> dict:
    """Real (non-padding) tokens per feature, from the attention masks, without a Python loop."""
    column = features.with_format("arrow")["attention_mask"].combine_chunks()
    lengths = pc.list_value_length(column).to_numpy()
    offsets = column.offsets.to_numpy()
    values = column.values.to_numpy(zero_copy_only=False).astype(np.int64)
    real = np.add.reduceat(values, offsets[:-1]) if len(lengths) else np.zeros(0, np.int64)
    n = max(len(lengths), 1)
    return {
        "features": int(len(lengths)),
        "real_tokens": int(real.sum()),
        "padded_tokens": int(lengths.sum()),
        "mean_real_tokens": float(real.sum() / n),
        "padding_fraction": float(1 - real.sum() / max(lengths.sum(), 1)),
    }


def train_throughput(metrics: dict, stats: dict, num_examples: int) -> dict:
    """Adds what the Trainer leaves out: its samples/s counts features (windows), not
    questions, and says nothing about how many of the tokens it processed were padding.
    `train_features_padding_fraction` is the padding stored in the features, before any batch
    is made (0 with dynamic padding); the padding of the batches the model computed on is the
    telemetry's `train_batches_padding_fraction` (qa.callbacks)."""
    per_s = metrics.get("train_samples_per_second", 0.0)
    return {
        "train_examples": num_examples,
        "train_features": stats["features"],
        "train_mean_real_tokens": round(stats["mean_real_tokens"], 2),
        "train_features_padding_fraction": round(stats["padding_fraction"], 4),
        "train_real_tokens_per_second": round(per_s * stats["mean_real_tokens"], 1),
    }


# ---------------------------------------------------------------------------------------------
# Elementary formulas


def rate(count, seconds):
    """count / seconds, or None when no time was measured."""
    return None if not seconds or seconds <= 0 else count / seconds


def share(part, total):
    """part / total clipped to [0, 1] (host timers can overlap by microseconds); None if total is 0."""
    if not total or total <= 0:
        return None
    return min(max(part / total, 0.0), 1.0)


def padding_fraction(real_tokens, batch_tokens):
    """Share of the token positions the model computed on that were padding: 1 - real / (batch × length)."""
    if not batch_tokens:
        return None
    return 1.0 - real_tokens / batch_tokens


def gib(num_bytes):
    return None if num_bytes is None else num_bytes / GIB


def flops_per_token(non_embedding_params, layers, hidden, seq_len):
    """Model FLOPs to train on one token of a sequence of `seq_len` real tokens (forward + backward):

        6 * N  +  12 * L * H * s

    N: parameters outside the embedding tables (every weight matrix costs 2 FLOPs per parameter
    per token forward, 4 backward); L layers, hidden size H, s the sequence length: the
    attention scores QK^T and the weighted sum AV cost 2 * 2 * s * H per token per layer forward,
    3x that with the backward pass. The formula of PaLM (Chowdhery et al. 2022, appendix B),
    without activation recomputation: this is *model* FLOPs, what MFU is defined on."""
    return 6 * non_embedding_params + 12 * layers * hidden * seq_len


def model_flops(non_embedding_params, layers, hidden, real_tokens, sum_sq_lengths):
    """Model FLOPs of training on a set of sequences, counting real tokens only.

    Summing `flops_per_token` over the s_i real tokens of each sequence i:
    sum_i s_i * (6N + 12 L H s_i) = 6 N * sum_i s_i + 12 L H * sum_i s_i**2.
    Padding positions are computed by the hardware but are not useful work, so they count for
    nothing here: padding lowers MFU, as it should."""
    return 6 * non_embedding_params * real_tokens + 12 * layers * hidden * sum_sq_lengths


def mfu(flops, seconds, peak_flops_per_s):
    """Model FLOPs utilisation: achieved model FLOP/s over the device's peak. None without a peak."""
    achieved = rate(flops, seconds)
    if achieved is None or not peak_flops_per_s:
        return None
    return achieved / peak_flops_per_s


# ---------------------------------------------------------------------------------------------
# Device peaks

# Dense (no sparsity) peak TFLOP/s per GPU from NVIDIA's data sheets, by the precision the
# matrix multiplications run in. First matching pattern (on the lower-cased name that
# torch.cuda.get_device_name() returns) wins, so specific variants come first. A device or a
# precision missing here gives MFU null unless --peak_tflops is given.
PEAK_TFLOPS = (
    (r"gh200", "GH200", {"bf16": 989, "fp16": 989, "tf32": 494, "fp32": 67}),
    (r"h200 nvl", "H200 NVL", {"bf16": 835, "fp16": 835, "tf32": 418, "fp32": 60}),
    (r"h200", "H200 SXM", {"bf16": 989, "fp16": 989, "tf32": 494, "fp32": 67}),
    (r"h100 nvl", "H100 NVL", {"bf16": 835, "fp16": 835, "tf32": 418, "fp32": 60}),
    (r"h100.*pcie", "H100 PCIe", {"bf16": 756, "fp16": 756, "tf32": 378, "fp32": 51}),
    (r"h100", "H100 SXM", {"bf16": 989, "fp16": 989, "tf32": 494, "fp32": 67}),
    (r"a100", "A100", {"bf16": 312, "fp16": 312, "tf32": 156, "fp32": 19.5}),
    (r"l40s", "L40S", {"bf16": 362, "fp16": 362, "tf32": 183, "fp32": 91.6}),
    (r"l40\b", "L40", {"bf16": 181, "fp16": 181, "tf32": 90.5, "fp32": 90.5}),
    (r"\bl4\b", "L4", {"bf16": 121, "fp16": 121, "tf32": 60, "fp32": 30.3}),
    (r"a40\b", "A40", {"bf16": 150, "fp16": 150, "tf32": 74.8, "fp32": 37.4}),
    (r"\ba10\b", "A10", {"bf16": 125, "fp16": 125, "tf32": 62.5, "fp32": 31.2}),
    (r"v100s", "V100S", {"fp16": 130, "fp32": 16.4}),
    (r"v100.*pcie", "V100 PCIe", {"fp16": 112, "fp32": 14}),
    (r"v100", "V100 SXM2", {"fp16": 125, "fp32": 15.7}),
    (r"\bt4\b", "T4", {"fp16": 65, "fp32": 8.1}),
)


def matmul_precision(bf16=False, fp16=False, tf32=None) -> str:
    """The precision the matrix multiplications run in: 'bf16', 'fp16', 'tf32' or 'fp32'.
    `tf32`: TrainingArguments.tf32; None asks torch (its default for matmuls is full fp32)."""
    if bf16:
        return "bf16"
    if fp16:
        return "fp16"
    if tf32 is None:
        import torch

        try:
            tf32 = torch.get_float32_matmul_precision() != "highest"
        except RuntimeError:  # torch >= 2.9 refuses once TF32 was set through its newer API
            tf32 = torch.backends.cuda.matmul.fp32_precision == "tf32"
    return "tf32" if tf32 else "fp32"


def peak_flops(device_name, precision, override_tflops=None):
    """-> (peak FLOP/s or None, where the figure comes from). `override_tflops` (--peak_tflops)
    wins; a CPU (device_name None) has no entry: MFU is then null unless overridden. So is a MIG
    slice ('NVIDIA H100 80GB HBM3 MIG 1g.10gb'): it has a fraction of the card's units, and
    the card's peak would understate its MFU by that fraction."""
    if override_tflops:
        return override_tflops * 1e12, f"--peak_tflops {override_tflops:g}"
    if not device_name:
        return None, "no peak for a CPU (pass --peak_tflops)"
    name = device_name.lower()
    if re.search(r"\bmig\b", name):
        return None, (f"{device_name!r} is a MIG slice of a GPU, whose share of the card's peak is not known "
                      "(pass --peak_tflops)")
    for pattern, label, peaks in PEAK_TFLOPS:
        if re.search(pattern, name):
            if precision in peaks:
                return peaks[precision] * 1e12, f"{label} {precision} dense"
            return None, f"no {precision} peak for {label} (pass --peak_tflops)"
    return None, f"unknown device {device_name!r} (pass --peak_tflops)"


# ---------------------------------------------------------------------------------------------
# The model's shape


def model_shape(model) -> dict:
    """Parameters outside embedding tables (lookups, no FLOPs), layers and hidden size."""
    import torch

    embedding = {id(p) for m in model.modules() if isinstance(m, torch.nn.Embedding) for p in m.parameters()}
    params = {id(p): p.numel() for p in model.parameters()}
    config = getattr(model, "config", None)
    return {
        "non_embedding_params": sum(n for i, n in params.items() if i not in embedding),
        "layers": getattr(config, "num_hidden_layers", 0) or 0,
        "hidden": getattr(config, "hidden_size", 0) or 0,
    }


def gradient_size(model) -> dict:
    """What one gradient synchronisation moves: the trainable parameters, their dtype, the bytes."""
    params = [p for p in model.parameters() if p.requires_grad]
    dtype = params[0].dtype if params else None
    return {"trainable_params": sum(p.numel() for p in params),
            "grad_dtype": str(dtype).replace("torch.", "") if dtype is not None else None,
            "grad_bytes": sum(p.numel() * p.element_size() for p in params)}


# ---------------------------------------------------------------------------------------------
# What a run really used


def describe_training(args, model, optimizer=None, train_dataloader=None) -> dict:
    """The kernels, optimizer, sampler, collator and precision a run trains with, read from the
    live objects the Trainer hands its callbacks (not from the arguments that asked for them)."""
    config = getattr(getattr(model, "_orig_mod", model), "config", None)
    inner = getattr(optimizer, "optimizer", optimizer)  # accelerate wraps the optimizer
    sampler = None
    if train_dataloader is not None:
        loader = getattr(train_dataloader, "base_dataloader", train_dataloader)
        batch_sampler = getattr(loader, "batch_sampler", None)
        sampler = getattr(getattr(batch_sampler, "batch_sampler", batch_sampler), "sampler", None)
        sampler = sampler or getattr(loader, "sampler", None)
    return {
        "attn_implementation": getattr(config, "_attn_implementation", None),
        "optimizer": type(inner).__name__ if inner is not None else None,
        "optimizer_fused": bool(getattr(inner, "defaults", {}).get("fused")),
        "sampler": type(sampler).__name__ if sampler is not None else None,
        "collator": type(getattr(train_dataloader, "collate_fn", None)).__name__ if train_dataloader else None,
        "dataloader_num_workers": getattr(train_dataloader, "num_workers", None),
        "matmul_precision": matmul_precision(args.bf16, args.fp16, args.tf32),
        "torch_compile": bool(args.torch_compile),
        "per_device_train_batch_size": args.per_device_train_batch_size,
        "gradient_accumulation_steps": args.gradient_accumulation_steps,
        "world_size": args.world_size,
    }


_RECOMPILES = {"count": 0, "hooked": False}


def _count_recompile(start):
    # Compile ids read 'frame/attempt' (torch._guards.CompileId): attempt n > 0 compiles a frame
    # again because the guards of its earlier graphs failed (a new shape, a None for a tensor).
    attempt = str(getattr(start, "compile_id", "")).rpartition("/")[2]
    if getattr(getattr(start, "callback_trigger", None), "name", "") == "DYNAMO" and attempt.isdigit() \
            and int(attempt) > 0:
        _RECOMPILES["count"] += 1


def _hook_recompiles() -> bool:
    """Counts recompilations from here on (torch's counters have no such count): a callback on
    every compilation start, registered once per process. False when torch offers no hook."""
    if not _RECOMPILES["hooked"]:
        try:
            import torch._dynamo

            torch._dynamo.callback_handler.register_start_callback(_count_recompile)
        except (ImportError, AttributeError):
            return False
        _RECOMPILES["hooked"] = True
    return True


def compile_stats():
    """What torch.compile has done so far in this process (torch._dynamo's counters), or None:
    `compiles`, the frames dynamo converted (each a first compilation or a recompilation, with
    their graph breaks' resumed frames); `frames_compiled`, those that succeeded;
    `unique_graphs`, the graphs built; `recompiles`, compilations of a frame compiled before
    (counted from the first call of this function on; None if torch has no hook for it);
    `graph_breaks`. Reading it costs nothing (no device synchronisation): the telemetry reads it
    at both ends of its timed window."""
    try:
        from torch._dynamo.utils import counters
    except ImportError:
        return None
    hooked = _hook_recompiles()
    return {"compiles": int(counters["frames"].get("total", 0)),
            "frames_compiled": int(counters["frames"].get("ok", 0)),
            "unique_graphs": int(counters["stats"].get("unique_graphs", 0)),
            "recompiles": _RECOMPILES["count"] if hooked else None,
            "graph_breaks": int(sum(counters["graph_break"].values()))}


def compile_delta(before, after) -> dict:
    """The compile counts between two compile_stats() readings (None where either is unknown)."""
    if before is None or after is None:
        return {}
    return {k: None if before.get(k) is None or after.get(k) is None else after[k] - before[k] for k in after}


# ---------------------------------------------------------------------------------------------
# Everything reported for a stretch of training


def perf_metrics(*, steps, samples, real_tokens, batch_tokens, flops, step_s, data_s,
                 peak_flops_per_s=None, world_size=1) -> dict:
    """The throughput figures of a stretch of training (a logging window, or the whole run).

    Counts are rank 0's (samples, real tokens, batch token positions = batch × padded length,
    model FLOPs of the real tokens); `step_s` the host time inside optimizer steps (forward,
    backward, optimizer), `data_s` the time waiting for the next batch between steps. Rates are
    over step_s + data_s (evaluation, checkpointing and logging excluded) and for the whole job:
    DDP ranks step in lockstep on equal batches, so rank 0's samples/s times the world size is
    exact and its real tokens/s times the world size an estimate. MFU is per device. A value
    that cannot be computed is None."""
    busy = step_s + data_s
    per_device_flops = rate(flops, busy)
    return {
        "step_time_s": step_s / steps if steps else None,
        "samples_per_s": None if rate(samples, busy) is None else rate(samples, busy) * world_size,
        "real_tokens_per_s": None if rate(real_tokens, busy) is None else rate(real_tokens, busy) * world_size,
        "padding_fraction": padding_fraction(real_tokens, batch_tokens),
        "data_time_share": share(data_s, busy),
        "tflops_per_device": None if per_device_flops is None else per_device_flops / 1e12,
        "mfu": mfu(flops, busy, peak_flops_per_s),
    }


def max_rss_gib():
    """This process's peak resident memory (Linux/macOS), or None."""
    try:
        import resource
        import sys
    except ImportError:  # Windows
        return None
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return rss / GIB if sys.platform == "darwin" else rss * 1024 / GIB  # bytes on macOS, KiB on Linux
