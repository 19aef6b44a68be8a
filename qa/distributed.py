"""The distributed stage of a run: decisions one process makes for every rank (taking the output folder's lock,
choosing and verifying the checkpoint to resume), on whose outcome, an error included, every rank then acts (a rank
left waiting for a main rank that stopped would wait in its next collective until the timeout, 30 minutes by
default); how the ranks end a run together and leave (close_process_group, exit_process); and the switches that
shrink the gradient communication: PyTorch's own DDP compression hooks (--ddp_comm_hook) and the dtype FSDP
reduces gradients in (--fsdp_reduce_dtype)."""
import dataclasses
import logging
import os
import sys

import torch
import torch.distributed as dist
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
from transformers import TrainerCallback

from qa.errors import InputError

logger = logging.getLogger(__name__)

DDP_HOOKS = {"fp16": default_hooks.fp16_compress_hook, "bf16": default_hooks.bf16_compress_hook}
REDUCE_DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}


def distributed() -> bool:
    """A process group of more than one rank is running."""
    return dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1


def on_main_rank(fn):
    """fn() on global rank 0; its result, or its InputError, on every rank. Without a process
    group (one process) it is just fn()."""
    if not distributed():
        return fn()
    outcome, failure = [None], None
    if dist.get_rank() == 0:
        try:
            outcome[0] = ("result", fn())
        except InputError as err:
            outcome[0] = ("error", err)
        except BaseException as err:  # still tell the others, then fail with the traceback
            outcome[0], failure = ("error", RuntimeError(f"rank 0 failed: {type(err).__name__}: {err}")), err
    dist.broadcast_object_list(outcome, src=0)
    if failure is not None:
        raise failure
    kind, value = outcome[0]
    if kind == "error":
        raise value
    return value


def every_rank(value) -> list:
    """`value` of every rank, rank 0's first; [value] without a process group."""
    if not distributed():
        return [value]
    values = [None] * dist.get_world_size()
    dist.all_gather_object(values, value)
    return values


def close_process_group():
    """End a run's process group on every rank together. Without it a rank that finished first
    tore its connections down while rank 0 was still writing the results: on gloo that rank
    could abort at exit (seen once in CI), and NCCL warns of leaked resources on every run."""
    if dist.is_available() and dist.is_initialized():
        dist.barrier()
        dist.destroy_process_group()


def exit_process(status: int):
    """Ends a command's process with `status`. A rank of a torchrun job leaves without the interpreter's
    teardown: the DDP model still holds the destroyed process group there, and gloo's threads, freed during
    finalization, aborted ranks whose run had finished (SIGABRT, "terminate called without an active
    exception"), failing a job whose results were written. Everything a run writes is closed or flushed
    by then (TensorBoard flushes on every log); the streams and the logs are flushed here."""
    if int(os.environ.get("WORLD_SIZE", "1")) > 1:
        logging.shutdown()
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(status)
    sys.exit(status)


def set_fsdp_reduce_dtype(fsdp_plugin, name: str) -> None:
    """Sets the reduction dtype of accelerate's FSDP plugin, before train() wraps the model; the
    parameters keep the dtype the run's precision chose."""
    policy = fsdp_plugin.mixed_precision_policy
    if policy is None:
        from torch.distributed.fsdp import MixedPrecision, MixedPrecisionPolicy

        policy = MixedPrecisionPolicy() if fsdp_plugin.fsdp_version == 2 else MixedPrecision()
    fsdp_plugin.mixed_precision_policy = dataclasses.replace(policy, reduce_dtype=REDUCE_DTYPES[name])


class DDPCompressionHook(TrainerCallback):
    """Registers PyTorch's `name` compression hook on the DDP-wrapped model when training begins
    (the Trainer wraps the model in train()); `bind(trainer)` first."""

    def __init__(self, name: str):
        self.name, self.trainer = name, None

    def bind(self, trainer) -> None:
        self.trainer = trainer

    def on_train_begin(self, args, state, control, **kwargs):
        model = self.trainer.model_wrapped
        model = getattr(model, "_orig_mod", model)  # compiled: the DDP wrapper is inside
        ddp = isinstance(model, torch.nn.parallel.DistributedDataParallel)
        backend = torch.distributed.get_backend() if ddp else None
        if not ddp or (self.name == "bf16" and backend not in ("nccl", "xccl")):
            why = f"PyTorch's bf16 hook needs NCCL, not {backend}" if ddp else f"{type(model).__name__} is not DDP"
            logger.warning("--ddp_comm_hook %s: no hook: %s", self.name, why)
            return
        model.register_comm_hook(state=None, hook=DDP_HOOKS[self.name])
