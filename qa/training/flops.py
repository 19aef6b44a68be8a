"""What training costs (model FLOPs, real tokens only), what a device can do (dense peaks by precision), and MFU."""
import os
import re

from qa.errors import InputError


def model_shape(model) -> dict:
    """Parameters outside embedding tables (lookups, no FLOPs), layers and hidden size."""
    import torch

    embedding = {id(p) for m in model.modules() if isinstance(m, torch.nn.Embedding) for p in m.parameters()}
    params = {id(p): p.numel() for p in model.parameters()}
    config = getattr(model, "config", None)
    return {"non_embedding_params": sum(n for i, n in params.items() if i not in embedding),
            "layers": getattr(config, "num_hidden_layers", 0) or 0,
            "hidden": getattr(config, "hidden_size", 0) or 0}


def gradient_size(model) -> dict:
    """What one gradient synchronisation moves: the trainable parameters, their dtype, the bytes."""
    params = [p for p in model.parameters() if p.requires_grad]
    dtype = params[0].dtype if params else None
    return {"trainable_params": sum(p.numel() for p in params),
            "grad_dtype": str(dtype).replace("torch.", "") if dtype is not None else None,
            "grad_bytes": sum(p.numel() * p.element_size() for p in params)}


def model_flops(non_embedding_params, layers, hidden, real_tokens, sum_sq_lengths):
    """Model FLOPs of training on a set of sequences, real tokens only (padding lowers MFU, as it should), by PaLM's
    formula (Chowdhery et al. 2022, app. B): a token of a sequence of s real tokens costs 6N + 12·L·H·s (N parameters
    outside the embeddings, L layers, H hidden: QK^T and AV), so the set costs 6N·sum(s) + 12·L·H·sum(s^2)."""
    return 6 * non_embedding_params * real_tokens + 12 * layers * hidden * sum_sq_lengths


# Dense peak TFLOP/s per GPU (NVIDIA's data sheets); the first pattern matching the lower-case name wins: variants first
PEAK_TFLOPS = ((r"gh200", "GH200", {"bf16": 989, "fp16": 989, "tf32": 494, "fp32": 67}),
               (r"h200 nvl", "H200 NVL", {"bf16": 835, "fp16": 835, "tf32": 418, "fp32": 60}),
               (r"h200", "H200 SXM", {"bf16": 989, "fp16": 989, "tf32": 494, "fp32": 67}),
               (r"h100 nvl", "H100 NVL", {"bf16": 835, "fp16": 835, "tf32": 418, "fp32": 60}),
               (r"h100.*pcie", "H100 PCIe", {"bf16": 756, "fp16": 756, "tf32": 378, "fp32": 51}),
               (r"h100", "H100 SXM", {"bf16": 989, "fp16": 989, "tf32": 494, "fp32": 67}),
               (r"a100", "A100", {"bf16": 312, "fp16": 312, "tf32": 156, "fp32": 19.5}),
               (r"l40s", "L40S", {"bf16": 362, "fp16": 362, "tf32": 183, "fp32": 91.6}),
               (r"l40\b", "L40", {"bf16": 181, "fp16": 181, "tf32": 90.5, "fp32": 90.5}),
               (r"\bl4\b", "L4", {"bf16": 121, "fp16": 121, "tf32": 60, "fp32": 30.3}),
               (r"a40\b", "A40", {"bf16": 150, "fp16": 150, "tf32": 74.8, "fp32": 37.4}),
               (r"\ba10\b", "A10", {"bf16": 125, "fp16": 125, "tf32": 62.5, "fp32": 31.2}),
               (r"v100s", "V100S", {"fp16": 130, "fp32": 16.4}),
               (r"v100.*pcie", "V100 PCIe", {"fp16": 112, "fp32": 14}),
               (r"v100", "V100 SXM2", {"fp16": 125, "fp32": 15.7}),
               (r"\bt4\b", "T4", {"fp16": 65, "fp32": 8.1}))


def matmul_precision(bf16=False, fp16=False, tf32=None) -> str:
    if bf16:
        return "bf16"
    if fp16:
        return "fp16"
    return "tf32" if (tf32_on() if tf32 is None else tf32) else "fp32"


def tf32_on() -> bool:
    """Whether float32 matmuls run in TF32 now, by the one reading that works whichever API set it."""
    import torch

    return torch.backends.cuda.matmul.fp32_precision == "tf32"


def settle_tf32() -> bool:
    """Sets TF32 through torch's two APIs at once, keeping what is set now (transformers >= 5.17 sets it through
    the newer `fp32_precision` alone); -> whether TF32 is on. After the newer API alone, torch 2.9-2.13 raises
    on a read of the legacy `allow_tf32` flags, and inductor (torch 2.10/2.11) reads them while compiling: the
    compilation then fails and the run goes on uncompiled (pytorch#166387)."""
    import torch

    enable = tf32_on()
    torch.backends.fp32_precision = "tf32" if enable else "ieee"
    torch.backends.cuda.matmul.allow_tf32 = enable
    torch.backends.cudnn.allow_tf32 = enable
    return enable


def training_device(values: dict) -> tuple:
    """(this rank's GPU's compute capability, None on a CPU or when no precision is asked; whether it trains on the
    CPU: with --use_cpu or without any accelerator, as accelerate picks) for the run's parsed settings."""
    import torch

    on_cpu = bool(values.get("use_cpu")) or not torch.accelerator.is_available()  # CUDA, MPS, XPU, ...
    asked = values.get("bf16") or values.get("tf32") or values.get("fp16")
    gpu = int(os.environ.get("LOCAL_RANK") or 0) % max(torch.cuda.device_count(), 1)
    on_gpu = asked and not on_cpu and torch.cuda.is_available()
    return (torch.cuda.get_device_capability(gpu) if on_gpu else None), on_cpu


def device_precision(capability, bf16: bool, tf32, fp16: bool = False, on_cpu: bool | None = None) -> tuple:
    """-> (settings to change, the line saying so, or None) on a GPU of compute `capability` (None: the CPU). Below 8.0
    no bf16 tensor cores (fp16 uses them) and no TF32, nor on a CPU; bf16 on a CPU stays: autocast runs it natively.
    fp16 on a CPU is refused: accelerate runs no fp16 autocast there, so the run would train in fp32 as if in fp16."""
    on_cpu = capability is None if on_cpu is None else on_cpu
    if fp16 and on_cpu:
        raise InputError("fp16=true", "the CPU cannot train in fp16 (no fp16 autocast there: the run would train "
                         "in fp32 while its records said fp16)", "pass --bf16 true (the CPU runs bf16) instead, or "
                         "leave --fp16 out to train in fp32")
    native = capability is not None and tuple(capability) >= (8, 0)
    changes, instead = {}, {}  # what the device lacks -> what the run does instead
    if bf16 and not native and capability is not None:
        changes.update(bf16=False, fp16=True)
        instead["native bf16"] = "training in fp16 with loss scaling instead of bf16"
    if tf32 and not native:
        changes["tf32"] = False
        instead["TF32"] = "tf32 off"
    device = "the CPU" if capability is None else f"this GPU (compute capability {capability[0]}.{capability[1]})"
    return changes, (f"{device} has no {' and no '.join(instead)}: {', '.join(instead.values())}" if instead else None)


def peak_flops(device_name, precision, override_tflops=None):
    """-> (peak FLOP/s or None: a CPU, a MIG slice, an unknown card; where it comes from); `override_tflops` wins."""
    if override_tflops:
        return override_tflops * 1e12, f"--peak_tflops {override_tflops:g}"
    if not device_name:
        return None, "no peak for a CPU (pass --peak_tflops)"
    if re.search(r"\bmig\b", name := device_name.lower()):
        return None, (f"{device_name!r} is a MIG slice of a GPU, whose share of the card's peak is not known "
                      "(pass --peak_tflops)")
    for pattern, label, peaks in PEAK_TFLOPS:
        if re.search(pattern, name):
            if precision in peaks:
                return peaks[precision] * 1e12, f"{label} {precision} dense"
            return None, f"no {precision} peak for {label} (pass --peak_tflops)"
    return None, f"unknown device {device_name!r} (pass --peak_tflops)"


def mfu(flops, seconds, peak_flops_per_s):
    return None if not seconds or seconds <= 0 or not peak_flops_per_s else flops / seconds / peak_flops_per_s
