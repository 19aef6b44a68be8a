"""A checkpoint is resumed from only when its files are what was saved: the completion marker
records each file's size and hash, a damaged checkpoint (weights cut short, optimizer state
changed, a file missing) is reported in one line and moved aside, and the run resumes from the
newest checkpoint that verifies; when none does, one `error:` line says to pass --resume never."""
import hashlib
import json
import logging
import shutil

import pytest
import torch
from safetensors.torch import save_file

from qa.manifest import HASH
from qa.training.checkpoints import COMPLETE_MARKER, Checkpoints
from qa.errors import InputError
from tests.helpers import TINY, error_lines, go_offline, hash_tree, offline_env, tiny_bert, wait_until

# ---------------------------------------------------------------------------------------------
# The marker and the checks, on files written by the same libraries as a real checkpoint


def _checkpoint(folder):
    folder.mkdir(parents=True)
    save_file({"w": torch.arange(64, dtype=torch.float32).reshape(8, 8), "b": torch.zeros(8)},
              str(folder / "model.safetensors"))
    torch.save({"state": {0: {"exp_avg": torch.ones(100)}}}, folder / "optimizer.pt")
    (folder / "trainer_state.json").write_text(json.dumps({"global_step": 4, "epoch": 0.5}))
    (folder / "shards").mkdir()
    (folder / "shards" / "part.bin").write_bytes(b"\1" * 100)  # FSDP keeps shards in subfolders
    return folder


def _flip(path, offset=None):
    data = bytearray(path.read_bytes())
    offset = len(data) // 2 if offset is None else offset
    data[offset] ^= 0xFF
    path.write_bytes(bytes(data))


def test_marker_records_every_file_and_verifies(tmp_path):
    folder = _checkpoint(tmp_path / "checkpoint-4")
    Checkpoints(tmp_path).mark(folder, 4)
    marker = json.loads((folder / COMPLETE_MARKER).read_text())
    assert marker["global_step"] == 4 and marker["format"] == 2
    assert sorted(marker["files"]) == ["model.safetensors", "optimizer.pt", "shards/part.bin", "trainer_state.json"]
    assert marker["files"]["optimizer.pt"]["size"] == (folder / "optimizer.pt").stat().st_size
    assert all(len(f[HASH]) == 32 for f in marker["files"].values())
    assert Checkpoints.verify(folder) is None


@pytest.mark.parametrize("damage, problem", [
    (lambda f: (f / "model.safetensors").write_bytes((f / "model.safetensors").read_bytes()[:200]),
     "model.safetensors has 200 bytes, "),
    (lambda f: _flip(f / "optimizer.pt"), "optimizer.pt differs from what was saved (content hash)"),
    (lambda f: _flip(f / "shards" / "part.bin", 0), "shards/part.bin differs from what was saved"),
    (lambda f: (f / "trainer_state.json").unlink(), "trainer_state.json is missing"),
], ids=["truncated weights", "changed optimizer state", "changed shard", "missing file"])
def test_damage_is_found(damage, problem, tmp_path):
    folder = _checkpoint(tmp_path / "checkpoint-4")
    Checkpoints(tmp_path).mark(folder, 4)
    damage(folder)
    assert Checkpoints.verify(folder).startswith(problem), Checkpoints.verify(folder)


# What Checkpoints.choose is told of the run: one that trains on, to step 100.
RUN = {"max_steps": 100, "num_train_epochs": 1.0}


def test_resume_picks_the_newest_that_verifies(tmp_path, caplog):
    for step in (2, 4, 6):
        Checkpoints(tmp_path).mark(_checkpoint(tmp_path / f"checkpoint-{step}"), step)
    (tmp_path / "checkpoint-8").mkdir()  # torn: no marker
    _flip(tmp_path / "checkpoint-6" / "model.safetensors")
    with caplog.at_level(logging.INFO):
        assert Checkpoints(tmp_path, RUN).choose("auto") == str(tmp_path / "checkpoint-4")
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING and "damaged" in r.getMessage()]
    assert len(warnings) == 1 and warnings[0].startswith(
        "checkpoint-6 is damaged (model.safetensors differs from what was saved (content hash)): moved to "), warnings
    assert warnings[0].endswith("; resuming from checkpoint-4")
    assert [p.name for p in tmp_path.glob("damaged-*/*")] == ["checkpoint-6"]
    assert [p.name for p in tmp_path.glob("incomplete-*/*")] == ["checkpoint-8"]


def test_a_marker_without_files_counts_as_damaged(tmp_path, caplog):
    """A marker that lists no files (unreadable, or written by an earlier version: the step alone)
    cannot be verified: that checkpoint is moved aside like a damaged one."""
    for step in (2, 4):
        Checkpoints(tmp_path).mark(_checkpoint(tmp_path / f"checkpoint-{step}"), step)
    (tmp_path / "checkpoint-4" / COMPLETE_MARKER).write_text(json.dumps({"global_step": 4}))
    with caplog.at_level(logging.WARNING):
        assert Checkpoints(tmp_path, RUN).choose("auto") == str(tmp_path / "checkpoint-2")
    assert [r.getMessage() for r in caplog.records][0].startswith(
        f"checkpoint-4 is damaged (its {COMPLETE_MARKER} lists no files to verify): moved to ")
    assert [p.name for p in tmp_path.glob("damaged-*/*")] == ["checkpoint-4"]


def test_a_run_that_does_not_train_leaves_a_finished_run_alone(tmp_path):
    (tmp_path / "trainer_state.json").write_text(json.dumps({"global_step": 6, "epoch": 2.0}))
    with pytest.raises(InputError, match=r"holds a finished run \(trained to step 6, epoch 2\); a run that does not "
                                         r"train would overwrite its results\. Fix: --resume never moves it"):
        Checkpoints(tmp_path).choose("auto")
    assert Checkpoints(tmp_path.parent / "fresh").choose("auto") is None


def test_explicit_damaged_checkpoint_is_refused(tmp_path):
    folder = _checkpoint(tmp_path / "checkpoint-4")
    Checkpoints(tmp_path).mark(folder, 4)
    (folder / "optimizer.pt").unlink()
    with pytest.raises(InputError, match=r"checkpoint-4: damaged checkpoint: optimizer.pt is missing\. Fix: pass "
                                         r"--resume auto"):
        Checkpoints(tmp_path, RUN).choose(str(folder))


# ---------------------------------------------------------------------------------------------
# Through run_qa.py with the real Trainer: a tiny BERT saving every 2 steps, 3 checkpoints kept

COMMON = [*TINY, "--do_train", "--save_strategy", "steps", "--save_steps", "2", "--save_total_limit", "3",
          "--report_to", "none"]


def _trained(tmp_path_factory, name, args):
    """The output folder of run_qa.main with `args`, in-process and offline."""
    from run_qa import main

    out = tmp_path_factory.mktemp(name) / "out"
    with pytest.MonkeyPatch.context() as mp:
        go_offline(mp, tmp_path_factory.getbasetemp() / "hf_ckpt")
        assert main([*args, "--output_dir", str(out)]) == 0
    return out


def _copy(trained, tmp_path, monkeypatch, args):
    """A copy of a trained output folder, and run_qa.main on it with `args` (and more)."""
    from run_qa import main

    go_offline(monkeypatch, trained.parents[1] / "hf_ckpt")
    out = tmp_path / "out"
    shutil.copytree(trained, out)
    return out, lambda *more: main([*args, "--output_dir", str(out), *more])


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """checkpoint-2, -4 and -6 of a 6-step run."""
    out = _trained(tmp_path_factory, "trained", [*COMMON, "--max_steps", "6"])
    assert sorted(p.name for p in out.glob("checkpoint-*")) == ["checkpoint-2", "checkpoint-4", "checkpoint-6"]
    return out


@pytest.fixture
def run(trained, tmp_path, monkeypatch):
    """A copy of the trained output folder, and run_qa.main on it."""
    return _copy(trained, tmp_path, monkeypatch, COMMON)


def _errors(capsys):
    """The `error:` lines of the run (model loading draws progress bars on stderr too)."""
    err = capsys.readouterr().err
    assert "Traceback" not in err, err
    return error_lines(err)


@pytest.mark.parametrize("damage, problem", [
    (lambda c: (c / "model.safetensors").write_bytes((c / "model.safetensors").read_bytes()[:100_000]),
     "model.safetensors has 100,000 bytes, "),
    (lambda c: _flip(c / "optimizer.pt"), "optimizer.pt differs from what was saved (content hash)"),
    (lambda c: (c / "rng_state.pth").unlink(), "rng_state.pth is missing"),
], ids=["truncated weights", "damaged optimizer state", "missing file"])
def test_damaged_latest_checkpoint_resumes_from_the_previous(damage, problem, run, caplog):
    out, main = run
    damage(out / "checkpoint-6")
    with caplog.at_level(logging.INFO):
        assert main("--max_steps", "8") == 0
    lines = [r.getMessage() for r in caplog.records if r.name == "qa.training.checkpoints"]
    damaged = [line for line in lines if " is damaged " in line]
    assert len(damaged) == 1 and "\n" not in damaged[0], lines
    assert damaged[0].startswith(f"checkpoint-6 is damaged ({problem}") and \
        damaged[0].endswith("; resuming from checkpoint-4"), damaged
    assert f"resuming from {out / 'checkpoint-4'}" in lines
    assert [p.name for p in out.glob("damaged-*/*")] == ["checkpoint-6"]
    assert json.loads((out / "trainer_state.json").read_text())["global_step"] == 8
    # the run went on from step 4: it saved step 6 again, whole this time
    assert Checkpoints.verify(out / "checkpoint-6") is None and Checkpoints.verify(out / "checkpoint-8") is None


def test_a_run_that_finishes_removes_the_saves_cut_short_and_nothing_else(run, caplog):
    """incomplete-<time>/ (a checkpoint's save cut short, moved aside by a later run) is never resumed from: the next run
    that finishes removes it, with one line; the complete checkpoints, previous-<time>/, damaged-<time>/ and a folder
    the project did not name stay."""
    out, main = run
    kept = ["previous-20240101-000000", "damaged-20240101-000000", "incomplete-notes"]
    for name in ["incomplete-20240101-000000", *kept]:
        (out / name / "checkpoint-8").mkdir(parents=True)
        (out / name / "checkpoint-8" / "model.safetensors").write_bytes(b"\0" * 100)
    (out / "checkpoint-8").mkdir()  # torn: moved to incomplete-<now> when the run starts, removed when it ends
    with caplog.at_level(logging.INFO):
        assert main("--max_steps", "8") == 0
    said = [r.getMessage() for r in caplog.records if r.name == "qa.training.checkpoints" and "removed" in r.getMessage()]
    assert len(said) == 1 and said[0].startswith(
        f"removed 2 folder(s) of checkpoint saves cut short (never resumed from) in {out}: "
        "incomplete-20240101-000000, incomplete-2"), said
    assert sorted(p.name for p in out.iterdir() if p.is_dir() and not p.name.startswith(("checkpoint-", "runs"))) == \
        sorted([*kept, "plots"])
    for step in (4, 6, 8):
        assert Checkpoints.verify(out / f"checkpoint-{step}") is None, step


def test_no_checkpoint_verifies(run, capsys):
    out, main = run
    for step in (2, 4, 6):
        _flip(out / f"checkpoint-{step}" / "model.safetensors")
    before = hash_tree(out)
    assert main("--max_steps", "8") == 2
    err = _errors(capsys)
    assert len(err) == 1 and err[0].startswith(f"error: {out}: none of its 3 complete checkpoint(s) can be resumed "
                                               "(checkpoint-6: model.safetensors differs"), err
    assert "Fix: pass --resume never to start afresh" in err[0]
    assert hash_tree(out) == before, "nothing moved or written"
    assert main("--max_steps", "2", "--resume", "never") == 0  # the fix works: the earlier run moved aside, whole
    assert {"checkpoint-2", "checkpoint-4", "checkpoint-6", "all_results.json", "trainer_state.json"} <= {
        p.name for p in out.glob("previous-*/*")}


def test_explicit_damaged_checkpoint_stops_the_run(run, capsys):
    out, main = run
    (out / "checkpoint-4" / "scheduler.pt").unlink()
    before = hash_tree(out)
    assert main("--max_steps", "8", "--resume", str(out / "checkpoint-4")) == 2
    err = _errors(capsys)
    assert err == [f"error: {out / 'checkpoint-4'}: damaged checkpoint: scheduler.pt is missing. Fix: pass --resume "
                   "auto (the newest checkpoint that verifies), another checkpoint-N folder, or --resume never to "
                   "start afresh"]
    assert hash_tree(out) == before


@pytest.mark.slow
def test_an_explicit_checkpoint_resumes_from_it_though_newer_ones_exist(run):
    """--resume path/to/checkpoint-N (docs/running.md, "Resuming") picks that one, not the newest: with checkpoint-4
    and -6 beside it, --resume checkpoint-2 goes on from step 2 (checkpoint-4 and -6 written again by this run, the
    Trainer's mean loss over steps 3-8) and trains to the end."""
    import time

    from tests.helpers import assert_complete_checkpoint, results

    out, main = run
    started = time.time()
    assert main("--max_steps", "8", "--resume", str(out / "checkpoint-2")) == 0
    assert json.loads((out / "trainer_state.json").read_text())["global_step"] == 8
    assert results(out)["train_loss_steps"] == "3-8"
    for step in (4, 6, 8):  # each saved by this run, whole
        assert_complete_checkpoint(out / f"checkpoint-{step}", step)
        assert (out / f"checkpoint-{step}" / COMPLETE_MARKER).stat().st_mtime >= started, step


# ---------------------------------------------------------------------------------------------
# A finished run is never overwritten by one that trains less, and a checkpoint resumes only
# under settings that keep what its steps mean. A small run by epochs: 64 questions, batch 16.

SMALL = [*TINY, "--synthetic_train_examples", "64", "--synthetic_eval_examples", "16", "--per_device_train_batch_size",
         "16", "--num_train_epochs", "1", "--do_train", "--do_eval", "--save_strategy", "steps", "--save_steps", "2",
         "--report_to", "none"]


@pytest.fixture(scope="module")
def finished(tmp_path_factory):
    return _trained(tmp_path_factory, "finished", SMALL)


@pytest.fixture
def rerun(finished, tmp_path, monkeypatch):
    """A copy of the finished run's folder, its files, and run_qa.main on it with SMALL's settings."""
    out, main = _copy(finished, tmp_path, monkeypatch, SMALL)
    return out, hash_tree(out), main


@pytest.mark.slow
@pytest.mark.parametrize("args", [(), ("--do_train", "false")], ids=["the same command", "evaluation only"])
def test_a_finished_run_is_not_overwritten(args, rerun, capsys):
    out, before, main = rerun
    step = json.loads((out / "trainer_state.json").read_text())["global_step"]
    assert main(*args) == 2
    err = _errors(capsys)
    assert len(err) == 1, err
    assert err[0].startswith(f"error: {out}: holds a finished run (trained to step {step}, epoch 1); "), err
    assert "--resume never moves it to previous-<time>/ and starts afresh" in err[0]
    assert f"to evaluate it, --model_name_or_path {out} --do_eval, another --output_dir" in err[0]
    assert hash_tree(out) == before


@pytest.mark.slow
def test_resume_never_moves_a_finished_run_aside_whole(rerun):
    out, before, main = rerun
    assert main("--resume", "never") == 0
    aside = list(out.glob("previous-*"))
    assert len(aside) == 1 and hash_tree(aside[0]) == before  # the earlier run, every file as it was
    assert (out / "all_results.json").is_file() and (out / "checkpoint-2").is_dir()  # and the new one beside it


@pytest.mark.slow
def test_more_epochs_train_a_finished_run_further(rerun, caplog):
    out, _, main = rerun
    step = json.loads((out / "trainer_state.json").read_text())["global_step"]
    with caplog.at_level(logging.INFO):
        assert main("--num_train_epochs", "2") == 0
    said = [r.getMessage() for r in caplog.records
            if r.name == "qa.training.checkpoints" and r.levelno == logging.WARNING]
    assert said == [f"resuming checkpoint-{step} with num_train_epochs 2 (it was written with 1)"]
    assert json.loads((out / "trainer_state.json").read_text())["global_step"] == 2 * step


@pytest.mark.slow
@pytest.mark.parametrize("change, differs", [
    ("model", "model hidden_size 64 (now 32); model intermediate_size 256 (now 128)"),
    (["--per_device_train_batch_size", "8"], "global batch 16 (now 8)"),
    (["--max_seq_length", "96", "--doc_stride", "24"],
     "max_seq_length 128 (now 96); doc_stride 32 (now 24)"),
    (["--synthetic_seed", "7"], "training data 64 questions, content "),
], ids=["another model", "another global batch", "other windows", "other training data"])
def test_a_checkpoint_whose_steps_mean_something_else_is_refused(change, differs, rerun, tmp_path, capsys):
    """Even with more epochs, before anything is written; another model would fail to load its
    weights (size mismatch) with a traceback, the others would train on silently."""
    out, before, main = rerun
    if change == "model":
        change = ["--model_name_or_path", str(tiny_bert(tmp_path / "narrower", hidden_size=32, intermediate_size=128))]
    last = max(out.glob("checkpoint-*"), key=lambda p: int(p.name.split("-")[1]))
    assert main(*change, "--num_train_epochs", "2") == 2
    err = _errors(capsys)
    assert len(err) == 1 and err[0].startswith(f"error: {last}: its steps mean something else: "
                                               f"{differs}"), err
    assert err[0].endswith("Fix: resume with its own settings, or start afresh: --resume never (moves it to "
                           "previous-<time>/) or another --output_dir")
    assert hash_tree(out) == before


@pytest.mark.slow
def test_out_of_memory_in_a_step_says_what_to_do_and_the_smaller_batch_resumes(tmp_path, monkeypatch, capsys,
                                                                                caplog):
    """CUDA running out of memory at step 3 (raised on a CPU, as torch raises it): one line naming the
    per-device batch and the fix, exit status 3, checkpoint-2 as it was saved; the fix resumes from it."""
    import functools

    import torch
    from transformers import BertForQuestionAnswering

    from run_qa import main

    go_offline(monkeypatch, tmp_path / "hf")
    out = tmp_path / "out"
    forward, calls = BertForQuestionAnswering.forward, []

    @functools.wraps(forward)
    def runs_out_at_step_3(self, *args, **kwargs):
        calls.append(self.training)
        if calls.count(True) == 3:
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity "
                                         "of 15.77 GiB of which 1.05 GiB is free.")
        return forward(self, *args, **kwargs)

    monkeypatch.setattr(BertForQuestionAnswering, "forward", runs_out_at_step_3)
    assert main([*SMALL, "--output_dir", str(out)]) == 3
    err = _errors(capsys)
    assert err == ["error: per_device_train_batch_size=16: the device ran out of memory in a training step (CUDA "
                   "out of memory. Tried to allocate 2.00 GiB). Fix: pass a smaller --per_device_train_batch_size "
                   "(e.g. 8) with --global_batch 16 (the same global batch); the run resumes from its last checkpoint"]
    assert [p.name for p in out.glob("checkpoint-*")] == ["checkpoint-2"]
    assert Checkpoints.verify(out / "checkpoint-2") is None
    assert not (out / "all_results.json").exists() and not (out / "run.lock").exists()
    monkeypatch.setattr(BertForQuestionAnswering, "forward", forward)
    with caplog.at_level(logging.INFO):
        assert main([*SMALL, "--output_dir", str(out), "--per_device_train_batch_size", "8",
                     "--global_batch", "16"]) == 0
    said = [r.getMessage() for r in caplog.records
            if r.name == "qa.training.checkpoints" and r.levelno == logging.WARNING]
    assert said == ["resuming checkpoint-2 with per-device batch 8 x 2 accumulation x 1 processes (it was written with "
                    "16 x 1 accumulation x 1 processes)"]


# ---------------------------------------------------------------------------------------------
# Stopped after its training ended, in its final evaluation (SIGTERM, out of memory): the rerun
# evaluates the model trained, trains no step and leaves the training's records as they were.
# 64 questions in batches of 16 and --max_steps 6: the end falls inside the second epoch, where
# a resume from the last checkpoint would train a step past it.

ENDED = [*TINY, "--synthetic_train_examples", "64", "--synthetic_eval_examples", "16", "--per_device_train_batch_size",
         "16", "--max_steps", "6", "--do_train", "--do_eval", "--per_device_eval_batch_size", "32",
         "--report_to", "none"]
SAVES = {"steps": ["--save_strategy", "steps", "--save_steps", "2"], "no": ["--save_strategy", "no"]}


def _training_records(out):
    """What the training left: its files (model, state, results, checkpoints) with their hashes, its step, and
    the model's sha256."""
    names = ("model.safetensors", "trainer_state.json", "train_results.json", "config.json")
    return ({name: digest for name, digest in hash_tree(out).items()
             if name in names or name.startswith("checkpoint-")},
            json.loads((out / "trainer_state.json").read_text())["global_step"],
            hashlib.sha256((out / "model.safetensors").read_bytes()).hexdigest())


def _evaluated_without_training(out, main, before, caplog, *more):
    """The rerun of the same command (with `more`): exit 0, the warning, the records as they were, the evaluation's."""
    with caplog.at_level(logging.INFO):
        assert main(*more) == 0
    assert _training_records(out) == before
    said = [r.getMessage() for r in caplog.records
            if r.name == "qa.training.checkpoints" and r.levelno == logging.WARNING]
    assert said == [f"{out}: the training ended (step 6) but not the run: evaluating the model it trained; the "
                    "training's records stay as they are"]
    results = json.loads((out / "all_results.json").read_text())
    assert results["train_runtime"] == json.loads((out / "train_results.json").read_text())["train_runtime"]
    assert results["eval_f1"] == json.loads((out / "eval_results.json").read_text())["eval_f1"] >= 0
    assert "WALL_CLOCK_SECONDS" in results and not (out / "run.lock").exists()


@pytest.mark.slow
@pytest.mark.parametrize("saves", SAVES, ids=["with checkpoints", "save_strategy no"])
def test_sigterm_in_the_final_evaluation_then_the_rerun_evaluates(saves, tmp_path, tmp_path_factory, monkeypatch,
                                                                  caplog):
    """A real SIGTERM to run_qa.py while it evaluates (a test callback holds it at its first evaluation batch)."""
    import signal
    import subprocess
    import sys

    from run_qa import main
    from tests.helpers import REPO

    env = offline_env(tmp_path_factory)
    out, flag, log = tmp_path / "out", tmp_path / "evaluating", tmp_path / "stderr.txt"
    args = [*ENDED, *SAVES[saves], "--output_dir", str(out)]
    with open(log, "w") as stderr:
        proc = subprocess.Popen([sys.executable, "-m", "tests.eval_hooks", "pause", str(flag), "--", *args], cwd=REPO,
                                env=env, stdout=subprocess.DEVNULL, stderr=stderr)
        try:
            wait_until(flag.exists, proc, "the pause in the evaluation", log.read_text, every=0.2)
            assert flag.read_text() == "step 6\n", log.read_text()[-3000:]  # the final evaluation, after training
            proc.send_signal(signal.SIGTERM)
            assert proc.wait(timeout=120) == 143, log.read_text()[-3000:]
        finally:
            if proc.poll() is None:
                proc.kill()
    text = log.read_text()
    assert "interrupted by SIGTERM during final evaluation: stopped at once, nothing more saved; the same command goes " \
           "on from what was saved" in text, text[-3000:]
    assert "Traceback" not in text and not (out / "eval_results.json").exists()
    before = _training_records(out)
    assert before[1] == 6 and (saves == "no") == (not list(out.glob("checkpoint-*")))
    assert 1 < json.loads((out / "trainer_state.json").read_text())["epoch"] < 2  # the end inside an epoch
    go_offline(monkeypatch, env["HF_HOME"])
    _evaluated_without_training(out, lambda *more: main([*args, *more]), before, caplog)


@pytest.mark.slow
def test_out_of_memory_in_the_evaluation_keeps_the_training_and_a_smaller_batch_evaluates(tmp_path, monkeypatch,
                                                                                           capsys, caplog):
    """configs/fast.json's case: no checkpoints, an evaluation batch the device cannot hold (raised at the
    evaluation step, as torch raises it). One line naming the setting and a batch that fits, exit status 3,
    the trained model and its records kept; the fix evaluates them without training."""
    from run_qa import main
    from tests.eval_hooks import OutOfMemoryInEvaluation

    go_offline(monkeypatch, tmp_path / "hf")
    out = tmp_path / "out"
    args = [*ENDED, *SAVES["no"], "--output_dir", str(out)]
    device = [OutOfMemoryInEvaluation(fits=8)]
    assert main(args, callbacks=device) == 3
    assert _errors(capsys) == [
        "error: per_device_eval_batch_size=32: the device ran out of memory in an evaluation (CUDA out of memory. "
        "Tried to allocate 3.00 GiB). Fix: pass a smaller --per_device_eval_batch_size (e.g. 16, or 8); the same "
        f"command with it evaluates the model trained in {out}, without training again"]
    before = _training_records(out)
    assert before[1] == 6 and not (out / "eval_results.json").exists() and not (out / "run.lock").exists()
    _evaluated_without_training(out, lambda *more: main([*args, *more], callbacks=device), before, caplog,
                                "--per_device_eval_batch_size", "8")


@pytest.mark.slow
def test_out_of_memory_in_an_evaluation_during_training_names_the_evaluation_batch(tmp_path, monkeypatch, capsys):
    """--eval_every: the evaluation at step 4 runs out of memory, after checkpoint-2. The line names the
    evaluation batch, not the training one, and the fix resumes from checkpoint-2 to the end."""
    from run_qa import main
    from tests.eval_hooks import OutOfMemoryInEvaluation

    go_offline(monkeypatch, tmp_path / "hf")
    out = tmp_path / "out"
    args = [*ENDED, *SAVES["steps"], "--eval_every", "4", "--output_dir", str(out)]
    device = [OutOfMemoryInEvaluation(fits=8)]
    assert main(args, callbacks=device) == 3
    err = _errors(capsys)
    assert len(err) == 1 and err[0].startswith("error: per_device_eval_batch_size=32: the device ran out of memory "
                                               "in an evaluation (CUDA out of memory."), err
    assert err[0].endswith("Fix: pass a smaller --per_device_eval_batch_size (e.g. 16, or 8); the run resumes from "
                           "its last checkpoint"), err
    assert [p.name for p in out.glob("checkpoint-*")] == ["checkpoint-2"] and Checkpoints.verify(out / "checkpoint-2") \
        is None
    assert main([*args, "--per_device_eval_batch_size", "8"], callbacks=device) == 0
    assert json.loads((out / "trainer_state.json").read_text())["global_step"] == 6
