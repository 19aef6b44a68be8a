"""Measuring a run's training: throughput, padding, MFU, memory and compilations, in one place.

`TelemetryCallback` counts the tokens of every training batch the model sees and times the
optimizer steps and the waits between them; `perf_metrics` turns a stretch of those counts into
the `perf/*` figures logged at each logging step and the `train_*` totals of train_results.json.
What a token costs and what the device can do is qa.training.flops. Units: seconds, GiB (2**30 bytes),
FLOP/s; shares and MFU are fractions in [0, 1], not percent.
"""
import logging
import time

import numpy as np
import pyarrow.compute as pc
import torch
from transformers import TrainerCallback

from qa.training.flops import gradient_size, matmul_precision, mfu, model_flops, model_shape, peak_flops

logger = logging.getLogger(__name__)

GIB = 2 ** 30
PERF_PREFIX = "perf/"  # the TensorBoard callback files these under train/perf/*


# ---------------------------------------------------------------------------------------------
# The training features, before any batch is made


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
    telemetry's `train_batches_padding_fraction` (TelemetryCallback, below)."""
    per_s = metrics.get("train_samples_per_second", 0.0)
    return {
        "train_examples": num_examples,
        "train_features": stats["features"],
        "train_mean_real_tokens": round(stats["mean_real_tokens"], 2),
        "train_features_padding_fraction": round(stats["padding_fraction"], 4),
        "train_real_tokens_per_second": round(per_s * stats["mean_real_tokens"], 1),
    }


# ---------------------------------------------------------------------------------------------
# The figures of a stretch of training


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


def max_rss_gib():
    """This process's peak resident memory (Linux/macOS), or None."""
    try:
        import resource
        import sys
    except ImportError:  # Windows
        return None
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return rss / GIB if sys.platform == "darwin" else rss * 1024 / GIB  # bytes on macOS, KiB on Linux


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


def _sig(value, digits=5):
    """Rounded to significant digits (tiny CPU figures such as MFU would round to 0 in decimals)."""
    return None if value is None else float(f"{value:.{digits}g}")


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


# ---------------------------------------------------------------------------------------------
# Compilations


_RECOMPILES = {"count": 0}


def _count_recompile(start):
    # Compile ids read 'frame/attempt' (torch._guards.CompileId): attempt n > 0 compiles a frame
    # again because the guards of its earlier graphs failed (a new shape, a None for a tensor).
    attempt = str(getattr(start, "compile_id", "")).rpartition("/")[2]
    if getattr(getattr(start, "callback_trigger", None), "name", "") == "DYNAMO" and attempt.isdigit() \
            and int(attempt) > 0:
        _RECOMPILES["count"] += 1


def _hook_recompiles() -> bool:
    """Counts recompilations from here on (torch's counters have no such count): a callback on
    every compilation start, registered once, and again after torch._dynamo.reset() cleared it.
    False when torch offers no hook."""
    try:
        import torch._dynamo

        handler = torch._dynamo.callback_handler
        if _count_recompile not in handler.start_callbacks:
            handler.register_start_callback(_count_recompile)
    except (ImportError, AttributeError):
        return False
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
# The callback that measures


class _Counts:
    """Raw counts of a stretch of training. The token counts of the batches stay on the device
    (`pending`) until `settle()` reads them, so counting costs no synchronisation per step."""

    def __init__(self):
        self.steps = self.samples = self.batch_tokens = self.real_tokens = self.sum_sq = 0
        self.step_s = self.data_s = 0.0
        self.pending = None  # device tensor [real tokens, sum of squared real lengths]

    def settle(self):
        if self.pending is not None:
            real, sum_sq = (int(v) for v in self.pending.tolist())  # one device sync
            self.real_tokens += real
            self.sum_sq += sum_sq
            self.pending = None

    FIELDS = ("steps", "samples", "batch_tokens", "real_tokens", "sum_sq", "step_s", "data_s")

    def add(self, other: "_Counts"):
        other.settle()
        for name in self.FIELDS:
            setattr(self, name, getattr(self, name) + getattr(other, name))

    def snapshot(self) -> dict:
        self.settle()
        return {name: getattr(self, name) for name in self.FIELDS}


class TelemetryCallback(TrainerCallback):
    """Measures the training loop from the inside; `log_values` gives the `perf/*` figures of the
    steps since the last logging step, `summary` those of the whole run.

    - Step time: host time from `on_step_begin` to `on_step_end` of each optimizer step
      (forward, backward, optimizer; the Trainer fetches a step's batches before `on_step_begin`).
    - Data time: from the end of the previous step (or of the logging, evaluation, checkpointing
      and profiling that followed it) to the next `on_step_begin`: fetching, collating and moving
      the next batch(es). By default the Trainer synchronises with the GPU at every micro-step
      (`logging_nan_inf_filter` checks the loss on the host), so host times track device times;
      at logging steps this callback reads its device counters, which synchronises too.
    - Tokens: a forward pre-hook on the model reads the `attention_mask` of every training batch
      the model sees (padded as the collator padded it): real tokens, token positions, the
      squared real lengths (for the attention FLOPs).
    - Model FLOPs, MFU: qa.training.flops.model_flops over step + data time, against the peak of the
      device for the run's precision (qa.training.flops.peak_flops; null on a CPU unless given).
    - Memory: torch.cuda.max_memory_allocated on a GPU; the process's peak RSS everywhere.
    - Timed window (`timed_steps=(start, stop)`, --telemetry_window): the device is synchronised
      at the end of optimizer steps `start` and `stop` and everything between is counted apart
      (`train_window_*`): what a benchmark compares, after warm-up and compilation. With
      `window_min_s` (--telemetry_window_min_s) the window stays open past `stop` until it has
      lasted that long (host time, read at each step's end without a synchronisation), and
      training stops when it closes. The graphs torch.compile compiled inside the window (first
      compilations and recompilations, from torch's counters read at both ends) are counted
      (`train_window_compiles`): a window with any timed compilation, not training.
    """

    def __init__(self, peak_tflops=None, overhead_sources=(), timed_steps=None, window_min_s=None):
        self.peak_tflops = peak_tflops
        self.overhead_sources = list(overhead_sources)  # objects with `overhead_s` to set aside
        self.timed_steps = timed_steps
        self.window_min_s = window_min_s
        self._summary = {}
        self._hook = None
        self._training = False

    # -- measuring ------------------------------------------------------------------------

    def on_train_begin(self, args, state, control, model=None, optimizer=None, train_dataloader=None, **kwargs):
        self._cuda = torch.cuda.is_available() and getattr(args.device, "type", "") == "cuda"
        device_name = torch.cuda.get_device_name(args.device) if self._cuda else None
        self.precision = matmul_precision(args.bf16, args.fp16, args.tf32)
        self.peak, self.peak_source = peak_flops(device_name, self.precision, self.peak_tflops)
        self.shape = model_shape(model)
        self.gradients = gradient_size(model)
        self.setup = describe_training(args, model, optimizer, train_dataloader)
        self.world_size = max(int(getattr(args, "world_size", 1) or 1), 1)
        self.pad_token_id = getattr(getattr(model, "config", None), "pad_token_id", None)
        self.interval, self.total = _Counts(), _Counts()
        self.timed = {}
        compile_stats()  # from here on, recompilations are counted too
        self.train_start = self._mark = time.perf_counter()
        self._overhead_at_mark = self._overhead()
        self._step_start = None
        self._training = True
        if self._hook is not None:
            self._hook.remove()
        self._hook = model.register_forward_pre_hook(self._count_batch, with_kwargs=True)
        logger.info("telemetry: %s matmuls, peak %s (%s); model FLOPs = 6 x %d params x tokens + "
                    "12 x %d layers x %d hidden x sum(len^2)", self.precision,
                    "n/a" if self.peak is None else f"{self.peak / 1e12:g} TFLOP/s", self.peak_source,
                    self.shape["non_embedding_params"], self.shape["layers"], self.shape["hidden"])

    def _overhead(self):
        return sum(getattr(s, "overhead_s", 0.0) for s in self.overhead_sources)

    def _set_mark(self):
        self._mark = time.perf_counter()
        self._overhead_at_mark = self._overhead()

    def _count_batch(self, module, args, kwargs):
        # Only the batches of optimizer steps (every micro-batch runs between on_step_begin and
        # on_step_end): the compile warm-up's and the communication measurement's passes, in
        # training mode before the first step, are set aside with their time.
        if not (self._training and module.training) or self._step_start is None:
            return
        mask = kwargs.get("attention_mask")
        if mask is None:
            ids = kwargs.get("input_ids", args[0] if args else None)
            if ids is None:
                return
            mask = ids != self.pad_token_id if self.pad_token_id is not None else torch.ones_like(ids)
        with torch.no_grad():
            lengths = mask.reshape(mask.shape[0], -1).to(torch.int64).sum(dim=1)
            counts = torch.stack([lengths.sum(), (lengths * lengths).sum()])
            w = self.interval
            w.pending = counts if w.pending is None else w.pending + counts
        w.samples += mask.shape[0]
        w.batch_tokens += mask.numel()

    def on_step_begin(self, args, state, control, **kwargs):
        now = time.perf_counter()
        set_aside = self._overhead() - self._overhead_at_mark
        self.interval.data_s += max(now - self._mark - set_aside, 0.0)
        self._step_start = now

    def on_step_end(self, args, state, control, **kwargs):
        now = time.perf_counter()
        if self._step_start is not None:
            self.interval.step_s += now - self._step_start
            self.interval.steps += 1
            self._step_start = None
        if self.timed_steps is not None:
            self._timed_window(state.global_step, control)
        self._set_mark()

    def _timed_window(self, step, control):
        start, stop = self.timed_steps
        opened = self.timed.get("open")
        closing = opened is not None and step >= stop and (
            not self.window_min_s or time.perf_counter() - opened["at"] >= self.window_min_s)
        if step not in (1, start) and not closing:
            return
        if self._cuda:
            torch.cuda.synchronize()  # host time = device time at the window's edges
        now = time.perf_counter()
        if step == 1:
            self.timed["first_step_s"] = now - self.train_start
        if step == start:
            self.timed["open"] = {"at": now, "counts": self._cumulative(), "compiles": compile_stats()}
        if closing:
            del self.timed["open"]
            counts = {k: v - opened["counts"][k] for k, v in self._cumulative().items()}
            self.timed.update(warmup_s=opened["at"] - self.train_start, seconds=now - opened["at"],
                              counts=counts, memory=self._memory(), last_step=step,
                              compiles=compile_delta(opened["compiles"], compile_stats()))
            self.timed["complete"] = True
            if self.timed["compiles"].get("compiles"):
                logger.warning("telemetry: %d compilation(s) inside the timed window (steps %d-%d): its figures "
                               "include compile time", self.timed["compiles"]["compiles"], start + 1, step)
            if self.window_min_s:
                control.should_training_stop = True  # the window was what this run was for

    def _cumulative(self) -> dict:
        """Counts since training began (the logged intervals plus the current one)."""
        now = self.interval.snapshot()
        return {k: getattr(self.total, k) + v for k, v in now.items()}

    def log_values(self, logs: dict) -> dict:
        """The `perf/*` figures of the steps since the last log entry, for an entry of the training
        loss (QuestionAnsweringTrainer adds them to its log entries: TensorBoard under
        train/perf/*, trainer_state.json's log_history, the console)."""
        if not (self._training and "loss" in logs and self.interval.steps):
            return {}
        perf = self._close_interval()
        return {PERF_PREFIX + k: _sig(v, 6) for k, v in perf.items() if v is not None}

    def on_log(self, args, state, control, logs=None, **kwargs):
        self._set_mark()

    def on_evaluate(self, args, state, control, **kwargs):
        self._set_mark()

    def on_save(self, args, state, control, **kwargs):
        self._set_mark()

    def _memory(self) -> dict:
        out = {"peak_rss_gib": max_rss_gib()}
        if self._cuda:
            out["peak_mem_gib"] = gib(torch.cuda.max_memory_allocated())
        return out

    def _flops(self, c: dict) -> float:
        s = self.shape
        return model_flops(s["non_embedding_params"], s["layers"], s["hidden"], c["real_tokens"], c["sum_sq"])

    def _perf(self, c: dict) -> dict:
        return perf_metrics(steps=c["steps"], samples=c["samples"], real_tokens=c["real_tokens"],
                            batch_tokens=c["batch_tokens"], flops=self._flops(c), step_s=c["step_s"],
                            data_s=c["data_s"], peak_flops_per_s=self.peak, world_size=self.world_size)

    def _roll_interval(self) -> None:
        """The counts of the steps since the last log entry move into the total."""
        self.total.add(self.interval)
        self.interval = _Counts()

    def _close_interval(self) -> dict:
        """The figures of the steps since the last log entry; their counts move into the total."""
        perf = self._perf(self.interval.snapshot())
        perf.update(self._memory())
        self._roll_interval()
        return perf

    def on_train_end(self, args, state, control, **kwargs):
        if not self._training:
            return
        self._roll_interval()
        self._training = False
        if self._hook is not None:
            self._hook.remove()
            self._hook = None
        wall = time.perf_counter() - self.train_start
        t, s = self.total.snapshot(), self.shape
        perf = self._perf(t)
        memory = self._memory()
        self._summary = {
            "train_step_time_mean_s": _sig(perf["step_time_s"]),
            "train_data_loading_share": _sig(perf["data_time_share"]),
            "train_step_time_total_s": _sig(t["step_s"]),
            "train_data_time_total_s": _sig(t["data_s"]),
            "train_other_time_total_s": _sig(max(wall - t["step_s"] - t["data_s"], 0.0)),  # log, eval, save, profiler
            "train_batches_padding_fraction": _sig(perf["padding_fraction"]),
            "train_real_tokens_batches": t["real_tokens"],
            "train_real_tokens_per_second_measured": _sig(perf["real_tokens_per_s"]),
            "train_samples_per_second_measured": _sig(perf["samples_per_s"]),
            "train_model_flops": self._flops(t),
            "train_tflops_per_device": _sig(perf["tflops_per_device"]),
            "train_mfu": _sig(perf["mfu"]),
            "train_peak_tflops": None if self.peak is None else round(self.peak / 1e12, 2),
            "train_peak_tflops_source": self.peak_source,
            "train_matmul_precision": self.precision,
            "train_peak_memory_gib": _sig(memory.get("peak_mem_gib")),
            "train_peak_rss_gib": _sig(memory.get("peak_rss_gib")),
            "train_non_embedding_params": s["non_embedding_params"],
            "train_layers": s["layers"],
            "train_hidden_size": s["hidden"],
            **{f"train_{k}": v for k, v in self.gradients.items()},
            "train_setup": {**self.setup, "compile": compile_stats() if args.torch_compile else None},
        }
        if self.timed_steps is not None:
            self._summary.update(self._timed_summary())

    def _timed_summary(self) -> dict:
        start, stop = self.timed_steps
        out = {"train_window_first_step": start + 1, "train_window_last_step": self.timed.get("last_step", stop),
               "train_window_min_s": self.window_min_s,
               "train_window_complete": bool(self.timed.get("complete")),
               "train_first_step_s": _sig(self.timed.get("first_step_s"))}
        if not out["train_window_complete"]:
            logger.warning("telemetry: training ended before the timed window %d:%d%s closed", start, stop,
                           f" (at least {self.window_min_s:g} s)" if self.window_min_s else "")
            return out
        c, seconds, compiles = self.timed["counts"], self.timed["seconds"], self.timed["compiles"]
        perf = self._perf({**c, "step_s": seconds, "data_s": 0.0})  # the window's wall time covers both
        memory = self.timed["memory"]
        out.update({
            "train_window_seconds": _sig(seconds, 6),
            "train_window_warmup_s": _sig(self.timed["warmup_s"]),
            "train_window_steps": c["steps"],
            "train_window_samples": c["samples"],
            "train_window_batch_tokens": c["batch_tokens"],
            "train_window_real_tokens": c["real_tokens"],
            "train_window_sum_sq_lengths": c["sum_sq"],
            "train_window_samples_per_second": _sig(perf["samples_per_s"]),
            "train_window_real_tokens_per_second": _sig(perf["real_tokens_per_s"]),
            "train_window_padding_fraction": _sig(perf["padding_fraction"]),
            "train_window_tflops_per_device": _sig(perf["tflops_per_device"]),
            "train_window_mfu": _sig(perf["mfu"]),
            "train_window_peak_memory_gib": _sig(memory.get("peak_mem_gib")),
            "train_window_peak_rss_gib": _sig(memory.get("peak_rss_gib")),
            "train_window_compiles": compiles.get("compiles"),
            "train_window_recompiles": compiles.get("recompiles"),
            "train_window_new_graphs": compiles.get("unique_graphs"),
        })
        return out

    def summary(self) -> dict:
        """The run's totals, for train_results.json."""
        return dict(self._summary)
