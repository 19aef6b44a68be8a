"""Time to accuracy (qa/evaluation/time_to_accuracy.py): the training clock leaves the evaluations out, the
target time is interpolated between the evaluations around it (or null with the best F1), and
evaluating during training changes nothing in training, in one process and under torchrun."""
import json
import sys
import time

import pytest

from qa.evaluation.time_to_accuracy import TimeToAccuracyCallback, eval_interval, first_questions, time_to_target
from tests.helpers import TINY, TORCHRUN, go_offline, offline_env, results, run_qa
from tests.helpers import losses as _losses

# ---------------------------------------------------------------------------------------------
# The arithmetic, on hand-made evaluations


def _evaluations(*points):
    return [{"train_seconds": s, "step": step, "f1": f1} for s, step, f1 in points]


def test_interval_is_a_fraction_of_an_epoch_or_steps():
    assert eval_interval(0.25, 79) == 20
    assert eval_interval(0.5, 3) == 2
    assert eval_interval(0.001, 10) == 1  # at least every step
    assert eval_interval(200, 79) == 200
    assert eval_interval(1, 79) == 1      # 1 is one step, as transformers' step intervals read it


def test_time_to_target_interpolates_between_the_evaluations_around_it():
    out = time_to_target(_evaluations((10.0, 10, 50.0), (20.0, 20, 70.0), (30.0, 30, 90.0)), 80.0)
    assert out["train_seconds_to_target_f1"] == pytest.approx(25.0)  # halfway from 70 to 90
    assert out["train_seconds_to_target_f1_at_evaluation"] == 30.0 and out["step_at_target_f1"] == 30
    assert "interpolation" in out["target_f1_method"] and "steps 20" in out["target_f1_method"]
    assert out["best_f1_during_training"] == 90.0 and out["best_f1_during_training_step"] == 30


def test_the_first_crossing_counts_and_equal_is_reached():
    evaluations = _evaluations((10.0, 10, 60.0), (20.0, 20, 80.0), (30.0, 30, 70.0), (40.0, 40, 85.0))
    out = time_to_target(evaluations, 80.0)
    assert out["train_seconds_to_target_f1"] == pytest.approx(20.0) and out["step_at_target_f1"] == 20
    first = time_to_target(evaluations, 55.0)  # already there at the first evaluation: nothing before it
    assert first["train_seconds_to_target_f1"] == 10.0 and "first evaluation" in first["target_f1_method"]


def test_never_reached_is_null_with_the_best_f1():
    out = time_to_target(_evaluations((10.0, 10, 50.0), (20.0, 20, 72.5), (30.0, 30, 71.0)), 88.5)
    assert out["train_seconds_to_target_f1"] is None and out["train_seconds_to_target_f1_at_evaluation"] is None
    assert out["best_f1_during_training"] == 72.5 and out["best_f1_during_training_step"] == 20
    assert "not reached" in out["target_f1_method"]
    assert time_to_target([], 80.0)["best_f1_during_training"] is None


# ---------------------------------------------------------------------------------------------
# The clock, with real time


def test_the_training_clock_stops_while_evaluating(tmp_path):
    """Training steps of 0.05 s, and evaluations of 0.3 s after steps 2 and 4: each evaluation's
    training seconds leave out every evaluation before it."""
    from torch.utils.data import DataLoader
    from transformers import TrainerControl, TrainerState, TrainingArguments

    args = TrainingArguments(output_dir=str(tmp_path), use_cpu=True, per_device_train_batch_size=4, report_to=[])
    state, control = TrainerState(max_steps=4), TrainerControl()
    clock = TimeToAccuracyCallback(every=2)
    started = time.perf_counter()
    clock.on_train_begin(args, state, control, train_dataloader=DataLoader(range(16), batch_size=4))
    for step in range(1, 5):
        time.sleep(0.05)                      # training
        state.global_step = step
        control.should_evaluate = False
        clock.on_step_end(args, state, control)
        assert control.should_evaluate == (step % 2 == 0)  # every 2 steps, and at the last
        if control.should_evaluate:
            time.sleep(0.3)                   # evaluating
            clock.on_evaluate(args, state, control, metrics={"eval_f1": 10.0 * step, "eval_exact_match": 1.0})
    clock.on_train_end(args, state, control)
    elapsed = time.perf_counter() - started
    first, second = clock.evaluations
    assert first["step"] == 2 and second["step"] == 4
    assert first["eval_seconds"] >= 0.3 and clock.evaluation_s >= 0.6
    assert 0.1 <= first["train_seconds"] <= elapsed - 0.6           # two steps; no evaluation in it
    assert second["train_seconds"] - first["train_seconds"] >= 0.1  # two more steps
    assert second["train_seconds"] <= elapsed - 0.6                 # the first evaluation is not in it
    assert clock.summary()["train_seconds_excluding_evaluation"] == pytest.approx(
        elapsed - clock.evaluation_s, abs=0.05)


def test_first_questions_keep_every_window():
    from datasets import Dataset

    examples = Dataset.from_dict({"id": ["a", "b", "c"], "question": ["?"] * 3})
    features = Dataset.from_dict({"example_id": ["a", "a", "b", "c", "c", "c"], "x": list(range(6))})
    ex, feats = first_questions(examples, features, 2)
    assert ex["id"] == ["a", "b"] and feats["x"] == [0, 1, 2]
    assert first_questions(examples, features, None) == (examples, features)


# ---------------------------------------------------------------------------------------------
# Through run_qa.py


def _run(tmp_path, env, name, extra, launcher=(sys.executable,)):
    out = tmp_path / name
    proc = run_qa([*TINY, "--do_train", "--do_eval", "--logging_steps", "1", "--save_strategy", "no",
                   "--output_dir", str(out), *extra], env, launcher)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return out


@pytest.mark.slow
def test_evaluating_during_training_changes_nothing_in_training(tmp_path, tmp_path_factory):
    """Same losses at every step with and without --eval_every (the evaluation's data loader would
    otherwise draw from the random stream that dropout and the next epoch's shuffling use), and
    what the evaluations recorded: the JSON, the results, results.md and TensorBoard."""
    env = offline_env(tmp_path_factory)
    plain = _run(tmp_path, env, "plain", [])
    timed = _run(tmp_path, env, "timed", ["--eval_every", "0.25", "--eval_every_questions", "40",
                                          "--target_f1", "1"])
    assert _losses(timed) == _losses(plain) and len(_losses(plain)) > 8
    record = json.loads((timed / "time_to_accuracy.json").read_text())
    evaluations = record["evaluations"]
    state = json.loads((timed / "trainer_state.json").read_text())
    every, last = record["eval_during_training_interval_steps"], state["max_steps"]
    assert [e["step"] for e in evaluations] == sorted(set(range(every, last + 1, every)) | {last})  # and the last
    assert 7 <= len(evaluations) <= 9  # about 4 per epoch, 2 epochs
    assert all(b["train_seconds"] > a["train_seconds"] and b["features"] > a["features"]
               for a, b in zip(evaluations, evaluations[1:]))
    assert evaluations[-1]["features"] == 2 * results(timed)["train_features"]
    res = results(timed)
    assert res["train_seconds_excluding_evaluation"] + res["train_evaluation_seconds"] <= res["train_runtime"] + 0.5
    assert res["target_f1"] == 1.0 and res["train_seconds_to_target_f1"] is not None
    assert res["train_seconds_to_target_f1"] <= res["train_seconds_to_target_f1_at_evaluation"]
    assert res["eval_examples"] == 100  # the final evaluation takes every validation question again
    summary = (timed / "results.md").read_text()
    assert "training time to F1 1" in summary and "| training time (evaluations included) |" in summary
    assert "| training time |" in (plain / "results.md").read_text()
    assert (timed / "plots" / "f1.png").is_file()  # the evaluations by training seconds, drawn by the run


@pytest.mark.slow
def test_the_final_evaluation_takes_every_question_with_persistent_workers(tmp_path, tmp_path_factory):
    """configs/fast.json keeps DataLoader workers alive, and the Trainer then reuses its eval loader:
    the one over the subset evaluated during training must not serve the final evaluation."""
    out = _run(tmp_path, offline_env(tmp_path_factory), "persistent", [
        "--eval_every", "0.5", "--eval_every_questions", "40", "--dataloader_num_workers", "1",
        "--dataloader_persistent_workers", "true"])
    res = results(out)
    assert res["eval_examples"] == res["eval_predictions"] == 100
    assert json.loads((out / "time_to_accuracy.json").read_text())["evaluations"]


@pytest.mark.slow
def test_never_reached_target_is_null(tmp_path, tmp_path_factory):
    out = _run(tmp_path, offline_env(tmp_path_factory), "unreached", ["--eval_every", "0.5", "--target_f1", "99.9",
                                                               "--num_train_epochs", "1"])
    res = results(out)
    assert res["train_seconds_to_target_f1"] is None and res["best_f1_during_training"] < 99.9
    assert "not reached" in (out / "results.md").read_text()


@pytest.mark.parametrize("extra, culprit", [
    (["--eval_every", "0.25"], "eval_every=0.25"),                # no validation split to evaluate on
    (["--do_eval", "--target_f1", "80"], "target_f1=80"),         # a target without evaluations
    (["--do_eval", "--eval_every", "1.5"], "eval_every=1.5"),     # neither a fraction nor whole steps
    (["--do_eval", "--eval_every_questions", "10"], "eval_every_questions=10"),
])
def test_bad_time_to_accuracy_settings_are_one_line(extra, culprit, tmp_path, monkeypatch, capsys):
    from run_qa import main

    go_offline(monkeypatch, tmp_path / "hf")
    out = tmp_path / "out"
    assert main([*TINY, "--do_train", *extra, "--output_dir", str(out)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith(f"error: {culprit}") and "Fix:" in err[-1], err
    assert not out.exists()


@pytest.mark.slow
@pytest.mark.torchrun
def test_under_torchrun_every_rank_evaluates_and_training_is_unchanged(tmp_path, tmp_path_factory):
    """2 gloo ranks: the evaluations during training run on both (as the final one does) and the
    losses are those of the same run without them."""
    env = offline_env(tmp_path_factory)
    plain = _run(tmp_path, env, "plain", ["--ddp_find_unused_parameters", "false"], TORCHRUN)
    timed = _run(tmp_path, env, "timed", ["--ddp_find_unused_parameters", "false", "--eval_every", "0.5",
                                          "--target_f1", "1"], TORCHRUN)
    assert json.loads((timed / "environment.json").read_text())["distributed"]["WORLD_SIZE"] == "2"
    assert _losses(timed) == _losses(plain)
    assert len(json.loads((timed / "time_to_accuracy.json").read_text())["evaluations"]) == 4
