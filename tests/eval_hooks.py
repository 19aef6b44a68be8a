"""Test-only hooks that act at the evaluation or training steps of run_qa.py, and run_qa.py run with one of them:

    python -m tests.eval_hooks pause FLAG_FILE -- RUN_QA_ARGS...
    python -m tests.eval_hooks pause_training FLAG_FILE -- RUN_QA_ARGS...
    python -m tests.eval_hooks oom FITS -- RUN_QA_ARGS...
    python -m tests.eval_hooks slow SECONDS -- RUN_QA_ARGS...

`pause`: at the first evaluation batch, FLAG_FILE is written and the run waits there (up to 10 minutes), so
that a test knows the evaluation is under way when it sends SIGTERM. `pause_training`: the same at the end of the
first optimizer step, with FLAG_FILE.RANK for each rank (a Ctrl-C lands in training, and a second one before the step
ends). `oom`: evaluation batches larger than FITS run out of memory (OutOfMemoryInEvaluation), on a CPU too. `slow`:
each training forward pass takes SECONDS more, the check job's measured steps too (a check meets its time limit)."""
import functools
import os
import sys
import time
from pathlib import Path

import torch
from transformers import BertForQuestionAnswering, TrainerCallback


class PauseInEvaluation(TrainerCallback):
    def __init__(self, flag):
        self.flag = Path(flag)

    def on_prediction_step(self, args, state, control, **kwargs):
        self.pause(state)

    def pause(self, state):
        if not self.flag.exists():
            self.flag.write_text(f"step {state.global_step}\n")
            time.sleep(600)


class PauseInTraining(PauseInEvaluation):
    def __init__(self, flag):  # one flag per rank: each pauses at that step's end, none waits in a collective
        super().__init__(f"{flag}.{os.environ.get('RANK', '0')}")

    def on_prediction_step(self, args, state, control, **kwargs):
        pass

    def on_step_end(self, args, state, control, **kwargs):
        self.pause(state)


def slow_training(seconds):
    forward = BertForQuestionAnswering.forward

    @functools.wraps(forward)  # the Trainer reads the signature
    def slow(self, *args, **kwargs):
        if self.training:
            time.sleep(seconds)
        return forward(self, *args, **kwargs)

    BertForQuestionAnswering.forward = slow  # the model's, not a callback: the check's Trainer gets none of ours


class OutOfMemoryInEvaluation(TrainerCallback):
    """A device on which evaluation batches larger than `fits` run out of memory, as CUDA's allocator says it."""

    def __init__(self, fits):
        self.fits = fits

    def on_prediction_step(self, args, state, control, **kwargs):
        if args.per_device_eval_batch_size > self.fits:
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 3.00 GiB. GPU 0 has a total "
                                         "capacity of 14.74 GiB of which 1.12 GiB is free.")


if __name__ == "__main__":
    hook, value, dashes, *argv = sys.argv[1:]
    hooks = {"pause": PauseInEvaluation, "pause_training": PauseInTraining,
             "oom": lambda fits: OutOfMemoryInEvaluation(int(fits)), "slow": lambda s: slow_training(float(s))}
    assert hook in hooks and dashes == "--", sys.argv
    from qa.distributed import exit_process
    from run_qa import main

    callback = hooks[hook](value)
    exit_process(main(argv, callbacks=[callback] if callback else []))
