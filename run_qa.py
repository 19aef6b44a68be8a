#!/usr/bin/env python
"""Fine-tune a BERT-style model for extractive question answering (SQuAD v1.1 / v2.0).

    python run_qa.py configs/smoke.json                      # offline, a few CPU minutes
    python run_qa.py configs/reference.json --output_dir runs/ref
    torchrun --nproc_per_node 2 run_qa.py configs/reference.json

Arguments: `python run_qa.py --help` and qa/arguments.py. What a run writes into `output_dir`: README,
"What a run records".
"""
import logging
import sys
import time
from dataclasses import asdict, replace
from pathlib import Path

import psutil
import torch
from transformers import default_data_collator, set_seed

from qa.arguments import eval_out_of_memory, finalize, out_of_memory, parse_args
from qa.console import configure_logging
from qa.data.cache import cached_features, default_cache_dir
from qa.data.collate import BucketPaddingCollator, add_length_column
from qa.data.features import check_tokenizer, prepare_train_features, prepare_validation_features
from qa.data.sources import load_raw_datasets
from qa.distributed import close_process_group, on_main_rank
from qa.errors import EXIT_INTERRUPTED, InputError, command
from qa.evaluation.postprocess import PostProcessing
from qa.io import atomic_write_json
from qa.model import check_model_and_tokenizer, load_model_and_tokenizer
from qa.results.records import environment_record, finish_run, save_split_metrics, write_environment
from qa.training.callbacks import install, run_callbacks, summary
from qa.training.checkpoints import find_checkpoint, run_record
from qa.training.compile import compile_outcome
from qa.training.flops import settle_tf32
from qa.training.preemption import Interrupted, interrupted_by_sigterm
from qa.training.runlock import RunLock
from qa.training.telemetry import token_stats, train_throughput
from trainer_qa import EvaluationOutOfMemory, QuestionAnsweringTrainer, evaluated_during_training

logger = logging.getLogger("run_qa")


def select_examples(dataset, limit):
    """The first `limit` questions: windows are made after this cut, so every kept question keeps them all."""
    return dataset if limit is None else dataset.select(range(min(limit, len(dataset))))


def build_features(split, examples, tokenizer, data_args, training_args, cache_root):
    fn = prepare_train_features if split == "train" else prepare_validation_features
    params = dict(max_seq_length=data_args.max_seq_length, doc_stride=data_args.doc_stride,
                  max_query_length=data_args.max_query_length, pad_to_max_length=data_args.pad_to_max_length)
    features, hit = cached_features(
        examples, tokenizer, fn, params, cache_dir=cache_root, num_proc=data_args.preprocessing_num_workers,
        overwrite=data_args.overwrite_cache, main_process_first=training_args.main_process_first,
        desc=f"tokenizing {split}")
    logger.info("%s: %d questions -> %d features (%s)", split, len(examples), len(features),
                "cached" if hit else "tokenized")
    return features


def run(argv, callbacks=()):
    """`callbacks`: more for the Trainer, e.g. a benchmark's (bench/timed_run.py)."""
    model_args, data_args, run_args, training_args, explicit = parse_args(argv)  # every setting checked
    # Reading should_log sets up the devices and, in a distributed run, the process group that finalize (the
    # world size) and on_main_rank below need. Logging is configured first so that finalize's notes are shown.
    configure_logging(training_args.should_log)
    finalize(training_args, run_args, explicit)
    settle_tf32()  # as TrainingArguments left it, readable by both of torch's APIs (inductor reads the older)
    splits = [s for s, on in (("train", training_args.do_train), ("validation", training_args.do_eval),
                              ("test", training_args.do_predict)) if on]
    if not splits:
        raise InputError("arguments", "nothing to do", "pass --do_train, --do_eval and/or --do_predict")
    if run_args.eval_every is not None and training_args.do_train and not training_args.do_eval:
        raise InputError(f"eval_every={run_args.eval_every:g}", "evaluates during training, on the validation "
                         "split", "pass --do_eval with it, or leave --eval_every out")

    # One run per output folder: rank 0 takes its lock before anything is written there, every rank learns whether
    # it got it. A folder the lock created is removed again if the run stops on bad input below (nothing written).
    lock = RunLock(training_args.output_dir)
    on_main_rank(lock.acquire)
    try:
        # Everything else that can reject the user's input runs before anything is written.
        raw = load_raw_datasets(data_args, splits=splits, cache_dir=model_args.cache_dir)
        cache_root = Path(data_args.features_cache_dir) if data_args.features_cache_dir else default_cache_dir()
        set_seed(training_args.seed)  # before loading: a new QA head is initialised at random
        def check(model, tokenizer):  # on the configuration, before the weights are read
            check_tokenizer(tokenizer, data_args.max_seq_length, data_args.doc_stride, data_args.max_query_length)
            check_model_and_tokenizer(model, tokenizer, data_args)

        model, tokenizer = load_model_and_tokenizer(model_args, work_dir=cache_root, training=training_args.do_train,
                                                    compile=training_args.torch_compile, check=check)
        limits = {"train": data_args.max_train_samples, "validation": data_args.max_eval_samples,
                  "test": data_args.max_predict_samples}
        examples = {s: select_examples(raw[s], limits[s]) for s in raw}
        # What a checkpoint's steps mean: it must fit the one resumed, and no run overwrites a finished one with less
        # training. Checked (and the checkpoint chosen, verified, damaged ones moved aside) once for all ranks.
        record = (run_record(model.config, training_args, data_args, examples["train"]) if training_args.do_train
                  else None)
        checkpoint = on_main_rank(lambda: find_checkpoint(training_args.output_dir, run_args.resume, record))
        if trained_here(checkpoint, training_args):  # the training ended there: its model is evaluated, as it is
            model, tokenizer = load_model_and_tokenizer(
                replace(model_args, model_name_or_path=training_args.output_dir, tokenizer_name=None),
                work_dir=cache_root, training=False, compile=training_args.torch_compile)
        return _train_and_evaluate(model, tokenizer, examples, model_args, data_args, run_args, training_args,
                                   checkpoint, cache_root, record, callbacks)
    finally:
        lock.release()


def trained_here(checkpoint, training_args) -> bool:
    """find_checkpoint names output_dir itself when the training there ended but its run did not."""
    return checkpoint is not None and Path(checkpoint) == Path(training_args.output_dir)


def _train_and_evaluate(model, tokenizer, examples, model_args, data_args, run_args, training_args, checkpoint,
                        cache_root, record, extra_callbacks):
    train = training_args.do_train and not trained_here(checkpoint, training_args)
    features = {s: build_features(s, examples[s], tokenizer, data_args, training_args, cache_root) for s in examples
                if s != "train" or train}

    collator = default_data_collator
    if not data_args.pad_to_max_length:  # dynamic padding, to a few lengths (qa/data/collate.py)
        collator = BucketPaddingCollator(tokenizer, data_args.max_seq_length, data_args.pad_to_multiple_of,
                                         data_args.length_buckets)
        if "train" in features and training_args.train_sampling_strategy == "group_by_length":
            features["train"] = add_length_column(features["train"])  # lengths for the sampler, read at once
    callbacks = run_callbacks(run_args, training_args)
    extra = list(extra_callbacks)
    if run_args.measure_communication:  # the scaling study's instrument: opt-in, and kept with the study
        from scaling.comm_measure import CommunicationMeasurement

        extra.append(CommunicationMeasurement())
    telemetry = callbacks.get("telemetry")
    trainer = QuestionAnsweringTrainer(
        model=model, args=training_args, train_dataset=features.get("train"),
        eval_dataset=features.get("validation"), eval_examples=examples.get("validation"),
        processing_class=tokenizer, data_collator=collator, post_processing=PostProcessing.from_args(data_args),
        log_extras=telemetry.log_values if telemetry else None, checkpoint_record=record)
    install(trainer, [*callbacks.values(), *extra], run_args)

    out = training_args.output_dir
    main = trainer.is_world_process_zero()
    if main:  # the record runs git and asks every GPU: rank 0's alone is written
        env = environment_record({**asdict(model_args), **asdict(data_args), **asdict(run_args),
                                  **training_args.to_dict()})
        write_environment(out, env)

    if train:
        with evaluated_during_training(trainer, run_args.eval_every_questions):
            try:
                result = trainer.train(resume_from_checkpoint=checkpoint)
            except EvaluationOutOfMemory as err:  # in an evaluation during training (--eval_every)
                raise eval_out_of_memory(training_args, err, "the run resumes from its last checkpoint") from None
            except torch.OutOfMemoryError as err:  # one line and its status; the checkpoints stay as they are
                raise out_of_memory(training_args, err) from None
        stopped_at = callbacks["preemption"].stopped_at if "preemption" in callbacks else None
        if stopped_at is not None:
            # Stopped on SIGTERM with checkpoint-N saved: unfinished, so no results are written;
            # every rank leaves together, after the main one has marked the checkpoint complete.
            trainer.accelerator.wait_for_everyone()
            logger.warning("interrupted by SIGTERM (on this or another rank): checkpoint-%d saved in %s; "
                           "rerun (--resume auto) to continue", stopped_at, out)
            return EXIT_INTERRUPTED
        trainer.save_model()
        metrics = dict(result.metrics)
        metrics.update(train_throughput(metrics, token_stats(features["train"]), len(examples["train"])))
        metrics.update(summary([*callbacks.values(), *extra]))
        if main:
            save_split_metrics(out, "train", metrics)
            if "time_to_accuracy" in callbacks:
                atomic_write_json(Path(out) / "time_to_accuracy.json", callbacks["time_to_accuracy"].record())
            trainer.save_state()  # last: trainer_state.json in output_dir says the training ended (its progress)
    # From here on the trained model and its records stay as they are whatever happens: a rerun of the same
    # command evaluates that model without training (qa.training.checkpoints.find_checkpoint).
    then = (f"the trained model and its records stay in {out}, and the same command with it evaluates that model "
            "without training again" if training_args.do_train else "rerun with it")
    try:
        with interrupted_by_sigterm():
            _evaluate(trainer, features, examples, training_args, main)
    except torch.OutOfMemoryError as err:
        raise eval_out_of_memory(training_args, err, then) from None
    except Interrupted:  # nothing to checkpoint: the evaluation is done again by the rerun
        logger.warning("interrupted by SIGTERM during the evaluation%s: rerun the same command to evaluate",
                       f" (the trained model stays in {out})" if training_args.do_train else "")
        return EXIT_INTERRUPTED
    if main:
        compiled = {"compiled": compile_outcome()} if training_args.torch_compile else {}
        # The wall clock from the process's start: imports are part of a job's cost.
        results = finish_run(out, time.time() - psutil.Process().create_time(), env, compiled)
        logger.info("done in %.1f s; results in %s", results["WALL_CLOCK_SECONDS"], out)
    close_process_group()
    return 0


def _evaluate(trainer, features, examples, training_args, main):
    out = training_args.output_dir
    if training_args.do_eval:
        metrics = trainer.evaluate()
        if main:
            save_split_metrics(out, "eval", metrics)
        logger.info("eval: EM %.2f F1 %.2f", metrics.get("eval_exact_match", float("nan")),
                    metrics.get("eval_f1", float("nan")))
    if training_args.do_predict:
        _, metrics = trainer.predict(features["test"], examples["test"])
        if main:
            save_split_metrics(out, "predict", metrics)


@command
def main(argv=None, callbacks=()):
    return run(sys.argv[1:] if argv is None else argv, callbacks)


if __name__ == "__main__":
    sys.exit(main())
