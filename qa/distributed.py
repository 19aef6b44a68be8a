"""Decisions one process makes for every rank of a run.

Some steps must happen once per run, not once per rank: taking the output folder's lock,
choosing (and verifying) the checkpoint to resume from, moving damaged ones aside. Every rank
must then act on the same outcome, an error included: a rank left waiting for a main rank that
stopped would wait in its next collective until the timeout (30 minutes by default).
"""
import torch.distributed as dist

from qa.errors import InputError


def distributed() -> bool:
    """A process group of more than one rank is running."""
    return dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1


def on_main_rank(fn):
    """fn() on global rank 0; its result, or its InputError, on every rank. Without a process
    group (one process) it is just fn()."""
    if not distributed():
        return fn()
    outcome = [None]
    failure = None
    if dist.get_rank() == 0:
        try:
            outcome[0] = ("result", fn())
        except InputError as err:
            outcome[0] = ("input error", err)
        except BaseException as err:  # still tell the others, then fail with the traceback
            outcome[0] = ("failure", f"{type(err).__name__}: {err}")
            failure = err
    dist.broadcast_object_list(outcome, src=0)
    if failure is not None:
        raise failure
    kind, value = outcome[0]
    if kind == "input error":
        raise value
    if kind == "failure":
        raise RuntimeError(f"rank 0 failed: {value}")
    return value


def close_process_group():
    """End a run's process group on every rank together. Without it a rank that finished first
    tore its connections down while rank 0 was still writing the results: on gloo that rank
    could abort at exit (seen once in CI), and NCCL warns of leaked resources on every run."""
    if dist.is_available() and dist.is_initialized():
        dist.barrier()
        dist.destroy_process_group()
