"""Trainer callbacks a run adds on top of the Trainer's own (telemetry, profiling).

A callback with a `summary() -> dict` has that dict merged into train_results.json and
all_results.json by run_qa.py after training.
"""
import logging
import sys
import time

import torch
from transformers import TrainerCallback

from .telemetry import gib, matmul_precision, max_rss_gib, model_flops, model_shape, peak_flops, perf_metrics

logger = logging.getLogger(__name__)

PERF_PREFIX = "perf/"  # the TensorBoard callback files these under train/perf/*


def _sig(value, digits=5):
    """Rounded to significant digits (tiny CPU figures such as MFU would round to 0 in decimals)."""
    return None if value is None else float(f"{value:.{digits}g}")


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

    def add(self, other: "_Counts"):
        other.settle()
        for name in ("steps", "samples", "batch_tokens", "real_tokens", "sum_sq", "step_s", "data_s"):
            setattr(self, name, getattr(self, name) + getattr(other, name))


class TelemetryCallback(TrainerCallback):
    """Measures the training loop from the inside and logs `perf/*` at every logging step.

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
    - Model FLOPs, MFU: qa.telemetry.model_flops over step + data time, against the peak of the
      device for the run's precision (qa.telemetry.peak_flops; null on a CPU unless given).
    - Memory: torch.cuda.max_memory_allocated on a GPU; the process's peak RSS everywhere.

    The values are added to the `logs` of the Trainer's `log()` call, so they land in the
    TensorBoard events, trainer_state.json's log_history and the console like the loss does.
    """

    def __init__(self, peak_tflops=None, overhead_sources=()):
        self.peak_tflops = peak_tflops
        self.overhead_sources = list(overhead_sources)  # objects with `overhead_s` to set aside
        self._summary = {}
        self._hook = None
        self._training = False

    # -- placement: before the reporting callbacks --------------------------------------------

    def on_init_end(self, args, state, control, **kwargs):
        """transformers calls callbacks in list order and puts the reporting ones (TensorBoard)
        before the user's, so values a user callback adds to `logs` in `on_log` would reach them
        one call late. Move this callback to the front of the Trainer's list, once (the handler
        is the object that is calling this method)."""
        from transformers.trainer_callback import CallbackHandler

        frame = sys._getframe(1)
        for _ in range(4):
            handler = frame.f_locals.get("self") if frame is not None else None
            if isinstance(handler, CallbackHandler):
                if self in handler.callbacks:
                    handler.callbacks.remove(self)
                    handler.callbacks.insert(0, self)
                return
            frame = frame.f_back if frame is not None else None
        logger.warning("telemetry: could not reorder the Trainer's callbacks; perf/* values may be "
                       "missing from TensorBoard (they stay in trainer_state.json and train_results.json)")

    # -- measuring ------------------------------------------------------------------------

    def on_train_begin(self, args, state, control, model=None, **kwargs):
        self._cuda = torch.cuda.is_available() and getattr(args.device, "type", "") == "cuda"
        device_name = torch.cuda.get_device_name(args.device) if self._cuda else None
        self.precision = matmul_precision(args.bf16, args.fp16, args.tf32)
        self.peak, self.peak_source = peak_flops(device_name, self.precision, self.peak_tflops)
        self.shape = model_shape(model)
        self.world_size = max(int(getattr(args, "world_size", 1) or 1), 1)
        self.pad_token_id = getattr(getattr(model, "config", None), "pad_token_id", None)
        self.window, self.total = _Counts(), _Counts()
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
        if not (self._training and module.training):
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
            w = self.window
            w.pending = counts if w.pending is None else w.pending + counts
        w.samples += mask.shape[0]
        w.batch_tokens += mask.numel()

    def on_step_begin(self, args, state, control, **kwargs):
        now = time.perf_counter()
        set_aside = self._overhead() - self._overhead_at_mark
        self.window.data_s += max(now - self._mark - set_aside, 0.0)
        self._step_start = now

    def on_step_end(self, args, state, control, **kwargs):
        now = time.perf_counter()
        if self._step_start is not None:
            self.window.step_s += now - self._step_start
            self.window.steps += 1
            self._step_start = None
        self._set_mark()

    def on_log(self, args, state, control, logs=None, **kwargs):
        if self._training and logs is not None and "loss" in logs and self.window.steps:
            perf = self._close_window()
            values = {PERF_PREFIX + k: _sig(v, 6) for k, v in perf.items() if v is not None}
            logs.update(values)
            last = state.log_history[-1] if state.log_history else None
            if last is not None and last.get("step") == state.global_step and "loss" in last:
                last.update(values)  # the Trainer copied `logs` into log_history before calling us
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

    def _close_window(self) -> dict:
        """The window's figures; its counts move into the run's total."""
        w, s = self.window, self.shape
        w.settle()
        perf = perf_metrics(steps=w.steps, samples=w.samples, real_tokens=w.real_tokens,
                            batch_tokens=w.batch_tokens,
                            flops=model_flops(s["non_embedding_params"], s["layers"], s["hidden"], w.real_tokens,
                                              w.sum_sq),
                            step_s=w.step_s, data_s=w.data_s, peak_flops_per_s=self.peak,
                            world_size=self.world_size)
        perf.update(self._memory())
        self.total.add(w)
        self.window = _Counts()
        return perf

    def on_train_end(self, args, state, control, **kwargs):
        if not self._training:
            return
        self._close_window()
        self._training = False
        if self._hook is not None:
            self._hook.remove()
            self._hook = None
        wall = time.perf_counter() - self.train_start
        t, s = self.total, self.shape
        flops = model_flops(s["non_embedding_params"], s["layers"], s["hidden"], t.real_tokens, t.sum_sq)
        perf = perf_metrics(steps=t.steps, samples=t.samples, real_tokens=t.real_tokens,
                            batch_tokens=t.batch_tokens, flops=flops, step_s=t.step_s, data_s=t.data_s,
                            peak_flops_per_s=self.peak, world_size=self.world_size)
        memory = self._memory()

        self._summary = {
            "train_step_time_mean_s": _sig(perf["step_time_s"]),
            "train_data_loading_share": _sig(perf["data_time_share"]),
            "train_step_time_total_s": _sig(t.step_s),
            "train_data_time_total_s": _sig(t.data_s),
            "train_other_time_total_s": _sig(max(wall - t.step_s - t.data_s, 0.0)),  # log, eval, save, profiler
            "train_padding_fraction_batches": _sig(perf["padding_fraction"]),
            "train_real_tokens_batches": t.real_tokens,
            "train_real_tokens_per_second_measured": _sig(perf["real_tokens_per_s"]),
            "train_samples_per_second_measured": _sig(perf["samples_per_s"]),
            "train_model_flops": flops,
            "train_tflops_per_device": _sig(perf["tflops_per_device"]),
            "train_mfu": _sig(perf["mfu"]),
            "train_peak_tflops": None if self.peak is None else round(self.peak / 1e12, 2),
            "train_peak_tflops_source": self.peak_source,
            "train_matmul_precision": self.precision,
            "train_peak_memory_gib": _sig(memory.get("peak_mem_gib")),
            "train_peak_rss_gib": _sig(memory.get("peak_rss_gib")),
        }

    def summary(self) -> dict:
        """Merged into train_results.json by run_qa.py."""
        return dict(self._summary)


def run_callbacks(run_args, training_args, train_stats=None) -> list:
    """`train_stats`: qa.telemetry.token_stats of the training features, or None (the telemetry
    measures the batches themselves: with dynamic padding the stored features have no padding)."""
    callbacks = []
    profiler = None
    if run_args.profile:
        from .profiling import ProfilerCallback

        profiler = ProfilerCallback(training_args.output_dir, wait=run_args.profile_wait,
                                    warmup=run_args.profile_warmup, active=run_args.profile_active,
                                    repeat=run_args.profile_repeat, with_stack=run_args.profile_with_stack)
    if run_args.telemetry:
        callbacks.append(TelemetryCallback(peak_tflops=run_args.peak_tflops,
                                           overhead_sources=[profiler] if profiler else []))
    if profiler:
        callbacks.append(profiler)
    return callbacks
