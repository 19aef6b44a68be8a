"""The callbacks a run adds to the Trainer, built and installed in one place (`RunCallbacks`), and
the throughput telemetry among them.

`RunCallbacks` builds, from the run's arguments, the telemetry (qa.callbacks.TelemetryCallback),
the profiler (qa.profiling), the checkpoint-on-SIGTERM callback (qa.preemption) and the
communication measurement and switches (qa.communication); installs them
through the Trainer's public `add_callback`; hands the Trainer the values to add to its log
entries (`log_values`, for QuestionAnsweringTrainer's `log_extras`); and gathers what they
measured for train_results.json (`summary`).
"""
import logging
import time

import torch
from transformers import TrainerCallback

from .communication import CommunicationCallback
from .console import log_lines_callback, replace_log_printer
from .preemption import CheckpointOnSignalCallback
from .telemetry import (compile_delta, compile_stats, describe_training, gib, gradient_size, matmul_precision,
                        max_rss_gib, model_flops, model_shape, peak_flops, perf_metrics)
from .trial_steps import CompileWarmupCallback

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
    - Model FLOPs, MFU: qa.telemetry.model_flops over step + data time, against the peak of the
      device for the run's precision (qa.telemetry.peak_flops; null on a CPU unless given).
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

    def _perf(self, c: dict) -> dict:
        s = self.shape
        return perf_metrics(steps=c["steps"], samples=c["samples"], real_tokens=c["real_tokens"],
                            batch_tokens=c["batch_tokens"],
                            flops=model_flops(s["non_embedding_params"], s["layers"], s["hidden"], c["real_tokens"],
                                              c["sum_sq"]),
                            step_s=c["step_s"], data_s=c["data_s"], peak_flops_per_s=self.peak,
                            world_size=self.world_size)

    def _close_interval(self) -> dict:
        """The figures of the steps since the last log entry; their counts move into the total."""
        perf = self._perf(self.interval.snapshot())
        perf.update(self._memory())
        self.total.add(self.interval)
        self.interval = _Counts()
        return perf

    def on_train_end(self, args, state, control, **kwargs):
        if not self._training:
            return
        self._close_interval()
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
            "train_model_flops": model_flops(s["non_embedding_params"], s["layers"], s["hidden"], t["real_tokens"],
                                             t["sum_sq"]),
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


class RunCallbacks:
    """Every callback a run adds to the Trainer, built from its arguments in one place.

    `install(trainer)` puts the console's log printer (qa.console) in place of the Trainer's
    and adds the others through the Trainer's public add_callback, after the Trainer's own (its
    flow control and reporting callbacks): the telemetry goes first among
    them, so the profiler's time in on_step_end falls between two telemetry marks and is set
    aside (the profiler reports it as `overhead_s`), and so is the time the compile warm-up and
    the communication measurement take in on_train_begin, after the telemetry started its
    clock. The warm-up runs before the measurement, whose passes then reuse the graphs it
    compiled. Nothing here needs to run before the
    reporting callbacks: the throughput figures join the log entries in the Trainer's `log`
    (`log_values`), before any callback sees them.
    """

    def __init__(self, run_args, training_args):
        self.console = None  # the log printer, chosen in install() from the Trainer's arguments
        self.profiler = None
        if run_args.profile:
            from .profiling import ProfilerCallback

            self.profiler = ProfilerCallback(training_args.output_dir, wait=run_args.profile_wait,
                                             warmup=run_args.profile_warmup, active=run_args.profile_active,
                                             repeat=run_args.profile_repeat, with_stack=run_args.profile_with_stack)
        self.warmup = None
        if run_args.compile_warmup and getattr(training_args, "torch_compile", False):
            self.warmup = CompileWarmupCallback()
        elif run_args.compile_warmup:
            logger.warning("--compile_warmup: the run does not compile (--torch_compile false): nothing to warm up")
        self.communication = CommunicationCallback(run_args.measure_communication, run_args.ddp_comm_hook,
                                                   run_args.fsdp_reduce_dtype)
        self.telemetry = None
        if run_args.telemetry:
            overhead = [c for c in (self.profiler, self.warmup, self.communication) if c is not None]
            self.telemetry = TelemetryCallback(peak_tflops=run_args.peak_tflops, overhead_sources=overhead,
                                               timed_steps=run_args.timed_steps(),
                                               window_min_s=run_args.telemetry_window_min_s)
        self.preemption = (CheckpointOnSignalCallback(run_args.preemption_check_steps)
                           if run_args.checkpoint_on_sigterm else None)

    @property
    def callbacks(self) -> list:
        return [c for c in (self.telemetry, self.profiler, self.preemption, self.warmup, self.communication)
                if c is not None]

    def install(self, trainer) -> None:
        self.communication.bind(trainer)
        self.console = log_lines_callback(trainer.args)
        if not replace_log_printer(trainer, self.console):
            self.console = None
        if self.warmup is not None:
            self.warmup.bind(trainer)
        for callback in self.callbacks:
            trainer.add_callback(callback)

    def log_values(self, logs: dict) -> dict:
        return self.telemetry.log_values(logs) if self.telemetry is not None else {}

    def stopped_at(self):
        """The global step at which a SIGTERM stopped training, or None."""
        return self.preemption.stopped_at if self.preemption is not None else None

    def summary(self) -> dict:
        """What the telemetry, the profiler, the compile warm-up and the communication measurement
        recorded, for train_results.json."""
        out = {}
        for callback in (self.telemetry, self.profiler, self.warmup, self.communication):
            if callback is not None:
                out.update(callback.summary())
        return out
