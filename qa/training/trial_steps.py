"""Forward and backward passes outside the training loop that leave training as it would have
been: the compile warm-up (here) and the scaling study's communication measurement (scaling.comm_measure).

They run on the model the training loop calls and the way `training_step` runs it (training
mode, compute_loss, the accelerator's backward), so a compiled model meets the graphs training
uses; nothing is stepped, gradients are cleared and every random generator is put back. The
warm-up (`--compile_warmup`) runs one batch of every shape the collator will produce before the
first step, so that no compilation lands later (in a benchmark's timed window, say)."""
import contextlib
import inspect
import itertools
import logging
import random
import time

import numpy as np
import torch
from transformers import TrainerCallback

from qa.data.collate import feature_lengths
from qa.training.telemetry import compile_delta, compile_stats

logger = logging.getLogger(__name__)


@contextlib.contextmanager
def rng_kept():
    """Every random generator as it was: a pass outside training must not change what training does."""
    states = (random.getstate(), np.random.get_state(), torch.get_rng_state(),
              torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None)
    try:
        yield
    finally:
        random.setstate(states[0])
        np.random.set_state(states[1])
        torch.set_rng_state(states[2])
        if states[3] is not None:
            torch.cuda.set_rng_state_all(states[3])


def forward_backward(trainer, model, batch: dict):
    """One forward and backward pass of `batch` as Trainer.training_step runs them (training mode,
    the Trainer's loss context, compute_loss, the accelerator's backward); no optimizer step.
    Returns the loss (detached). The model's mode is put back afterwards."""
    was_training = model.training
    model.train()
    try:
        with trainer.compute_loss_context_manager():
            loss = trainer.compute_loss(model, batch)
        trainer.accelerator.backward(loss)
    finally:
        model.train(was_training)
    return loss.detach()


def collate_rows(trainer, indices) -> dict:
    """Training rows `indices`, as the model takes them (its forward's arguments only), collated by
    the run's collator and moved to the run's device."""
    dataset, args = trainer.train_dataset, trainer.args
    accepted = set(inspect.signature(trainer.model.forward).parameters)
    rows = [{k: v for k, v in dataset[int(i)].items() if k in accepted} for i in indices]
    return {k: v.to(args.device) for k, v in trainer.data_collator(rows).items()}


def batch_shapes(lengths, batch_size: int, width_of, last_batch: int = 0) -> list:
    """-> [(width, rows)]: one batch of each shape training can produce, from the features' token
    counts `lengths`. A batch's width is `width_of(its longest feature)` (the collator's bucket);
    its rows are features of that bucket, repeated when it has fewer than a batch (only the shape
    matters). `last_batch`: the size of an epoch's last, smaller batch (0: none)."""
    buckets = {}
    for index, length in enumerate(lengths):
        rows = buckets.setdefault(width_of(int(length)), [])
        if len(rows) < batch_size:
            rows.append(index)
    sizes = [batch_size] + ([last_batch] if 0 < last_batch < batch_size else [])
    return [(width, list(itertools.islice(itertools.cycle(buckets[width]), size)))
            for width in sorted(buckets) for size in sizes]


def training_shapes(trainer) -> list:
    """batch_shapes for the run: its training features, per-device batch and collator. A collator
    without buckets (every feature padded to max_seq_length) pads a batch to its longest feature."""
    args = trainer.args
    lengths = feature_lengths(trainer.train_dataset)
    width_of = getattr(trainer.data_collator, "target_length", lambda longest: longest)
    # One process: the sampler's last batch holds the remainder. Under DDP accelerate completes
    # every rank's last batch to full size (even_batches), so there is no smaller one.
    last = 0 if args.dataloader_drop_last or args.world_size > 1 else len(lengths) % args.per_device_train_batch_size
    return batch_shapes(lengths, args.per_device_train_batch_size, width_of, last)


class CompileWarmupCallback(TrainerCallback):
    """Before the first optimizer step of a compiled run, one forward and backward pass of every
    batch shape training will produce (see the module docstring). `bind(trainer)` first.
    `overhead_s`: its time, which the telemetry sets aside from the first step's data time."""

    def __init__(self):
        self.trainer = None
        self.overhead_s = 0.0
        self.record = {}

    def bind(self, trainer) -> None:
        self.trainer = trainer

    def on_train_begin(self, args, state, control, **kwargs):
        trainer = self.trainer
        started, before = time.perf_counter(), compile_stats()
        shapes = training_shapes(trainer)
        model = trainer.model_wrapped
        with rng_kept():
            for _, rows in shapes:
                forward_backward(trainer, model, collate_rows(trainer, rows))
            model.zero_grad(set_to_none=True)
        self.overhead_s = time.perf_counter() - started
        compiled = compile_delta(before, compile_stats())
        self.record = {"compile_warmup_shapes": [[len(rows), width] for width, rows in shapes],
                       "compile_warmup_s": round(self.overhead_s, 3),
                       "compile_warmup_compiles": compiled.get("compiles"),
                       "compile_warmup_recompiles": compiled.get("recompiles")}
        logger.info("compile warm-up: %d batch shapes (batch x width) in %.1f s, %s compilations", len(shapes),
                    self.overhead_s, compiled.get("compiles"))

    def summary(self) -> dict:
        """For train_results.json: the shapes warmed up and the time it took."""
        return dict(self.record)
