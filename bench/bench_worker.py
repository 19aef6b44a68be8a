"""One benchmark variant: runs `run_qa.main(argv)` itself, with a stopwatch around a fixed
window of optimizer steps after warm-up. Started by bench/run_bench.py, one process per variant
(so no variant inherits another's compiled graphs, TF32 flags or memory high-water mark):

    python bench/bench_worker.py TIMING.json WARMUP_STEPS TIMED_STEPS -- RUN_QA_ARGS...

Nothing in the training path is replaced. Two things are added:
- a Trainer callback that synchronises the device at the end of optimizer step WARMUP_STEPS and
  of step WARMUP_STEPS + TIMED_STEPS and times the steps between (data loading included, as in
  a real run: the DataLoader is part of the step loop);
- a wrapper around `QuestionAnsweringTrainer.training_step` that counts, per micro-batch, the
  samples, the token positions (batch x padded length) and the real tokens (attention mask); the
  real-token sums stay on the device until the window closes, so counting adds no sync.
It writes TIMING.json with those counts and what the run really used (attention kernel,
optimizer, sampler, collator, precision, compiled graphs, peak memory).
"""
import json
import os
import resource
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))


class Counts:
    def __init__(self):
        self.samples = 0
        self.batch_tokens = 0
        self.real = []  # device scalars: real tokens of each micro-batch
        self.sum_sq = []  # device scalars: sum of squared real lengths of each micro-batch

    def snapshot(self):
        import torch

        real = int(torch.stack(self.real).sum().item()) if self.real else 0
        sum_sq = int(torch.stack(self.sum_sq).sum().item()) if self.sum_sq else 0
        return {"samples": self.samples, "batch_tokens": self.batch_tokens, "real_tokens": real,
                "sum_sq_lengths": sum_sq}


COUNTS = Counts()


def _sync():
    import torch

    if torch.cuda.is_available():
        torch.cuda.synchronize()


def _install_counter():
    from trainer_qa import QuestionAnsweringTrainer

    original = QuestionAnsweringTrainer.training_step

    def training_step(self, model, inputs, *args, **kwargs):
        mask = inputs.get("attention_mask")
        if mask is not None:
            COUNTS.samples += mask.shape[0]
            COUNTS.batch_tokens += mask.numel()
            lengths = mask.sum(dim=1)
            COUNTS.real.append(lengths.sum())
            COUNTS.sum_sq.append((lengths.long() ** 2).sum())
        return original(self, model, inputs, *args, **kwargs)

    QuestionAnsweringTrainer.training_step = training_step


def _tf32_state():
    """'tf32' or 'ieee' for fp32 matmuls on the GPU. torch >= 2.9 has a new API (which
    transformers uses); once it is set, reading the legacy `allow_tf32` raises."""
    import torch

    matmul = torch.backends.cuda.matmul
    try:
        precision = getattr(matmul, "fp32_precision", None)
        if precision is not None:
            return getattr(torch.backends, "fp32_precision", "none") if precision == "none" else precision
        return "tf32" if matmul.allow_tf32 else "ieee"
    except RuntimeError as err:
        return f"unknown ({str(err)[:60]})"


def _describe(trainer_kwargs, args):
    """What the run really used, read from the live objects."""
    import torch

    model, optimizer = trainer_kwargs.get("model"), trainer_kwargs.get("optimizer")
    loader = trainer_kwargs.get("train_dataloader")
    base = getattr(model, "_orig_mod", model)
    config = getattr(base, "config", None)
    sampler = None
    if loader is not None:
        inner = getattr(loader, "base_dataloader", loader)
        batch_sampler = getattr(inner, "batch_sampler", None)
        sampler = getattr(getattr(batch_sampler, "batch_sampler", batch_sampler), "sampler", None)
        sampler = sampler or getattr(inner, "sampler", None)
    return {
        "attn_implementation": getattr(config, "_attn_implementation", None),
        "optimizer": type(optimizer.optimizer if hasattr(optimizer, "optimizer") else optimizer).__name__
        if optimizer is not None else None,
        "optimizer_fused": bool(getattr(getattr(optimizer, "optimizer", optimizer), "defaults", {}).get("fused")),
        "sampler": type(sampler).__name__ if sampler is not None else None,
        "collator": type(getattr(loader, "collate_fn", None)).__name__ if loader is not None else None,
        "dataloader_num_workers": getattr(loader, "num_workers", None),
        "bf16": bool(args.bf16),
        "tf32_matmul": _tf32_state() if torch.cuda.is_available() else None,
        "torch_compile": bool(args.torch_compile),
        "compile_dynamic": os.environ.get("ACCELERATE_DYNAMO_USE_DYNAMIC"),
        "compile_regional": os.environ.get("ACCELERATE_DYNAMO_USE_REGIONAL_COMPILATION"),
        "per_device_train_batch_size": args.per_device_train_batch_size,
        "gradient_accumulation_steps": args.gradient_accumulation_steps,
        "world_size": args.world_size,
    }


def _model_shape(model):
    import torch

    base = getattr(model, "_orig_mod", model)
    embedding = {id(p) for m in base.modules() if isinstance(m, torch.nn.Embedding) for p in m.parameters()}
    config = base.config
    return {
        "non_embedding_params": sum(p.numel() for p in base.parameters() if id(p) not in embedding),
        "params": sum(p.numel() for p in base.parameters()),
        "layers": config.num_hidden_layers, "hidden": config.hidden_size,
        "heads": config.num_attention_heads, "intermediate": config.intermediate_size,
    }


def _device():
    import platform

    import torch

    if torch.cuda.is_available():
        p = torch.cuda.get_device_properties(0)
        return {"kind": "cuda", "name": p.name, "memory_gib": round(p.total_memory / 2**30, 1),
                "count": torch.cuda.device_count(), "capability": f"{p.major}.{p.minor}"}
    return {"kind": "cpu", "name": f"CPU: {platform.processor() or platform.machine()}",
            "cores": os.cpu_count(), "torch_threads": torch.get_num_threads()}


def make_callback(path, warmup, timed):
    from transformers import TrainerCallback

    class StepWindow(TrainerCallback):
        def __init__(self):
            self.record = {"warmup_steps": warmup, "timed_steps": timed, "complete": False}
            self.t_begin = None

        def on_train_begin(self, args, state, control, **kwargs):
            import torch

            if torch.cuda.is_available():
                torch.cuda.reset_peak_memory_stats()
            _sync()
            self.t_begin = time.perf_counter()
            self.record["until_train_begin_s"] = round(self.t_begin - WORKER_START, 3)
            self.record["used"] = _describe(kwargs, args)
            self.record["model"] = _model_shape(kwargs["model"])

        def on_step_end(self, args, state, control, **kwargs):
            step = state.global_step
            if step == 1:
                _sync()
                self.record["first_step_s"] = round(time.perf_counter() - self.t_begin, 3)
            if step == warmup:
                _sync()
                self.t0 = time.perf_counter()
                self.record["warmup_s"] = round(self.t0 - self.t_begin, 3)
                self.c0 = COUNTS.snapshot()
            if step == warmup + timed:
                _sync()
                seconds = time.perf_counter() - self.t0
                c1 = COUNTS.snapshot()
                self.record.update({k: c1[k] - self.c0[k] for k in c1})
                self.record["seconds"] = seconds
                self.record["complete"] = True
                self.record.update(_memory())
                self.record["compile"] = _compile_stats()
                # Whether compilation happened is in the compile counters: the callbacks see the
                # Trainer's unwrapped model, not the compiled one it trains.
                Path(path).write_text(json.dumps(self.record, indent=1))

    return StepWindow()


def _memory():
    import torch

    out = {"peak_rss_gib": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20, 3)}
    if torch.cuda.is_available():
        out["peak_memory_gib"] = round(torch.cuda.max_memory_allocated() / 2**30, 3)
        out["peak_reserved_gib"] = round(torch.cuda.max_memory_reserved() / 2**30, 3)
    return out


def _compile_stats():
    try:
        from torch._dynamo.utils import counters
    except ImportError:
        return None
    return {"unique_graphs": int(counters["stats"].get("unique_graphs", 0)),
            "frames_compiled": int(counters["frames"].get("ok", 0)),
            "graph_breaks": int(sum(counters["graph_break"].values()))}


WORKER_START = time.perf_counter()


def main(argv):
    path, warmup, timed = argv[0], int(argv[1]), int(argv[2])
    assert argv[3] == "--", argv
    run_argv = argv[4:]
    import qa.callbacks

    _install_counter()
    original = qa.callbacks.run_callbacks
    window = make_callback(path, warmup, timed)

    def run_callbacks(*args, **kwargs):
        return [*original(*args, **kwargs), window]

    qa.callbacks.run_callbacks = run_callbacks
    import run_qa

    run_qa.logger.info("bench worker: timing steps %d..%d", warmup + 1, warmup + timed)
    code = run_qa.main(run_argv)
    record = window.record
    record["device"] = _device()
    record["exit_code"] = code
    Path(path).write_text(json.dumps(record, indent=1))
    return code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
