"""The training's measurements (docs/telemetry.md), in one place. Units: seconds, GiB (2**30 bytes), FLOP/s; shares
and MFU are fractions in [0, 1], not percent."""
import logging
import resource
import time

import pyarrow.compute as pc
import torch
from transformers import TrainerCallback

from qa.training.compile import compile_stats
from qa.training.flops import gradient_size, matmul_precision, mfu, model_flops, model_shape, peak_flops

logger = logging.getLogger(__name__)
GIB = 2 ** 30


def train_throughput(metrics: dict, features, num_examples: int) -> dict:
    """What the Trainer leaves out: it counts features (windows), not questions, and not padding (here the
    features', from their attention masks' totals; the batches' is the telemetry's `train_batches_padding_fraction`)."""
    masks = pc.list_flatten(features.with_format("arrow")["attention_mask"])
    real, count = int(pc.sum(masks).as_py() or 0), len(features)
    mean = real / max(count, 1)
    return {"train_examples": num_examples, "train_features": count, "train_mean_real_tokens": round(mean, 2),
            "train_features_padding_fraction": round(1 - real / max(len(masks), 1), 4),
            "train_real_tokens_per_second": round(metrics.get("train_samples_per_second", 0.0) * mean, 1)}


def rate(count, seconds):
    return None if not seconds or seconds <= 0 else count / seconds


def share(part, total):
    """part / total clipped to [0, 1] (host timers can overlap by microseconds); None if total is 0."""
    return None if not total or total <= 0 else min(max(part / total, 0.0), 1.0)


def padding_fraction(real_tokens, batch_tokens):
    return None if not batch_tokens else 1.0 - real_tokens / batch_tokens


def gib(num_bytes):
    return None if num_bytes is None else num_bytes / GIB


def max_rss_gib():
    """This process's peak resident memory (ru_maxrss: KiB on Linux)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 / GIB


def perf_metrics(*, steps, samples, real_tokens, batch_tokens, flops, step_s, data_s,
                 peak_flops_per_s=None, world_size=1) -> dict:
    """From rank 0's counts for the whole job: DDP ranks step in lockstep on equal batches, so samples/s x world size
    is exact, real tokens/s x world size an estimate. MFU is per device; None where unknown."""
    busy = step_s + data_s
    per_device_flops = rate(flops, busy)
    return {"step_time_s": step_s / steps if steps else None,
            "samples_per_s": rate(samples * world_size, busy),
            "real_tokens_per_s": rate(real_tokens * world_size, busy),
            "padding_fraction": padding_fraction(real_tokens, batch_tokens),
            "data_time_share": share(data_s, busy),
            "tflops_per_device": None if per_device_flops is None else per_device_flops / 1e12,
            "mfu": mfu(flops, busy, peak_flops_per_s)}


def sig(value, digits=5):
    """Rounded to significant digits (tiny CPU figures such as MFU would round to 0 in decimals)."""
    return None if value is None else float(f"{value:.{digits}g}")


def autocast_precision(args, accelerator=None) -> str:
    """The matmul precision training runs in: accelerate's autocast when it runs one (it runs none for fp16 on a
    CPU), else TF32 or fp32 as torch has it; from the arguments only without the accelerator."""
    if accelerator is None:
        return matmul_precision(args.bf16, args.fp16)
    autocast = accelerator.mixed_precision if accelerator.native_amp else None
    return matmul_precision(autocast == "bf16", autocast == "fp16")


def describe_training(args, model, optimizer=None, train_dataloader=None, accelerator=None) -> dict:
    """Read from the live objects the Trainer hands its callbacks and its accelerator, not the arguments that asked."""
    config = getattr(model, "config", None)  # a compiled model's too
    inner = getattr(optimizer, "optimizer", optimizer)  # accelerate wraps the optimizer
    batch_sampler = getattr(train_dataloader, "batch_sampler", None)  # accelerate's DataLoader passes it on
    sampler = getattr(getattr(batch_sampler, "batch_sampler", batch_sampler), "sampler", None)
    sampler = sampler or getattr(train_dataloader, "sampler", None)
    return {"attn_implementation": getattr(config, "_attn_implementation", None),
            "optimizer": type(inner).__name__ if inner is not None else None,
            "optimizer_fused": bool(getattr(inner, "defaults", {}).get("fused")),
            "sampler": type(sampler).__name__ if sampler is not None else None,
            "collator": type(getattr(train_dataloader, "collate_fn", None)).__name__ if train_dataloader else None,
            "dataloader_num_workers": getattr(train_dataloader, "num_workers", None),
            "dataloader_non_blocking": accelerator.non_blocking if accelerator is not None else None,
            "matmul_precision": autocast_precision(args, accelerator),  # TF32 as torch has it, not as asked
            "torch_compile": bool(args.torch_compile),
            "per_device_train_batch_size": args.per_device_train_batch_size,
            "gradient_accumulation_steps": args.gradient_accumulation_steps,
            "world_size": args.world_size}


class _Counts:
    """The batches' token counts stay on the device until `snapshot()` reads them: no synchronisation per step."""
    FIELDS = ("steps", "samples", "batch_tokens", "real_tokens", "sum_sq", "step_s", "data_s")

    def __init__(self):
        self.steps = self.samples = self.batch_tokens = self.real_tokens = self.sum_sq = 0
        self.step_s = self.data_s = 0.0
        self.pending = None  # device tensor [real tokens, sum of squared real lengths, samples]

    def snapshot(self, since=None) -> dict:
        if self.pending is not None:
            for name, value in zip(("real_tokens", "sum_sq", "samples"), self.pending.tolist()):  # one device sync
                setattr(self, name, getattr(self, name) + int(value))
            self.pending = None
        return {name: getattr(self, name) - (since[name] if since else 0) for name in self.FIELDS}


class TelemetryCallback(TrainerCallback):
    """The loop timed from the inside, on a clock that starts at the first optimizer step (a compile warm-up, other
    callbacks, the DataLoader's start-up are outside it): step time from `on_step_begin` to `on_step_end`, data time
    from the previous step's end (or the logging, evaluation, saving after it) to the next begin; over many steps host
    times track device times (a host ahead fills the GPU's bounded launch queue and waits). docs/telemetry.md."""

    def __init__(self, peak_tflops=None):
        self.peak_tflops = peak_tflops
        self._summary, self._hook, self._accelerator = {}, None, None  # the hook: while training

    def bind(self, trainer) -> None:  # its accelerator says which autocast, if any, the training steps run in
        self._accelerator = trainer.accelerator

    def on_train_begin(self, args, state, control, model=None, optimizer=None, train_dataloader=None, **kwargs):
        self._cuda = torch.cuda.is_available() and getattr(args.device, "type", "") == "cuda"
        device_name = torch.cuda.get_device_name(args.device) if self._cuda else None
        self.setup = describe_training(args, model, optimizer, train_dataloader, self._accelerator)
        self.precision, self.world_size = self.setup["matmul_precision"], self.setup["world_size"]
        self.peak, self.peak_source = peak_flops(device_name, self.precision, self.peak_tflops)
        self.shape, self.gradients = model_shape(model), gradient_size(model)
        self.counts, self.peak_before_reset = _Counts(), 0
        self._logged = self.counts.snapshot()  # the counts at the last log entry
        compile_stats()  # from here on, recompilations are counted too
        self.train_start = self._mark = self._step_start = None
        if self._hook is not None:
            self._hook.remove()
        self._hook = model.register_forward_pre_hook(self._count_batch, with_kwargs=True)
        logger.info("telemetry: %s matmuls, peak %s (%s)", self.precision,
                    "n/a" if self.peak is None else f"{self.peak / 1e12:g} TFLOP/s", self.peak_source)

    def _count_batch(self, module, args, kwargs):
        if not module.training or self._step_start is None:
            return  # only the batches of optimizer steps
        mask = kwargs["attention_mask"]  # the Trainer's batches always have it: every run's features do
        with torch.no_grad():
            lengths = mask.reshape(mask.shape[0], -1).to(torch.int64).sum(dim=1)
            if (start := kwargs.get("start_positions")) is not None:  # rows the loss ignores fill a batch: no samples
                lengths = lengths * (start < mask.shape[-1])
            counts = torch.stack([lengths.sum(), (lengths * lengths).sum(), (lengths > 0).sum()])
            w = self.counts
            w.pending = counts if w.pending is None else w.pending + counts
        w.batch_tokens += mask.numel()

    def on_step_begin(self, args, state, control, **kwargs):
        self._step_start = time.perf_counter()
        if self.train_start is None:
            self.train_start = self._step_start
        elif self._mark is not None:
            self.counts.data_s += self._step_start - self._mark

    def on_step_end(self, args, state, control, **kwargs):
        self.counts.step_s += time.perf_counter() - self._step_start
        self.counts.steps += 1
        self._step_start = None
        self._set_mark()

    def _set_mark(self, *args, **kwargs):
        self._mark = time.perf_counter()

    on_log = on_evaluate = on_save = _set_mark  # their time is neither step nor data time

    def log_values(self, logs: dict) -> dict:
        """For an entry of the training loss; QuestionAnsweringTrainer adds them to it (TensorBoard, the console)."""
        if self._hook is None or "loss" not in logs or self.counts.steps <= self._logged["steps"]:
            return {}
        perf = {**self.figures(self.counts.snapshot(since=self._logged)), **self._memory()}
        self._logged = self.counts.snapshot()
        return {"perf/" + k: sig(v, 6) for k, v in perf.items() if v is not None}

    def _memory(self) -> dict:
        out = {"peak_rss_gib": max_rss_gib()}  # the host's peak has no reset: the process's
        if self._cuda:  # a timed window resets the device's peak (bench/timed_run.py): the run's is kept here
            out["peak_mem_gib"] = gib(max(torch.cuda.max_memory_allocated(), self.peak_before_reset))
        return out

    def _flops(self, c: dict) -> float:
        s = self.shape
        return model_flops(s["non_embedding_params"], s["layers"], s["hidden"], c["real_tokens"], c["sum_sq"])

    def figures(self, c: dict) -> dict:
        """perf_metrics of counts `c` (a `counts.snapshot()`, or the difference of two)."""
        return perf_metrics(steps=c["steps"], samples=c["samples"], real_tokens=c["real_tokens"],
                            batch_tokens=c["batch_tokens"], flops=self._flops(c), step_s=c["step_s"],
                            data_s=c["data_s"], peak_flops_per_s=self.peak, world_size=self.world_size)

    def on_train_end(self, args, state, control, **kwargs):
        self._hook.remove()
        self._hook = None
        wall = time.perf_counter() - (self.train_start or time.perf_counter())
        t, s = self.counts.snapshot(), self.shape
        perf, memory = self.figures(t), self._memory()
        self._summary = {"train_step_time_mean_s": sig(perf["step_time_s"]),
                         "train_data_loading_share": sig(perf["data_time_share"]),
                         "train_step_time_total_s": sig(t["step_s"]),
                         "train_data_time_total_s": sig(t["data_s"]),
                         # the rest of the loop's wall time: logging, evaluations, checkpoints
                         "train_other_time_total_s": sig(max(wall - t["step_s"] - t["data_s"], 0.0)),
                         "train_batches_padding_fraction": sig(perf["padding_fraction"]),
                         "train_real_tokens_batches": t["real_tokens"],
                         "train_real_tokens_per_second_measured": sig(perf["real_tokens_per_s"]),
                         "train_samples_per_second_measured": sig(perf["samples_per_s"]),
                         "train_model_flops": self._flops(t),
                         **{f"train_{k}": sig(perf[k]) for k in ("tflops_per_device", "mfu")},
                         "train_peak_tflops": None if self.peak is None else round(self.peak / 1e12, 2),
                         "train_peak_tflops_source": self.peak_source,
                         "train_matmul_precision": self.precision,
                         "train_peak_memory_gib": sig(memory.get("peak_mem_gib")),
                         "train_peak_rss_gib": sig(memory.get("peak_rss_gib")),
                         **{f"train_{k}": s[k] for k in ("non_embedding_params", "layers")},
                         "train_hidden_size": s["hidden"],
                         **{f"train_{k}": v for k, v in self.gradients.items()},
                         "train_setup": {**self.setup, "compile": compile_stats() if args.torch_compile else None}}

    def summary(self) -> dict:
        return dict(self._summary)
