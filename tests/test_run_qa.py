"""run_qa.py end to end, on CPU and offline: it must learn, record what it did, agree with
itself under torchrun, and refuse bad input cleanly."""
import json
import logging
import math
import os
import re
import subprocess
import sys

import pytest

from utils_qa import normalize_answer
from tests.helpers import (REPO, TINY, TORCHRUN, assert_complete_checkpoint, error_lines, go_offline, losses,
                           offline_env, results, run_qa, same_as_predict)

SMOKE = str(REPO / "configs" / "smoke.json")  # the README's main job


def in_process(monkeypatch, tmp_path_factory, out):
    """For run_qa.main in this process: offline with the session's Hugging Face cache (offline_env's), and TensorBoard
    in out/runs, where a run_qa.py process puts it (run_qa.finalize sets the variable only when it is unset, and
    monkeypatch takes it back after the test)."""
    go_offline(monkeypatch, tmp_path_factory.getbasetemp() / "hf_home")
    monkeypatch.setenv("TENSORBOARD_LOGGING_DIR", str(out / "runs"))


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """The README's main job (configs/smoke.json: a pretrained MiniLM fine-tuned on generated
    data), and the same model evaluated on the same questions before any training."""
    env = offline_env(tmp_path_factory)
    before = tmp_path_factory.mktemp("before")
    proc = run_qa([SMOKE, "--do_train", "false", "--output_dir", str(before)], env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = tmp_path_factory.mktemp("smoke")
    proc = run_qa([SMOKE, "--output_dir", str(out)], env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return before, out, env, proc


@pytest.mark.slow
def test_training_learns(trained):
    before, out, _, _ = trained
    f1_before, f1_after = results(before)["eval_f1"], results(out)["eval_f1"]
    assert f1_before < 15, f1_before
    assert f1_after > f1_before + 20 and f1_after > 2.5 * f1_before, (f1_before, f1_after)


@pytest.mark.slow
def test_run_records_everything(trained):
    _, out, _, _ = trained
    res = results(out)
    for key in ("WALL_CLOCK_SECONDS", "train_runtime", "train_samples_per_second", "train_real_tokens_per_second",
                "eval_f1", "eval_exact_match", "eval_loss"):
        assert isinstance(res[key], (int, float)) and res[key] >= 0, key
    assert res["WALL_CLOCK_SECONDS"] > res["train_runtime"]
    assert res["train_examples"] == 1000 and res["train_features"] >= 1000
    for name in ("train_results.json", "eval_results.json", "environment.json", "results.md",
                 "predictions.json", "nbest_predictions.json", "trainer_state.json", "model.safetensors",
                 "eval_data.json"):
        assert (out / name).is_file(), name
    env = json.loads((out / "environment.json").read_text())
    assert env["versions"]["torch"] and env["config"]["learning_rate"] == 3e-4 and env["git_commit"]
    predictions = json.loads((out / "predictions.json").read_text())
    assert len(predictions) == 300
    # time to accuracy (the config evaluates every quarter epoch and names a target it reaches)
    timed = json.loads((out / "time_to_accuracy.json").read_text())
    assert len(timed["evaluations"]) >= 7 and res["target_f1"] == 85
    assert 0 < res["train_seconds_to_target_f1"] < res["train_seconds_excluding_evaluation"] < res["train_runtime"]
    events = list((out / "runs").rglob("events.out.tfevents.*"))
    assert events, "TensorBoard events are written by default"
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    tags = set()
    for e in events:
        acc = EventAccumulator(str(e))
        acc.Reload()
        tags |= set(acc.Tags()["scalars"])
    assert {"train/loss", "train/learning_rate", "train/grad_norm"} <= tags, tags
    assert "eval F1" in (out / "results.md").read_text()
    logged = losses(out)[-1]  # the real run's last logged loss, beside the mean of all its steps
    assert res["train_loss_last_logged"] == pytest.approx(logged, abs=1e-6) and res["train_loss_steps"].startswith("1-")
    assert "| training loss, last logged (mean of steps " in (out / "results.md").read_text()
    assert_breakdown_adds_up(out, training=True)


def assert_breakdown_adds_up(out, training):
    """all_results.json's wall_clock_breakdown: every phase, adding up to the wall clock within 5%, in results.md."""
    from qa.results.wall_clock import PHASES

    res = results(out)
    phases, wall = res["wall_clock_breakdown"], res["WALL_CLOCK_SECONDS"]
    assert set(PHASES) <= set(phases) and all(phases[p] >= 0 for p in PHASES), phases
    assert abs(sum(phases[p] for p in PHASES) - wall) <= 0.05 * wall, (phases, wall)
    assert phases["startup"] > 0 and phases["features"] > 0 and phases["final_evaluation"] > 0
    assert (phases["training"] > 0) == training
    summary = (out / "results.md").read_text()
    assert (f"| training | {phases['training']:.1f} |" in summary) == training, summary
    assert f"| final evaluation | {phases['final_evaluation']:.1f} |" in summary, summary


def test_results_name_each_loss_for_what_it_is():
    """results.md called the run's mean training loss its "final training loss" (1.898 where the last logged loss
    was 0.493): each figure by what it is, the last logged loss beside the mean, and the steps each covers."""
    from qa.results.records import loss_figures, results_markdown

    history = [{"loss": 4.1, "step": 10}, {"eval_f1": 50.0, "step": 10}, {"loss": 0.9, "step": 20},
               {"loss": 0.493, "step": 30}, {"train_loss": 1.898, "step": 30}]
    figures = loss_figures(history, 0, 30)
    assert figures == {"train_loss_steps": "1-30", "train_loss_last_logged": 0.493,
                       "train_loss_last_logged_steps": "21-30"}
    assert loss_figures(history, 25, 30)["train_loss_steps"] == "26-30"  # resumed: the Trainer's mean starts there
    assert loss_figures(history, 25, 30)["train_loss_last_logged_steps"] == "26-30"
    env = {"config": {"do_train": True}, "distributed": {}, "slurm": {}, "git_commit": None, "host": "node1",
           "devices": {"gpus": [], "cpu_count": 2}}
    table = results_markdown({"train_loss": 1.898, "epoch": 2.0, **figures}, env)
    assert "| training loss, mean of steps 1-30 | 1.8980 |" in table
    assert "| training loss, last logged (mean of steps 21-30) | 0.4930 |" in table
    assert "| epochs trained | 2.00 |" in table and "final training loss" not in table


@pytest.mark.slow
def test_the_trained_model_answers_as_do_predict_does_and_has_a_model_card(trained, tmp_path, tmp_path_factory,
                                                                           monkeypatch):
    """bert-squad-answer's API on the main job's model: --do_predict's answers to the questions the
    run evaluated, some of them over several windows; README.md says how to ask it."""
    from answer_qa import Answerer
    from qa.data.sources import read_squad
    from utils_qa import postprocess_qa_predictions, prepare_validation_features

    from run_qa import main

    _, out, _, _ = trained
    questions, predicted = out / "eval_data.json", tmp_path / "predicted"
    in_process(monkeypatch, tmp_path_factory, predicted)
    assert main([SMOKE, "--model_name_or_path", str(out), "--do_train", "false", "--do_eval", "false",
                 "--do_predict", "--test_file", str(questions), "--output_dir", str(predicted)]) == 0
    answerer = Answerer(out)
    columns = read_squad(questions).dataset.to_dict()
    windows = prepare_validation_features(columns, answerer.tokenizer, 128, 32, 32, with_labels=False)
    assert len(windows["input_ids"]) > len(columns["id"])  # some contexts span several windows
    same_as_predict(answerer.answer_file(questions, top_k=3), predicted, dict(zip(columns["id"], columns["context"])))
    # The Hugging Face example's calling convention, on this tokenizer's windows, gives --do_predict's answers.
    args = answerer.data_args
    answers = postprocess_qa_predictions(
        columns, windows, answerer._logits(windows), version_2_with_negative=False, n_best_size=args.n_best_size,
        max_answer_length=args.max_answer_length, null_score_diff_threshold=args.null_score_diff_threshold)
    assert answers == json.loads((predicted / "predict_predictions.json").read_text())
    card = (out / "README.md").read_text()
    assert "base_model: sentence-transformers/all-MiniLM-L6-v2" in card
    assert f"F1 {results(out)['eval_f1']:.2f} / EM {results(out)['eval_exact_match']:.2f} on 300 questions" in card
    assert f"bert-squad-answer {out} --question" in card


@pytest.mark.slow
def test_cached_features_are_reused(trained):
    _, out, _, proc = trained
    assert "features cache hit" in proc.stderr  # the untrained run tokenized the same eval set


@pytest.mark.slow
@pytest.mark.torchrun
def test_torchrun_two_processes_match_single_process(tmp_path, tmp_path_factory):
    """2 gloo ranks train with per-epoch evaluation and keep the best model by eval_f1 (every
    rank must hold the metric), then evaluate; the single-process evaluation of the saved
    model gives the same metrics."""
    env = offline_env(tmp_path_factory)
    ddp = tmp_path / "ddp"
    args = [*TINY, "--do_train", "--do_eval", "--output_dir", str(ddp),
            "--eval_strategy", "epoch", "--save_strategy", "epoch", "--load_best_model_at_end", "true",
            "--metric_for_best_model", "eval_f1", "--ddp_find_unused_parameters", "false"]
    proc = run_qa(args, env, launcher=TORCHRUN)
    assert proc.returncode == 0, proc.stderr[-4000:]
    record = json.loads((ddp / "environment.json").read_text())
    assert record["distributed"]["WORLD_SIZE"] == "2"
    state = json.loads((ddp / "trainer_state.json").read_text())
    assert state["best_metric"] is not None and state["best_model_checkpoint"]
    single = tmp_path / "single"  # a process of its own: its wall-clock breakdown starts with the process
    proc = run_qa([*TINY, "--model_name_or_path", str(ddp), "--do_eval", "--do_predict", "--output_dir", str(single)],
                  env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert (single / "predict_predictions.json").is_file() and "predict_f1" in results(single)
    for key in ("eval_f1", "eval_exact_match"):
        assert results(ddp)[key] == results(single)[key], key
    # The loss is the Trainer's: each rank's batch mean, and the sampler repeats a feature to
    # give both ranks equal shares, so it is close but not equal. The answers are exact.
    assert results(ddp)["eval_loss"] == pytest.approx(results(single)["eval_loss"], rel=0.01)
    assert_breakdown_adds_up(ddp, training=True)  # under torchrun: rank 0's, and every rank's phases gathered
    assert_breakdown_adds_up(single, training=False)
    assert results(single)["wall_clock_breakdown"]["prediction"] > 0


def _write(path, obj):
    path.write_text(json.dumps(obj))
    return str(path)


def _squad(qas, context="Paris is the capital of France."):
    return {"version": "1.1", "data": [{"title": "T", "paragraphs": [{"context": context, "qas": qas}]}]}


GOOD_QA = {"id": "a", "question": "What is the capital?", "answers": [{"text": "Paris", "answer_start": 0}]}

BAD_INPUTS = {
    "missing file": (lambda d: ["--train_file", str(d / "nope.json")], "nope.json"),
    "malformed json": (lambda d: ["--train_file", _bad_text(d / "bad.json", '{"data": [')], "bad.json"),
    "unknown schema": (lambda d: ["--train_file", _write(d / "schema.json", {"rows": [1, 2]})], "schema.json"),
    "missing columns": (lambda d: ["--train_file", _write(d / "cols.json", [{"id": "a", "question": "q"}])],
                        "context"),
    "answer_start off": (lambda d: ["--train_file", _write(d / "off.json", _squad(
        [{**GOOD_QA, "answers": [{"text": "Paris", "answer_start": 3}]}]))], "off.json"),
    "empty question": (lambda d: ["--train_file", _write(d / "emptyq.json", _squad(
        [{**GOOD_QA, "question": "  "}]))], "question"),
    "empty context": (lambda d: ["--train_file", _write(d / "emptyc.json", _squad([], context=""))], "emptyc.json"),
    "duplicate ids": (lambda d: ["--train_file", _write(d / "dup.json", _squad([GOOD_QA, GOOD_QA]))], "dup.json"),
    "v2 without flag": (lambda d: ["--train_file", _write(d / "v2.json", _squad(
        [GOOD_QA, {"id": "b", "question": "Who?", "answers": [], "is_impossible": True}]))],
        "version_2_with_negative"),
    "stride too large": (lambda d: ["--doc_stride", "128"], "doc_stride"),
    "stride zero": (lambda d: ["--doc_stride", "0"], "doc_stride=0"),
    "stride negative": (lambda d: ["--doc_stride", "-5"], "doc_stride=-5"),
    "query length zero": (lambda d: ["--max_query_length", "0"], "max_query_length=0"),
    "longer than the model's positions": (lambda d: ["--max_seq_length", "600", "--doc_stride", "128",
                                                     "--max_query_length", "64"], "for 512 tokens only"),
    "bucket beyond max_seq_length": (lambda d: ["--pad_to_max_length", "false", "--length_buckets", "64", "256"],
                                     "bucket 256"),
    "bucket zero": (lambda d: ["--pad_to_max_length", "false", "--length_buckets", "0", "128"], "bucket 0"),
    "pad multiple zero": (lambda d: ["--pad_to_max_length", "false", "--pad_to_multiple_of", "0"],
                          "pad_to_multiple_of=0"),
    "unknown model path": (lambda d: ["--model_name_or_path", str(d / "no-such-model")], "no-such-model"),
    "offline, not cached": (lambda d: ["--model_name_or_path", "google-bert/bert-base-uncased"], "setup_bert.sh"),
    "offline dataset": (lambda d: ["--dataset_name", "rajpurkar/squad"], "setup_bert.sh"),
    "bad config": (lambda d: [_bad_text(d / "cfg.json", "{oops")], "cfg.json"),
    "preemption checks never": (lambda d: ["--preemption_check_steps", "0"], "preemption_check_steps"),
}


def _bad_text(path, text):
    path.write_text(text)
    return str(path)


@pytest.mark.parametrize("case", sorted(BAD_INPUTS))
def test_bad_input_fails_cleanly(case, tmp_path, monkeypatch, capsys):
    """In-process (a fresh interpreter per case would cost ~10 s of imports each)."""
    from run_qa import main

    make, must_mention = BAD_INPUTS[case]
    go_offline(monkeypatch, tmp_path / "hf")
    out = tmp_path / "out"
    base = ["--model_name_or_path", "bundled:tiny-bert", "--dataset_name", "synthetic", "--do_train",
            "--max_seq_length", "128", "--doc_stride", "32", "--max_query_length", "32", "--use_cpu", "true"]
    extra = make(tmp_path)
    args = (extra if case == "bad config" else base + extra) + ["--output_dir", str(out)]
    assert main(args) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err and err[-1].startswith("error:") and "Fix:" in err[-1], err
    assert must_mention in err[-1], err[-1]
    assert not out.exists(), "bad input must leave no output behind"


@pytest.mark.slow
def test_bad_input_message_is_one_line_naming_the_culprit(tmp_path, tmp_path_factory):
    """Through a real process: exit status 2 and a single `error:` line with the fix."""
    env = offline_env(tmp_path_factory)
    bad = _write(tmp_path / "off.json", _squad([{**GOOD_QA, "answers": [{"text": "Paris", "answer_start": 3}]}]))
    proc = run_qa(["--model_name_or_path", "bundled:tiny-bert", "--train_file", bad, "--do_train",
                   "--output_dir", str(tmp_path / "out")], env)
    assert proc.returncode == 2
    errors = error_lines(proc.stderr)
    assert len(errors) == 1 and "off.json" in errors[0] and "Fix:" in errors[0], proc.stderr[-2000:]
    assert not (tmp_path / "out").exists()


@pytest.mark.slow
def test_checkpoints_are_marked_rotated_and_resumed(tmp_path, tmp_path_factory, monkeypatch, caplog):
    """Checkpoints carry the completion marker, rotation keeps save_total_limit complete ones,
    a torn checkpoint is moved aside, and a rerun resumes from the last complete one (in-process)."""
    from run_qa import main

    out = tmp_path / "ckpt"
    in_process(monkeypatch, tmp_path_factory, out)
    common = [*TINY, "--do_train", "--save_strategy", "steps", "--save_steps", "2", "--save_total_limit", "1",
              "--output_dir", str(out)]
    assert main([*common, "--max_steps", "4"]) == 0
    assert sorted(p.name for p in out.glob("checkpoint-*")) == ["checkpoint-4"]
    assert_complete_checkpoint(out / "checkpoint-4", 4)
    torn = out / "checkpoint-9"
    torn.mkdir()
    (torn / "config.json").write_text("{")  # what a job killed mid-save leaves
    with caplog.at_level(logging.INFO):
        assert main([*common, "--max_steps", "6"]) == 0
    assert f"resuming from {out / 'checkpoint-4'}" in caplog.messages
    assert not torn.exists() and not list(out.glob("incomplete-*"))  # moved aside, then removed once finished
    assert any(m.startswith("removed 1 folder(s) of checkpoint saves cut short") for m in caplog.messages)
    assert json.loads((out / "trainer_state.json").read_text())["global_step"] == 6
    assert main([*common, "--max_steps", "2", "--resume", "never"]) == 0
    assert json.loads((out / "trainer_state.json").read_text())["global_step"] == 2
    assert list(out.glob("previous-*/checkpoint-6"))


def _unlabelled_official(path, version_2=False):
    """An official-format file with three questions and no answers at all (as one to predict on)."""
    contexts = ["Paris is the capital of France and its largest city.",
                "The Nile flows north through eleven countries into the Mediterranean Sea."]
    qas = [[{"id": "u1", "question": "What is the capital of France?"},
            {"id": "u2", "question": "Which is the largest city of France?"}],
           [{"id": "u3", "question": "Where does the Nile flow into?"}]]
    data = {"version": "v2.0" if version_2 else "1.1",
            "data": [{"title": f"T{i}", "paragraphs": [{"context": c, "qas": q}]}
                     for i, (c, q) in enumerate(zip(contexts, qas))]}
    return _write(path, data)


def _unlabelled_jsonl(path):
    rows = [{"id": "j1", "title": "T", "context": "Paris is the capital of France.", "question": "Capital?"},
            {"id": "j2", "title": "T", "context": "The Nile flows north.", "question": "Which way?"}]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


@pytest.mark.parametrize("kind", ["official v1.1", "official v2.0", "json lines"])
def test_predict_on_unlabelled_questions(kind, tmp_path, monkeypatch):
    """--do_predict on a file without answers: a prediction for every question, no F1/EM/loss,
    the results files written, exit 0 (in-process: a tiny random model, no training)."""
    from run_qa import main

    go_offline(monkeypatch, tmp_path / "hf", drop=("TENSORBOARD_LOGGING_DIR",))
    version_2 = kind == "official v2.0"
    test_file = (_unlabelled_jsonl(tmp_path / "test.jsonl") if kind == "json lines"
                 else _unlabelled_official(tmp_path / "test.json", version_2))
    out = tmp_path / "out"
    args = ["--model_name_or_path", "bundled:tiny-bert", "--do_predict", "--test_file", test_file,
            "--max_seq_length", "128", "--doc_stride", "32", "--max_query_length", "32", "--use_cpu", "true",
            "--report_to", "none", "--output_dir", str(out)] + (["--version_2_with_negative"] if version_2 else [])
    assert main(args) == 0
    ids = {"json lines": ["j1", "j2"]}.get(kind, ["u1", "u2", "u3"])
    predictions = json.loads((out / "predict_predictions.json").read_text())
    assert sorted(predictions) == ids and all(isinstance(p, str) for p in predictions.values())
    assert sorted(json.loads((out / "predict_nbest_predictions.json").read_text())) == ids
    assert (out / "predict_null_odds.json").is_file() == version_2
    metrics = json.loads((out / "predict_results.json").read_text())
    assert metrics["predict_examples"] == len(ids) and metrics["predict_runtime"] >= 0
    assert not [k for k in metrics if k.endswith(("_f1", "_exact_match", "_exact", "_loss"))], metrics
    assert json.loads((out / "all_results.json").read_text())["WALL_CLOCK_SECONDS"] > 0
    assert metrics["predict_predictions"] == len(ids)
    # results.md: the file predicted on, how many answers; no rows for steps the run did not take
    summary = (out / "results.md").read_text()
    assert f"| prediction data | {test_file} |" in summary, summary
    assert f"| predictions | {len(ids)} of {len(ids)} questions, in predict_predictions.json |" in summary
    assert "n/a" not in summary and "rajpurkar/squad" not in summary, summary
    assert not [line for line in summary.splitlines() if line.startswith(("| train", "| eval", "| SLURM"))]


@pytest.mark.slow
@pytest.mark.torchrun
def test_torchrun_without_gpu_trains_as_one_gloo_group(watched_torchrun):
    """A GPU config (no use_cpu) started by torchrun on a machine without a GPU: the two
    processes train as one gloo group (half the steps each), not as two lone copies. (The run is
    the teardown test's plain one: run_qa.main under torchrun, with a callback that only watches.)"""
    proc, out = watched_torchrun()
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "no GPU is visible here: training as one gloo group" in proc.stderr
    record = json.loads((out / "environment.json").read_text())
    assert record["distributed"]["WORLD_SIZE"] == "2" and record["config"]["use_cpu"] is True
    features = results(out)["train_features"]
    steps = json.loads((out / "trainer_state.json").read_text())["global_step"]
    assert steps == math.ceil(features / (2 * 4)), (steps, features)  # batch 4 on each of 2 ranks


@pytest.mark.parametrize("world_size", ["1", "2"])
def test_a_command_leaves_with_its_status_and_a_torchrun_rank_without_teardown(world_size):
    """run_qa.py's exit: a torchrun rank (WORLD_SIZE > 1) skips the interpreter's teardown, where gloo's threads
    aborted finished ranks, yet its status, prints and logs get out; one process exits as usual."""
    code = ("import atexit, logging; from qa.distributed import exit_process; logging.basicConfig(); "
            "atexit.register(print, 'teardown'); print('printed'); logging.getLogger('t').warning('logged'); "
            "exit_process(3)")
    env = {k: v for k, v in os.environ.items() if k != "WORLD_SIZE"} | {"WORLD_SIZE": world_size}
    proc = subprocess.run([sys.executable, "-c", code], cwd=REPO, env=env, capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 3 and "logged" in proc.stderr, proc.stderr
    assert proc.stdout.split() == (["printed"] if world_size == "2" else ["printed", "teardown"])


WATCHED_RUN = """
import sys, weakref
import torch.distributed as dist
import run_qa
from transformers import TrainerCallback

class Watch(TrainerCallback):  # weak references only: it must not keep alive what it watches
    def bind(self, trainer):
        self.trainer = weakref.ref(trainer)

    def on_train_end(self, args, state, control, **kwargs):
        self.wrapped = weakref.ref(self.trainer().model_wrapped)
        self.kind = type(self.trainer().model_wrapped).__name__

watch, destroy = Watch(), dist.destroy_process_group

def destroy_once_freed(*args, **kwargs):
    sys.stdout.write(f"{watch.kind} freed before the group: {watch.wrapped() is None}\\n")  # one write: one line
    sys.stdout.flush()
    destroy(*args, **kwargs)

dist.destroy_process_group = destroy_once_freed
run_qa.exit_process(run_qa.main(sys.argv[1:], callbacks=[watch]))
"""


@pytest.fixture(scope="module")
def watched_torchrun(tmp_path_factory):
    """configs/smoke_tiny.json as a GPU config (no use_cpu) under torchrun, its GPUs hidden, through WATCHED_RUN, with
    `extra` arguments: (the CompletedProcess, the output folder), run once per module and `extra` (the gloo-group
    test reads the teardown test's plain run)."""
    runs = {}

    def run(*extra):
        if extra not in runs:
            folder = tmp_path_factory.mktemp("watched")
            script = folder / "watched_run.py"
            script.write_text(WATCHED_RUN)
            # CUDA_VISIBLE_DEVICES="": the same on a GPU machine with its GPUs hidden
            env = {**offline_env(tmp_path_factory), "CUDA_VISIBLE_DEVICES": "", "PYTHONPATH": str(REPO)}
            proc = subprocess.run([*TORCHRUN, str(script), str(REPO / "configs" / "smoke_tiny.json"), "--use_cpu",
                                   "false", "--do_eval", "false", "--save_strategy", "no", "--report_to", "none",
                                   "--output_dir", str(folder / "run"), *extra], cwd=REPO, env=env,
                                  capture_output=True, text=True, timeout=900)
            runs[extra] = proc, folder / "run"
        return runs[extra]

    return run


@pytest.mark.parametrize("extra", [[], ["--ddp_comm_hook", "fp16"]], ids=["plain", "hook-bound-to-trainer"])
@pytest.mark.slow
@pytest.mark.torchrun
def test_a_torchrun_rank_frees_its_ddp_model_before_it_destroys_the_group(extra, watched_torchrun):
    """At a run's end the DDP model, and with it the trainer, is gone before the process group, also when a callback
    bound to the trainer holds it in a reference cycle: freed after the gloo group was destroyed, it dropped the
    group's last reference, whose destructor joined gloo's worker while holding the interpreter lock the worker
    needed to free a finished collective's tensors (a torchrun rank hung at exit)."""
    proc, _ = watched_torchrun(*extra)
    assert proc.returncode == 0, proc.stderr[-3000:]
    said = re.findall(r"(\w+) freed before the group: (True|False)", proc.stdout)
    assert said == [("DistributedDataParallel", "True")] * 2, proc.stdout[-3000:]


@pytest.mark.slow
@pytest.mark.parametrize("mask", [0o022, 0o077], ids=["umask-022", "umask-077"])
def test_written_files_take_the_umask(mask, tmp_path, monkeypatch):
    """Results, predictions, profile tables, checkpoints and model weights get the mode any new
    file gets under the user's umask (0644 under 022: readable by the group on a shared cluster),
    not the 0600 of temporary files."""
    from run_qa import main

    go_offline(monkeypatch, tmp_path / "hf", drop=("TENSORBOARD_LOGGING_DIR",))
    out = tmp_path / "out"
    old = os.umask(mask)
    try:
        code = main([*TINY, "--synthetic_train_examples", "64", "--synthetic_eval_examples", "16",
                     "--do_train", "--do_eval", "--do_predict", "--max_steps", "4", "--save_strategy", "steps",
                     "--save_steps", "2", "--profile", "true", "--profile_wait", "0", "--profile_warmup", "0",
                     "--profile_active", "1", "--output_dir", str(out)])
    finally:
        os.umask(old)
    assert code == 0
    files = {p.relative_to(out).as_posix(): p.stat().st_mode & 0o777 for p in out.rglob("*") if p.is_file()}
    for name in ("all_results.json", "eval_results.json", "environment.json", "results.md", "predictions.json",
                 "predict_predictions.json", "model.safetensors", "checkpoint-4/model.safetensors",
                 "checkpoint-4/checkpoint_complete.json", "profile/operators.txt", "profile/profile.json"):
        assert name in files, name
    wrong = {name: oct(m) for name, m in files.items() if m != 0o666 & ~mask}
    assert not wrong, wrong
    folders = {p.relative_to(out).as_posix(): p.stat().st_mode & 0o777 for p in out.rglob("*") if p.is_dir()}
    assert all(m == 0o777 & ~mask for m in folders.values()), folders


def test_one_error_type_for_every_command(capsys, tmp_path, monkeypatch):
    """InputError stays whole across processes (datasets.map workers), and every command reports
    it the same way: one line, `error: ... Fix: ...`, exit 2."""
    import pickle

    from qa.errors import EXIT_INPUT_ERROR, InputError, command

    err = pickle.loads(pickle.dumps(InputError("train.json, question 'q2'", "no answer", "add one")))
    assert str(err) == "train.json, question 'q2': no answer. Fix: add one"

    @command
    def fails(argv=None):
        raise err

    assert fails() == EXIT_INPUT_ERROR == 2
    assert capsys.readouterr().err == "error: train.json, question 'q2': no answer. Fix: add one\n"
    import importlib.util

    import run_qa
    import score_qa
    from qa import arguments

    mains = [run_qa.main, score_qa.main, arguments.main]
    for tool in ("prefetch", "scaling_predict", "plot_tb"):
        spec = importlib.util.spec_from_file_location(tool, REPO / "tools" / f"{tool}.py")
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        mains.append(module.main)
    # Each runs through `command`: with its body made to refuse, a main says so in one line, ends with 2 and
    # records the refusal (any functools.wraps wrapper has a __wrapped__; only `command` does this).
    outcome = tmp_path / "outcome.json"
    monkeypatch.setenv("QA_OUTCOME_FILE", str(outcome))
    monkeypatch.delenv("RANK", raising=False)
    for m in mains:
        body = m.__wrapped__
        monkeypatch.setattr(body, "__code__", _refuses.__code__)
        assert m([]) == EXIT_INPUT_ERROR, body.__qualname__
        assert capsys.readouterr().err == "error: here: refused. Fix: nothing\n", body.__qualname__
        assert json.loads(outcome.read_text()) == {"status": 2, "outcome": "refused",
                                                   "reason": "here: refused. Fix: nothing"}, body.__qualname__
        outcome.unlink()


def _refuses(*args, **kwargs):
    """A body for a command's main: only its code is used, with the globals of the main it stands in for, so it
    imports what it raises."""
    raise __import__("qa.errors", fromlist=["InputError"]).InputError("here", "refused", "nothing")


def test_a_command_says_how_it_ended_in_the_outcome_file(tmp_path, monkeypatch, capsys):
    """What a job's launcher records, read from QA_OUTCOME_FILE (torchrun ends with 1 whatever a worker's status):
    each status with its outcome and one-line reason, a bug's type and first line (its traceback kept), and
    nothing from a rank other than 0."""
    from qa.errors import EXIT_INTERRUPTED, EXIT_OUT_OF_MEMORY, InputError, command

    @command
    def ends(how):
        if isinstance(how, BaseException):
            raise how
        return how

    outcome = tmp_path / "outcome.json"
    monkeypatch.setenv("QA_OUTCOME_FILE", str(outcome))
    refusal = InputError("--max_seq_length 0", "must be positive", "e.g. 384")
    oom = InputError("per_device_eval_batch_size=64", "the device ran out of memory in an evaluation", "pass 32",
                     exit_code=EXIT_OUT_OF_MEMORY)
    for how, status, name, reason in (
            (0, 0, "completed", "done"),
            (None, 0, "completed", "done"),
            (SystemExit(0), 0, "completed", "done"),  # --help
            (refusal, 2, "refused", "--max_seq_length 0: must be positive. Fix: e.g. 384"),
            (oom, 3, "out_of_memory", "per_device_eval_batch_size=64: the device ran out of memory in an evaluation. "
                                      "Fix: pass 32"),
            (EXIT_INTERRUPTED, 143, "interrupted",
             "stopped by SIGTERM (a time limit or preemption): rerun to continue")):
        assert ends(how) == status
        assert json.loads(outcome.read_text()) == {"status": status, "outcome": name, "reason": reason}, how
    with pytest.raises(RuntimeError):
        ends(RuntimeError("Connection closed by peer\n  at gloo/transport/tcp/pair.cc:598"))
    assert json.loads(outcome.read_text()) == {"status": 1, "outcome": "failed",
                                               "reason": "RuntimeError: Connection closed by peer"}
    outcome.unlink()
    monkeypatch.setenv("RANK", "1")
    assert ends(refusal) == 2 and not outcome.exists()
    monkeypatch.setenv("RANK", "0")
    assert ends(0) == 0 and outcome.exists()
    assert capsys.readouterr().err.count("error: ") == 3  # the refusals' one lines: rank 1's too


def test_a_shell_without_the_environment_gets_one_line(tmp_path):
    """python run_qa.py where the project's environment is not active: which to activate, not a traceback."""
    import subprocess
    import sys

    import re

    subprocess.run([sys._base_executable, "-m", "venv", "--without-pip", str(tmp_path / "bare")], check=True)
    written = tmp_path / "mine.env.sh"  # where setup_bert.sh wrote it (ENV_FILE)
    written.write_text("source .venv/bin/activate\n")
    # The file named is one that exists: not the cluster's default, which the README's local flow never makes
    for script, env_file in (("run_qa.py", written), ("utils_qa.py", written), ("run_qa.py", None)):
        env = {k: v for k, v in os.environ.items() if k not in ("ENV_FILE", "STORE", "VIRTUAL_ENV")}
        env.update(HOME=str(tmp_path / "home"), **({"ENV_FILE": str(env_file)} if env_file else {}))
        proc = subprocess.run([str(tmp_path / "bare" / "bin" / "python"), str(REPO / script), SMOKE],
                              capture_output=True, text=True, timeout=60, cwd=tmp_path, env=env)
        lines = proc.stderr.strip().splitlines()
        assert proc.returncode == 2 and len(lines) == 1, proc.stderr
        assert "environment is not active" in lines[0], lines[0]
        named = re.search(r"Fix: source (\S+)$", lines[0])
        if env_file:
            assert named and named[1] == str(env_file), lines[0]
        else:  # the repository's own (README: VENV_DIR=.venv), or none yet: run the setup
            assert named[1] == str(REPO / ".venv.env.sh") if named else "run ./setup_bert.sh" in lines[0], lines[0]


# ---------------------------------------------------------------------------------------------
# SQuAD v2.0, subsets of whole questions and the global batch, through run_qa.main in-process:
# a tiny BERT, a few dozen questions, 64-token windows.

SHORT_WINDOWS = ["--max_seq_length", "64", "--doc_stride", "16", "--max_query_length", "16", "--use_cpu", "true",
                 "--report_to", "none", "--save_strategy", "no", "--seed", "1"]
CITIES = [("Paris", "France"), ("Rome", "Italy"), ("Berlin", "Germany"), ("Madrid", "Spain"), ("Lisbon", "Portugal"),
          ("Vienna", "Austria"), ("Oslo", "Norway"), ("Dublin", "Ireland"), ("Athens", "Greece"), ("Bern", "Switzerland")]
FILLER = "The old town has narrow streets, small shops and a market every week. "


def _official(path, articles, version="1.1"):
    """An official-format SQuAD file of `articles`: [(context, [(id, question, answer text or None), ...]), ...];
    None: an unanswerable question (SQuAD v2.0's is_impossible, no answers)."""
    data = [{"title": f"T{a}", "paragraphs": [{"context": context, "qas": [
        {"id": qid, "question": question, "is_impossible": answer is None,
         "answers": [] if answer is None else [{"text": answer, "answer_start": context.index(answer)}]}
        for qid, question, answer in qas]}]} for a, (context, qas) in enumerate(articles)]
    return _write(path, {"version": version, "data": data})


def _v2_articles(offset, n):
    """n articles, each with an answerable question (the capital) and an unanswerable one (the population)."""
    articles = []
    for i in range(offset, offset + n):
        city, country = CITIES[i % len(CITIES)]
        articles.append((f"{city} is the capital of {country}. It lies on a river with many old bridges.",
                         [(f"a{i}", f"What is the capital of {country}?", city),
                          (f"n{i}", f"How many people live in {country}?", None)]))
    return articles


@pytest.mark.slow
def test_squad_v2_trains_and_evaluates_with_unanswerable_questions(tmp_path, tmp_path_factory, monkeypatch):
    """--version_2_with_negative end to end on an official v2.0 file: training takes the unanswerable questions, and
    the evaluation reports the official v2.0 figures: as many HasAns/NoAns questions as the file holds, each figure
    what the written predictions score, the overall one their weighted mean, and a null-odds file."""
    from run_qa import main

    out = tmp_path / "out"
    in_process(monkeypatch, tmp_path_factory, out)
    train = _official(tmp_path / "train.json", _v2_articles(0, 16), version="v2.0")
    evaluation = _official(tmp_path / "dev.json", _v2_articles(3, 6), version="v2.0")
    assert main(["--model_name_or_path", "bundled:tiny-bert", "--train_file", train, "--validation_file", evaluation,
                 "--version_2_with_negative", "--do_train", "--do_eval", *SHORT_WINDOWS,
                 "--per_device_train_batch_size", "16", "--learning_rate", "2e-3", "--num_train_epochs", "2",
                 "--output_dir", str(out)]) == 0
    res = results(out)
    assert res["train_examples"] == 32 and json.loads((out / "trainer_state.json").read_text())["global_step"] == 4
    assert (res["eval_total"], res["eval_HasAns_total"], res["eval_NoAns_total"], res["eval_examples"]) == (12, 6, 6, 12)
    predictions = json.loads((out / "predictions.json").read_text())
    gold = {qid: answer for _, qas in _v2_articles(3, 6) for qid, _, answer in qas}
    assert sorted(predictions) == sorted(gold)
    right = {qid: (predictions[qid] == "" if answer is None
                   else normalize_answer(predictions[qid]) == normalize_answer(answer))
             for qid, answer in gold.items()}
    has, no = [q for q in gold if gold[q] is not None], [q for q in gold if gold[q] is None]
    assert res["eval_NoAns_exact"] == res["eval_NoAns_f1"] == pytest.approx(100 * sum(right[q] for q in no) / 6)
    assert res["eval_HasAns_exact"] == pytest.approx(100 * sum(right[q] for q in has) / 6)
    assert res["eval_HasAns_exact"] <= res["eval_HasAns_f1"] <= 100
    for key in ("exact", "f1"):
        assert res[f"eval_{key}"] == pytest.approx((res[f"eval_HasAns_{key}"] + res[f"eval_NoAns_{key}"]) / 2), key
    assert res["eval_exact_match"] == res["eval_exact"]
    assert sorted(json.loads((out / "null_odds.json").read_text())) == sorted(gold)


def _windows(questions, contexts, length=64, stride=16):
    """How many windows the tokenizer cuts each question's context into (its own overflow, not the project's), and
    where each question's first window ends in its context (a character offset)."""
    from tests.helpers import minilm_tokenizer

    enc = minilm_tokenizer()(questions, contexts, truncation="only_second", max_length=length, stride=stride,
                             return_overflowing_tokens=True, return_offsets_mapping=True)
    sample_of = list(enc["overflow_to_sample_mapping"])
    first_end = [max(end for (_, end), part in zip(enc["offset_mapping"][sample_of.index(i)],
                                                   enc.sequence_ids(sample_of.index(i))) if part == 1)
                 for i in range(len(questions))]
    return [sample_of.count(i) for i in range(len(questions))], first_end


@pytest.mark.slow
def test_max_samples_keep_whole_questions(tmp_path, tmp_path_factory, monkeypatch, caplog):
    """--max_train_samples 5 and --max_eval_samples 4 keep the first questions with every window: the last kept
    question's context spans several windows, and all of them are trained on and evaluated (the well-known example
    cut the features to N instead, leaving that question without logits)."""
    from run_qa import main

    out = tmp_path / "out"
    in_process(monkeypatch, tmp_path_factory, out)
    articles = [(f"{city} is the capital of {country}. " + FILLER * (8 if i in (3, 4) else 0),
                 [(f"q{i}", f"What is the capital of {country}?", city)]) for i, (city, country) in enumerate(CITIES)]
    data = _official(tmp_path / "data.json", articles)
    windows, first_end = _windows([qas[0][1] for _, qas in articles], [context for context, _ in articles])
    assert windows[:3] == [1, 1, 1] and min(windows[3:5]) >= 3 and windows[5:] == [1] * 5
    with caplog.at_level(logging.INFO, logger="run_qa"):
        assert main(["--model_name_or_path", "bundled:tiny-bert", "--train_file", data, "--validation_file", data,
                     "--max_train_samples", "5", "--max_eval_samples", "4", "--do_train", "--do_eval",
                     *SHORT_WINDOWS, "--max_steps", "2", "--per_device_train_batch_size", "8",
                     "--output_dir", str(out)]) == 0
    res = results(out)
    assert res["train_examples"] == 5 and res["train_features"] == sum(windows[:5]), (res["train_features"], windows)
    assert res["eval_examples"] == res["eval_predictions"] == 4
    assert f"validation: 4 questions -> {sum(windows[:4])} features (tokenized)" in caplog.messages, caplog.messages
    assert sorted(json.loads((out / "predictions.json").read_text())) == ["q0", "q1", "q2", "q3"]
    nbest = json.loads((out / "nbest_predictions.json").read_text())
    # q3's candidates come from all its windows: some lie past its first window's end
    assert max(e["answer_start"] for e in nbest["q3"] if e["answer_start"] is not None) >= first_end[3]


@pytest.mark.slow
def test_global_batch_by_accumulation_trains_as_the_whole_batch(tmp_path, tmp_path_factory, monkeypatch, caplog):
    """--global_batch 16 on one process, from a per-device batch of 16 (16 x 1) and of 8 (8 x 2 accumulation): the
    same losses and gradient norms step by step (fp32 on a CPU; a tiny BERT without dropout, whose masks would be
    drawn for other shapes; every window padded to the same length), the same data and seed."""
    from run_qa import main
    from tests.helpers import tiny_bert

    model = tiny_bert(tmp_path / "no-dropout", hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    runs = {}
    for batch in (16, 8):
        out = tmp_path / f"batch{batch}"
        in_process(monkeypatch, tmp_path_factory, out)
        with caplog.at_level(logging.INFO, logger="run_qa"):
            assert main([*TINY, "--model_name_or_path", str(model), "--synthetic_train_examples", "64", "--do_train",
                         "--per_device_train_batch_size", str(batch), "--global_batch", "16", "--max_steps", "4",
                         "--logging_steps", "1", "--pad_to_max_length", "true", "--max_seq_length", "64",
                         "--doc_stride", "16", "--max_query_length", "16", "--report_to", "none",
                         "--save_strategy", "no", "--output_dir", str(out)]) == 0
        history = json.loads((out / "trainer_state.json").read_text())["log_history"]
        runs[batch] = ([(e["step"], e["loss"], e["grad_norm"]) for e in history if "loss" in e],
                       results(out)["train_setup"])
    assert "global_batch 16 over 1 processes: per-device batch 8 (configured 8) x gradient accumulation 2" in \
        caplog.messages
    (whole, setup16), (accumulated, setup8) = runs[16], runs[8]
    assert (setup16["per_device_train_batch_size"], setup16["gradient_accumulation_steps"]) == (16, 1)
    assert (setup8["per_device_train_batch_size"], setup8["gradient_accumulation_steps"]) == (8, 2)
    assert [s for s, _, _ in whole] == [s for s, _, _ in accumulated] == [1, 2, 3, 4]
    assert len({loss for _, loss, _ in whole}) == 4  # the model moves: a step that differed would show
    for (step, loss, norm), (_, loss8, norm8) in zip(whole, accumulated):
        assert loss8 == pytest.approx(loss, rel=1e-5, abs=1e-6), step
        assert norm8 == pytest.approx(norm, rel=1e-4, abs=1e-6), step
