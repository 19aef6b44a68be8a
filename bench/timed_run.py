#!/usr/bin/env python
"""run_qa.py with the benchmark's own timed window; bench/run_bench.py runs every variant through it.

    python bench/timed_run.py START:STOP[:MIN_S] RUN_QA_ARGUMENTS...

The device is synchronised at the end of optimizer step START and of the step that closes the
window (STOP, or the first one after it once the window has lasted MIN_S seconds), and training
stops there. bench_window.json in the output folder gets the window's steps and seconds,
measured the same way whatever instruments the run has on (its telemetry's window, when it has
one, gives the samples, tokens, MFU and compilations)."""
import sys
import time
from pathlib import Path

import torch
from transformers import TrainerCallback

import run_qa
from qa.io import atomic_write_json


class TimedWindow(TrainerCallback):
    def __init__(self, start: int, stop: int, min_s: float = 0.0):
        self.start, self.stop, self.min_s = start, stop, min_s
        self.opened = None

    @staticmethod
    def _now(args) -> float:
        if args.device.type == "cuda":
            torch.cuda.synchronize()
        return time.perf_counter()

    def on_step_end(self, args, state, control, **kwargs):
        step = state.global_step
        if step == self.start:
            self.opened = self._now(args)
        elif self.opened is not None and step >= self.stop and time.perf_counter() - self.opened >= self.min_s:
            seconds = self._now(args) - self.opened
            self.opened, control.should_training_stop = None, True
            if state.is_world_process_zero:
                record = {"first_step": self.start + 1, "last_step": step, "steps": step - self.start,
                          "seconds": seconds}
                atomic_write_json(Path(args.output_dir, "bench_window.json"), record)


def main(argv) -> int:
    start, stop, min_s = (argv[0].split(":") + ["0"])[:3]
    return run_qa.main(argv[1:], callbacks=[TimedWindow(int(start), int(stop), float(min_s))])


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
