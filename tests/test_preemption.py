"""Checkpoint on SIGTERM in a distributed run (2 gloo processes on the CPU): a signal that only
one rank gets still stops every rank at one and the same step with a complete checkpoint, and
the ranks agree on it with an all-reduce every --preemption_check_steps steps, not at every step."""
import json
import os
import re
import signal
import socket
import subprocess
import time

import pytest
import torch

from tests.helpers import REPO, TORCHRUN, running
from tests.test_run_qa import _env

pytestmark = pytest.mark.slow  # gloo process groups and torchrun runs: tens of seconds each


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


def test_sigterm_to_one_rank_stops_both_at_one_step_with_a_complete_checkpoint(tmp_path, tmp_path_factory):
    """run_qa.py under torchrun; SIGTERM to rank 1's process only (as when ranks get a signal at
    different moments). Both ranks save the same step and leave; the checkpoint is marked complete."""
    env = _env(tmp_path_factory)
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
    assert (out / f"checkpoint-{step}" / "checkpoint_complete.json").is_file()
    state = json.loads((out / f"checkpoint-{step}" / "trainer_state.json").read_text())
    assert state["global_step"] == step and state["global_step"] < state["max_steps"]
    assert "interrupted by SIGTERM" in text and not (out / "all_results.json").exists()
