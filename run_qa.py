#!/usr/bin/env python
"""Fine-tune a BERT-style model for extractive question answering (SQuAD v1.1 / v2.0).

    python run_qa.py configs/smoke.json                      # offline, a few CPU minutes
    python run_qa.py configs/reference.json --output_dir runs/ref
    torchrun --nproc_per_node 2 run_qa.py configs/reference.json

Arguments: see `python run_qa.py --help` and qa/arguments.py. Outputs in `output_dir`:
all_results.json (WALL_CLOCK_SECONDS, train_runtime, samples/s, real tokens/s, F1/EM),
train/eval/predict_results.json, environment.json, results.md, predictions.json,
nbest_predictions.json, trainer_state.json, TensorBoard events under runs/, the model.
"""
import time

WALL_START = time.perf_counter()  # the wall clock covers imports too: they are part of a job's cost

import contextlib  # noqa: E402
import logging  # noqa: E402
import sys  # noqa: E402
from dataclasses import asdict  # noqa: E402
from pathlib import Path  # noqa: E402

import torch  # noqa: E402
from transformers import default_data_collator, set_seed  # noqa: E402

from qa.data.cache import cached_features, default_cache_dir  # noqa: E402
from qa.training.callbacks import RunCallbacks  # noqa: E402
from qa.training.checkpoints import check_no_finished_run, checkpoint_step, find_checkpoint, run_record  # noqa: E402
from qa.data.collate import BucketPaddingCollator, add_length_column  # noqa: E402
from qa.arguments import finalize, out_of_memory, parse_args  # noqa: E402
from qa.console import configure_logging  # noqa: E402
from qa.data import load_raw_datasets  # noqa: E402
from qa.errors import InputError, command  # noqa: E402
from qa.data.features import check_tokenizer, prepare_train_features, prepare_validation_features  # noqa: E402
from qa.io import atomic_write_json  # noqa: E402
from qa.model import check_model_and_tokenizer, compile_outcome, load_model_and_tokenizer  # noqa: E402
from qa.evaluation.postprocess import PostProcessing  # noqa: E402
from qa.training.preemption import EXIT_INTERRUPTED  # noqa: E402
from qa.distributed import close_process_group, on_main_rank  # noqa: E402
from qa.results.records import environment_record, finish_run, save_split_metrics, write_environment  # noqa: E402
from qa.training.runlock import RunLock  # noqa: E402
from qa.training.telemetry import token_stats, train_throughput  # noqa: E402
from qa.evaluation.time_to_accuracy import first_questions  # noqa: E402
from trainer_qa import QuestionAnsweringTrainer, attributes_set, check_trainer_contracts  # noqa: E402

logger = logging.getLogger("run_qa")


def select_examples(dataset, limit):
    """The first `limit` questions. Windows are made after this cut, so every kept question
    keeps all its windows (cutting features instead drops answers and skews the metric)."""
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


def run(argv):
    check_trainer_contracts()
    model_args, data_args, run_args, training_args, explicit = parse_args(argv)  # every setting checked
    # Reading should_log sets up the devices and, in a distributed run, the process group that
    # finalize (the world size) and on_main_rank below need. Logging is configured first so that
    # finalize's notes are shown.
    configure_logging(training_args.should_log)
    finalize(training_args, run_args, explicit)
    splits = [s for s, on in (("train", training_args.do_train), ("validation", training_args.do_eval),
                              ("test", training_args.do_predict)) if on]
    if not splits:
        raise InputError("arguments", "nothing to do", "pass --do_train, --do_eval and/or --do_predict")
    if run_args.eval_every is not None and training_args.do_train and not training_args.do_eval:
        raise InputError(f"eval_every={run_args.eval_every:g}", "evaluates during training, on the validation "
                         "split", "pass --do_eval with it, or leave --eval_every out")

    # One run per output folder: rank 0 takes its lock before anything is written there, and every
    # rank learns whether it got it. A folder the lock created is removed again if the run stops
    # on bad input below (nothing written).
    lock = RunLock(training_args.output_dir)
    on_main_rank(lock.acquire)
    try:
        # Everything else that can reject the user's input runs before anything is written.
        raw = load_raw_datasets(data_args, splits=splits, cache_dir=model_args.cache_dir)
        cache_root = Path(data_args.features_cache_dir) if data_args.features_cache_dir else default_cache_dir()
        set_seed(training_args.seed)  # before loading: a new QA head is initialised at random
        model, tokenizer = load_model_and_tokenizer(model_args, work_dir=cache_root,
                                                    training=training_args.do_train,
                                                    compile=training_args.torch_compile)
        check_tokenizer(tokenizer, data_args.max_seq_length, data_args.doc_stride, data_args.max_query_length)
        check_model_and_tokenizer(model, tokenizer, data_args)
        limits = {"train": data_args.max_train_samples, "validation": data_args.max_eval_samples,
                  "test": data_args.max_predict_samples}
        examples = {s: select_examples(raw[s], limits[s]) for s in raw}
        # What a checkpoint's steps mean. It must fit the one resumed; nothing a finished run wrote is overwritten
        # by a run that trains less. Checked (and the checkpoint chosen, verified, damaged ones moved aside) once
        # for all ranks.
        record = None if not training_args.do_train else run_record(model.config, training_args, data_args,
                                                                    examples["train"])
        checkpoint = None
        if training_args.do_train or run_args.resume == "never":
            checkpoint = on_main_rank(lambda: find_checkpoint(training_args.output_dir, run_args.resume, record))
        else:
            on_main_rank(lambda: check_no_finished_run(training_args.output_dir))
        return _train_and_evaluate(model, tokenizer, examples, model_args, data_args, run_args, training_args,
                                   checkpoint, cache_root, record)
    finally:
        lock.release()


def _train_and_evaluate(model, tokenizer, examples, model_args, data_args, run_args, training_args, checkpoint,
                        cache_root, record):
    features = {s: build_features(s, examples[s], tokenizer, data_args, training_args, cache_root) for s in examples}

    train_stats = token_stats(features["train"]) if "train" in features else None
    collator = default_data_collator
    if not data_args.pad_to_max_length:  # dynamic padding, to a few lengths (qa/data/collate.py)
        collator = BucketPaddingCollator(tokenizer, data_args.max_seq_length, data_args.pad_to_multiple_of,
                                         data_args.length_buckets)
        if "train" in features and training_args.train_sampling_strategy == "group_by_length":
            features["train"] = add_length_column(features["train"])  # lengths for the sampler, read at once
    callbacks = RunCallbacks(run_args, training_args)
    trainer = QuestionAnsweringTrainer(
        model=model, args=training_args, train_dataset=features.get("train"),
        eval_dataset=features.get("validation"), eval_examples=examples.get("validation"),
        processing_class=tokenizer, data_collator=collator, post_processing=PostProcessing.from_args(data_args),
        log_extras=callbacks.log_values, checkpoint_record=record)
    callbacks.install(trainer)

    config = {**asdict(model_args), **asdict(data_args), **asdict(run_args), **training_args.to_dict()}
    env = environment_record(config)
    out = training_args.output_dir
    main = trainer.is_world_process_zero()
    if main:
        write_environment(out, env)

    if training_args.do_train:
        with evaluated_during_training(trainer, run_args):
            try:
                result = trainer.train(resume_from_checkpoint=checkpoint)
            except torch.OutOfMemoryError as err:  # one line and its status; the checkpoints stay as they are
                raise out_of_memory(training_args, err) from None
        stopped_at = callbacks.stopped_at()
        if stopped_at is not None:
            # Stopped on SIGTERM with checkpoint-N saved: unfinished, so no results are written;
            # every rank leaves together, after the main one has marked the checkpoint complete.
            trainer.accelerator.wait_for_everyone()
            logger.warning("interrupted by SIGTERM (on this or another rank): checkpoint-%d saved in %s; "
                           "rerun (--resume auto) to continue", stopped_at, out)
            return EXIT_INTERRUPTED
        # Nothing trained: resumed at the end of a training that had ended, to evaluate it (a job stopped during
        # its final evaluation; qa.training.checkpoints.check_resume). That training's records stay as they are.
        if checkpoint is None or result.global_step > checkpoint_step(checkpoint):
            trainer.save_model()
            metrics = dict(result.metrics)
            metrics.update(train_throughput(metrics, train_stats, len(examples["train"])))
            metrics.update(callbacks.summary())
            if main:
                save_split_metrics(out, "train", metrics)
                trainer.save_state()
                if callbacks.time_to_accuracy is not None:
                    atomic_write_json(Path(out) / "time_to_accuracy.json", callbacks.time_to_accuracy.record())
                if callbacks.communication.record:  # measured at the start of training
                    env["communication"] = callbacks.communication.record
                    write_environment(out, env)
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
    if main:
        compiled = {"compiled": compile_outcome()} if training_args.torch_compile else {}
        results = finish_run(out, time.perf_counter() - WALL_START, env, compiled)
        logger.info("done in %.1f s; results in %s", results["WALL_CLOCK_SECONDS"], out)
    close_process_group()
    return 0


@contextlib.contextmanager
def evaluated_during_training(trainer, run_args):
    """With --eval_every_questions, the evaluations during training take the first N validation
    questions (else all of them); the final evaluation takes them all again."""
    if run_args.eval_every_questions is None:
        yield
        return
    examples, features = first_questions(trainer.eval_examples, trainer.eval_dataset, run_args.eval_every_questions)
    with attributes_set(trainer, eval_examples=examples, eval_dataset=features):
        yield
    # Internal: with persistent workers the Trainer keeps its eval DataLoader under "eval" whatever the
    # dataset, so the subset's loader would feed the final evaluation (fewer logits than features).
    getattr(trainer, "_eval_dataloaders", {}).pop("eval", None)


@command
def main(argv=None):
    return run(sys.argv[1:] if argv is None else argv)


if __name__ == "__main__":
    sys.exit(main())
