"""One run per output folder (qa/training/runlock.py): a second run refuses at start with one line naming
the first, a lock left by a run that is gone is taken over, a requeued SLURM job takes over its
own lock, every rank of a refused torchrun run stops, and the lock is given back on every exit."""
import json
import logging
import os
import signal
import socket
import subprocess
import sys
import time

import pytest

from qa.training import runlock
from qa.errors import InputError
from qa.training.runlock import LOCK_NAME, RunLock, process_start, stale_reason, this_run
from tests.helpers import TINY, TORCHRUN, error_lines, go_offline, offline_env, run_qa, running, wait_until

# ---------------------------------------------------------------------------------------------
# The rule, on real processes


def _ended_pid() -> int:
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    return child.pid


def _holder(**fields):
    return {**this_run(), **fields}


def test_a_live_run_on_this_host_holds_its_lock():
    me = this_run()
    assert stale_reason(_holder(), 1e6, me) is None  # alive: however old its heartbeat
    assert process_start(os.getpid()) == me["process_start"] is not None


def test_a_run_whose_process_ended_is_gone():
    assert stale_reason(_holder(pid=_ended_pid()), 0, this_run()) == "its process has ended"


def test_a_reused_pid_is_not_the_holder():
    holder = _holder(process_start=this_run()["process_start"] - 1)
    assert stale_reason(holder, 0, this_run()) == "its process has ended"


def test_another_host_is_judged_by_its_heartbeat():
    holder = _holder(host="node7", pid=1)
    assert stale_reason(holder, runlock.STALE_AFTER_SECONDS - 5, this_run()) is None
    assert stale_reason(holder, runlock.STALE_AFTER_SECONDS + 60, this_run()) == "its heartbeat stopped 11 min ago"


def test_a_requeued_slurm_job_takes_over_its_own_lock():
    me = {**this_run(), "slurm_job_id": "4242", "slurm_restart_count": 1}
    earlier = _holder(host="node7", slurm_job_id="4242", slurm_restart_count=0)
    assert stale_reason(earlier, 0, me) == "it is an earlier run of this SLURM job (restart 0)"
    assert stale_reason(_holder(slurm_job_id="4242", slurm_restart_count=1), 0, me) is None  # the same run
    assert stale_reason(_holder(slurm_job_id="99", slurm_restart_count=0), 0, me) is None     # another job


# ---------------------------------------------------------------------------------------------
# The lock file


def _write_lock(folder, **fields):
    folder.mkdir(parents=True, exist_ok=True)
    (folder / LOCK_NAME).write_text(json.dumps(_holder(**fields)))
    return folder / LOCK_NAME


def test_acquire_release_and_refuse(tmp_path):
    out = tmp_path / "a" / "out"
    first = RunLock(out)
    first.acquire()
    record = json.loads((out / LOCK_NAME).read_text())
    assert (record["host"], record["pid"]) == (socket.gethostname(), os.getpid())
    assert {"process_start", "slurm_job_id", "slurm_restart_count", "started_utc"} <= set(record)
    with pytest.raises(InputError) as info:
        RunLock(out).acquire()
    message = str(info.value)
    assert "\n" not in message and message.startswith(f"{out}: is in use by another run (host "
                                                      f"{socket.gethostname()}, pid {os.getpid()}, started ")
    assert f"Fix: wait for that run to end, or give another --output_dir; if no such run is alive, delete " \
           f"{out / LOCK_NAME}" in message
    first.release()
    assert not (tmp_path / "a").exists(), "the folders the lock made are removed when the run left them empty"
    second = RunLock(out)
    second.acquire()
    (out / "results.json").write_text("{}")
    second.release()
    assert sorted(p.name for p in out.iterdir()) == ["results.json"]


def test_stale_lock_is_taken_over(tmp_path, caplog):
    out = tmp_path / "out"
    gone = _ended_pid()
    _write_lock(out, pid=gone, started_utc="2026-01-01T00:00:00+00:00")
    lock = RunLock(out)
    with caplog.at_level(logging.WARNING):
        lock.acquire()
    assert json.loads((out / LOCK_NAME).read_text())["pid"] == os.getpid()
    lock.release()
    assert [r.getMessage() for r in caplog.records] == [
        f"{out}: taking over the lock of a run that is gone (host {socket.gethostname()}, pid {gone}, "
        "started 2026-01-01T00:00:00+00:00): its process has ended"]
    assert os.listdir(out) == [], "the lock is given back; the folder the test made stays"


def test_heartbeat_refreshes_the_lock(tmp_path, monkeypatch):
    monkeypatch.setattr(runlock, "HEARTBEAT_SECONDS", 0.05)
    out = tmp_path / "out"
    lock = RunLock(out)
    lock.acquire()
    os.utime(out / LOCK_NAME, (0, 0))
    deadline = time.time() + 10
    while os.stat(out / LOCK_NAME).st_mtime < 1 and time.time() < deadline:
        time.sleep(0.05)
    assert time.time() - os.stat(out / LOCK_NAME).st_mtime < 10
    lock.release()


# ---------------------------------------------------------------------------------------------
# Through run_qa.py

QUICK = ["--model_name_or_path", "bundled:tiny-bert", "--dataset_name", "synthetic", "--synthetic_eval_examples",
         "20", "--do_eval", "--max_seq_length", "128", "--doc_stride", "32", "--max_query_length", "32",
         "--use_cpu", "true", "--report_to", "none"]


@pytest.fixture
def offline(tmp_path, monkeypatch):
    go_offline(monkeypatch, tmp_path / "hf", drop=("SLURM_JOB_ID", "SLURM_RESTART_COUNT", "TENSORBOARD_LOGGING_DIR"))
    return monkeypatch


def test_requeued_job_takes_over_and_others_are_refused(tmp_path, offline, capsys, caplog):
    """The lock of a live process of SLURM job 4242 (this test's own process, restart 0): another
    run is refused; the same job's next run (restart 1) takes it over and gives it back."""
    from run_qa import main

    out = tmp_path / "out"
    lock = _write_lock(out, slurm_job_id="4242", slurm_restart_count=0)
    assert main([*QUICK, "--output_dir", str(out)]) == 2
    err = error_lines(capsys.readouterr().err)
    assert len(err) == 1 and f"pid {os.getpid()}, SLURM job 4242 restart 0" in err[0], err
    assert sorted(os.listdir(out)) == [LOCK_NAME]
    offline.setenv("SLURM_JOB_ID", "4242")
    offline.setenv("SLURM_RESTART_COUNT", "1")
    with caplog.at_level(logging.WARNING):
        assert main([*QUICK, "--output_dir", str(out)]) == 0
    taken = [r.getMessage() for r in caplog.records if "taking over" in r.getMessage()]
    assert len(taken) == 1 and taken[0].endswith("it is an earlier run of this SLURM job (restart 0)"), taken
    assert not lock.exists() and (out / "eval_results.json").is_file()


def test_lock_of_a_crashed_run_is_taken_over(tmp_path, offline, caplog):
    from run_qa import main

    out = tmp_path / "out"
    _write_lock(out, pid=_ended_pid())
    with caplog.at_level(logging.WARNING):
        assert main([*QUICK, "--output_dir", str(out)]) == 0
    assert any(r.getMessage().endswith("its process has ended") for r in caplog.records)
    assert not (out / LOCK_NAME).exists()


def _wait_for(path, proc, timeout=300):
    """Until `path` exists; the stderr of `proc` (piped) if it ends first."""
    wait_until(path.exists, proc, path, lambda: proc.communicate()[1] if proc.poll() is not None else "", timeout,
               every=0.2)


@pytest.mark.slow
def test_second_run_on_the_same_folder_is_refused(tmp_path, tmp_path_factory):
    """Two real processes: the second refuses at start, naming the first, which finishes fine."""
    env = offline_env(tmp_path_factory)
    out = tmp_path / "out"
    with running([*TINY, "--do_train", "--max_steps", "40", "--save_strategy", "no", "--report_to", "none",
                  "--output_dir", str(out)], env) as first:
        _wait_for(out / LOCK_NAME, first)
        second = run_qa([*TINY, "--do_train", "--output_dir", str(out)], env, timeout=600)
        assert first.poll() is None, "the first run ended before the second started: make it longer"
        assert second.returncode == 2 and "Traceback" not in second.stderr, second.stderr[-3000:]
        errors = error_lines(second.stderr)
        assert len(errors) == 1 and errors[0].startswith(
            f"error: {out}: is in use by another run (host {socket.gethostname()}, pid {first.pid}, started "), errors
        _, stderr = first.communicate(timeout=900)
    assert first.returncode == 0, stderr[-3000:]
    assert json.loads((out / "trainer_state.json").read_text())["global_step"] == 40
    assert not (out / LOCK_NAME).exists()


@pytest.mark.slow
@pytest.mark.torchrun
def test_refused_torchrun_run_stops_on_every_rank(tmp_path, tmp_path_factory):
    """Rank 0 refuses (the folder is held by a live run: this test's process); rank 1 must not
    wait for it in a collective, nor take the lock itself."""
    env = offline_env(tmp_path_factory)
    out = tmp_path / "out"
    lock = _write_lock(out)
    held = lock.read_text()
    started = time.monotonic()
    proc = run_qa([*TINY, "--do_train", "--output_dir", str(out)], env, launcher=TORCHRUN, timeout=600)
    assert proc.returncode != 0
    errors = error_lines(proc.stderr)
    assert len(errors) == 2 and all("is in use by another run" in e for e in errors), proc.stderr[-4000:]
    assert time.monotonic() - started < 300
    assert lock.read_text() == held and sorted(os.listdir(out)) == [LOCK_NAME]


def test_lock_is_given_back_on_the_sigterm_checkpoint_exit(tmp_path, tmp_path_factory):
    env = offline_env(tmp_path_factory)
    out = tmp_path / "out"
    with running([*TINY, "--do_train", "--max_steps", "500", "--save_steps", "2", "--report_to", "none",
                  "--output_dir", str(out)], env) as proc:
        _wait_for(out / "checkpoint-2" / "checkpoint_complete.json", proc)
        assert (out / LOCK_NAME).is_file()
        proc.send_signal(signal.SIGTERM)
        _, stderr = proc.communicate(timeout=300)
    assert proc.returncode == 143, stderr[-3000:]
    assert "interrupted by SIGTERM" in stderr and not (out / LOCK_NAME).exists()


def test_final_model_staging_folder_is_cleared_first(tmp_path):
    """With one run per folder the staging folder of the final model is the run's own: what a run
    killed while saving left there (here the vocabulary of another tokenizer, a file this save
    does not write) must not be moved into place with the new files."""
    from transformers import BertConfig, BertForQuestionAnswering, TrainingArguments

    from trainer_qa import QuestionAnsweringTrainer

    model = BertForQuestionAnswering(BertConfig(vocab_size=100, hidden_size=16, num_hidden_layers=1,
                                                num_attention_heads=2, intermediate_size=32))
    trainer = QuestionAnsweringTrainer(model=model, args=TrainingArguments(output_dir=str(tmp_path), use_cpu=True,
                                                                           report_to=[]))
    leftover = tmp_path / ".saving-model" / "vocab.txt"
    leftover.parent.mkdir()
    leftover.write_bytes(b"torn")
    trainer.save_model()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["config.json", "model.safetensors", "training_args.bin"]


def test_a_lock_replaced_while_taking_over_goes_back(tmp_path, monkeypatch, caplog):
    """Two runs take over the same stale lock at once: the one that comes second finds the first's
    fresh lock where the stale one was, puts it back and refuses."""
    out = tmp_path / "out"
    live = _write_lock(out).read_text()  # this process: alive
    stale = json.dumps(_holder(pid=_ended_pid()))
    real_read, calls = RunLock._read, []

    def read_the_stale_lock_first(self):
        calls.append(1)
        return (stale, json.loads(stale), 0.0) if len(calls) == 1 else real_read(self)

    monkeypatch.setattr(RunLock, "_read", read_the_stale_lock_first)
    with caplog.at_level(logging.WARNING), pytest.raises(InputError, match="is in use by another run"):
        RunLock(out).acquire()
    assert (out / LOCK_NAME).read_text() == live and os.listdir(out) == [LOCK_NAME]
    assert not [r for r in caplog.records if "taking over" in r.getMessage()]
