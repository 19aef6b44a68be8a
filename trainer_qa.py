"""A `Trainer` whose evaluate() and predict() report SQuAD's exact match and F1.

The model gives start/end logits per feature (window); answers are per question. So after
the usual prediction loop (which gathers the logits of every rank), the logits are turned
into answer texts and scored against the gold answers. Every rank does this on the same
gathered logits and so ends with the same metrics: `load_best_model_at_end` with
`metric_for_best_model="eval_f1"` then works under DDP, where a metric computed on rank 0
alone leaves the other ranks without `eval_f1` (the failure of the well-known example).
Only the main process writes prediction files.
"""
import math
import os
import time

from transformers import Trainer
from transformers.trainer_utils import speed_metrics

from qa.checkpoints import COMPLETE_MARKER
from qa.io import atomic_write_json
from qa.metric import scores_from_examples
from qa.postprocess import postprocess_qa_predictions


class QuestionAnsweringTrainer(Trainer):
    def __init__(self, *args, eval_examples=None, qa_args=None, **kwargs):
        """`qa_args`: the DataArguments (n_best_size, max_answer_length, v2 settings)."""
        super().__init__(*args, **kwargs)
        self.eval_examples = eval_examples
        self.qa_args = qa_args

    def _save_checkpoint(self, model, trial):
        super()._save_checkpoint(model, trial)
        # Only once every rank has written its part (its RNG state, its FSDP shards) is the
        # checkpoint whole; the marker says so, and resuming trusts nothing without it.
        self.accelerator.wait_for_everyone()
        if self.args.should_save:
            folder = os.path.join(self._get_output_dir(trial=trial), f"checkpoint-{self.state.global_step}")
            atomic_write_json(os.path.join(folder, COMPLETE_MARKER), {"global_step": self.state.global_step})

    def evaluate(self, eval_dataset=None, eval_examples=None, ignore_keys=None, metric_key_prefix="eval"):
        features = eval_dataset if eval_dataset is not None else self.eval_dataset
        examples = eval_examples if eval_examples is not None else self.eval_examples
        _, metrics = self._predict_and_score(features, examples, ignore_keys, metric_key_prefix, "Evaluation")
        self.log(metrics)
        self.control = self.callback_handler.on_evaluate(self.args, self.state, self.control, metrics)
        return metrics

    def predict(self, test_dataset, test_examples=None, ignore_keys=None, metric_key_prefix="predict"):
        """Returns (predictions: question id -> answer text, metrics). Metrics include F1/EM
        only when the examples carry gold answers."""
        predictions, metrics = self._predict_and_score(
            test_dataset, test_examples, ignore_keys, metric_key_prefix, "Prediction")
        self.control = self.callback_handler.on_predict(self.args, self.state, self.control, metrics)
        return predictions, metrics

    def _predict_and_score(self, features, examples, ignore_keys, prefix, description):
        self._memory_tracker.start()
        dataloader = self.get_eval_dataloader(features) if prefix == "eval" else self.get_test_dataloader(features)
        start = time.time()
        output = self.evaluation_loop(dataloader, description=description, prediction_loss_only=False,
                                      ignore_keys=ignore_keys, metric_key_prefix=prefix)
        start_logits, end_logits = output.predictions[:2]
        q = self.qa_args
        predictions, _, _ = postprocess_qa_predictions(
            examples, features, start_logits, end_logits,
            version_2_with_negative=q.version_2_with_negative, n_best_size=q.n_best_size,
            max_answer_length=q.max_answer_length, null_score_diff_threshold=q.null_score_diff_threshold,
            output_dir=self.args.output_dir if self.is_world_process_zero() else None,
            prefix=None if prefix == "eval" else prefix,
        )
        metrics = dict(output.metrics)
        if "answers" in examples.column_names:
            scores = scores_from_examples(examples, predictions, q.version_2_with_negative)
            if "exact" in scores:  # v2 names it "exact"; one name for both versions downstream
                scores = {"exact_match": scores["exact"], **scores}
            metrics.update({f"{prefix}_{k}": v for k, v in scores.items()})
        batch = self.args.eval_batch_size * self.args.world_size
        metrics.update(speed_metrics(prefix, start, num_samples=output.num_samples,
                                     num_steps=math.ceil(output.num_samples / batch)))
        metrics[f"{prefix}_examples"] = len(examples)
        self._memory_tracker.stop_and_update_metrics(metrics)
        return predictions, metrics
