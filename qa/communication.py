"""What a distributed run switches on for its gradient communication, applied and read back.

Switches: `--ddp_comm_hook bf16|fp16` (a DDP communication hook: gradients travel in 16 bits),
`--ddp_bucket_cap_mb` (the Trainer's own argument: DDP's bucket size), `--fsdp_reduce_dtype`
(FSDP's gradient reduction dtype). `CommunicationCallback` applies them when the Trainer allows,
reads back from the wrapped model what is in effect, and has qa.comm_measure measure the
communication before the first step (`--measure_communication`); all of it is recorded as
`comm_*` in train_results.json and all_results.json, and in environment.json's `communication`.
"""
import logging
import time

import torch
import torch.distributed as dist
from transformers import TrainerCallback

from qa import comm_measure
from qa.training.flops import gradient_size
from qa.distributed import distributed

logger = logging.getLogger(__name__)

COMM_HOOKS = ("none", "bf16", "fp16")
COMPRESSED = {"bf16": torch.bfloat16, "fp16": torch.float16}
REDUCE_DTYPES = {"auto": None, "fp32": torch.float32, "bf16": torch.bfloat16}


# ---------------------------------------------------------------------------------------------
# The switches


def compression_hook(dtype: torch.dtype):
    """A DDP communication hook that sends each gradient bucket in `dtype` (16 bits: half the
    bytes of fp32) and writes the average back into the gradients in their own dtype. Divided
    before the sum, so fp16 does not overflow. PyTorch ships such hooks, but its bf16 one accepts
    NCCL only; this one runs on every backend, so a CPU run (gloo) runs the code a GPU job runs."""
    def hook(process_group, bucket):
        group = process_group if process_group is not None else dist.group.WORLD
        gradients = bucket.buffer()
        sent = gradients.to(dtype).div_(dist.get_world_size(group))
        work = dist.all_reduce(sent, group=group, async_op=True)

        def unpack(future):
            gradients.copy_(future.value()[0])
            return gradients
        return work.get_future().then(unpack)

    hook.__name__ = hook.__qualname__ = f"{str(dtype).replace('torch.', '')}_compress_hook"
    return hook


def apply_ddp_comm_hook(model, name: str):
    """Registers the `name` ('bf16', 'fp16') compression hook on a DDP-wrapped model; 'none'
    leaves it alone. Returns the hook's name, or None when nothing was registered."""
    if name == "none":
        return None
    if not isinstance(model, torch.nn.parallel.DistributedDataParallel):
        logger.warning("--ddp_comm_hook %s: the model is not wrapped in DistributedDataParallel (%s): no hook",
                       name, type(model).__name__)
        return None
    hook = compression_hook(COMPRESSED[name])
    model.register_comm_hook(state=None, hook=hook)
    return hook.__name__


def apply_fsdp_reduce_dtype(fsdp_plugin, name: str):
    """Sets the gradient reduction dtype of accelerate's FSDP plugin before it wraps the model;
    keeps the parameter dtype the run's precision chose. Returns the dtype in effect, as text."""
    dtype = REDUCE_DTYPES[name]
    policy = fsdp_plugin.mixed_precision_policy
    if dtype is not None:
        import dataclasses

        if policy is None:
            if fsdp_plugin.fsdp_version == 2:
                from torch.distributed.fsdp import MixedPrecisionPolicy as Policy
            else:
                from torch.distributed.fsdp import MixedPrecision as Policy
            policy = Policy(reduce_dtype=dtype)
        else:
            policy = dataclasses.replace(policy, reduce_dtype=dtype)
        fsdp_plugin.mixed_precision_policy = policy
    reduce = getattr(policy, "reduce_dtype", None)
    return str(reduce).replace("torch.", "") if reduce is not None else "the parameters' dtype"


def wire_dtype(hook_registered, fsdp_reduce, grad_dtype: str) -> torch.dtype:
    """The dtype the gradients travel in: the compression hook's when one is registered
    (`hook_registered`: 'bf16', 'fp16' or None), else FSDP's reduction dtype if set, else the
    gradients' own (`grad_dtype`, as gradient_size names it)."""
    return COMPRESSED.get(hook_registered) or fsdp_reduce or getattr(torch, grad_dtype)


def in_effect(model, hook_registered) -> dict:
    """The switches as the wrapped model has them: the hook registered, DDP's bucket size (MiB)."""
    return {"ddp_comm_hook": hook_registered or "none",
            "ddp_bucket_cap_mb": (model.bucket_bytes_cap / 2 ** 20 if hasattr(model, "bucket_bytes_cap") else None)}


# ---------------------------------------------------------------------------------------------
# The callback


class CommunicationCallback(TrainerCallback):
    """Applies the switches, records what is in effect and has the communication measured, at
    the start of training (see the module docstring). `bind(trainer)` before training: the FSDP
    dtype must reach accelerate's plugin before train() wraps the model, and the hook and the
    measurement need the wrapped model (Trainer.model_wrapped), the accelerator and a training
    batch. `overhead_s`: the measurement's time, which the telemetry sets aside from the first
    step's data time."""

    def __init__(self, measure: str = "auto", ddp_comm_hook: str = "none", fsdp_reduce_dtype: str = "auto"):
        self.measure, self.ddp_comm_hook, self.fsdp_reduce_dtype = measure, ddp_comm_hook, fsdp_reduce_dtype
        self.trainer = None
        self.fsdp_wire = None  # the FSDP reduction dtype set on accelerate's plugin, if any
        self.record = {}
        self.overhead_s = 0.0

    def bind(self, trainer) -> None:
        self.trainer = trainer
        plugin = getattr(trainer.accelerator.state, "fsdp_plugin", None)
        if plugin is not None:  # the model is wrapped only in train(): the policy must be set now
            self.record["fsdp_reduce_dtype"] = apply_fsdp_reduce_dtype(plugin, self.fsdp_reduce_dtype)
            self.fsdp_wire = getattr(plugin.mixed_precision_policy, "reduce_dtype", None)  # auto included
        elif self.fsdp_reduce_dtype != "auto":
            self.record["fsdp_reduce_dtype"] = "not in effect: the run does not shard with FSDP"

    def on_train_begin(self, args, state, control, **kwargs):
        if not distributed():
            if self.ddp_comm_hook != "none":
                logger.warning("--ddp_comm_hook %s: not a distributed run, nothing to compress", self.ddp_comm_hook)
            return
        trainer = self.trainer
        model = trainer.model_wrapped
        if not comm_measure.can_toggle_sync(model):
            model = getattr(model, "_orig_mod", model)  # compiled: the DDP/FSDP wrapper is inside
        hook = apply_ddp_comm_hook(model, self.ddp_comm_hook)
        grads = gradient_size(trainer.model)
        self.record.update({"world_size": dist.get_world_size(), "backend": dist.get_backend(),
                            "wrapper": type(model).__name__, "grad_bytes": grads["grad_bytes"],
                            "grad_dtype": grads["grad_dtype"], **in_effect(model, hook)})
        if self.measure == "false":
            return
        started = time.perf_counter()
        wire = wire_dtype(self.ddp_comm_hook if hook else None, self.fsdp_wire, grads["grad_dtype"])
        self.record.update(comm_measure.measure(trainer, model, wire, grads["trainable_params"], args.device))
        self.record["measure_s"] = self.overhead_s = time.perf_counter() - started
        logger.info("communication: all-reduce of %.1f MB (%s) over %d ranks: %.4f s, bus bandwidth %.2f GB/s; "
                    "exposed per step %.4f s", self.record["allreduce_bytes"] / 1e6, self.record["allreduce_dtype"],
                    self.record["world_size"], self.record["allreduce_s"], self.record["allreduce_busbw_GBps"],
                    self.record.get("exposed_s", float("nan")))

    def summary(self) -> dict:
        """`comm_*` keys for train_results.json (environment.json gets `record` as it is)."""
        return {f"comm_{k}": (round(v, 6) if isinstance(v, float) else v) for k, v in self.record.items()}
