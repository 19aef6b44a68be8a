"""A full disk or quota (ENOSPC, EDQUOT) at each place a run writes: one `error:` line naming the folder, what was
being written and the fix, exit status 4 (EXIT_DISK_FULL), no traceback, nothing partial (the last complete checkpoint
whole, and the rerun goes on from it; earlier records as they were). A cache's disk full: one warning, and the run goes
on without it. For real: a small tmpfs mounted per test (as root; skipped where mounting is refused), filled by a
filler file that leaves the room wanted, at the moment wanted (a callback at the Trainer's event before the write).
tmpfs cannot be over a quota: EDQUOT is covered where it is recognised, qa.io.disk_full."""
import contextlib
import errno
import json
import logging
import os
import pickle
import shutil
import subprocess
from pathlib import Path
from types import SimpleNamespace

import pytest
from transformers import TrainerCallback

from qa.errors import EXIT_DISK_FULL, command
from qa.io import DiskFull, atomic_write_json, disk_full, writing
from qa.manifest import file_hash
from qa.training.checkpoints import Checkpoints
from tests.helpers import (COMPILED_TINY, FEATURE_PARAMS, TINY, go_offline, hash_tree, minilm_tokenizer, offline_env,
                           one_error_line, run_qa, synthetic_examples, tiny_bert)

FILLER = "filler"
FIX = ("Fix: free space there and rerun, or write elsewhere: another --output_dir (in a SLURM job: OUTPUT_DIR on the "
       "scratch file system)")
# 64 questions in batches of 16, a loss logged every step: seconds a run
SMALL = [*TINY, "--synthetic_train_examples", "64", "--synthetic_eval_examples", "16", "--per_device_train_batch_size",
         "16", "--logging_steps", "1", "--do_train", "--do_eval"]


@pytest.fixture
def disk(tmp_path):
    """A tmpfs of 96 MiB at tmp_path/disk, for this test alone."""
    mount = tmp_path / "disk"
    mount.mkdir()
    try:
        done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=96m", "tmpfs", str(mount)], capture_output=True,
                              text=True)
    except OSError as err:
        pytest.skip(f"no mount command here ({err})")
    if done.returncode:
        pytest.skip(f"mounting a tmpfs is not allowed here (needs root): {done.stderr.strip()}")
    try:
        yield mount
    finally:  # lazily: a writer thread of a failed run may still hold a file there
        subprocess.run(["umount", "-l", str(mount)], check=False)


def leave(mount, room=0):
    """The tmpfs filled but `room` bytes, by the filler file."""
    filler = mount / FILLER
    filler.unlink(missing_ok=True)
    size = shutil.disk_usage(mount).free - room
    fd = os.open(filler, os.O_CREAT | os.O_WRONLY)
    try:
        if size > 0:
            os.posix_fallocate(fd, 0, size)
    finally:
        os.close(fd)


def fills(mount, event, when=lambda state: True, room=0):
    """A callback that fills the tmpfs (but `room`) at the Trainer's `event` when `when(state)`: the next write is the
    site under test."""
    def act(self, args, state, control, **kwargs):
        if when(state):
            leave(mount, room)
    return type("FillsTheDisk", (TrainerCallback,), {event: act})()


@pytest.fixture
def run(disk, tmp_path_factory, monkeypatch):
    """run_qa.main in-process and offline (the tiny BERT and features cached off the tmpfs), its output folder on it."""
    from run_qa import main

    go_offline(monkeypatch, tmp_path_factory.getbasetemp() / "hf_disk_full", drop=("TENSORBOARD_LOGGING_DIR",))
    out = disk / "out"
    return out, lambda args, *callbacks, to=out: main([*args, "--output_dir", str(to)], callbacks=list(callbacks))


def one_error(capfd):
    """The run's one `error:` line; no traceback, no other error line."""
    return one_error_line(capfd.readouterr().err)


def full(folder, what, then=""):
    return (f"error: {folder}: no space left on its file system (ENOSPC) while writing {what}. {FIX}"
            + (f"; {then}" if then else ""))


def tree(folder):
    """Every file below `folder` (the filler aside), with its content hash."""
    return hash_tree(folder, skip=(FILLER,))


def nothing_partial(out):
    """No staging file or folder, no run lock, no incomplete checkpoint left in `out`."""
    left = [p.name for p in Path(out).rglob("*") if p.name.startswith((".tmp-", ".saving-model"))
            or ".tmp" in p.name or p.name == "run.lock"]
    assert not left, left
    for checkpoint in Path(out).glob("checkpoint-*"):
        assert Checkpoints.verify(checkpoint) is None, checkpoint


# ---------------------------------------------------------------------------------------------
# The one recogniser, and EDQUOT, which a tmpfs cannot produce


def test_the_recogniser_knows_both_errnos_however_they_are_said(tmp_path):
    assert disk_full(OSError(errno.EDQUOT, "Disk quota exceeded")) == errno.EDQUOT
    assert disk_full(OSError(errno.ENOSPC, "No space left on device")) == errno.ENOSPC
    # safetensors (Rust) says the errno in its message only
    assert disk_full(Exception("Error while serializing: I/O error: Disk quota exceeded (os error 122)")) == \
        errno.EDQUOT
    try:  # a library's error raised while handling the OSError
        try:
            raise OSError(errno.EDQUOT, "Disk quota exceeded")
        except OSError:
            raise RuntimeError("could not save")
    except RuntimeError as err:
        assert disk_full(err) == errno.EDQUOT
    for other in (OSError(errno.EACCES, "Permission denied"), ValueError("no"), RuntimeError("unexpected pos 5")):
        assert disk_full(other, tmp_path) is None  # a RuntimeError asks the folder, which has room
    with pytest.raises(DiskFull) as raised, writing(tmp_path / "runs" / "x", "checkpoint-6", "the rerun goes on "
                                                    "from checkpoint-4"):
        raise OSError(errno.EDQUOT, "Disk quota exceeded")
    err = raised.value
    assert err.exit_code == EXIT_DISK_FULL == 4 and disk_full(err) == errno.EDQUOT
    assert str(err) == (f"{tmp_path}/runs/x: the disk quota is exceeded (EDQUOT) while writing checkpoint-6. "
                        f"{FIX}; the rerun goes on from checkpoint-4")
    assert str(pickle.loads(pickle.dumps(err))) == str(err)  # whole across processes
    with pytest.raises(ValueError), writing(tmp_path, "anything"):  # any other error passes as it is
        raise ValueError("not the disk")


def test_a_disk_full_error_ends_a_command_with_its_status_and_outcome(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("QA_OUTCOME_FILE", str(tmp_path / "outcome.json"))
    monkeypatch.delenv("RANK", raising=False)

    @command
    def main():
        with writing("runs/x", "eval_results.json"):
            raise OSError(errno.EDQUOT, "Disk quota exceeded")

    assert main() == 4
    line = "runs/x: the disk quota is exceeded (EDQUOT) while writing eval_results.json. " + FIX
    assert capsys.readouterr().err == f"error: {line}\n"
    assert json.loads((tmp_path / "outcome.json").read_text()) == {"status": 4, "outcome": "disk_full",
                                                                   "reason": line}


def test_torch_save_says_no_errno_and_the_folder_is_asked(disk):
    """torch.save's C++ writer fails with 'unexpected pos' and no errno: the probe of the folder finds it full."""
    import torch

    leave(disk, 64 << 10)
    with pytest.raises(DiskFull) as raised, writing(disk, "optimizer.pt"):
        torch.save({"w": torch.zeros(1 << 20)}, disk / "optimizer.pt")
    assert raised.value.code == errno.ENOSPC


# ---------------------------------------------------------------------------------------------
# Each write site of a run, for real


def test_a_disk_full_from_the_start_stops_at_the_lock_and_leaves_nothing(run, disk, capfd):
    """The first write of a run is its lock: cut short, it would hold the folder for 10 minutes."""
    out, main = run
    leave(disk)
    assert main(SMALL) == 4
    assert one_error(capfd) == full(out, "run.lock")
    assert not out.exists()


def test_a_checkpoint_cut_short_leaves_the_last_complete_one_and_the_rerun_goes_on_from_it(run, disk, capfd, caplog):
    out, main = run
    args = [*SMALL, "--max_steps", "4", "--save_strategy", "steps", "--save_steps", "2", "--report_to", "none"]
    # room for the weights and tokenizer, not the optimizer state: torch.save, which says no errno
    assert main(args, fills(disk, "on_step_begin", lambda state: state.global_step == 3, room=12 << 20)) == 4
    assert one_error(capfd) == full(out, "checkpoint-4", "the rerun goes on from checkpoint-2")
    assert sorted(p.name for p in out.glob("checkpoint-*")) == ["checkpoint-2"]
    nothing_partial(out)
    kept = tree(out / "checkpoint-2")
    (disk / FILLER).unlink()
    with caplog.at_level(logging.INFO):
        assert main(args) == 0
    assert f"resuming from {out / 'checkpoint-2'}" in [r.getMessage() for r in caplog.records]
    assert tree(out / "checkpoint-2") == kept and json.loads((out / "trainer_state.json").read_text())[
        "global_step"] == 4


def test_the_final_model_cut_short_then_the_rerun_evaluates_the_last_checkpoint(run, disk, capfd, caplog):
    """The training ended in checkpoint-2 (saved at the last step), then the model's save found the disk full."""
    out, main = run
    args = [*SMALL, "--max_steps", "2", "--save_strategy", "steps", "--save_steps", "2"]
    assert main(args, fills(disk, "on_train_end", room=1 << 20)) == 4
    assert one_error(capfd) == full(out, "the trained model", "the rerun goes on from checkpoint-2")
    assert not (out / "model.safetensors").exists() and not (out / "trainer_state.json").exists()
    nothing_partial(out)
    kept = tree(out / "checkpoint-2")
    (disk / FILLER).unlink()
    with caplog.at_level(logging.WARNING):
        assert main(args) == 0
    said = [r.getMessage() for r in caplog.records if r.name == "qa.training.checkpoints"]
    assert said == [f"{out}: the training ended in checkpoint-2 but its model was not saved (a full disk, or stopped "
                    "while saving): evaluating the model of checkpoint-2; that training's figures (train_results.json) "
                    "are lost"]
    assert tree(out / "checkpoint-2") == kept
    assert file_hash(out / "model.safetensors") == kept["model.safetensors"]
    assert "WALL_CLOCK_SECONDS" in json.loads((out / "all_results.json").read_text())


def test_tensorboard_events_on_a_full_disk_are_one_warning_and_the_training_goes_on(run, disk, capfd, caplog,
                                                                                     monkeypatch):
    """The events on a disk of their own, the model's folder with room: the curves stop, not the training. The events
    are written by tensorboard's thread, whose own traceback would be a second report; a loss logged every step fills
    the events file's last page within a few steps."""
    out, main = run
    monkeypatch.setenv("TENSORBOARD_LOGGING_DIR", str(disk / "runs"))
    with caplog.at_level(logging.WARNING):
        assert main([*SMALL, "--max_steps", "24", "--save_strategy", "no"],
                    fills(disk, "on_step_end", lambda state: state.global_step == 1), to=disk.parent / "out") == 0
    assert stopped_writing(caplog) == [optional(disk / "runs", "TensorBoard events")]
    assert "Traceback" not in capfd.readouterr().err
    assert json.loads((disk.parent / "out" / "trainer_state.json").read_text())["global_step"] == 24
    assert "eval_f1" in json.loads((disk.parent / "out" / "all_results.json").read_text())


def stopped_writing(caplog):
    return [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING and r.name == "qa.io"]


def optional(folder, what):
    return (f"{folder}: no space left on its file system (ENOSPC) while writing {what}: no more of them in this run, "
            "which goes on (free space there for the next run's)")


def frees(mount, event):
    """A callback that gives the room back at the Trainer's `event`, after the run's own callbacks wrote."""
    return type("FreesTheDisk", (TrainerCallback,), {event: lambda *_, **kw: (mount / FILLER).unlink(missing_ok=True)})()


def test_the_evaluation_records_on_a_full_disk_keep_the_training_and_the_rerun_evaluates(run, disk, capfd, caplog):
    out, main = run
    args = [*SMALL, "--max_steps", "2", "--save_strategy", "no", "--report_to", "none"]
    assert main(args, fills(disk, "on_evaluate")) == 4
    assert one_error(capfd) == full(out, "eval_results.json")
    nothing_partial(out)
    assert not (out / "eval_results.json").exists()
    trained = {name: digest for name, digest in tree(out).items()
               if name in ("model.safetensors", "trainer_state.json", "train_results.json")}
    assert len(trained) == 3
    (disk / FILLER).unlink()
    with caplog.at_level(logging.WARNING):
        assert main(args) == 0
    assert {name: tree(out)[name] for name in trained} == trained  # the finished training's records untouched
    assert "eval_f1" in json.loads((out / "eval_results.json").read_text())


def test_predictions_on_a_full_disk_leave_the_earlier_ones_whole(run, disk, capfd):
    """A prediction run beside an earlier one's predictions: these stay as they were."""
    out, main = run
    args = [*SMALL, "--do_train", "false", "--do_eval", "false", "--do_predict", "--report_to", "none"]
    assert main(args) == 0
    earlier = {name: digest for name, digest in tree(out).items() if name.startswith("predict_")}
    assert main(args, fills(disk, "on_prediction_step")) == 4
    assert one_error(capfd) == full(out, "predict_predictions.json")
    nothing_partial(out)
    now = tree(out)
    assert {name: now[name] for name in earlier} == earlier


def test_the_profile_on_a_full_disk_is_one_warning_and_the_run_goes_on(run, disk, capfd, caplog):
    out, main = run
    args = [*SMALL, "--max_steps", "2", "--save_strategy", "no", "--report_to", "none", "--profile", "true",
            "--profile_wait", "0", "--profile_warmup", "0", "--profile_active", "1"]
    with caplog.at_level(logging.WARNING):
        assert main(args, fills(disk, "on_step_begin", lambda state: state.global_step == 0),
                    frees(disk, "on_step_end")) == 0
    assert stopped_writing(caplog) == [optional(out / "profile", "the profile")]
    assert "Traceback" not in capfd.readouterr().err
    nothing_partial(out)
    assert "train_profile_dir" not in json.loads((out / "train_results.json").read_text())  # no profile recorded


def test_nbest_lists_on_a_full_disk_are_one_warning_and_the_predictions_are_written(run, disk, capfd, caplog):
    out, main = run
    args = [*SMALL, "--do_train", "false", "--do_eval", "false", "--do_predict", "--report_to", "none"]
    with caplog.at_level(logging.WARNING):  # room for the predictions, not their 20-best lists
        assert main(args, fills(disk, "on_prediction_step", room=48 << 10)) == 0
    assert stopped_writing(caplog) == [optional(out, "predict_nbest_predictions.json")]
    assert "Traceback" not in capfd.readouterr().err
    nothing_partial(out)
    assert len(json.loads((out / "predict_predictions.json").read_text())) == 16
    assert not (out / "predict_nbest_predictions.json").exists()


def test_the_features_cache_on_a_full_disk_is_one_warning_and_the_run_goes_on(run, disk, capfd, caplog):
    out, main = run
    cache = disk / "features"
    args = [*SMALL, "--do_train", "false", "--features_cache_dir", str(cache), "--report_to", "none"]
    tiny_bert(cache / "tiny-bert")  # the model the run reads from there
    leave(disk)
    with caplog.at_level(logging.WARNING):
        assert main(args, to=disk.parent / "out") == 0
    said = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert said == [f"features cache {cache}: no space left on its file system (ENOSPC): this run goes on with its "
                    "features in memory, uncached"], said
    assert "Traceback" not in capfd.readouterr().err
    assert sorted(p.name for p in cache.iterdir()) == ["tiny-bert", "tiny-bert.lock"]  # no partial entry
    assert "eval_f1" in json.loads((disk.parent / "out" / "all_results.json").read_text())


def test_the_features_of_a_dataset_read_from_a_full_disk_stay_in_memory(disk, caplog):
    """A dataset read from disk (the Hub's, in HF_HOME) gets its map written beside it: there too, the run goes on."""
    from datasets import load_from_disk

    from qa.data.cache import cached_features
    from utils_qa import prepare_train_features

    synthetic_examples().save_to_disk(str(disk / "hub"))
    examples, source = load_from_disk(str(disk / "hub")), tree(disk / "hub")
    leave(disk)
    with caplog.at_level(logging.WARNING):
        feats, hit = cached_features(examples, minilm_tokenizer(), prepare_train_features, FEATURE_PARAMS,
                                     cache_dir=disk / "features")
    assert not hit and len(feats) >= len(examples)
    assert [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING] == [
        f"features cache {disk / 'features'}: no space left on its file system (ENOSPC): this run goes on with its "
        "features in memory, uncached"]
    assert not (disk / "features").exists()
    # what datasets left of its map is its own temporary file (tmpXXXXXXXX), no entry that it would take as valid
    assert {name: digest for name, digest in tree(disk / "hub").items() if not name.startswith("tmp")} == source


def test_the_tiny_model_on_a_full_disk_is_one_line(run, disk, capfd):
    out, main = run
    cache = disk / "features"
    leave(disk, room=64 << 10)
    assert main([*SMALL, "--features_cache_dir", str(cache)], to=disk.parent / "out") == 4
    assert one_error(capfd) == full(cache, "tiny-bert")
    assert [p.name for p in cache.iterdir()] == ["tiny-bert.lock"]


def test_the_compile_cache_on_a_full_disk_is_one_warning_each(disk, monkeypatch, caplog, request):
    """At the start the run compiles without it (torch's per-node default); its record at the end stays as it was."""
    import torch._dynamo
    import torch.fx.experimental._config as shapes

    from qa.training.compile import CACHE_RECORD, configure_compile, record_compile_cache

    for name in ("TORCHINDUCTOR_CACHE_DIR", "TRITON_CACHE_DIR"):  # put back after the test
        monkeypatch.setenv(name, "unset")
    settings = contextlib.ExitStack()  # the config modules' own patch(): monkeypatch would delete these when it undoes
    settings.enter_context(torch._dynamo.config.patch(specialize_float=torch._dynamo.config.specialize_float))
    settings.enter_context(shapes.patch(use_duck_shape=shapes.use_duck_shape))
    request.addfinalizer(settings.close)
    cache = disk / "compile"
    cache.mkdir()
    (cache / "graph.py").write_text("compiled\n")
    atomic_write_json(cache / CACHE_RECORD, {})
    before = tree(cache)
    leave(disk)
    with caplog.at_level(logging.WARNING):
        configure_compile(SimpleNamespace(compile_cache_dir=str(cache), compile_dynamic="auto",
                                          compile_regional=False), disk)
        used = Path(os.environ["TORCHINDUCTOR_CACHE_DIR"])
        shutil.rmtree(used)
        monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(cache))
        record_compile_cache()
    assert not used.is_relative_to(disk)
    assert [r.getMessage() for r in caplog.records] == [
        f"compile cache {cache}: no space left on its file system (ENOSPC): this run compiles without it",
        f"compile cache {cache}: no space left on its file system (ENOSPC): what this run added is not recorded"]
    assert tree(cache) == before


def test_the_check_jobs_files_on_a_full_disk_stay_as_they_were(disk):
    from check_qa import write

    report = SimpleNamespace(main=True, writable=True, problem=None, caveat=None, lines=[], measured={"x": 1.0},
                             predicted={})
    env = {"host": "node1", "command": ["run_qa.py", "--check"]}
    write(report, disk / "out", env)
    before = tree(disk / "out")
    leave(disk)
    with pytest.raises(DiskFull) as raised:
        write(report, disk / "out", env)
    assert str(raised.value) == full(disk / "out", "check.json")[len("error: "):]
    assert tree(disk / "out") == before
    nothing_partial(disk / "out")


def test_the_outcome_file_on_a_full_disk_is_one_warning(disk, monkeypatch, capsys):
    monkeypatch.setenv("QA_OUTCOME_FILE", str(disk / "outcome.json"))
    monkeypatch.delenv("RANK", raising=False)
    leave(disk)
    assert command(lambda: 0)() == 0
    assert capsys.readouterr().err == f"warning: {disk / 'outcome.json'}: how the run ended is not recorded (No space " \
                                      "left on device)\n"
    assert os.listdir(disk) == [FILLER]


@pytest.mark.slow
@pytest.mark.compile
def test_the_compile_cache_filling_while_compiling_is_one_warning_and_the_run_goes_on(disk, tmp_path):
    """Inductor writes its code into the cache as it compiles: the code it was compiling runs eagerly."""
    env = offline_env(tmp_path / "hf")
    leave(disk, room=128 << 10)  # the start's probe passes; the first compiled code does not fit
    proc = run_qa([*COMPILED_TINY, "--max_steps", "1", "--do_eval", "false", "--compile_warmup", "false",
                   "--report_to", "none", "--compile_cache_dir", str(disk / "compile"),
                   "--output_dir", str(tmp_path / "out")], env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    said = [line for line in proc.stderr.splitlines() if "WARNING" in line and "compile" in line]
    assert said and all(f"no space left on its file system (ENOSPC) in the compile cache {disk / 'compile'}" in line
                        for line in said if "torch.compile failed" in line), said
    assert len([line for line in said if "torch.compile failed" in line]) == 1, said
    assert "Traceback" not in proc.stderr
