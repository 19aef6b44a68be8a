#!/usr/bin/env python
"""run_qa.py with the benchmark's timed window, the one instrument that times a window of steps;
bench/run_bench.py runs every variant through it.

    python bench/timed_run.py START:STOP[:MIN_S] RUN_QA_ARGUMENTS...

The device is synchronised at the end of optimizer step 1 (the first step's time), of step START
(the window opens) and of the step that closes it (STOP, or the first one after it once the
window has lasted MIN_S seconds), and training stops there. bench_window.json in the output
folder gets the window as train_window_* keys: its steps, seconds, the warm-up's seconds before
it, the compilations inside it and its own memory peaks, measured the same way whatever
instruments the run has on; with the run's telemetry on (--telemetry, the default), the samples,
batch and real tokens, padding, TFLOP/s and MFU of its steps too, from the telemetry's counts."""
import logging
import sys
import time
from pathlib import Path

import torch
from transformers import TrainerCallback

import run_qa
from qa.errors import InputError, command
from qa.io import atomic_write_json
from qa.training.compile import compile_stats
from qa.training.telemetry import TelemetryCallback, gib, max_rss_gib, sig

logger = logging.getLogger("bench.timed_run")


class TimedWindow(TrainerCallback):
    def __init__(self, start: int, stop: int, min_s: float = 0.0, file: str | None = "bench_window.json"):
        self.start, self.stop, self.min_s, self.file = start, stop, min_s, file
        self.began = self.opened = self.telemetry = None
        self.record = {}  # the window's figures once it has closed

    def bind(self, trainer) -> None:  # the run's callbacks are added before this one: the telemetry is there
        self.telemetry = next((c for c in trainer.callback_handler.callbacks if isinstance(c, TelemetryCallback)), None)

    def on_step_begin(self, args, state, control, **kwargs):
        if self.began is None:
            self.began = time.perf_counter()

    def on_step_end(self, args, state, control, **kwargs):
        step, cuda = state.global_step, args.device.type == "cuda"
        closing = (self.opened is not None and step >= self.stop
                   and time.perf_counter() - self.opened["at"] >= self.min_s)
        if step not in (1, self.start) and not closing:
            return
        if cuda:
            torch.cuda.synchronize()  # host time = device time at the window's edges
        now = time.perf_counter()
        if step == 1:
            self.record["train_first_step_s"] = sig(now - self.began)
        if step == self.start:
            counts = self.telemetry.counts.snapshot() if self.telemetry else None
            self.opened = {"at": now, "counts": counts, "compiles": compile_stats()}
            if cuda:  # the window's peak is its own, not the warm-up's; the run's telemetry keeps the run's
                if self.telemetry:
                    self.telemetry.peak_before_reset = torch.cuda.max_memory_allocated()
                torch.cuda.reset_peak_memory_stats()
        if closing:
            self._close(step, now - self.opened["at"], cuda)
            self.opened, control.should_training_stop = None, True
            if self.file and state.is_world_process_zero:
                atomic_write_json(Path(args.output_dir, self.file), self.record)

    def _close(self, step: int, seconds: float, cuda: bool) -> None:
        compiles = compile_stats(since=self.opened["compiles"])
        self.record.update({
            "train_window_first_step": self.start + 1, "train_window_last_step": step,
            "train_window_steps": step - self.start, "train_window_seconds": sig(seconds, 6),
            "train_window_min_s": self.min_s or None, "train_window_warmup_s": sig(self.opened["at"] - self.began),
            "train_window_peak_memory_gib": sig(gib(torch.cuda.max_memory_allocated())) if cuda else None,
            "train_window_peak_rss_gib": sig(max_rss_gib()),  # the host's peak has no reset: the process's
            **{f"train_window_{k}": compiles[k] for k in ("compiles", "recompiles")},
            "train_window_new_graphs": compiles["unique_graphs"]})
        if compiles["compiles"]:
            logger.warning("timed window: %d compilation(s) inside it (steps %d-%d): its figures include compile "
                           "time", compiles["compiles"], self.start + 1, step)
        if self.opened["counts"] is None:
            return
        c = self.telemetry.counts.snapshot(since=self.opened["counts"])
        perf = self.telemetry.figures({**c, "step_s": seconds, "data_s": 0.0})  # its wall time covers both
        self.record.update({**{f"train_window_{k}": c[k] for k in ("samples", "batch_tokens", "real_tokens")},
                            "train_window_sum_sq_lengths": c["sum_sq"],
                            "train_window_samples_per_second": sig(perf["samples_per_s"]),
                            "train_window_real_tokens_per_second": sig(perf["real_tokens_per_s"]),
                            **{f"train_window_{k}": sig(perf[k]) for k in ("padding_fraction", "tflops_per_device",
                                                                            "mfu")}})


def window(text: str) -> tuple:
    start, _, rest = text.partition(":")
    stop, _, min_s = rest.partition(":")
    min_s = min_s or "0"
    if not (start.isdigit() and stop.isdigit() and 1 <= int(start) < int(stop) and min_s.replace(".", "", 1).isdigit()):
        raise InputError(f"bench/timed_run.py {text!r}", "must be START:STOP[:MIN_S] with 1 <= START < STOP (optimizer "
                         "steps; the window opens at the end of step START) and MIN_S seconds, 0 or more",
                         "give e.g. 10:50 or 10:50:20 before run_qa.py's arguments")
    return int(start), int(stop), float(min_s)


@command
def main(argv) -> int:
    return run_qa.main(argv[1:], callbacks=[TimedWindow(*window(argv[0] if argv else ""))])


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
