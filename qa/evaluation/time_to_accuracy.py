"""Time to accuracy, as throughput alone flatters a larger batch (docs/time-to-accuracy.md). The clock includes
compilation and warm-up, which are part of the cost; evaluations run inside `rng_kept`, so they change no training."""
import contextlib
import logging
import math
import random
import time

import numpy as np
import torch
from transformers import TrainerCallback

logger = logging.getLogger(__name__)


def eval_interval(every: float, steps_per_epoch: int) -> int:
    """Optimizer steps between evaluations: `every` below 1 is a fraction of an epoch, else steps."""
    return max(1, round(every * steps_per_epoch)) if every < 1 else int(every)


def first_questions(examples, features, n: int | None):
    """(examples, features) of the first `n` questions (all if None), every window of each."""
    if n is None or n >= len(examples):
        return examples, features
    examples = examples.select(range(n))
    kept = set(examples["id"])
    ids = features.with_format("arrow")["example_id"].to_pylist()
    return examples, features.select([i for i, qid in enumerate(ids) if qid in kept])


@contextlib.contextmanager
def rng_kept():
    """Every random generator as it was: a pass outside training must not change what training does."""
    python_state, numpy_state = random.getstate(), np.random.get_state()
    try:
        with torch.random.fork_rng(devices=range(torch.cuda.device_count()), device_type="cuda"):  # CPU and CUDA
            yield
    finally:
        random.setstate(python_state)
        np.random.set_state(numpy_state)


def time_to_target(evaluations: list[dict], target: float) -> dict:
    """When the F1 of `evaluations` (in training order) first reached `target`: the training
    seconds interpolated from the evaluation before, that evaluation's; else None and the best F1."""
    best = max(evaluations, key=lambda e: e["f1"], default=None)
    out = {"target_f1": target, "train_seconds_to_target_f1": None,
           "train_seconds_to_target_f1_at_evaluation": None, "step_at_target_f1": None,
           "target_f1_method": None, "best_f1_during_training": best and best["f1"],
           "best_f1_during_training_step": best and best["step"]}
    for i, e in enumerate(evaluations):
        if e["f1"] < target:
            continue
        out.update(train_seconds_to_target_f1_at_evaluation=e["train_seconds"], step_at_target_f1=e["step"])
        if i == 0:
            out["train_seconds_to_target_f1"] = e["train_seconds"]
            out["target_f1_method"] = (f"the first evaluation (step {e['step']}) is at or above the target: "
                                       "its time, no earlier evaluation to interpolate from")
        else:
            p = evaluations[i - 1]
            share = (target - p["f1"]) / (e["f1"] - p["f1"])
            out["train_seconds_to_target_f1"] = p["train_seconds"] + share * (e["train_seconds"] - p["train_seconds"])
            out["target_f1_method"] = (f"linear interpolation between the evaluations at steps {p['step']} "
                                       f"(F1 {p['f1']:.2f}) and {e['step']} (F1 {e['f1']:.2f})")
        return out
    out["target_f1_method"] = "not reached: no evaluation during training at or above the target"
    return out


class TimeToAccuracyCallback(TrainerCallback):
    """An evaluation every `every` (eval_interval) and at the last step, each on the training clock, on every rank."""

    def __init__(self, every: float, target_f1: float | None = None):
        self.every, self.target_f1 = every, target_f1
        self.evaluations: list[dict] = []
        self.interval, self._training = None, False

    def on_train_begin(self, args, state, control, train_dataloader, **kwargs):
        self._accumulation = max(int(args.gradient_accumulation_steps), 1)
        self._batches_per_epoch = len(train_dataloader)
        self.interval = eval_interval(self.every, math.ceil(self._batches_per_epoch / self._accumulation))
        self._global_batch = args.per_device_train_batch_size * max(int(args.world_size), 1)
        self._features = len(train_dataloader.dataset)
        self.evaluations, self.evaluation_s = [], 0.0
        self._start = self._step_end = time.perf_counter()
        self._training = True
        logger.info("time to accuracy: evaluating every %d optimizer steps and at the last%s", self.interval,
                    f"; target F1 {self.target_f1:g}" if self.target_f1 is not None else "")

    def _features_seen(self, step: int) -> int:
        """Features (windows) trained on by the end of optimizer step `step`, all ranks together."""
        epochs, partial = divmod(step * self._accumulation, self._batches_per_epoch)
        return epochs * self._features + min(partial * self._global_batch, self._features)

    def on_step_end(self, args, state, control, **kwargs):
        self._step_end = time.perf_counter()
        if state.global_step % self.interval == 0 or state.global_step >= state.max_steps:
            control.should_evaluate = True

    def on_evaluate(self, args, state, control, metrics=None, **kwargs):
        if not self._training or not metrics:
            return
        now = time.perf_counter()
        train_seconds = self._step_end - self._start - self.evaluation_s
        entry = {"step": state.global_step, "epoch": state.epoch, "train_seconds": train_seconds,
                 "features": self._features_seen(state.global_step), "f1": metrics.get("eval_f1"),
                 "exact_match": metrics.get("eval_exact_match"), "eval_seconds": now - self._step_end}
        # Everything from the end of the step to here (the evaluation and its logging) is off the clock.
        self.evaluation_s += now - self._step_end
        if entry["f1"] is None:
            logger.warning("time to accuracy: the evaluation at step %d gave no F1 (unlabelled validation data?)",
                           state.global_step)
            return
        self.evaluations.append(entry)  # its plot by training seconds: plots/f1.png, tools/plot_tb.py
        logger.info("time to accuracy: step %d, %.1f training seconds, F1 %.2f, EM %.2f", entry["step"],
                    train_seconds, entry["f1"], entry["exact_match"])

    def on_train_end(self, args, state, control, **kwargs):
        self._training = False
        self.train_seconds = time.perf_counter() - self._start - self.evaluation_s

    def summary(self) -> dict:
        if self.interval is None:
            return {}
        out = {"train_seconds_excluding_evaluation": getattr(self, "train_seconds", None),
               "train_evaluation_seconds": self.evaluation_s,
               "eval_during_training_interval_steps": self.interval,
               "eval_during_training_count": len(self.evaluations)}
        if self.target_f1 is not None:
            out.update(time_to_target(self.evaluations, self.target_f1))
        return out

    def record(self) -> dict:
        return {"evaluations": self.evaluations, **self.summary()}
