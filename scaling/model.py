"""The communication model of data-parallel training: what a step costs on N nodes x G GPUs.

From one GPU's step time, batch and model size, and the bus bandwidth of the links between the
GPUs, it predicts the step time, samples/s, speedup and efficiency of DDP and FSDP (full shard)
on any shape, and of what-ifs: bf16 communication, gradient accumulation, a larger per-device
batch. Small pure functions, each tested on hand-made numbers (tests/test_scaling_model.py);
docs/scaling.md states the model and its assumptions. Units: seconds, bytes, GB/s in the
NCCL-tests sense (scaling.bandwidth).
"""
import math
from dataclasses import dataclass

from scaling.bandwidth import GB

# The QA model of bert-base-uncased: BertForQuestionAnswering(BertConfig()).parameters(), all
# trainable (the count is checked against transformers in the tests).
BERT_BASE_QA_PARAMS = 108_893_186
# Its embedding block: word 30522x768 + position 512x768 + token type 2x768 + LayerNorm 2x768.
# Its gradients are complete only at the very end of backward, so their communication cannot
# hide behind any compute: the tail of every step (the first FSDP unit's all-gather, too).
BERT_BASE_EMBEDDING_PARAMS = 23_837_184

# torch DistributedDataParallel's bucket_cap_mb default: 25 MiB.
DDP_BUCKET_BYTES = 25 * 2 ** 20
# job_ddp.sh's FSDP config wraps each of the 12 BertLayer in its own unit, plus the root
# (embeddings and QA head).
FSDP_UNITS = 13
# Backward costs twice the forward: 4N of the 6N training FLOPs per token (qa/training/flops.py).
BACKWARD_SHARE = 2 / 3

DTYPE_BYTES = {"float32": 4, "fp32": 4, "float": 4, "tf32": 4, "float16": 2, "fp16": 2, "half": 2,
               "bfloat16": 2, "bf16": 2, "float64": 8, "fp64": 8}
STRATEGIES = ("ddp", "fsdp")

# FinisTerrae III's A100 nodes, where no measurement is given. Each is an assumption; the
# sources say what is known and what is not (docs/scaling.md has the details).
FT3_INTRA_BUSBW = 20.0
FT3_INTER_BUSBW = 12.0
FT3_LATENCY_US = 10.0
FT3_SOURCES = {
    "intra": ("the two A100 of a node talk over PCIe 4.0 x16 (32 GB/s per direction), not NVLink; NCCL "
              "all-reduce busbw over PCIe is about 20 GB/s (https://github.com/NVIDIA/nccl-tests/issues/178). "
              "The node's A100 variant and link were not found in CESGA's public documentation "
              "(https://cesga-docs.gitlab.io/ft3-user-guide/overview.html): PCIe is the conservative guess"),
    "inter": ("one InfiniBand HDR100 port per node, 100 Gb/s = 12.5 GB/s per direction, the low end of "
              "the 100-200 Gb/s such clusters have; NCCL's maintainers give 12.2 GB/s as the best all-reduce "
              "busbw of a 100 Gb/s card (https://github.com/NVIDIA/nccl-tests/issues/29). The generation "
              "of FinisTerrae III's InfiniBand was not confirmed from CESGA's documentation"),
    "latency": ("order of magnitude of one NCCL ring step over InfiniBand, not measured on FinisTerrae III; "
                "it matters only for small buckets and many GPUs (nccl-tests all_reduce_perf at 8 bytes "
                "takes about 2(n-1) x latency)"),
}


def dtype_bytes(name: str) -> int:
    """Bytes per element of a dtype given as torch names it ('float32', 'torch.bfloat16', 'bf16')."""
    key = str(name).lower().removeprefix("torch.")
    if key not in DTYPE_BYTES:
        raise ValueError(f"unknown dtype {name!r}")
    return DTYPE_BYTES[key]


# ---------------------------------------------------------------------------------------------
# Collectives on a ring


def ring_allreduce_s(nbytes, n, busbw_gbps, latency_s=0.0, messages=1):
    """Time of a ring all-reduce of `nbytes` over n ranks, sent as `messages` separate calls
    (DDP's buckets):  messages * 2(n-1) * latency  +  2(n-1)/n * nbytes / busbw.

    A ring all-reduce is a reduce-scatter then an all-gather: 2(n-1) steps, each moving 1/n of
    the data over every link at once, each paying one link latency."""
    if n < 2:
        return 0.0
    return messages * 2 * (n - 1) * latency_s + 2 * (n - 1) / n * nbytes / (busbw_gbps * GB)


def ring_allgather_s(nbytes, n, busbw_gbps, latency_s=0.0, messages=1):
    """Time of a ring all-gather whose *result* is `nbytes` (each rank holds nbytes/n before):
    messages * (n-1) * latency  +  (n-1)/n * nbytes / busbw. A reduce-scatter of nbytes costs
    the same: it is the first half of the all-reduce."""
    if n < 2:
        return 0.0
    return messages * (n - 1) * latency_s + (n - 1) / n * nbytes / (busbw_gbps * GB)


ring_reducescatter_s = ring_allgather_s


def ring_busbw(nodes, gpus_per_node, intra_gbps, inter_gbps):
    """The bus bandwidth a ring over this shape gets: its slowest link. One node: the link between
    its GPUs. Several nodes: the ring enters and leaves every node through the network, and also
    crosses the intra-node link when a node has more than one GPU. None for one GPU."""
    if nodes * gpus_per_node < 2:
        return None
    if nodes == 1:
        return intra_gbps
    if gpus_per_node == 1:
        return inter_gbps
    return min(intra_gbps, inter_gbps)


# ---------------------------------------------------------------------------------------------
# The inputs


@dataclass(frozen=True)
class Baseline:
    """One GPU, one micro-batch: `compute_s` forward + backward + optimizer (the host time of an
    optimizer step without accumulation), `data_s` the wait for the batch between steps."""
    compute_s: float
    data_s: float
    batch: int
    params: int
    grad_dtype_bytes: int = 4
    tail_params: int = BERT_BASE_EMBEDDING_PARAMS

    @property
    def samples_per_s(self):
        return self.batch / (self.compute_s + self.data_s)

    @property
    def grad_bytes(self):
        return self.params * self.grad_dtype_bytes


@dataclass(frozen=True)
class WhatIf:
    """bf16: gradients (DDP) or parameters and gradients (FSDP) communicated as 2-byte floats;
    accum: optimizer steps every `accum` micro-batches, synchronising once; batch_mult: the
    per-device batch is batch_mult times the baseline's."""
    bf16: bool = False
    accum: int = 1
    batch_mult: float = 1

    @property
    def name(self):
        parts = (["bf16"] if self.bf16 else []) + ([f"accum={self.accum}"] if self.accum != 1 else []) + \
                ([f"batch={self.batch_mult:g}"] if self.batch_mult != 1 else [])
        return "+".join(parts) or "none"


@dataclass(frozen=True)
class Settings:
    """How the communication meets the compute. `overlap`: the share of the window it can hide
    in (1 = hides completely while there is compute left, 0 = none: everything is exposed)."""
    latency_s: float = 10e-6
    overlap: float = 1.0
    backward_share: float = BACKWARD_SHARE
    bucket_bytes: int = DDP_BUCKET_BYTES
    fsdp_units: int = FSDP_UNITS


def parse_shape(text: str):
    """'NODESxGPUS_PER_NODE' -> (nodes, gpus_per_node), both >= 1."""
    parts = text.strip().lower().split("x")
    if len(parts) != 2 or not all(p.isdigit() for p in parts) or min(int(p) for p in parts) < 1:
        raise ValueError(f"bad shape {text!r}: expected NODESxGPUS_PER_NODE with both >= 1, e.g. 2x2")
    return int(parts[0]), int(parts[1])


def parse_what_if(text: str) -> WhatIf:
    """'none', or '+'-joined terms: 'bf16', 'accum=K' (K >= 1), 'batch=M' (M > 0)."""
    text = text.strip().lower()
    if text in ("none", "base", ""):
        return WhatIf()
    bf16, accum, mult = False, 1, 1.0
    for term in text.split("+"):
        key, _, value = term.partition("=")
        try:
            if key == "bf16" and not value:
                bf16 = True
            elif key == "accum" and int(value) >= 1:
                accum = int(value)
            elif key == "batch" and float(value) > 0:
                mult = float(value)
            else:
                raise ValueError
        except ValueError:
            raise ValueError(f"bad what-if {term!r} in {text!r}: use none, bf16, accum=K or batch=M, "
                             "joined with + (e.g. bf16+accum=4)") from None
    return WhatIf(bf16, accum, mult)


# ---------------------------------------------------------------------------------------------
# One shape


def comm_bytes(baseline: Baseline, bf16: bool):
    """Bytes a full set of gradients (or parameters) occupies on the wire."""
    per_element = min(baseline.grad_dtype_bytes, 2) if bf16 else baseline.grad_dtype_bytes
    return baseline.params * per_element, min(baseline.tail_params, baseline.params) * per_element


def ddp_comm(baseline: Baseline, what: WhatIf, n, busbw, s: Settings, micro_compute_s):
    """(total, exposed) seconds of DDP's gradient all-reduce per optimizer step.

    The gradients leave in buckets while backward runs, so they hide behind the backward of the
    micro-batch that synchronises (with accumulation, only the last one does: no_sync before).
    What is left after that window is exposed, and never less than the all-reduce of the
    embedding gradients, which are complete only when backward ends:
        exposed = max(t_allreduce - overlap * t_backward, t_allreduce(tail))."""
    if n < 2:
        return 0.0, 0.0
    nbytes, tail = comm_bytes(baseline, what.bf16)
    buckets = max(1, math.ceil(baseline.grad_bytes / s.bucket_bytes))  # formed on the uncompressed gradients
    total = ring_allreduce_s(nbytes, n, busbw, s.latency_s, messages=buckets)
    window = s.overlap * s.backward_share * micro_compute_s
    return total, max(total - window, ring_allreduce_s(tail, n, busbw, s.latency_s))


def fsdp_comm(baseline: Baseline, what: WhatIf, n, busbw, s: Settings, micro_compute_s):
    """(total, exposed) seconds of FSDP full-shard communication per optimizer step.

    Each micro-batch all-gathers the parameters in forward and again in backward (they are
    resharded after forward); the gradients are reduce-scattered once per optimizer step (sync
    skipped on the first accum-1 micro-batches). Prefetching hides it behind forward and backward;
    the first unit's all-gather (each micro-batch) and the last unit's reduce-scatter cannot hide:
        exposed = max(t_total - overlap * t_compute, accum * t_allgather(tail) + t_reducescatter(tail))."""
    if n < 2:
        return 0.0, 0.0
    nbytes, tail = comm_bytes(baseline, what.bf16)
    gather = ring_allgather_s(nbytes, n, busbw, s.latency_s, messages=s.fsdp_units)
    scatter = ring_reducescatter_s(nbytes, n, busbw, s.latency_s, messages=s.fsdp_units)
    total = 2 * what.accum * gather + scatter
    window = s.overlap * what.accum * micro_compute_s
    edges = (what.accum * ring_allgather_s(tail, n, busbw, s.latency_s)
             + ring_reducescatter_s(tail, n, busbw, s.latency_s))
    return total, max(total - window, edges)


def predict(baseline: Baseline, nodes, gpus_per_node, strategy, what: WhatIf, busbw, s: Settings) -> dict:
    """Step time, samples/s, speedup over the baseline and efficiency of one shape.

    A larger per-device batch multiplies compute and data time by the same factor (a GPU that
    is under-used at the small batch does better: this is the pessimistic case); accumulation
    runs `accum` micro-batches per optimizer step. Data loading happens on every rank in
    parallel, so it costs each step what it costs one GPU."""
    if strategy not in STRATEGIES:
        raise ValueError(f"unknown strategy {strategy!r}")
    n = nodes * gpus_per_node
    micro_compute = baseline.compute_s * what.batch_mult
    compute = micro_compute * what.accum
    data = baseline.data_s * what.batch_mult * what.accum
    comm = ddp_comm if strategy == "ddp" else fsdp_comm
    total, exposed = comm(baseline, what, n, busbw, s, micro_compute)
    step = compute + data + exposed
    samples = n * baseline.batch * what.batch_mult * what.accum
    rate = samples / step
    speedup = rate / baseline.samples_per_s
    return {"shape": f"{nodes}x{gpus_per_node}", "nodes": nodes, "gpus_per_node": gpus_per_node, "gpus": n,
            "strategy": strategy, "what_if": what.name, "busbw_GBps": busbw if n > 1 else None,
            "compute_s": compute, "data_s": data, "comm_total_s": total, "comm_exposed_s": exposed,
            "step_s": step, "samples_per_step": samples, "samples_per_s": rate,
            "speedup": speedup, "efficiency": speedup / n}


def busbw_for_speedup(baseline: Baseline, nodes, gpus_per_node, strategy, what: WhatIf, s: Settings, target):
    """The bus bandwidth (GB/s) of the ring's slowest link at which this shape reaches `target`
    speedup, or None when no bandwidth does (one GPU, target >= what the compute and latency
    allow). Speedup grows monotonically with bandwidth: bisection on a log scale."""
    def speedup(bw):
        return predict(baseline, nodes, gpus_per_node, strategy, what, bw, s)["speedup"]

    lo, hi = 1e-4, 1e7
    if nodes * gpus_per_node < 2 or speedup(hi) < target:
        return None
    if speedup(lo) >= target:
        return lo
    for _ in range(200):
        mid = math.sqrt(lo * hi)
        lo, hi = (mid, hi) if speedup(mid) < target else (lo, mid)
        if hi / lo < 1 + 1e-9:
            break
    return hi
