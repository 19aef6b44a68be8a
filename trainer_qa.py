"""A `Trainer` whose evaluate() and predict() report SQuAD's exact match and F1.

The model gives start/end logits per feature (window); answers are per question. So after
the usual prediction loop (which gathers the logits of every rank), the logits are turned
into answer texts and scored against the gold answers. Every rank does this on the same
gathered logits and so ends with the same metrics: `load_best_model_at_end` with
`metric_for_best_model="eval_f1"` then works under DDP, where a metric computed on rank 0
alone leaves the other ranks without `eval_f1` (the failure of the well-known example).
Only the main process writes prediction files.
"""
import logging
import math
import os
import shutil
import time

import transformers
from torch.utils.data import SequentialSampler
from transformers import Trainer
from transformers.trainer_pt_utils import LengthGroupedSampler
from transformers.trainer_utils import has_length, rotate_checkpoints, speed_metrics

from qa.checkpoints import COMPLETE_MARKER, write_marker
from qa.errors import InputError
from qa.io import give_new_file_modes
from qa.metric import scores_from_examples
from qa.postprocess import PostProcessing

logger = logging.getLogger(__name__)

# The overrides below of Trainer internals (_get_train_sampler, _get_eval_sampler,
# _save_checkpoint, and the evaluation_loop/_memory_tracker they call) follow transformers'
# code of this release; another release may call them differently without any error.
WRITTEN_FOR_TRANSFORMERS = "5.23"


def check_transformers_version(version: str = transformers.__version__) -> None:
    if version.split(".")[:2] != WRITTEN_FOR_TRANSFORMERS.split("."):
        raise InputError(f"transformers {version}",
                         f"trainer_qa.py overrides Trainer internals written for transformers "
                         f"{WRITTEN_FOR_TRANSFORMERS}.x, which another release may use differently",
                         f"pip install transformers=={WRITTEN_FOR_TRANSFORMERS}.0 (requirements.txt; "
                         "setup_bert.sh installs it)")


class QuestionAnsweringTrainer(Trainer):
    def __init__(self, *args, eval_examples=None, post_processing: PostProcessing = PostProcessing(),
                 log_extras=None, **kwargs):
        """`eval_examples`: the questions behind `eval_dataset` (its features);
        `post_processing`: how logits become answers (qa.postprocess.PostProcessing);
        `log_extras`: a function of a log entry returning values to add to it (the run's
        throughput figures, qa.callbacks.RunCallbacks.log_values)."""
        super().__init__(*args, **kwargs)
        self.eval_examples = eval_examples
        self.post_processing = post_processing
        self.log_extras = log_extras

    def log(self, logs, start_time=None):
        # Trainer.log copies `logs` into state.log_history before any callback sees it, so values
        # a callback added in on_log would miss trainer_state.json; they join here instead
        # (Trainer.log is documented as the method to override for this).
        if self.log_extras is not None:
            logs.update(self.log_extras(logs))
        super().log(logs, start_time)

    def _get_train_sampler(self, train_dataset=None):
        # transformers 5.23 builds the sampler from the dataset *after* removing the columns the
        # model does not take, so a precomputed `length` column is gone by then and it would read
        # every row to measure input_ids; read the column from the full dataset instead.
        dataset = self.train_dataset
        name = self.args.length_column_name
        if (self.args.train_sampling_strategy == "group_by_length" and hasattr(dataset, "column_names")
                and name in dataset.column_names):
            lengths = dataset.with_format("arrow")[name].to_pylist()
            return LengthGroupedSampler(self.args.train_batch_size * self.args.gradient_accumulation_steps,
                                        lengths=lengths)
        return super()._get_train_sampler(train_dataset)

    def _get_eval_sampler(self, eval_dataset):
        # Post-processing pairs the i-th row of logits with the i-th feature, so evaluation and
        # prediction keep the dataset's order. (transformers 5.23 applies a length-grouped,
        # shuffled sampler to evaluation too when train_sampling_strategy="group_by_length".)
        if eval_dataset is None or not has_length(eval_dataset):
            return None
        return SequentialSampler(eval_dataset) if self.args.world_size <= 1 else None

    def _save_checkpoint(self, model, trial):
        folder = os.path.join(self._get_output_dir(trial=trial), f"checkpoint-{self.state.global_step}")
        marker = os.path.join(folder, COMPLETE_MARKER)
        if self.args.should_save and os.path.exists(marker):
            os.remove(marker)  # the same step saved again: incomplete until rewritten
        # The Trainer deletes old checkpoints (save_total_limit) as soon as it has written the new
        # one, before the marker below; a job killed in between would keep no complete checkpoint.
        # So rotation waits until the new one is marked complete.
        limit, self.args.save_total_limit = self.args.save_total_limit, None
        try:
            super()._save_checkpoint(model, trial)
        finally:
            self.args.save_total_limit = limit
        # Only once every rank has written its part (its RNG state, its FSDP shards) is the
        # checkpoint whole; the marker says so, and resuming trusts nothing without it.
        self.accelerator.wait_for_everyone()
        if self.args.should_save:
            give_new_file_modes(folder)  # safetensors writes weights 0600 whatever the umask
            write_marker(folder, self.state.global_step)  # every file's size and hash, for resuming
            rotate_checkpoints(output_dir=os.path.dirname(folder), save_total_limit=limit,
                               best_model_checkpoint=self.state.best_model_checkpoint, use_mtime=True)

    def save_model(self, output_dir=None, _internal_call=False):
        """The final model goes to a staging folder first and then file by file into place with
        atomic renames, so a job killed while saving never leaves a torn weights file. One run
        writes into an output folder at a time (qa.runlock), so the staging folder is this run's;
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
        features = eval_dataset if eval_dataset is not None else self.eval_dataset
        examples = eval_examples if eval_examples is not None else self.eval_examples
        _, metrics = self._predict_and_score(self.get_eval_dataloader(features), features, examples, ignore_keys,
                                             metric_key_prefix, "Evaluation", files_prefix=None)
        self.log(metrics)
        self.control = self.callback_handler.on_evaluate(self.args, self.state, self.control, metrics)
        return metrics

    def predict(self, test_dataset, test_examples=None, ignore_keys=None, metric_key_prefix="predict"):
        """Returns (predictions: question id -> answer text, metrics). Metrics include F1/EM
        only when the examples carry gold answers."""
        predictions, metrics = self._predict_and_score(
            self.get_test_dataloader(test_dataset), test_dataset, test_examples, ignore_keys, metric_key_prefix,
            "Prediction", files_prefix=metric_key_prefix)
        self.control = self.callback_handler.on_predict(self.args, self.state, self.control, metrics)
        return predictions, metrics

    def _predict_and_score(self, dataloader, features, examples, ignore_keys, prefix, description, files_prefix):
        self._memory_tracker.start()
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
        self._memory_tracker.stop_and_update_metrics(metrics)
        return predictions, metrics
