"""A `Trainer` whose evaluate() and predict() report SQuAD's exact match and F1.

The model gives start/end logits per feature (window); answers are per question. So after
the usual prediction loop (which gathers the logits of every rank), the logits are turned
into answer texts and scored against the gold answers. Every rank does this on the same
gathered logits and so ends with the same metrics: `load_best_model_at_end` with
`metric_for_best_model="eval_f1"` then works under DDP, where a metric computed on rank 0
alone leaves the other ranks without `eval_f1` (the failure of the well-known example).
Only the main process writes prediction files. The other overrides keep evaluation in order,
length grouping cheap, checkpoints marked complete and the final save atomic; each says why.
"""
import contextlib
import inspect
import logging
import math
import os
import shutil
import time

import transformers
from transformers import Trainer, TrainingArguments
from transformers.trainer_pt_utils import LengthGroupedSampler
from transformers.trainer_utils import EvalLoopOutput, rotate_checkpoints, speed_metrics

from qa.training.checkpoints import COMPLETE_MARKER, write_marker
from qa.errors import InputError
from qa.io import give_new_file_modes
from qa.evaluation.metric import scores_from_examples
from qa.evaluation.postprocess import PostProcessing
from qa.training.compile import rng_kept

logger = logging.getLogger(__name__)

# The releases this file was run against (tests/test_transformers_range.py runs the oldest; the
# suite runs the newest, requirements.txt's pin).
TESTED_TRANSFORMERS = ("5.17", "5.23")


def _params(fn) -> list:
    return list(inspect.signature(fn).parameters)


def _uses(fn, text: str) -> bool:
    """Whether `fn`'s source contains `text`: the Trainer still reaches the internal that an
    override below replaces (`self._get_train_sampler`), or reads the setting it relies on."""
    try:
        return text in inspect.getsource(fn)
    except (OSError, TypeError):  # no source (a compiled or generated function): cannot vouch for it
        return False


def trainer_contracts(trainer_cls=Trainer) -> list:
    """What QuestionAnsweringTrainer relies on in transformers' Trainer, as (what, holds) pairs.

    The overrides below replace or call Trainer methods (two of them internal: _get_train_sampler,
    _save_checkpoint): a release that renamed one, changed its parameters, or stopped calling it
    would run without any error and silently lose what the override does (the length column, the
    evaluation order, the completion marker). Each entry checks one such fact, read from the
    installed classes and functions; none builds a model."""
    t, args = trainer_cls, TrainingArguments.__dataclass_fields__
    return [
        ("Trainer.log(logs, start_time)", _params(t.log)[1:3] == ["logs", "start_time"]),
        ("Trainer._get_train_sampler(train_dataset), called by get_train_dataloader",
         _params(t._get_train_sampler)[1:] == ["train_dataset"]
         and _uses(t.get_train_dataloader, "self._get_train_sampler")),
        ("Trainer.get_eval_dataloader(eval_dataset) and get_test_dataloader(test_dataset), choosing the sampler "
         "when called",
         _params(t.get_eval_dataloader)[1:] == ["eval_dataset"]
         and _params(t.get_test_dataloader)[1:] == ["test_dataset"]
         and _uses(t.get_eval_dataloader, "self._get_eval_sampler")
         and _uses(t.get_test_dataloader, "self._get_eval_sampler")),
        ("Trainer._save_checkpoint(model, trial), rotating by args.save_total_limit",
         _params(t._save_checkpoint)[1:] == ["model", "trial"] and _uses(t._save_checkpoint, "rotate_checkpoints(")
         and _uses(t._save_checkpoint, "self.args.save_total_limit")),
        ("Trainer._get_output_dir(trial)", _params(t._get_output_dir)[1:] == ["trial"]),
        ("Trainer.save_model(output_dir, _internal_call)",
         _params(t.save_model)[1:3] == ["output_dir", "_internal_call"]),
        ("Trainer.evaluation_loop(dataloader, description, prediction_loss_only, ignore_keys, metric_key_prefix)",
         _params(t.evaluation_loop)[1:6] == ["dataloader", "description", "prediction_loss_only", "ignore_keys",
                                             "metric_key_prefix"]),
        ("EvalLoopOutput with predictions, metrics, num_samples",
         {"predictions", "metrics", "num_samples"} <= set(EvalLoopOutput._fields)),
        ("rotate_checkpoints(output_dir, save_total_limit, best_model_checkpoint, use_mtime)",
         {"output_dir", "save_total_limit", "best_model_checkpoint", "use_mtime"} <= set(_params(rotate_checkpoints))),
        ("speed_metrics(split, start_time, num_samples, num_steps)",
         _params(speed_metrics)[:4] == ["split", "start_time", "num_samples", "num_steps"]),
        ("LengthGroupedSampler(batch_size, lengths=...)",
         {"batch_size", "lengths"} <= set(_params(LengthGroupedSampler.__init__))),
        ("TrainingArguments.train_sampling_strategy, length_column_name, save_total_limit",
         {"train_sampling_strategy", "length_column_name", "save_total_limit"} <= set(args)),
    ]


def check_trainer_contracts(trainer_cls=Trainer, version: str = transformers.__version__) -> None:
    """Stops at start-up, with one line, when the installed transformers breaks what the
    overrides rely on (see trainer_contracts); any release that keeps it runs."""
    broken = [what for what, holds in trainer_contracts(trainer_cls) if not holds]
    if broken:
        low, high = TESTED_TRANSFORMERS
        raise InputError(f"transformers {version}",
                         f"trainer_qa.py relies on Trainer internals this release changed: {'; '.join(broken)}",
                         f"install a release from the tested range {low} to {high} (requirements.txt pins "
                         f"{high}; setup_bert.sh installs it)")


class QuestionAnsweringTrainer(Trainer):
    def __init__(self, *args, eval_examples=None, post_processing: PostProcessing = PostProcessing(),
                 log_extras=None, checkpoint_record=None, **kwargs):
        """`eval_examples`: the questions behind `eval_dataset` (its features);
        `post_processing`: how logits become answers (qa.evaluation.postprocess.PostProcessing);
        `log_extras`: a function of a log entry returning values to add to it (the run's
        throughput figures, qa.training.telemetry.TelemetryCallback.log_values); `checkpoint_record`: what the
        checkpoints' steps mean (qa.training.checkpoints.run_record), kept in their completion markers."""
        super().__init__(*args, **kwargs)
        self.eval_examples = eval_examples
        self.post_processing = post_processing
        self.log_extras = log_extras
        self.checkpoint_record = checkpoint_record

    def log(self, logs, start_time=None):
        # Why: Trainer.log stores `logs` before callbacks see them, so the run's figures join here (documented).
        if self.log_extras is not None:
            logs.update(self.log_extras(logs))
        super().log(logs, start_time)

    def _get_train_sampler(self, train_dataset=None):
        # Why: the Trainer reads lengths row by row, seconds a run at SQuAD's size; as one list: milliseconds.
        # Its copy of the dataset has lost `length` with the unused columns, so it measures every row; kept
        # (remove_unused_columns=False), the column is a datasets Column indexed per row at every epoch.
        dataset, name = self.train_dataset, self.args.length_column_name
        if (self.args.train_sampling_strategy == "group_by_length" and hasattr(dataset, "column_names")
                and name in dataset.column_names):
            lengths = dataset.with_format("arrow")[name].to_pylist()
            return LengthGroupedSampler(self.args.train_batch_size * self.args.gradient_accumulation_steps,
                                        lengths=lengths)
        return super()._get_train_sampler(train_dataset)

    def get_eval_dataloader(self, eval_dataset=None):
        # Why: logits pair with features by position; under group_by_length the Trainer would shuffle these too.
        with attributes_set(self.args, train_sampling_strategy="random"):
            return super().get_eval_dataloader(eval_dataset)

    def get_test_dataloader(self, test_dataset):
        # Why: as in get_eval_dataloader: prediction keeps the features' order.
        with attributes_set(self.args, train_sampling_strategy="random"):
            return super().get_test_dataloader(test_dataset)

    def _save_checkpoint(self, model, trial):
        # Why: the completion marker, once every rank has saved; rotation after it, so a complete one remains.
        folder = os.path.join(self._get_output_dir(trial=trial), f"checkpoint-{self.state.global_step}")
        marker = os.path.join(folder, COMPLETE_MARKER)
        if self.args.should_save and os.path.exists(marker):
            os.remove(marker)  # the same step saved again: incomplete until rewritten
        # The Trainer deletes old checkpoints (save_total_limit) as soon as it has written the new one, before
        # the marker below: a job killed in between would keep no complete checkpoint.
        with attributes_set(self.args, save_total_limit=None):
            super()._save_checkpoint(model, trial)
        self.accelerator.wait_for_everyone()  # every rank's part (its RNG state, its FSDP shards) is written
        if self.args.should_save:
            give_new_file_modes(folder)  # safetensors writes weights 0600 whatever the umask
            write_marker(folder, self.state.global_step, self.checkpoint_record)  # files' sizes and hashes; the run
            rotate_checkpoints(output_dir=os.path.dirname(folder), save_total_limit=self.args.save_total_limit,
                               best_model_checkpoint=self.state.best_model_checkpoint, use_mtime=True)

    def save_model(self, output_dir=None, _internal_call=False):
        # Why: the final model is written atomically, so a job killed while saving leaves no torn weights.
        """The final model goes to a staging folder first and then file by file into place with
        atomic renames, so a job killed while saving never leaves a torn weights file. One run
        writes into an output folder at a time (qa.training.runlock), so the staging folder is this run's;
        what a run killed while saving left there is cleared first, or its files (those this save
        does not overwrite, e.g. another tokenizer's vocabulary) would be moved into place too."""
        if _internal_call:  # a checkpoint: whole only once it has the marker
            return super().save_model(output_dir, _internal_call=True)
        target = output_dir or self.args.output_dir
        staging = os.path.join(target, ".saving-model")
        if self.args.should_save and os.path.isdir(staging):
            shutil.rmtree(staging)
        self.accelerator.wait_for_everyone()
        super().save_model(staging)
        self.accelerator.wait_for_everyone()
        if self.args.should_save:
            give_new_file_modes(staging)  # safetensors writes weights 0600 whatever the umask
            for name in os.listdir(staging):
                os.replace(os.path.join(staging, name), os.path.join(target, name))
            os.rmdir(staging)
        self.accelerator.wait_for_everyone()

    def evaluate(self, eval_dataset=None, eval_examples=None, ignore_keys=None, metric_key_prefix="eval"):
        # Why: SQuAD's metrics are per question, from the logits of all its features (post-processing).
        features = eval_dataset if eval_dataset is not None else self.eval_dataset
        examples = eval_examples if eval_examples is not None else self.eval_examples
        with rng_kept():  # an evaluation during training must leave its random streams (sampling, dropout) alone
            _, metrics = self._predict_and_score(self.get_eval_dataloader(features), features, examples,
                                                 ignore_keys, metric_key_prefix, "Evaluation", files_prefix=None)
        self.log(metrics)
        self.control = self.callback_handler.on_evaluate(self.args, self.state, self.control, metrics)
        return metrics

    def predict(self, test_dataset, test_examples=None, ignore_keys=None, metric_key_prefix="predict"):
        # Why: answers are per question, from the logits of all its features, and written to files.
        """Returns (predictions: question id -> answer text, metrics). Metrics include F1/EM
        only when the examples carry gold answers."""
        predictions, metrics = self._predict_and_score(
            self.get_test_dataloader(test_dataset), test_dataset, test_examples, ignore_keys, metric_key_prefix,
            "Prediction", files_prefix=metric_key_prefix)
        self.control = self.callback_handler.on_predict(self.args, self.state, self.control, metrics)
        return predictions, metrics

    def _predict_and_score(self, dataloader, features, examples, ignore_keys, prefix, description, files_prefix):
        start = time.time()
        output = self.evaluation_loop(dataloader, description=description, prediction_loss_only=False,
                                      ignore_keys=ignore_keys, metric_key_prefix=prefix)
        start_logits, end_logits = output.predictions[:2]
        predictions, _, _ = self.post_processing(
            examples, features, start_logits, end_logits,
            output_dir=self.args.output_dir if self.is_world_process_zero() else None, prefix=files_prefix)
        metrics = dict(output.metrics)
        if "answers" in examples.column_names:  # an unlabelled split has no answers column
            scores = scores_from_examples(examples, predictions, self.post_processing.version_2_with_negative)
            if "exact" in scores:  # v2 names it "exact"; one name for both versions downstream
                scores = {"exact_match": scores["exact"], **scores}
            metrics.update({f"{prefix}_{k}": v for k, v in scores.items()})
        batch = self.args.eval_batch_size * self.args.world_size
        metrics.update(speed_metrics(prefix, start, num_samples=output.num_samples,
                                     num_steps=math.ceil(output.num_samples / batch)))
        metrics[f"{prefix}_examples"] = len(examples)
        metrics[f"{prefix}_predictions"] = len(predictions)  # answers written, one per question
        return predictions, metrics


@contextlib.contextmanager
def attributes_set(obj, **values):
    """`obj` (the TrainingArguments, the trainer) with `values` for the duration of the block, then as before."""
    before = {name: getattr(obj, name) for name in values}
    for name, value in values.items():
        setattr(obj, name, value)
    try:
        yield obj
    finally:
        for name, value in before.items():
            setattr(obj, name, value)
