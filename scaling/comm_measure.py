"""The scaling study's measurement of a distributed run's gradient communication, before its
first training step. Opt-in: `run_qa.py --measure_communication true` (the scaling
study's multi-GPU cells pass it) adds `CommunicationMeasurement`, whose record joins train_results.json as comm_*.

- All-reduce calibration: a buffer as large as the gradients, in the dtype that travels, timed
  after warm-ups (median of repeats, each its slowest rank's time) over the whole group and, when
  the job spans nodes, within one node; reported with NCCL-tests' bandwidths (scaling.bandwidth).
- Exposed communication: forward + backward of the real model on a training batch with the
  gradient synchronisation on and off, alternated; the difference of the medians is what the
  overlap with backward does not hide. The passes run as training steps do
  (qa.training.compile), so training then goes on exactly as it would have without them.
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

from qa.distributed import distributed
from qa.evaluation.time_to_accuracy import rng_kept
from qa.training.compile import collate_rows, forward_backward
from qa.training.flops import gradient_size
from scaling.bandwidth import GB, busbw_from_algbw

logger = logging.getLogger(__name__)

WARMUPS, REPEATS, STEP_REPEATS = 2, 5, 3


# ---------------------------------------------------------------------------------------------
# All-reduce calibration


def _sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _timed(run, device, group=None) -> float:
    """Seconds of run() on this rank, started together with the other ranks of `group`."""
    dist.barrier(group=group)
    _sync(device)
    start = time.perf_counter()
    run()
    _sync(device)
    return time.perf_counter() - start


def _slowest(times, device, group=None) -> list:
    """Each of `times` as the slowest rank of `group` measured it: a collective ends with its last rank."""
    gathered = torch.tensor(times, dtype=torch.float64, device=device)
    dist.all_reduce(gathered, op=dist.ReduceOp.MAX, group=group)
    return gathered.tolist()


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
    times = [_timed(lambda: dist.all_reduce(buffer, group=group), device, group) for _ in range(repeats)]
    seconds = statistics.median(_slowest(times, device, group))
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
    Each pass runs as a training step runs (qa.training.compile.forward_backward: training mode), so a
    compiled model reuses the training graphs instead of compiling evaluation-mode ones."""
    def step(sync: bool) -> float:
        def run():
            with _gradient_sync(model, sync):
                forward_backward(trainer, model, batch)

        model.zero_grad(set_to_none=True)
        return _timed(run, device)

    with rng_kept():
        step(True)
        step(False)
        times = {True: [], False: []}
        for _ in range(repeats):
            for sync in (True, False):
                times[sync].append(step(sync))
        model.zero_grad(set_to_none=True)
    slowest = _slowest(times[True] + times[False], device)
    with_sync, without = statistics.median(slowest[:repeats]), statistics.median(slowest[repeats:])
    return {"step_sync_s": with_sync, "step_nosync_s": without, "exposed_s": max(with_sync - without, 0.0),
            "exposed_share": max(with_sync - without, 0.0) / with_sync if with_sync > 0 else None,
            "step_repeats": repeats}


# ---------------------------------------------------------------------------------------------
# Both, when training begins


def measure(trainer, model, wire: torch.dtype, elements: int, device) -> dict:
    """The calibration of an all-reduce of `elements` gradients in `wire`, the dtype they travel
    in, then the exposed communication of a real step when `model` (the wrapper that synchronises:
    DDP, FSDP) can switch its synchronisation off; else a note saying why not."""
    out = calibrate(elements * torch.tensor([], dtype=wire).element_size(), wire, device)
    if can_toggle_sync(model):
        batch = training_batch(trainer)
        out.update(exposed_communication(trainer, model, batch, device))
        out["step_batch_shape"] = list(batch["input_ids"].shape)
    else:
        out["exposed_note"] = f"{type(model).__name__} cannot switch its gradient synchronisation off"
    return out


WIRE = {"fp16_compress_hook": torch.float16, "bf16_compress_hook": torch.bfloat16}


def in_effect(model) -> dict:
    """The switches as the wrapped model has them: the DDP hook registered, DDP's bucket size (MiB)."""
    hooks = [hook.__name__ for hook, _ in getattr(model, "_comm_hooks", [])]  # DDP has no public list of its hooks
    return {"ddp_comm_hook": hooks[0] if hooks else "none",
            "ddp_bucket_cap_mb": model.bucket_bytes_cap / 2 ** 20 if hasattr(model, "bucket_bytes_cap") else None}


class CommunicationMeasurement(TrainerCallback):
    """Measures the communication when training begins, in a run of more than one process, and
    records the switches in effect; `summary()`: comm_* for train_results.json. `bind(trainer)`
    first: it needs the wrapped model (Trainer.model_wrapped) and a training batch."""

    def __init__(self):
        self.trainer, self.record = None, {}

    def bind(self, trainer) -> None:
        self.trainer = trainer

    def on_train_begin(self, args, state, control, **kwargs):
        if not distributed():
            return
        trainer, started = self.trainer, time.perf_counter()
        model = trainer.model_wrapped
        if not can_toggle_sync(model):
            model = getattr(model, "_orig_mod", model)  # compiled: the DDP/FSDP wrapper is inside
        grads = gradient_size(trainer.model)
        self.record = {"world_size": dist.get_world_size(), "backend": dist.get_backend(),
                       "wrapper": type(model).__name__, "grad_bytes": grads["grad_bytes"],
                       "grad_dtype": grads["grad_dtype"], **in_effect(model)}
        plugin = getattr(trainer.accelerator.state, "fsdp_plugin", None)
        fsdp_reduce = getattr(getattr(plugin, "mixed_precision_policy", None), "reduce_dtype", None)
        if plugin is not None:
            self.record["fsdp_reduce_dtype"] = str(fsdp_reduce or "the parameters' dtype").replace("torch.", "")
        wire = WIRE.get(self.record["ddp_comm_hook"]) or fsdp_reduce or getattr(torch, grads["grad_dtype"])
        self.record.update(measure(trainer, model, wire, grads["trainable_params"], args.device))
        self.record["measure_s"] = time.perf_counter() - started
        logger.info("communication: all-reduce of %.1f MB (%s) over %d ranks: %.4f s, bus bandwidth %.2f GB/s; "
                    "exposed per step %.4f s", self.record["allreduce_bytes"] / 1e6, self.record["allreduce_dtype"],
                    self.record["world_size"], self.record["allreduce_s"], self.record["allreduce_busbw_GBps"],
                    self.record.get("exposed_s", float("nan")))

    def summary(self) -> dict:
        return {f"comm_{k}": (round(v, 6) if isinstance(v, float) else v) for k, v in self.record.items()}
