"""A `Trainer` whose evaluate() and predict() report SQuAD's exact match and F1 on every rank (each scores the
same gathered logits), so `load_best_model_at_end` with `metric_for_best_model="eval_f1"` works under DDP, unlike
the well-known example's rank-0 metric. tests/test_transformers_range.py checks the Trainer internals relied on."""
import contextlib
import functools
import math
import os
import shutil
import time
import weakref
from unittest.mock import patch

import torch
from accelerate.utils import DistributedType
from transformers import Trainer, TrainerCallback
from transformers.trainer_pt_utils import LengthGroupedSampler
from transformers.trainer_utils import rotate_checkpoints, speed_metrics

from qa.training.checkpoints import Checkpoints
from qa.io import give_new_file_modes, replacing, writing
from qa.results.wall_clock import PhaseClock
from qa.evaluation.time_to_accuracy import first_questions, rng_kept
from utils_qa import PostProcessing, scores_from_examples


class QuestionAnsweringTrainer(Trainer):
    def __init__(self, *args, eval_examples=None, post_processing: PostProcessing = PostProcessing(),
                 log_extras=None, checkpoints: Checkpoints = None, clock: PhaseClock = None, **kwargs):
        """`eval_examples`: the questions behind `eval_dataset`; `log_extras(logs)`: values to add to a log entry."""
        super().__init__(*args, **kwargs)
        self.eval_examples, self.post_processing, self.log_extras = eval_examples, post_processing, log_extras
        self.checkpoints = checkpoints or Checkpoints(self.args.output_dir)
        self.clock = clock or PhaseClock()
        self.add_callback(_NoModuleWalksPerStep(self))

    def floating_point_ops(self, inputs):
        # Why: the Trainer's own walks every module each step (num_parameters) for a factor counted once, at train start
        per_token, ids = getattr(self, "flops_per_token", None), inputs.get("input_ids")
        return super().floating_point_ops(inputs) if per_token is None or ids is None else per_token * ids.numel()

    def _clip_grad_norm(self, model):
        # Why an internal: the Trainer's clipping walks the model's parameters three times a step, looking for the
        # DTensors of FSDP, which one process or DDP never has; torch's own is the same arithmetic on the same tensors
        if self.accelerator.distributed_type not in (DistributedType.NO, DistributedType.MULTI_GPU,
                                                     DistributedType.MULTI_CPU):
            return super()._clip_grad_norm(model)
        self.accelerator.unscale_gradients()  # fp16's loss scale, if any
        params = [p for group in self.optimizer.param_groups for p in group["params"]]
        return torch.nn.utils.clip_grad_norm_(params, self.args.max_grad_norm)

    def log(self, logs, start_time=None):
        # Why: Trainer.log stores `logs` before callbacks see them, so the run's figures join here (documented).
        if self.log_extras is not None:
            logs.update(self.log_extras(logs))
        super().log(logs, start_time)

    def _get_train_sampler(self, train_dataset=None):
        # Why: the Trainer measures each row (`length` is an unused column) or reads it row by row: seconds for SQuAD
        dataset, name = self.train_dataset, self.args.length_column_name
        if self.args.train_sampling_strategy == "group_by_length" and name in dataset.column_names:
            return LengthGroupedSampler(self.args.train_batch_size * self.args.gradient_accumulation_steps,
                                        lengths=dataset.with_format("arrow")[name].to_pylist())
        return super()._get_train_sampler(train_dataset)

    def _get_eval_sampler(self, eval_dataset):
        # Why: logits pair with features by position, which group_by_length would shuffle for evaluation too.
        with attributes_set(self.args, train_sampling_strategy="random"):
            return super()._get_eval_sampler(eval_dataset)

    def _save_checkpoint(self, model, trial):
        # Why: the marker once every rank has saved, rotation after it (before, a kill could leave no complete one)
        folder = os.path.join(self._get_output_dir(trial=trial), f"checkpoint-{self.state.global_step}")
        with self.clock.phase("saving"), self.checkpoints.saving(folder, self.state.global_step, self.args.should_save):
            with attributes_set(self.args, save_total_limit=None):
                super()._save_checkpoint(model, trial)
            self.accelerator.wait_for_everyone()  # every rank's part (its RNG state, its FSDP shards) is written
        if self.args.should_save:
            rotate_checkpoints(output_dir=os.path.dirname(folder), save_total_limit=self.args.save_total_limit,
                               best_model_checkpoint=self.state.best_model_checkpoint, use_mtime=True)

    def save_model(self, output_dir=None, _internal_call=False):
        # Why: a job killed while saving leaves no torn weights: a staging folder, then atomic renames into place.
        # A killed save's staging is this run's (qa.training.runlock) to clear, or its files would be moved in too.
        if _internal_call:  # a checkpoint: whole only once it has the marker
            return super().save_model(output_dir, _internal_call=True)
        target = output_dir or self.args.output_dir
        staging = os.path.join(target, ".saving-model")
        if self.args.should_save and os.path.isdir(staging):
            shutil.rmtree(staging)
        self.accelerator.wait_for_everyone()
        with writing(target, "the trained model", self.checkpoints.rerun(),
                     undo=lambda: self.args.should_save and shutil.rmtree(staging, ignore_errors=True)):
            super().save_model(staging)
        self.accelerator.wait_for_everyone()
        if self.args.should_save:
            give_new_file_modes(staging)  # safetensors writes weights 0600 whatever the umask
            for name in os.listdir(staging):
                os.replace(os.path.join(staging, name), os.path.join(target, name))
            os.rmdir(staging)
        self.accelerator.wait_for_everyone()

    def save_state(self):
        # Why: trainer_state.json in output_dir says the training ended: a full disk leaves it whole or absent
        if self.is_world_process_zero():
            with replacing(os.path.join(self.args.output_dir, "trainer_state.json")) as tmp:
                self.state.save_to_json(tmp)

    def evaluate(self, eval_dataset=None, eval_examples=None, ignore_keys=None, metric_key_prefix="eval"):
        # Why: SQuAD's metrics are per question, from the logits of all its features (post-processing).
        features = eval_dataset if eval_dataset is not None else self.eval_dataset
        examples = eval_examples if eval_examples is not None else self.eval_examples
        # is_in_train: the Trainer's own flag (no public API says whether train() is running)
        phase = "evaluation_during_training" if self.is_in_train else "final_evaluation"
        with self.clock.phase(phase), rng_kept():  # during training: leave its random streams alone
            _, metrics = self._predict_and_score(self.get_eval_dataloader(features), features, examples,
                                                 ignore_keys, metric_key_prefix, "Evaluation", files_prefix=None)
        self.log(metrics)
        self.control = self.callback_handler.on_evaluate(self.args, self.state, self.control, metrics)
        return metrics

    def predict(self, test_dataset, test_examples=None, ignore_keys=None, metric_key_prefix="predict"):
        """(predictions: question id -> answer text, metrics), also written to files; F1/EM if examples have answers."""
        predictions, metrics = self._predict_and_score(
            self.get_test_dataloader(test_dataset), test_dataset, test_examples, ignore_keys, metric_key_prefix,
            "Prediction", files_prefix=metric_key_prefix)
        self.control = self.callback_handler.on_predict(self.args, self.state, self.control, metrics)
        return predictions, metrics

    def _predict_and_score(self, dataloader, features, examples, ignore_keys, prefix, description, files_prefix):
        start = time.time()
        try:
            output = self.evaluation_loop(dataloader, description=description, prediction_loss_only=False,
                                          ignore_keys=ignore_keys, metric_key_prefix=prefix)
        except torch.OutOfMemoryError as err:  # its fix is a smaller evaluation batch, also during training
            raise EvaluationOutOfMemory(str(err)) from err
        predictions, _, _ = self.post_processing(
            examples, features, *output.predictions[:2],
            output_dir=self.args.output_dir if self.is_world_process_zero() else None, prefix=files_prefix)
        metrics = dict(output.metrics)
        if "answers" in examples.column_names:  # an unlabelled split has no answers column
            scores = scores_from_examples(examples, predictions, self.post_processing.version_2_with_negative)
            if "exact" in scores:  # v2 names it "exact"; one name for both versions downstream
                scores = {"exact_match": scores["exact"], **scores}
            metrics.update({f"{prefix}_{k}": v for k, v in scores.items()})
        metrics.update(speed_metrics(prefix, start, num_samples=output.num_samples, num_steps=math.ceil(
            output.num_samples / (self.args.eval_batch_size * self.args.world_size))))
        metrics[f"{prefix}_examples"] = len(examples)
        metrics[f"{prefix}_predictions"] = len(predictions)  # answers written, one per question
        return predictions, metrics


class _NoModuleWalksPerStep(TrainerCallback):
    """No walk of every module each step: model.zero_grad() as the optimizer's zero_grad(set_to_none=True), a walk
    of its list of parameters; model.train() only when the mode changes (bench/bench_host.py measures them)."""

    def __init__(self, trainer):
        self.trainer = weakref.ref(trainer)

    def on_train_begin(self, args, state, control, **kwargs):
        # Why attributes of the wrapped model: the loop calls its zero_grad() and train(), and no setting changes them
        trainer = self.trainer()
        trainer.flops_per_token = 6 * trainer.model.num_parameters(exclude_embeddings=True)
        model = trainer.model_wrapped
        model.zero_grad = functools.partial(trainer.optimizer.zero_grad, set_to_none=True)
        ref, inner, train = weakref.ref(model), weakref.ref(trainer.model), type(model).train

        def train_when_changed(mode=True):  # weak references: no cycle keeps the model, or a DDP group, alive
            return ref() if ref().training == inner().training == mode else train(ref(), mode)  # DDP and its model
        model.train = train_when_changed


class EvaluationOutOfMemory(torch.OutOfMemoryError):
    """The device ran out of memory in an evaluation or prediction, not in a training step."""


attributes_set = patch.multiple  # `obj`'s attributes for the block, put back after it (also on an error)


@contextlib.contextmanager
def evaluated_during_training(trainer, questions=None):
    """With `questions` (--eval_every_questions) evaluations during training take the first that many; the final all."""
    examples, features = first_questions(trainer.eval_examples, trainer.eval_dataset, questions)  # all if None
    with attributes_set(trainer, eval_examples=examples, eval_dataset=features):
        yield
    if questions is not None:  # Internal: persistent workers keep the subset's loader as "eval", for the final one too
        getattr(trainer, "_eval_dataloaders", {}).pop("eval", None)
