"""Checkpoint on SIGTERM in a distributed run (2 gloo processes on the CPU): a signal that only
one rank gets still stops every rank at one and the same step with a complete checkpoint, and
the ranks agree on it with an all-reduce every --preemption_check_steps steps, not at every step.
Ctrl-C (SIGINT) does the same, alone and under torchrun, and a second one stops at once with one line."""
import contextlib
import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from qa.errors import CTRL_C, EXIT_CTRL_C
from qa.results.wall_clock import PhaseClock
from tests.helpers import (COMPILED_TINY, REPO, SMOKE_TINY, TINY, TORCHRUN, assert_complete_checkpoint, go_offline,
                           offline_env, run_qa, running, wait_until)



def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _agreeing_rank(rank, port, check_steps, signal_at, out):
    """The callback over 40 optimizer steps of a real gloo group; `signal_at`: (rank, step) at
    whose end that rank gets SIGTERM."""
    import torch.distributed as dist
    from transformers import TrainerControl, TrainerState

    from qa.training.preemption import CheckpointOnSignalCallback

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=2)
    args = type("Args", (), {"device": torch.device("cpu")})()
    state, control = TrainerState(max_steps=40), TrainerControl()
    callback = CheckpointOnSignalCallback(check_steps)
    callback.on_train_begin(args, state, control)
    while state.global_step < state.max_steps and not control.should_training_stop:
        callback.on_step_begin(args, state, control)
        state.global_step += 1
        time.sleep(0.01 * (1 + rank))  # the ranks drift apart, as real ones do
        if (rank, state.global_step) == signal_at:
            os.kill(os.getpid(), signal.SIGTERM)
        callback.on_step_end(args, state, control)
    callback.on_train_end(args, state, control)
    torch.save({"stopped_at": callback.stopped_at, "agreements": callback.agreements, "save": control.should_save,
                "step": state.global_step}, f"{out}.{rank}")
    dist.destroy_process_group()


@pytest.mark.parametrize("check_steps, signal_at", [(5, (1, 7)), (5, (0, 10)), (1, (1, 3))])
@pytest.mark.slow
def test_ranks_agree_every_n_steps_and_stop_together(tmp_path, check_steps, signal_at):
    out = str(tmp_path / "rank")
    torch.multiprocessing.spawn(_agreeing_rank, args=(_free_port(), check_steps, signal_at, out), nprocs=2)
    ranks = [torch.load(f"{out}.{r}") for r in (0, 1)]
    stops = {r["stopped_at"] for r in ranks}
    assert len(stops) == 1 and None not in stops, ranks  # both, at the same step
    stop = stops.pop()
    signalled = signal_at[1]
    # the first agreement started at or after the signal's step is read one step later
    first_check = -(-signalled // check_steps) * check_steps
    assert stop == first_check + 1, (stop, ranks)
    for r in ranks:
        assert r["save"] and r["step"] == stop
        assert r["agreements"] == first_check // check_steps  # one all-reduce every check_steps steps


def test_one_process_checks_its_own_flag_at_every_step():
    from transformers import TrainerControl, TrainerState

    from qa.training.preemption import CheckpointOnSignalCallback

    args = type("Args", (), {"device": torch.device("cpu")})()
    state, control = TrainerState(max_steps=20), TrainerControl()
    callback = CheckpointOnSignalCallback(10)
    callback.on_train_begin(args, state, control)
    try:
        for step in range(1, 6):
            callback.on_step_begin(args, state, control)
            state.global_step = step
            if step == 3:
                os.kill(os.getpid(), signal.SIGTERM)
            callback.on_step_end(args, state, control)
            if control.should_training_stop:
                break
    finally:
        callback.on_train_end(args, state, control)
    assert callback.stopped_at == 3 and callback.agreements == 0
    assert signal.getsignal(signal.SIGTERM) is not callback._handler  # the previous handler is back


@pytest.mark.slow
@pytest.mark.torchrun
def test_sigterm_to_one_rank_stops_both_at_one_step_with_a_complete_checkpoint(tmp_path, tmp_path_factory):
    """run_qa.py under torchrun; SIGTERM to rank 1's process only (as when ranks get a signal at
    different moments). Both ranks save the same step and leave; the checkpoint is marked complete."""
    env = offline_env(tmp_path_factory)
    env["OMP_NUM_THREADS"] = "1"
    out = tmp_path / "run"
    log = tmp_path / "stderr.txt"
    args = [str(REPO / "configs" / "smoke_tiny.json"), "--num_train_epochs", "20", "--do_eval", "false",
            "--report_to", "none", "--save_steps", "5", "--preemption_check_steps", "4", "--output_dir", str(out)]
    with open(log, "w") as stderr, running(args, env, launcher=TORCHRUN, stdout=subprocess.DEVNULL,
                                           stderr=stderr) as proc:
        deadline = time.monotonic() + 300
        pid = None
        while time.monotonic() < deadline and proc.poll() is None:
            found = re.search(r"rank 1 of 2 \(gloo backend\) on \S+, pid (\d+)", log.read_text())
            if found and (out / "checkpoint-10" / "checkpoint_complete.json").exists():
                pid = int(found.group(1))
                break
            time.sleep(0.2)
        assert pid is not None, log.read_text()[-3000:]
        os.kill(pid, signal.SIGTERM)
        proc.wait(timeout=300)
    text = log.read_text()
    stopped = re.findall(r"signal received: saving checkpoint-(\d+) and stopping", text)
    assert len(stopped) == 2 and len(set(stopped)) == 1, text[-3000:]  # each rank once, the same step
    step = int(stopped[0])
    assert_complete_checkpoint(out / f"checkpoint-{step}", step)
    state = json.loads((out / f"checkpoint-{step}" / "trainer_state.json").read_text())
    assert state["global_step"] == step and state["global_step"] < state["max_steps"]
    assert "interrupted by SIGTERM" in text and not (out / "all_results.json").exists()


# ---------------------------------------------------------------------------------------------
# Ctrl-C: SIGINT as a terminal (or srun --pty) sends it; torchrun passes it on to its workers

IN_TRAINING = CTRL_C.replace("Ctrl-C:", "Ctrl-C during training:")  # a second Ctrl-C's line
LONG = [SMOKE_TINY, "--num_train_epochs", "20", "--do_eval", "false", "--report_to", "none", "--save_steps", "1000"]


def _as_in_a_terminal():
    signal.signal(signal.SIGINT, signal.SIG_DFL)  # a test run as a background job inherits Ctrl-C ignored


def _wait(condition, proc, what, log):
    wait_until(condition, proc, what, log.read_text, every=0.05)


def _start(cmd, env, log):
    with open(log, "w") as out:
        return subprocess.Popen(cmd, cwd=REPO, env=env, stdout=out, stderr=subprocess.STDOUT,
                                preexec_fn=_as_in_a_terminal)


def _ctrl_c(proc, log, *ready, timeout=300):
    """A Ctrl-C each time the next of `ready` ((what, condition)) is met; -> the exit status."""
    try:
        for what, condition in ready:
            _wait(condition, proc, what, log)
            proc.send_signal(signal.SIGINT)
        return proc.wait(timeout=timeout)
    finally:
        proc.kill()


@pytest.mark.slow
def test_ctrl_c_saves_a_checkpoint_and_the_rerun_resumes_from_it(tmp_path, tmp_path_factory):
    """Ctrl-C in training: the step under way ends, its checkpoint is saved and marked complete, the run says so and
    how to go on, and ends with 130 without a traceback; the same command (longer here) resumes from that step."""
    env, out, log = offline_env(tmp_path_factory), tmp_path / "run", tmp_path / "log.txt"
    proc = _start([sys.executable, str(REPO / "run_qa.py"), *LONG, "--output_dir", str(out)], env, log)
    status = _ctrl_c(proc, log, ("logged step 5", lambda: '"step": 5,' in log.read_text()))
    assert status == EXIT_CTRL_C, log.read_text()[-3000:]
    text = log.read_text()
    assert "Traceback" not in text and "KeyboardInterrupt" not in text, text[-3000:]
    assert "Ctrl-C: stopping with a checkpoint at a step's end; Ctrl-C again stops at once, unsaved" in text
    step = int(re.findall(r"signal received: saving checkpoint-(\d+) and stopping", text)[0])
    assert (f"interrupted by Ctrl-C (on this or another rank): checkpoint-{step} saved in {out}; rerun (--resume auto) "
            "to continue") in text, text[-1000:]
    assert_complete_checkpoint(out / f"checkpoint-{step}", step)
    assert not (out / "run.lock").exists() and not (out / "all_results.json").exists()

    rerun = run_qa([*LONG, "--max_steps", str(step + 2), "--output_dir", str(out)], env)
    assert rerun.returncode == 0, rerun.stderr[-3000:]
    assert f"resuming from {out / f'checkpoint-{step}'}" in rerun.stderr
    assert json.loads((out / "trainer_state.json").read_text())["global_step"] == step + 2


@pytest.mark.slow
def test_a_second_ctrl_c_stops_at_once_with_one_line(tmp_path, tmp_path_factory):
    """Ctrl-C, then Ctrl-C again before the step ends (the step pauses for 10 minutes here): the run stops at once
    with one line and 130, saves nothing, and gives its output folder back."""
    env, out, log, flag = offline_env(tmp_path_factory), tmp_path / "run", tmp_path / "log.txt", tmp_path / "paused"
    proc = _start([sys.executable, "-m", "tests.eval_hooks", "pause_training", str(flag), "--", *LONG,
                   "--output_dir", str(out)], env, log)
    status = _ctrl_c(proc, log, ("the pause in training", lambda: Path(f"{flag}.0").exists()),
                     ("the first Ctrl-C's line", lambda: "Ctrl-C again" in log.read_text()), timeout=120)
    assert status == EXIT_CTRL_C, log.read_text()[-3000:]
    text = log.read_text()
    assert "Traceback" not in text and text.rstrip().splitlines()[-1] == IN_TRAINING, text[-3000:]
    assert not list(out.glob("checkpoint-*")) and not (out / "run.lock").exists()


@pytest.mark.slow
def test_ctrl_c_while_the_libraries_load_is_one_line(tmp_path):
    """The imports take seconds before a command's main runs: a Ctrl-C then is the same line, and the process ends by
    SIGINT (130 in a shell)."""
    run = [sys.executable, str(REPO / "run_qa.py"), SMOKE_TINY, "--output_dir", str(tmp_path / "run")]
    proc = subprocess.Popen(run, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            preexec_fn=_as_in_a_terminal)
    time.sleep(1.5)  # imports take more than that (transformers alone: seconds)
    proc.send_signal(signal.SIGINT)
    stdout, stderr = proc.communicate(timeout=60)
    assert (proc.returncode, stdout, stderr) == (-signal.SIGINT, "", CTRL_C + "\n")


@pytest.mark.slow
@pytest.mark.torchrun
def test_ctrl_c_under_torchrun_stops_every_rank_at_one_step_with_a_checkpoint(tmp_path, tmp_path_factory):
    """A terminal's Ctrl-C reaches torchrun alone (its workers run in sessions of their own); it passes SIGINT on to
    them. Both ranks save the same step and end with 130, which rank 0 writes into QA_OUTCOME_FILE (torchrun itself
    ends with 1 and a traceback of its own SignalException, as torch 2.13's torchrun does for every signal)."""
    env, out, log = offline_env(tmp_path_factory), tmp_path / "run", tmp_path / "log.txt"
    env.update(OMP_NUM_THREADS="1", QA_OUTCOME_FILE=str(tmp_path / "outcome.json"))
    proc = _start([*TORCHRUN, str(REPO / "run_qa.py"), *LONG, "--preemption_check_steps", "2",
                   "--output_dir", str(out)], env, log)
    try:
        _wait(lambda: '"step": 5,' in log.read_text(), proc, "logged step 5", log)
        proc.send_signal(signal.SIGINT)
        proc.wait(timeout=300)
    finally:
        proc.kill()
    text = log.read_text()
    stopped = re.findall(r"signal received: saving checkpoint-(\d+) and stopping", text)
    assert len(stopped) == 2 and len(set(stopped)) == 1, text[-3000:]  # each rank once, the same step
    assert_complete_checkpoint(out / f"checkpoint-{stopped[0]}", int(stopped[0]))
    assert text.count("interrupted by Ctrl-C (on this or another rank)") == 2, text[-3000:]
    assert "KeyboardInterrupt" not in text and 'run_qa.py", line' not in text, text[-3000:]
    outcome = json.loads((tmp_path / "outcome.json").read_text())
    assert (outcome["status"], outcome["outcome"]) == (EXIT_CTRL_C, "interrupted")


@pytest.mark.slow
@pytest.mark.torchrun
def test_a_second_ctrl_c_under_torchrun_stops_every_rank_at_once(tmp_path, tmp_path_factory):
    """torchrun passes a second Ctrl-C on as SIGTERM (torch 2.13): after a Ctrl-C that counts as the second, and each
    rank stops at once with one line; rank 0's outcome is 130."""
    env, out, log, flag = offline_env(tmp_path_factory), tmp_path / "run", tmp_path / "log.txt", tmp_path / "paused"
    env.update(OMP_NUM_THREADS="1", QA_OUTCOME_FILE=str(tmp_path / "outcome.json"))
    proc = _start([*TORCHRUN, "-m", "tests.eval_hooks", "pause_training", str(flag), "--", *LONG,
                   "--output_dir", str(out)], env, log)
    try:
        _wait(lambda: Path(f"{flag}.0").exists() and Path(f"{flag}.1").exists(), proc, "the pause in training", log)
        proc.send_signal(signal.SIGINT)
        _wait(lambda: "Ctrl-C again" in log.read_text(), proc, "the first Ctrl-C's line", log)
        proc.send_signal(signal.SIGINT)
        proc.wait(timeout=120)
    finally:
        proc.kill()
    text = log.read_text()
    assert text.count(IN_TRAINING) == 2 and "KeyboardInterrupt" not in text, text[-3000:]
    assert not list(out.glob("checkpoint-*"))
    assert json.loads((tmp_path / "outcome.json").read_text())["status"] == EXIT_CTRL_C


# ---------------------------------------------------------------------------------------------
# A signal at any other stage: one line saying where, the lock given back, and the same command goes on

STAGE_RUN = [*TINY, "--synthetic_train_examples", "64", "--synthetic_eval_examples", "16", "--max_steps", "2",
             "--do_train", "--do_eval", "--report_to", "none"]
NAMES = {signal.SIGTERM: "SIGTERM", signal.SIGUSR1: "SIGUSR1", signal.SIGINT: "Ctrl-C"}


@pytest.mark.parametrize("phase, nth, sig, said", [
    ("data_loading", 1, signal.SIGTERM, "data loading"),
    ("model_loading", 1, signal.SIGTERM, "model loading"),
    ("features", 1, signal.SIGTERM, "tokenizing"),
    ("features", 1, signal.SIGINT, "tokenizing"),
    ("features", 1, signal.SIGUSR1, "tokenizing"),
    ("compile_warmup", 1, signal.SIGTERM, "the compile warm-up"),
    ("saving", 3, signal.SIGTERM, "saving"),  # the trained model: after environment.json and the last checkpoint
    ("saving", 3, signal.SIGINT, "saving"),
    ("saving", 3, signal.SIGUSR1, "saving"),
])
def test_a_signal_at_any_stage_is_one_line_and_the_rerun_goes_on(phase, nth, sig, said, tmp_path, tmp_path_factory,
                                                                 monkeypatch, capsys):
    """The signal is real, sent by the run's process to itself as it enters the stage (the clock's phase)."""
    from run_qa import main

    go_offline(monkeypatch, tmp_path_factory.getbasetemp() / "hf_home")
    args = [*(COMPILED_TINY if phase == "compile_warmup" else STAGE_RUN), "--output_dir", str(tmp_path / "out")]
    entered, timed = [], PhaseClock.phase

    @contextlib.contextmanager
    def phase_with_a_signal(clock, name):
        with timed(clock, name):
            entered.append(name)
            if name == phase and entered.count(name) == nth:
                os.kill(os.getpid(), sig)
            yield

    monkeypatch.setattr(PhaseClock, "phase", phase_with_a_signal)
    handlers = {s: signal.getsignal(s) for s in NAMES}  # a stopping run ignores more signals: this process goes on
    signal.signal(signal.SIGINT, signal.default_int_handler)  # as in a terminal: pytest-xdist's workers ignore it
    assert main(args) == (EXIT_CTRL_C if sig == signal.SIGINT else 143)
    for s, handler in handlers.items():
        signal.signal(s, handler)
    err = capsys.readouterr().err  # transformers' warnings may come first, through a handler of an earlier test's
    assert err.splitlines()[-1] == (f"interrupted by {NAMES[sig]} during {said}: stopped at once, nothing more saved; "
                                    "the same command goes on from what was saved")
    assert err.count("interrupted by") == 1 and "Interrupt" not in err, err
    assert not (tmp_path / "out" / "run.lock").exists()
    monkeypatch.setattr(PhaseClock, "phase", timed)
    assert main(args) == 0
    assert "eval_f1" in json.loads((tmp_path / "out" / "all_results.json").read_text())
