#!/usr/bin/env python
"""Fine-tune a BERT-style model for extractive question answering (SQuAD v1.1 / v2.0): `python run_qa.py CONFIG
[--flag value ...]`, under torchrun too (docs/running.md, "Commands"; `--help` and qa/arguments.py for the
arguments). What a run writes: README, "What a run records"."""
import logging
import os
import sys
import time
from dataclasses import asdict, replace
from pathlib import Path
from types import SimpleNamespace

from qa.arguments import check_before_loading  # the standard library only
from qa.errors import EXIT_OUT_OF_MEMORY, InputError, Interrupted, command, require_packages

require_packages("torch", "transformers", "datasets", "accelerate", "matplotlib")  # one line, not a traceback
if __name__ == "__main__" or os.path.basename(sys.argv[0]) == "bert-squad-run":  # a command (torchrun's too)
    if status := command(check_before_loading, ends_the_run=False)(sys.argv[1:]):  # its line before torch loads
        sys.exit(status)
import torch
from transformers import default_data_collator, set_seed

from qa.arguments import CUDA_GRAPH_MODES, asks_check, check_together, parse_args, split_global_batch
from qa.console import configure_logging, configure_output, held_back
from qa.data.cache import cached_features, default_cache_dir
from qa.data.collate import BucketPaddingCollator, add_length_column
from qa.data.sources import load_raw_datasets
from qa.distributed import close_process_group, every_rank, exit_process, on_main_rank
from qa.io import atomic_write_json
from qa.model import check_model_and_tokenizer, load_model_and_tokenizer
from qa.results.records import environment_record, finish_run, loss_figures, save_split_metrics, write_environment
from qa.results.wall_clock import PhaseClock
from qa.training.callbacks import install, run_callbacks, summary
from qa.training.checkpoints import Checkpoints, progress
from qa.training.compile import compile_outcome, cuda_graphs_outcome, record_compile_cache
from qa.training.flops import settle_tf32
from qa.training.preemption import interrupted_by_signals, stopped_during
from qa.training.runlock import RunLock
from qa.training.telemetry import train_throughput
from trainer_qa import EvaluationOutOfMemory, QuestionAnsweringTrainer, evaluated_during_training
from utils_qa import PostProcessing, check_tokenizer, prepare_train_features, prepare_validation_features

logger = logging.getLogger("run_qa")


def run(argv, callbacks=()):
    """`callbacks`: more for the Trainer, e.g. a benchmark's (bench/timed_run.py). A signal at any stage: one line
    saying where (the training's own: a checkpoint first, qa.training.preemption)."""
    clock = PhaseClock()
    try:
        with interrupted_by_signals():
            return _run(argv, callbacks, clock)
    except (Interrupted, KeyboardInterrupt) as stop:
        return stopped_during(clock.left_in or "startup", stop)


def _run(argv, callbacks, clock):
    try:
        parsed = parse_args(argv)  # every setting checked: (model_args, data_args, run_args, training_args, explicit)
    except InputError as err:
        if asks_check(argv):  # the check's verdict, its one line
            from check_qa import say_verdict

            say_verdict(err)
        raise
    model_args, data_args, run_args, training_args, explicit = parsed
    # Reading should_log sets up the devices and process group that finalize needs; logging first shows its notes
    configure_logging(training_args.should_log)
    settings = finalize(training_args, run_args, explicit)  # said once nothing can refuse the run any more
    settle_tf32()  # as TrainingArguments left it, readable by both of torch's APIs (inductor reads the older)
    if run_args.check:  # nothing of a run is written: no lock, no checkpoint, no results
        from check_qa import check_job

        say(settings)
        return check_job(parsed[:4], SimpleNamespace(load=lambda: load(*parsed[:4], clock), features=features_for,
                                                     trainer=trainer_for, out_of_memory=out_of_memory))

    # One run per output folder (qa.training.runlock): rank 0 locks it first; a folder it created goes if load() refuses
    lock = RunLock(training_args.output_dir)
    on_main_rank(lock.acquire)
    try:
        setup = load(model_args, data_args, run_args, training_args, clock)
        say(settings)
        status = _train_and_evaluate(setup, callbacks)
    finally:
        lock.release()
    if status == 0:  # once the trainer is gone: a DDP model freed after its gloo group was destroyed hung its rank
        close_process_group()
    return status


def load(model_args, data_args, run_args, training_args, clock) -> SimpleNamespace:
    """What run() settles before anything is written, and the clock of its phases: the questions, the model and
    tokenizer, and the checkpoint to resume, everything that can still reject the user's input."""
    splits = [s for s, on in (("train", training_args.do_train), ("validation", training_args.do_eval),
                              ("test", training_args.do_predict)) if on]
    clock.since_start("startup")
    with clock.phase("data_loading"):
        raw = load_raw_datasets(data_args, splits=splits, cache_dir=model_args.cache_dir)
        limits = {"train": data_args.max_train_samples, "validation": data_args.max_eval_samples,
                  "test": data_args.max_predict_samples}
        # the first questions, cut before the windows are made: every kept question keeps them all
        examples = {s: raw[s] if limits[s] is None else raw[s].select(range(min(limits[s], len(raw[s])))) for s in raw}
    cache_root = Path(data_args.features_cache_dir) if data_args.features_cache_dir else default_cache_dir()
    set_seed(training_args.seed)  # before loading: a new QA head is initialised at random
    def check(model, tokenizer):  # on the configuration, before the weights are read
        check_tokenizer(tokenizer, data_args.max_seq_length, data_args.doc_stride, data_args.max_query_length)
        check_model_and_tokenizer(model, tokenizer, data_args)

    # What the loading says about the model waits for the checkpoints' refusals, and is not said of a model not used
    with clock.phase("model_loading"), held_back("qa.model") as said:
        model, tokenizer = load_model_and_tokenizer(model_args, work_dir=cache_root, check=check,
                                                    training=training_args.do_train,
                                                    compile=training_args.torch_compile)
        checkpoints = Checkpoints.open(model.config, training_args, data_args, run_args.resume, examples.get("train"))
        if checkpoints.trained_here:  # the training ended there: its model is evaluated, as it is
            said.clear()
            model, tokenizer = load_model_and_tokenizer(
                replace(model_args, model_name_or_path=training_args.output_dir, tokenizer_name=None),
                work_dir=cache_root, training=False, compile=training_args.torch_compile)
    return SimpleNamespace(model_args=model_args, data_args=data_args, run_args=run_args, training_args=training_args,
                           model=model, tokenizer=tokenizer, examples=examples, checkpoints=checkpoints,
                           cache_root=cache_root, clock=clock)


def finalize(training_args, run_args, explicit: set) -> list:
    """The run's defaults unlike transformers': TensorBoard into output_dir, progress bars on a terminal only, no DDP
    search for unused parameters (BERT-QA uses all), --global_batch split over the world (the process group is up);
    -> the lines that say the batch."""
    if "report_to" not in explicit:
        training_args.report_to = ["tensorboard"]
    os.environ.setdefault("TENSORBOARD_LOGGING_DIR", os.path.join(training_args.output_dir, "runs"))
    configure_output(training_args, explicit)
    if "ddp_find_unused_parameters" not in explicit and not training_args.fsdp:
        training_args.ddp_find_unused_parameters = False
    world, configured, lines = training_args.world_size, training_args.per_device_train_batch_size, []
    if run_args.global_batch is not None:
        batch, accumulation = split_global_batch(run_args.global_batch, world, configured)
        lines.append(f"global_batch {run_args.global_batch} over {world} processes: per-device batch {batch} "
                     f"(configured {configured}) x gradient accumulation {accumulation}")
        training_args.per_device_train_batch_size, training_args.gradient_accumulation_steps = batch, accumulation
        check_together(training_args.to_dict())  # the accumulation it set, as if given
    batch, accumulation = training_args.per_device_train_batch_size, training_args.gradient_accumulation_steps
    return lines + [f"global batch {batch * world * accumulation} = per-device {batch} x world size {world} x gradient "
                    f"accumulation {accumulation}; learning rate {training_args.learning_rate} (not scaled with the "
                    "batch)"]


def say(lines) -> None:
    for line in lines:
        logger.info(line)


def features_for(setup, train):
    """The features of the run's splits (train's only if it trains) and the collator that batches them."""
    args, data = setup.training_args, setup.data_args
    params = {k: getattr(data, k) for k in ("max_seq_length", "doc_stride", "max_query_length", "pad_to_max_length")}
    features, collator = {}, default_data_collator
    with setup.clock.phase("features"):
        for split in [s for s in setup.examples if s != "train" or train]:
            examples = setup.examples[split]
            features[split], hit = cached_features(
                examples, setup.tokenizer, prepare_train_features if split == "train" else prepare_validation_features,
                params, cache_dir=setup.cache_root, num_proc=data.preprocessing_num_workers,
                overwrite=data.overwrite_cache, main_process_first=args.main_process_first, desc=f"tokenizing {split}")
            logger.info("%s: %d questions -> %d features (%s)", split, len(examples), len(features[split]),
                        "cached" if hit else "tokenized")
        if not data.pad_to_max_length:  # dynamic padding, to a few lengths (qa/data/collate.py)
            # fixed widths: fixed rows too, so that a static compile sees len(length_buckets) shapes
            collator = BucketPaddingCollator(setup.tokenizer, data.max_seq_length, data.pad_to_multiple_of,
                                             data.length_buckets, data.length_buckets and args.train_batch_size)
            if "train" in features and args.train_sampling_strategy == "group_by_length":
                features["train"] = add_length_column(features["train"])  # lengths for the sampler, read at once
    return features, collator


def trainer_for(setup, features, collator, extra_callbacks=()):
    """The run's callbacks (by role, and the others) and its Trainer."""
    args, data = setup.training_args, setup.data_args
    callbacks = run_callbacks(setup.run_args, args)
    extra = list(extra_callbacks)
    if setup.run_args.measure_communication:  # the scaling study's instrument: opt-in, and kept with the study
        from scaling.comm_measure import CommunicationMeasurement

        extra.append(CommunicationMeasurement())
    telemetry = callbacks.get("telemetry")
    with setup.clock.phase("model_loading"):  # the Trainer places the model on its device
        trainer = QuestionAnsweringTrainer(
            model=setup.model, args=args, train_dataset=features.get("train"),
            eval_dataset=features.get("validation"), eval_examples=setup.examples.get("validation"),
            processing_class=setup.tokenizer, data_collator=collator, post_processing=PostProcessing.from_args(data),
            log_extras=telemetry.log_values if telemetry else None, checkpoints=setup.checkpoints, clock=setup.clock)
    install(trainer, [*callbacks.values(), *extra], setup.run_args)
    return callbacks, extra, trainer


def _train_and_evaluate(setup, extra_callbacks):
    """Trains, evaluates, predicts and records: the run's exit status."""
    args = setup.training_args
    train = args.do_train and not setup.checkpoints.trained_here
    features, collator = features_for(setup, train)
    callbacks, extra, trainer = trainer_for(setup, features, collator, extra_callbacks)

    out, main = args.output_dir, trainer.is_world_process_zero()
    if main:  # the record runs git and asks every GPU: rank 0's alone is written
        with setup.clock.phase("saving"):
            env = environment_record({**asdict(setup.model_args), **asdict(setup.data_args),
                                      **asdict(setup.run_args), **args.to_dict()})
            write_environment(out, env)

    if train:
        # read now: checkpoint rotation may remove the checkpoint it resumes from before training ends
        resumed = progress(setup.checkpoints.resume_from)[0] if setup.checkpoints.resume_from else 0
        with evaluated_during_training(trainer, setup.run_args.eval_every_questions), setup.clock.phase("training"):
            try:
                result = trainer.train(resume_from_checkpoint=setup.checkpoints.resume_from)
            except EvaluationOutOfMemory as err:  # in an evaluation during training (--eval_every)
                raise out_of_memory(args, err, "the run resumes from its last checkpoint") from None
            except torch.OutOfMemoryError as err:  # one line and its status; the checkpoints stay as they are
                raise out_of_memory(args, err) from None
        if (stopped_at := callbacks["preemption"].stopped_at if "preemption" in callbacks else None) is not None:
            # Stopped by a signal with checkpoint-N saved: no results; every rank leaves once the main one marked it
            trainer.accelerator.wait_for_everyone()
            cause, status = callbacks["preemption"].stopped_by()
            logger.warning("interrupted by %s (on this or another rank): checkpoint-%d saved in %s; "
                           "rerun (--resume auto) to continue", cause, stopped_at, out)
            return status
        metrics = {**result.metrics, **loss_figures(trainer.state.log_history, resumed, result.global_step),
                   **train_throughput(result.metrics, features["train"], len(setup.examples["train"])),
                   **summary([*callbacks.values(), *extra])}
        with setup.clock.phase("saving"):
            trainer.save_model()
            if main:
                save_split_metrics(out, "train", metrics)
                if "time_to_accuracy" in callbacks:
                    atomic_write_json(Path(out) / "time_to_accuracy.json", callbacks["time_to_accuracy"].record())
                trainer.save_state()  # last: trainer_state.json in output_dir says the training ended (its progress)
                setup.checkpoints.remove_incomplete()
    # From here on the trained model and its records stay: a rerun evaluates it without training (Checkpoints.choose)
    then = (f"the same command with it evaluates the model trained in {out}, without training again" if args.do_train
            else "rerun with it")
    try:
        _evaluate(trainer, features, setup.examples, args, main, setup.clock)
    except torch.OutOfMemoryError as err:
        raise out_of_memory(args, err, then) from None
    ranks = every_rank(setup.clock.seconds)
    if main:
        compiled = {"compiled": compile_outcome()} if args.torch_compile else {}
        if args.torch_compile and args.torch_compile_mode in CUDA_GRAPH_MODES:
            compiled["cuda_graphs"] = cuda_graphs_outcome()
        if compiled.get("compiled") == "yes":  # what the next jobs may reuse
            record_compile_cache()
        wall = time.time() - setup.clock.started  # from the process's start: imports are part of a job's cost
        results = finish_run(out, wall, env, {**compiled, "wall_clock_breakdown": setup.clock.breakdown(wall, ranks)})
        logger.info("done in %.1f s; results in %s", results["WALL_CLOCK_SECONDS"], out)
    return 0


def _evaluate(trainer, features, examples, training_args, main, clock):
    if training_args.do_eval:
        with clock.phase("final_evaluation"):
            metrics = trainer.evaluate()
            if main:
                save_split_metrics(training_args.output_dir, "eval", metrics)
        logger.info("eval: EM %.2f F1 %.2f", metrics.get("eval_exact_match", float("nan")),
                    metrics.get("eval_f1", float("nan")))
    if training_args.do_predict:
        with clock.phase("prediction"):
            _, metrics = trainer.predict(features["test"], examples["test"])
            if main:
                save_split_metrics(training_args.output_dir, "predict", metrics)


def out_of_memory(args, error, then=None) -> InputError:
    """Out of memory in a training step (`then` None): the fix keeps the global batch, so that the run can resume. In
    an evaluation: a smaller evaluation batch changes no result; `then` says what the rerun with it does."""
    name = "per_device_train_batch_size" if then is None else "per_device_eval_batch_size"
    batch = getattr(args, name)
    if batch == 1:
        fix = "lower --max_seq_length, or use a device with more memory"
    elif then is None:
        fix = (f"pass a smaller --{name} (e.g. {batch // 2}) with --global_batch "
               f"{batch * args.gradient_accumulation_steps * args.world_size} (the same global batch); the run resumes "
               "from its last checkpoint")
    else:
        fix = f"pass a smaller --{name} (e.g. {batch // 2}, or {max(batch // 4, 1)}); {then}"
    said = ". ".join((str(error).strip().splitlines() or ["OutOfMemoryError"])[0].split(". ")[:2])[:80].rstrip(".")
    where = "a training step" if then is None else "an evaluation"
    return InputError(f"{name}={batch}", f"the device ran out of memory in {where} ({said})", fix,
                      exit_code=EXIT_OUT_OF_MEMORY)


@command
def main(argv=None, callbacks=()):
    return run(sys.argv[1:] if argv is None else argv, callbacks)


def cli():
    """The command line's entry (run_qa.py, bert-squad-run): main's status, as the process's exit status."""
    exit_process(main())


if __name__ == "__main__":
    cli()
