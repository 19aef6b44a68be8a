"""What one rank decides for every rank and how the ranks leave together (a rank left waiting for one that stopped
waits in its next collective until --ddp_timeout); the switches that shrink gradient communication: docs/scaling.md."""
import dataclasses
import gc
import logging
import os
import sys

import torch
import torch.distributed as dist
from accelerate.utils import gather_object
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
from transformers import TrainerCallback

from qa.errors import InputError

logger = logging.getLogger(__name__)

DDP_HOOKS = {"fp16": default_hooks.fp16_compress_hook, "bf16": default_hooks.bf16_compress_hook}
REDUCE_DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}


def distributed() -> bool:
    return dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1


def on_main_rank(fn):
    """fn() on global rank 0 alone; its result, or its InputError, on every rank."""
    if not distributed():
        return fn()
    outcome, failure = [None, None], None  # [result, error]
    if dist.get_rank() == 0:
        try:
            outcome[0] = fn()
        except InputError as err:
            outcome[1] = err
        except BaseException as err:  # still tell the others, then fail with the traceback
            outcome[1], failure = RuntimeError(f"rank 0 failed: {type(err).__name__}: {err}"), err
    dist.broadcast_object_list(outcome, src=0)
    if (error := failure or outcome[1]) is not None:  # rank 0 raises its own, with the traceback
        raise error
    return outcome[0]


def every_rank(value) -> list:
    return gather_object([value])  # accelerate's: each rank's value, in rank order; [value] on one process


def close_process_group():
    """Every rank together: one that tore its connections down while rank 0 still wrote the results could abort at
    exit on gloo (seen once in CI), and NCCL warns of leaked resources on every run. What still holds the group (a
    DDP model in a reference cycle) is freed first: freed after it, it waited on the group forever."""
    if dist.is_available() and dist.is_initialized():
        gc.collect()
        dist.barrier()
        dist.destroy_process_group()


def exit_process(status: int):
    """A torchrun rank leaves without the interpreter's teardown: gloo's threads, freed in finalization while the DDP
    model still held the destroyed group, aborted finished ranks ("terminate called without an active exception"),
    failing a job whose results were written. What a run writes is closed by then; the streams and logs are flushed."""
    if int(os.environ.get("WORLD_SIZE", "1")) > 1:
        logging.shutdown()
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(status)
    sys.exit(status)


def set_fsdp_reduce_dtype(fsdp_plugin, name: str) -> None:
    """Before train() wraps the model; the parameters keep the dtype the run's precision chose."""
    policy = fsdp_plugin.mixed_precision_policy
    if policy is None:
        from torch.distributed.fsdp import MixedPrecision, MixedPrecisionPolicy

        policy = MixedPrecisionPolicy() if fsdp_plugin.fsdp_version == 2 else MixedPrecision()
    fsdp_plugin.mixed_precision_policy = dataclasses.replace(policy, reduce_dtype=REDUCE_DTYPES[name])


class DDPCompressionHook(TrainerCallback):
    """At train()'s start, where the Trainer has wrapped the model in DDP; `bind(trainer)` first."""

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
