"""Test-only callbacks that act at the evaluation step of run_qa.py, and run_qa.py run with one of them:

    python -m tests.eval_hooks pause FLAG_FILE -- RUN_QA_ARGS...
    python -m tests.eval_hooks oom FITS -- RUN_QA_ARGS...

`pause`: at the first evaluation batch, FLAG_FILE is written and the run waits there (up to 10 minutes), so
that a test knows the evaluation is under way when it sends SIGTERM. `oom`: evaluation batches larger than
FITS run out of memory (OutOfMemoryInEvaluation), on a CPU too."""
import sys
import time
from pathlib import Path

import torch
from transformers import TrainerCallback


class PauseInEvaluation(TrainerCallback):
    def __init__(self, flag):
        self.flag = Path(flag)

    def on_prediction_step(self, args, state, control, **kwargs):
        if not self.flag.exists():
            self.flag.write_text(f"step {state.global_step}\n")
            time.sleep(600)


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
    hooks = {"pause": PauseInEvaluation, "oom": lambda fits: OutOfMemoryInEvaluation(int(fits))}
    assert hook in hooks and dashes == "--", sys.argv
    from run_qa import main

    sys.exit(main(argv, callbacks=[hooks[hook](value)]))
