"""Checkpoint on SIGTERM or Ctrl-C, every rank at the same step, so that a rerun continues from it:
docs/slurm.md#time-limits-preemption-and-requeue, docs/running.md#ctrl-c."""
import contextlib
import logging
import os
import signal
import sys
import threading

import torch
from transformers import TrainerCallback

from qa.distributed import distributed
from qa.errors import CTRL_C, EXIT_CTRL_C, EXIT_INTERRUPTED, Interrupted, raise_again_if_lost

logger = logging.getLogger(__name__)


STOPPING = (signal.SIGTERM, signal.SIGUSR1)  # a job's end: SLURM's TERM, or its USR1 warning sent to the run
PHASE_NAMES = {"startup": "start-up", "features": "tokenizing", "compile_warmup": "the compile warm-up"}


@contextlib.contextmanager
def interrupted_by_signals():
    """SIGTERM and USR1 raise Interrupted in the block, so the run leaves with its one line, its status and its lock
    given back; a process forked meanwhile (a DataLoader worker) is ended, as before."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    pid, fired = os.getpid(), []

    def handler(signum, frame):
        if os.getpid() == pid:
            fired.append(signum)
            raise_again_if_lost()
            raise Interrupted(signal.Signals(signum).name)
        signal.signal(signum, signal.SIG_DFL)
        os.kill(os.getpid(), signum)

    previous = {sig: signal.signal(sig, handler) for sig in STOPPING}
    try:
        yield
    finally:  # ending on it: a later SIGTERM (torchrun passes SLURM's on) must not cut the last lines
        for sig, before in previous.items():
            signal.signal(sig, signal.SIG_IGN if fired else before)


def stopped_during(phase: str, stop: BaseException) -> int:
    """The one line of a run stopped by a signal outside the training's checkpointing; -> its exit status."""
    for sig in (signal.SIGINT, *STOPPING):  # stopping: one more changes nothing
        signal.signal(sig, signal.SIG_IGN)
    cause, status = ("Ctrl-C", EXIT_CTRL_C) if isinstance(stop, KeyboardInterrupt) else (str(stop), EXIT_INTERRUPTED)
    where = f" during {PHASE_NAMES.get(phase, phase.replace('_', ' '))}:"
    sys.stderr.write(CTRL_C.replace("Ctrl-C:", cause + where, 1) + "\n")  # what the rerun does: CTRL_C's words
    return status


class CheckpointOnSignalCallback(TrainerCallback):
    """A rank stopping alone would leave the others waiting in a collective (as transformers' `enable_jit_checkpoint`
    does), so the ranks agree with an all-reduce started without waiting and read a step later, long since arrived:
    reading at once would stall the device's stream (docs/slurm.md#time-limits-preemption-and-requeue). After a Ctrl-C
    the next signal stops at once: torchrun passes a second Ctrl-C on as SIGTERM (docs/running.md#ctrl-c)."""

    def __init__(self, check_steps: int = 10):
        self.check_steps = max(int(check_steps), 1)
        self.received = None      # the signal this rank got first, if any
        self.ctrl_c = False       # a Ctrl-C came: the next signal stops at once
        self.stopped_at = None    # global step at which training stopped on a signal
        self.agreements = 0       # all-reduces started (what the agreement cost)
        self._pending = None      # an agreement under way: (its wait, the value to read)
        self._host = None         # pinned host memory the result of an agreement on a GPU lands in
        self._previous = {}

    def _handler(self, signum, frame):
        if os.getpid() != self._pid:
            return  # a DataLoader worker, forked with this handler: the run ends it
        if self.ctrl_c or not self._stepping:  # before the first step (the warm-up) nothing is there to checkpoint
            raise_again_if_lost()
            raise KeyboardInterrupt if self.ctrl_c or signum == signal.SIGINT else \
                Interrupted(signal.Signals(signum).name)
        self.ctrl_c = signum == signal.SIGINT
        if self.ctrl_c and os.environ.get("RANK", "0") == "0":  # os.write: a print could re-enter the one it cut short
            os.write(2, b"Ctrl-C: stopping with a checkpoint at a step's end; Ctrl-C again stops at once, unsaved\n")
        self.received = self.received or signum  # a flag only: the training loop acts on it at a step's end

    def stopped_by(self) -> tuple:
        """(what, exit status): this rank's first signal; none here (another rank's) counts as SIGTERM, a job's."""
        if self.received == signal.SIGINT:
            return "Ctrl-C", EXIT_CTRL_C
        return signal.Signals(self.received or signal.SIGTERM).name, EXIT_INTERRUPTED

    def on_train_begin(self, args, state, control, **kwargs):
        self.received = self.stopped_at = self._pending = None
        self.agreements, self.ctrl_c, self._pid, self._stepping = 0, False, os.getpid(), False
        if threading.current_thread() is not threading.main_thread():
            logger.warning("checkpoint on SIGTERM: not in the main thread, no signal handler installed")
            return
        if getattr(args, "enable_jit_checkpoint", False):
            logger.warning("checkpoint on SIGTERM: replacing transformers' enable_jit_checkpoint handler "
                           "(its ranks checkpoint independently, which can hang DDP/FSDP)")
        for sig in (*STOPPING, signal.SIGINT):
            if signal.getsignal(sig) is not signal.SIG_IGN:  # ignored from the start (a background job): stays so
                self._previous[sig] = signal.signal(sig, self._handler)
        if torch.distributed.is_available() and torch.distributed.is_initialized():
            # One line per rank (warning: the level other ranks log at), so a job log shows who joined.
            logger.warning("rank %d of %d (%s backend) on %s, pid %d: training from step %d; SIGTERM saves a "
                           "checkpoint", torch.distributed.get_rank(), torch.distributed.get_world_size(),
                           torch.distributed.get_backend(), os.uname().nodename, os.getpid(), state.global_step)

    def on_step_begin(self, args, state, control, **kwargs):
        self._stepping = True

    def _start_agreement(self, args):
        flag = torch.tensor([int(self.received is not None)], dtype=torch.int32, device=args.device)
        work = torch.distributed.all_reduce(flag, op=torch.distributed.ReduceOp.MAX, async_op=True)
        self.agreements += 1
        if flag.is_cuda:
            # The host copy is queued behind the collective, with an event: reading waits for them, not later steps
            work.wait()  # the current stream waits for the collective; the host does not
            if self._host is None:
                self._host = torch.empty(1, dtype=torch.int32, pin_memory=True)  # allocated once: it is slow
            self._host.copy_(flag, non_blocking=True)
            done = torch.cuda.Event()
            done.record()
            self._pending = (done.synchronize, self._host)
        else:
            self._pending = (work.wait, flag)

    def _read_agreement(self) -> bool:
        wait, value = self._pending
        self._pending = None
        wait()
        return bool(value.item())

    def _any_rank_received(self, args, step) -> bool:
        if not distributed():
            return self.received is not None
        stop = self._read_agreement() if self._pending is not None else False
        if not stop and step % self.check_steps == 0:
            self._start_agreement(args)
        return stop

    def on_step_end(self, args, state, control, **kwargs):
        if self.stopped_at is not None or not self._any_rank_received(args, state.global_step):
            return
        if state.global_step >= state.max_steps:
            return  # the last step: training ends now anyway and saves its final checkpoint
        self.stopped_at = state.global_step
        control.should_save = control.should_training_stop = True
        control.should_evaluate = False  # the time before the limit goes to the checkpoint (--eval_every asks)
        logger.warning("signal received: saving checkpoint-%d and stopping (resume with --resume auto)",
                       state.global_step)

    def on_epoch_end(self, args, state, control, **kwargs):
        if self.stopped_at is not None:  # that step is saved already; no epoch-end save or evaluation
            control.should_save = control.should_evaluate = False

    def on_train_end(self, args, state, control, **kwargs):
        if self._pending is not None:  # every rank started it: every rank completes it
            self._read_agreement()
        for sig, handler in self._previous.items():
            signal.signal(sig, handler if handler is not None else signal.SIG_DFL)
        self._previous = {}

