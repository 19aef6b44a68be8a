"""Gradient communication in a distributed run: measured before training, and the switches that
shrink it.

Measured, in every run with more than one process (`--measure_communication auto`), over the
run's own process group and before the first training step:
- all-reduce calibration: a buffer as large as the gradients, in the dtype that travels (the
  gradients' dtype, or bf16/fp16 under a compression hook), all-reduced after warm-ups; the
  median of several repeats (each repeat timed as its slowest rank). Reported as bytes, seconds,
  algorithm bandwidth (bytes / time) and bus bandwidth (algbw x 2(n-1)/n), the definitions of
  NCCL-tests, for the whole group and, when the job spans nodes, within one node;
- exposed communication: forward + backward of the actual model on a training batch with the
  gradient synchronisation on, and off (DDP's `no_sync`, FSDP2's `set_requires_gradient_sync`),
  alternated; the difference of the medians is what the overlap with backward does not hide.
  Each pass runs as a training step does (qa.trial_steps: training mode, dropout included), so a
  compiled model reuses the training graphs and compiles nothing of its own. Nothing is stepped;
  gradients are cleared and every random generator is put back afterwards, so training goes on
  exactly as it would have without the measurement.

Switches: `--ddp_comm_hook bf16|fp16` (a DDP communication hook: gradients travel in 16 bits),
`--ddp_bucket_cap_mb` (the Trainer's own argument: DDP's bucket size), `--fsdp_reduce_dtype`
(FSDP's gradient reduction dtype). What is in effect is read back from the wrapped model and
recorded beside the measurements (`comm_*` in train_results.json and all_results.json, the
`communication` section of environment.json).
"""
import contextlib
import logging
import os
import socket
import statistics
import time

import torch
import torch.distributed as dist
from transformers import TrainerCallback

from .bandwidth import GB, busbw_from_algbw
from .flops import gradient_size
from .trial_steps import collate_rows, forward_backward, rng_kept

logger = logging.getLogger(__name__)

COMM_HOOKS = ("none", "bf16", "fp16")
REDUCE_DTYPES = {"auto": None, "fp32": torch.float32, "bf16": torch.bfloat16}
WARMUPS, REPEATS, STEP_REPEATS = 2, 5, 3


# ---------------------------------------------------------------------------------------------
# The switches


COMPRESSED = {"bf16": torch.bfloat16, "fp16": torch.float16}


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


# ---------------------------------------------------------------------------------------------
# All-reduce calibration


def _sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def time_allreduce(nbytes: int, dtype: torch.dtype, device, group=None, warmups=WARMUPS, repeats=REPEATS) -> dict:
    """All-reduce of `nbytes` in `dtype` over `group` (default: the whole world): median seconds
    over `repeats`, each the slowest rank's time, and the NCCL-tests bandwidths."""
    ranks = dist.get_world_size(group)
    elements = max(nbytes // torch.tensor([], dtype=dtype).element_size(), 1)
    buffer = torch.ones(elements, dtype=dtype, device=device)
    nbytes = buffer.numel() * buffer.element_size()
    for _ in range(warmups):
        dist.all_reduce(buffer, group=group)
    _sync(device)
    times = []
    for _ in range(repeats):
        dist.barrier(group=group)
        _sync(device)
        start = time.perf_counter()
        dist.all_reduce(buffer, group=group)
        _sync(device)
        times.append(time.perf_counter() - start)
    slowest = torch.tensor(times, dtype=torch.float64, device=device)
    dist.all_reduce(slowest, op=dist.ReduceOp.MAX, group=group)  # a collective ends with its last rank
    seconds = statistics.median(slowest.tolist())
    algbw = nbytes / seconds / GB
    return {"ranks": ranks, "bytes": nbytes, "dtype": str(dtype).replace("torch.", ""), "s": seconds,
            "algbw_GBps": algbw, "busbw_GBps": busbw_from_algbw(algbw, ranks), "repeats": repeats}


def node_groups():
    """The ranks of every node, from every rank's node (torchrun's GROUP_RANK, else the host
    name), gathered over the world. Collective: every rank calls it."""
    node = os.environ.get("GROUP_RANK") or socket.gethostname()
    nodes = [None] * dist.get_world_size()
    dist.all_gather_object(nodes, node)
    return [[r for r, n in enumerate(nodes) if n == key] for key in dict.fromkeys(nodes)]


def calibrate(nbytes: int, dtype: torch.dtype, device) -> dict:
    """allreduce_* over the whole group, then intranode_* over one node (jobs over several
    nodes with several ranks on each), and the number of nodes."""
    out = {f"allreduce_{k}": v for k, v in time_allreduce(nbytes, dtype, device).items()}
    ranks = node_groups()
    out["nodes"] = len(ranks)
    if len(ranks) > 1 and min(len(r) for r in ranks) > 1:
        group, _ = dist.new_subgroups_by_enumeration(ranks)  # collective: one group per node
        out.update({f"intranode_{k}": v for k, v in time_allreduce(nbytes, dtype, device, group=group).items()})
    elif len(ranks) > 1:
        out["intranode_note"] = "one rank per node: no link within a node to measure"
    return out


# ---------------------------------------------------------------------------------------------
# Exposed communication of a real step


@contextlib.contextmanager
def _gradient_sync(model, on: bool):
    if on:
        yield
    elif hasattr(model, "no_sync"):  # DDP (and FSDP1)
        with model.no_sync():
            yield
    else:  # FSDP2
        model.set_requires_gradient_sync(False)
        try:
            yield
        finally:
            model.set_requires_gradient_sync(True)


def can_toggle_sync(model) -> bool:
    return hasattr(model, "no_sync") or hasattr(model, "set_requires_gradient_sync")


def training_batch(trainer) -> dict:
    """This rank's share of the first training rows, as the model takes them, on its device."""
    dataset, args = trainer.train_dataset, trainer.args
    size = args.per_device_train_batch_size
    start = (args.process_index * size) % max(len(dataset) - size + 1, 1)
    return collate_rows(trainer, range(start, min(start + size, len(dataset))))


def exposed_communication(trainer, model, batch: dict, device, repeats=STEP_REPEATS) -> dict:
    """Median forward + backward time with the gradient synchronisation on and off (one warm-up
    of each first, then alternated), each repeat timed as its slowest rank; nothing stepped.
    Each pass runs as a training step runs (qa.trial_steps.forward_backward: training mode), so a
    compiled model reuses the training graphs instead of compiling evaluation-mode ones."""
    def step(sync: bool) -> float:
        model.zero_grad(set_to_none=True)
        dist.barrier()
        _sync(device)
        start = time.perf_counter()
        with _gradient_sync(model, sync):
            forward_backward(trainer, model, batch)
        _sync(device)
        return time.perf_counter() - start

    with rng_kept():
        step(True)
        step(False)
        times = {True: [], False: []}
        for _ in range(repeats):
            for sync in (True, False):
                times[sync].append(step(sync))
        model.zero_grad(set_to_none=True)
    slowest = torch.tensor(times[True] + times[False], dtype=torch.float64, device=device)
    dist.all_reduce(slowest, op=dist.ReduceOp.MAX)
    with_sync, without = (statistics.median(slowest[:repeats].tolist()),
                          statistics.median(slowest[repeats:].tolist()))
    return {"step_sync_s": with_sync, "step_nosync_s": without, "exposed_s": max(with_sync - without, 0.0),
            "exposed_share": max(with_sync - without, 0.0) / with_sync if with_sync > 0 else None,
            "step_repeats": repeats}


# ---------------------------------------------------------------------------------------------
# The callback


class CommunicationCallback(TrainerCallback):
    """Applies the communication switches and measures the communication at the start of
    training (see the module docstring). `bind(trainer)` before training: the measurement needs
    the wrapped model (Trainer.model_wrapped), the accelerator and a training batch.
    `overhead_s`: the measurement's time, which the telemetry sets aside from the first step's
    data time."""

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
        if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() < 2:
            if self.ddp_comm_hook != "none":
                logger.warning("--ddp_comm_hook %s: not a distributed run, nothing to compress", self.ddp_comm_hook)
            return
        trainer = self.trainer
        model = trainer.model_wrapped
        model = model if can_toggle_sync(model) else getattr(model, "_orig_mod", model)  # under torch.compile
        hook = apply_ddp_comm_hook(model, self.ddp_comm_hook)
        grads = gradient_size(trainer.model)
        wire = (COMPRESSED.get(self.ddp_comm_hook) if hook else None) or self.fsdp_wire or \
            getattr(torch, grads["grad_dtype"])
        self.record.update({
            "world_size": dist.get_world_size(), "backend": dist.get_backend(),
            "wrapper": type(model).__name__, "grad_bytes": grads["grad_bytes"], "grad_dtype": grads["grad_dtype"],
            "ddp_comm_hook": hook or "none",
            "ddp_bucket_cap_mb": (model.bucket_bytes_cap / 2 ** 20 if hasattr(model, "bucket_bytes_cap") else None),
        })
        if self.measure == "false":
            return
        started = time.perf_counter()
        elements = grads["trainable_params"]
        self.record.update(calibrate(elements * torch.tensor([], dtype=wire).element_size(), wire, args.device))
        if can_toggle_sync(model):
            batch = training_batch(trainer)
            self.record.update(exposed_communication(trainer, model, batch, args.device))
            self.record["step_batch_shape"] = list(batch["input_ids"].shape)
        else:
            self.record["exposed_note"] = f"{type(model).__name__} cannot switch its gradient synchronisation off"
        self.record["measure_s"] = self.overhead_s = time.perf_counter() - started
        logger.info("communication: all-reduce of %.1f MB (%s) over %d ranks: %.4f s, bus bandwidth %.2f GB/s; "
                    "exposed per step %.4f s", self.record["allreduce_bytes"] / 1e6, self.record["allreduce_dtype"],
                    self.record["world_size"], self.record["allreduce_s"], self.record["allreduce_busbw_GBps"],
                    self.record.get("exposed_s", float("nan")))

    def summary(self) -> dict:
        """`comm_*` keys for train_results.json (environment.json gets `record` as it is)."""
        return {f"comm_{k}": (round(v, 6) if isinstance(v, float) else v) for k, v in self.record.items()}
