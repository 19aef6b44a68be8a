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
import signal
import threading
import time

import torch
from torch.utils.data import SequentialSampler
from transformers import Trainer, TrainerCallback
from transformers.trainer_pt_utils import LengthGroupedSampler
from transformers.trainer_utils import has_length, rotate_checkpoints, speed_metrics

from qa.checkpoints import COMPLETE_MARKER
from qa.io import atomic_write_json, give_new_file_modes
from qa.metric import scores_from_examples
from qa.postprocess import postprocess_qa_predictions

logger = logging.getLogger(__name__)

# run_qa.py's exit status when training stopped on SIGTERM after saving a checkpoint: the run is
# unfinished and resumable (128 + SIGTERM, what a shell reports for a process ended by SIGTERM).
EXIT_INTERRUPTED = 128 + signal.SIGTERM


class CheckpointOnSignalCallback(TrainerCallback):
    """On SIGTERM: finish the optimizer step under way, save a checkpoint, stop training.

    SLURM sends SIGTERM at a job's time limit and on preemption, job_ft3.sh/job_ddp.sh send it
    when `--signal=B:USR1@T` warns them, and torchrun forwards it to its workers. The ranks of a
    distributed run get it at slightly different moments, possibly in different steps, and a rank
    that saved and stopped alone would leave the others waiting in a collective. So at the end of
    every optimizer step the ranks agree whether any of them got the signal (an all-reduce of one
    number; the Trainer synchronises with the device at every step anyway) and all save the same
    step's checkpoint (marked complete by QuestionAnsweringTrainer._save_checkpoint once every
    rank has written its part) and stop together. run_qa.py then exits with EXIT_INTERRUPTED
    without evaluating or writing results; `--resume auto` continues from that checkpoint with the
    optimizer, scheduler, RNG states and data position restored.

    Unlike transformers' `enable_jit_checkpoint` (each rank checkpoints on its own, 3 s after its
    own SIGTERM, at whichever step it is in; then `train()` returns as if training had finished),
    this is safe under DDP/FSDP and tells the caller that training did not finish.
    The handler is installed from on_train_begin to on_train_end only; a SIGTERM during
    evaluation ends the process as usual (the final checkpoint of the training is already saved).
    """

    signals = (signal.SIGTERM,)

    def __init__(self):
        self.received = None      # the signal this rank got, if any
        self.stopped_at = None    # global step at which training stopped on a signal
        self._previous = {}

    def _handler(self, signum, frame):
        self.received = signum    # a flag only: the training loop acts on it at the step's end

    def on_train_begin(self, args, state, control, **kwargs):
        self.received = self.stopped_at = None
        if threading.current_thread() is not threading.main_thread():
            logger.warning("checkpoint on SIGTERM: not in the main thread, no signal handler installed")
            return
        if getattr(args, "enable_jit_checkpoint", False):
            logger.warning("checkpoint on SIGTERM: replacing transformers' enable_jit_checkpoint handler "
                           "(its ranks checkpoint independently, which can hang DDP/FSDP)")
        for sig in self.signals:
            self._previous[sig] = signal.signal(sig, self._handler)
        if torch.distributed.is_available() and torch.distributed.is_initialized():
            # One line per rank (warning: the level other ranks log at), so a job log shows who joined.
            logger.warning("rank %d of %d (%s backend) on %s, pid %d: training from step %d; SIGTERM saves a "
                           "checkpoint", torch.distributed.get_rank(), torch.distributed.get_world_size(),
                           torch.distributed.get_backend(), os.uname().nodename, os.getpid(), state.global_step)

    def _any_rank_received(self, args) -> bool:
        flag = self.received is not None
        if torch.distributed.is_available() and torch.distributed.is_initialized() \
                and torch.distributed.get_world_size() > 1:
            t = torch.tensor([int(flag)], dtype=torch.int32, device=args.device)
            torch.distributed.all_reduce(t, op=torch.distributed.ReduceOp.MAX)
            flag = bool(t.item())
        return flag

    def on_step_end(self, args, state, control, **kwargs):
        if self.stopped_at is not None or not self._any_rank_received(args):
            return
        if state.global_step >= state.max_steps:
            return  # the last step: training ends now anyway and saves its final checkpoint
        self.stopped_at = state.global_step
        control.should_save = True
        control.should_training_stop = True
        logger.warning("signal received: saving checkpoint-%d and stopping (resume with --resume auto)",
                       state.global_step)

    def on_epoch_end(self, args, state, control, **kwargs):
        if self.stopped_at is not None:  # that step is saved already; no epoch-end save or evaluation
            control.should_save = control.should_evaluate = False

    def on_train_end(self, args, state, control, **kwargs):
        for sig, handler in self._previous.items():
            signal.signal(sig, handler if handler is not None else signal.SIG_DFL)
        self._previous = {}


class QuestionAnsweringTrainer(Trainer):
    def __init__(self, *args, eval_examples=None, qa_args=None, **kwargs):
        """`qa_args`: the DataArguments (n_best_size, max_answer_length, v2 settings)."""
        super().__init__(*args, **kwargs)
        self.eval_examples = eval_examples
        self.qa_args = qa_args

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
            atomic_write_json(marker, {"global_step": self.state.global_step})
            rotate_checkpoints(output_dir=os.path.dirname(folder), save_total_limit=limit,
                               best_model_checkpoint=self.state.best_model_checkpoint, use_mtime=True)

    def save_model(self, output_dir=None, _internal_call=False):
        """The final model goes to a staging folder first and then file by file into place with
        atomic renames, so a job killed while saving never leaves a torn weights file."""
        if _internal_call:  # a checkpoint: whole only once it has the marker
            return super().save_model(output_dir, _internal_call=True)
        target = output_dir or self.args.output_dir
        staging = os.path.join(target, ".saving-model")
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
