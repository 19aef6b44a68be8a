"""The switches that shrink a distributed run's gradient communication: PyTorch's own DDP
compression hooks (--ddp_comm_hook) and the dtype FSDP reduces gradients in (--fsdp_reduce_dtype)."""
import dataclasses
import logging

import torch
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
from transformers import TrainerCallback

logger = logging.getLogger(__name__)

DDP_HOOKS = {"fp16": default_hooks.fp16_compress_hook, "bf16": default_hooks.bf16_compress_hook}
REDUCE_DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}


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
