#!/usr/bin/env python
"""Host cost of a training step: the CPU time one step costs in each way of running it, with a "hollow" BERT.

    python bench/bench_host.py [--variants eager_bf16 regional whole_model whole_model_static framework]
                               [--steps 60] [--warmup 5] [--width 16] [--out bench/results]

On a GPU this project's step is bound by the host: on an H200 a batch-48 step of configs/fast.json took about 76 ms
while the GPU was busy about 15 ms (docs/benchmarks.md). The hollow BERT has bert-base's 12 layers and 199 parameter
tensors at hidden size 8: the same operators, as many of them per step, and almost no arithmetic, so a step's CPU time
(thread time, one thread) is the host's work: Python, dispatch, autograd, the optimizer's bookkeeping. The variants run
round-robin in one process (one step of each in turn, so that the machine's load hits them alike), each a full step
(forward and loss under bf16 autocast, backward, fused AdamW, gradients cleared) on ROWS x WIDTH random tokens with
padding in every row:

- eager_bf16: the model as it is, sdpa attention;
- regional: the encoder layers compiled one by one as configs/fast.json compiles them (accelerate's regional
  compilation, with the project's compile settings and its attention mask that is always built: qa/training/compile.py);
- whole_model, whole_model_static: torch.compile of the whole model, symbolic and static shapes;
- framework: run_qa.py's Trainer on configs/fast.json's settings (on the CPU, data loaded in-process) against a bare
  loop on the same model, optimizer, scheduler and batch: one bare step after each Trainer step, whose difference is
  the framework's cost per step; a cProfile of Trainer steps says where it goes.

Reported per variant: CPU ms per step (median, quartiles), and from untimed passes: top-level ATen calls per step
outside compiled code (a dispatch each; those that reach a kernel are a kernel launch or more on a GPU), Python calls
per step, calls that would make a GPU's host wait for the device, and how much of the CPU time the CPU's kernels took
(a range: where the hollow model is not hollow), the rest being the host's own work.

What a CPU cannot show: the GPU's launch latency (a CUDA launch costs the host more than a CPU kernel's dispatch);
inductor's Triton launchers (on a CPU inductor emits C++ kernels instead, called from its Python wrapper); CUDA-graph
replay; the host waiting for the device (a sync is counted here, never timed); copies between host and device (every
tensor is on the CPU; tests/test_host_sync.py follows them). Attention's work grows with the square of the width even
at hidden size 8, and CPU attention with dropout runs as separate operators where a GPU runs one fused kernel: the
default width is small so that the step stays hollow (docs/benchmarks.md, "Host cost per step").
Results: bench/results/host-cpu-<machine>-x<cores>-<time>.json and .md.
"""
import argparse
import cProfile
import json
import os
import platform
import pstats
import statistics
import sys
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path
from types import SimpleNamespace

import torch
from transformers import TrainerCallback

from qa.errors import command

REPO = Path(__file__).resolve().parents[1]
HOLLOW_BERT = dict(hidden_size=8, num_hidden_layers=12, num_attention_heads=2, intermediate_size=8,
                   max_position_embeddings=512)
CORE = ("eager_bf16", "regional", "whole_model", "whole_model_static")
VARIANTS = (*CORE, "framework")
FIRST_WORD = 1000  # below it the bert-base-uncased vocabulary holds special and [unused] tokens
# Each of these reads a device value on the host or sizes its output by the data: on a GPU the host waits. Counted
# outermost (is_nonzero calls item, which calls _local_scalar_dense: one wait), inside compiled code too.
SYNC_OPS = frozenset(f"aten::{name}" for name in (
    "_local_scalar_dense", "item", "is_nonzero", "nonzero", "equal", "allclose", "masked_select", "unique", "_unique",
    "_unique2", "unique_dim", "unique_consecutive", "bincount"))
# ATen calls under which a sync still waits on a GPU (boolean indexing calls nonzero there too). Under any other, a sync
# is the CPU kernel's own read: the CPU's fused AdamW reads each step count with item, the GPU's reads it on the device.
SYNC_CARRIERS = SYNC_OPS | {"aten::index", "aten::index_put_", "aten::_index_put_impl_"}
# How torch 2.13's profiler names compiled code: dynamo's frame, AOTAutograd's forward and backward, inductor's graph
COMPILED = ("Torch-Compiled Region", "CompiledFunction", "## Call CompiledFxGraph")
# Views, aliases and allocations: no kernel on a GPU unless a call below them does work
NO_WORK = frozenset(f"aten::{name}" for name in (
    "view", "_unsafe_view", "reshape", "_reshape_alias", "view_as", "transpose", "t", "permute", "expand", "expand_as",
    "unsqueeze", "squeeze", "slice", "select", "as_strided", "detach", "alias", "unflatten", "flatten", "split",
    "split_with_sizes", "chunk", "narrow", "unbind", "empty", "empty_strided", "empty_like", "contiguous", "to",
    "lift_fresh", "resolve_conj", "resolve_neg"))


def hollow_bert(work: Path, layers: int) -> Path:
    """The hollow BERT saved with the bundled tokenizer, as run_qa.py loads a model."""
    from qa.model import build_random_bert

    return build_random_bert(work / f"hollow-bert-{layers}", {**HOLLOW_BERT, "num_hidden_layers": layers})


def random_batch(tokenizer, rows: int, width: int, seed: int = 0) -> dict:
    """Random words after [CLS]; every row ends in padding; each answer span inside its row."""
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(width // 2 + 1, width, (rows,), generator=g)
    mask = (torch.arange(width) < lengths[:, None]).long()
    ids = torch.randint(FIRST_WORD, tokenizer.vocab_size, (rows, width), generator=g) * mask
    ids[:, 0] = tokenizer.cls_token_id
    start = 1 + (torch.rand(rows, generator=g) * (lengths - 1)).long()
    end = start + (torch.rand(rows, generator=g) * (lengths - start)).long()
    return dict(input_ids=ids, token_type_ids=torch.zeros_like(ids), attention_mask=mask, start_positions=start,
                end_positions=end)


class Step:
    """One variant's training step: its own copy of the model (`run`, maybe compiled, calls `model`), fused AdamW."""

    def __init__(self, model, run, batch):
        self.run, self.batch = run, batch
        self.optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=True)

    def __call__(self):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            loss = self.run(**self.batch).loss
        loss.backward()
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)


class BareStep:
    """The Trainer's model, optimizer and scheduler (the torch objects under accelerate's wrappers) stepped by hand on
    the batch the Trainer's step just used, under the Trainer's own autocast (accelerate's, around model.forward)."""

    def __init__(self, trainer, model, optimizer, scheduler):
        self.trainer, self.model, self.optimizer, self.scheduler = trainer, model, optimizer, scheduler
        self.batch = None

    def __call__(self):
        with self.trainer.compute_loss_context_manager():
            loss = self.model(**self.batch).loss
        loss.backward()
        self.optimizer.step()
        self.scheduler.step()
        self.optimizer.zero_grad(set_to_none=True)


def compile_kwargs(cache_dir) -> dict:
    """torch.compile's arguments as a fast.json run gets them: the project's settings, then accelerate's plugin."""
    from accelerate.utils import TorchDynamoPlugin

    from qa.data.cache import default_cache_dir
    from qa.training.compile import configure_compile

    configure_compile(SimpleNamespace(compile_cache_dir=cache_dir, compile_dynamic="true", compile_regional=True),
                      default_cache_dir())
    return TorchDynamoPlugin(backend="inductor").to_kwargs()


def core_step(name: str, folder: Path, batch: dict, dynamo: dict) -> Step:
    from accelerate.utils import compile_regions
    from transformers import BertForQuestionAnswering

    from qa.training.compile import keep_mask_when_compiled

    model = BertForQuestionAnswering.from_pretrained(folder, attn_implementation="sdpa").train()
    if name == "eager_bf16":
        return Step(model, model, batch)
    keep_mask_when_compiled(model)  # as every compiled run (qa/model.py)
    if name == "regional":
        return Step(model, compile_regions(model, **dynamo), batch)
    return Step(model, torch.compile(model, **{**dynamo, "dynamic": name == "whole_model"}), batch)


def warm_up(step, steps: int) -> dict:
    from qa.training.compile import compile_stats

    before, start = compile_stats(), time.perf_counter()
    step()
    first = time.perf_counter() - start
    for _ in range(steps - 1):
        step()
    return {"first_step_s": round(first, 2), "compiles": compile_stats(since=before)["compiles"]}


def one_round(steps: dict, times: dict) -> None:
    for name, step in steps.items():
        start = time.thread_time()
        step()
        times.setdefault(name, []).append(time.thread_time() - start)


def _ancestors(event):
    while (event := event.cpu_parent) is not None:
        yield event.name


def _does_work(event) -> bool:
    return event.name not in NO_WORK or any(_does_work(child) for child in event.cpu_children
                                            if child.name.startswith("aten::"))


def _kernels(event) -> tuple:
    """Whether an event's own time is CPU kernels', at least and at most: an ATen call that does work where no ATen
    call below it does (leaves out the own part of one that computes after calling another: addmm copies its bias
    first), and any ATen call that does work (counts a composite's own time, which is dispatch: linear's around
    its addmm). Each includes the calls' own dispatch."""
    if not event.name.startswith("aten::") or not _does_work(event):
        return False, False
    return not any(_does_work(child) for child in event.cpu_children if child.name.startswith("aten::")), True


def op_counts(events, steps: int) -> dict:
    """Per step, from a profile's events: top-level ATen calls (no ATen call above them) outside compiled code, those
    of them that reach a kernel, ATen calls made from compiled code, host syncs (SYNC_OPS) by name, and the time spent
    in ATen's CPU kernels, at least and at most (work a GPU would take off the host)."""
    top = work = compiled = least_us = most_us = 0
    syncs = {}
    for event in events:
        least, most = _kernels(event)
        least_us += least and event.self_cpu_time_total
        most_us += most and event.self_cpu_time_total
        above = list(_ancestors(event))
        if (event.name in SYNC_OPS and not SYNC_OPS.intersection(above)
                and SYNC_CARRIERS.issuperset(name for name in above if name.startswith("aten::"))):
            syncs[event.name] = syncs.get(event.name, 0) + 1
        if not event.name.startswith("aten::") or any(name.startswith("aten::") for name in above):
            continue
        if any(name.startswith(COMPILED) for name in above):
            compiled += 1
        else:
            top, work = top + 1, work + _does_work(event)
    return {"aten_top_level": round(top / steps, 2), "aten_top_level_doing_work": round(work / steps, 2),
            "aten_in_compiled_code": round(compiled / steps, 2),
            "aten_kernels_ms": [round(least_us / 1e3 / steps, 3), round(most_us / 1e3 / steps, 3)],
            "host_syncs": round(sum(syncs.values()) / steps, 2),
            "host_syncs_by_op": {name: round(n / steps, 2) for name, n in sorted(syncs.items())}}


class Passes:
    """The untimed passes over `steps` steps each, started and stopped around them (inside the Trainer's loop too):
    torch.profiler for the ATen calls, syncs and ATen's kernel time, sys.setprofile for the Python calls and the time
    in inductor's C++ kernels (on a CPU, builtins named `kernel` that its Python wrapper calls; the profiler lists no
    event for them)."""

    def __init__(self, steps: int):
        self.steps, self.calls, self.profiler, self.started = steps, 0, None, None
        self.kernel_s, self.kernel_started = 0.0, None

    def start_ops(self):
        from torch.profiler import ProfilerActivity, profile

        self.profiler = profile(activities=[ProfilerActivity.CPU])
        self.profiler.start()
        self.started = time.perf_counter(), time.thread_time()

    def stop_ops(self) -> dict:
        wall, cpu = time.perf_counter() - self.started[0], time.thread_time() - self.started[1]
        self.profiler.stop()
        counts = op_counts(self.profiler.events(), self.steps)
        # The profiler's clock is the wall's, which other jobs on the machine stretch: its kernel times as CPU time
        counts["aten_kernels_ms"] = [round(ms * cpu / wall, 3) for ms in counts["aten_kernels_ms"]]
        return {**counts, "profiled_step_ms": round(1e3 * cpu / self.steps, 3)}

    def _count(self, frame, event, arg):
        if event == "call":
            self.calls += 1
        elif event.startswith("c_") and getattr(arg, "__name__", None) == "kernel":
            if event == "c_call":
                self.kernel_started = time.thread_time()
            elif self.kernel_started is not None:
                self.kernel_s += time.thread_time() - self.kernel_started
                self.kernel_started = None

    def start_calls(self):
        self.calls, self.kernel_s = 0, 0.0
        sys.setprofile(self._count)

    def stop_calls(self) -> dict:
        sys.setprofile(None)
        return {"python_calls": round(self.calls / self.steps, 1),
                "inductor_kernels_ms": round(1e3 * self.kernel_s / self.steps, 3)}

    def of(self, step) -> dict:
        self.start_ops()
        for _ in range(self.steps):
            step()
        ops = self.stop_ops()
        self.start_calls()
        for _ in range(self.steps):
            step()
        return {**ops, **self.stop_calls()}


def spread(seconds) -> dict:
    ms = sorted(1e3 * s for s in seconds)
    q = statistics.quantiles(ms, n=4) if len(ms) > 1 else ms * 3
    return {"median_ms": round(statistics.median(ms), 3), "p25_ms": round(q[0], 3), "p75_ms": round(q[2], 3),
            "mean_ms": round(statistics.mean(ms), 3), "steps": len(ms)}


def _where(key) -> str:
    path, line, name = key
    for root in (str(REPO) + "/", "site-packages/", "/lib/python"):
        path = path.split(root, 1)[-1] if root in path else path
    return f"{path}:{line}({name})" if line else name


def breakdown(profile: cProfile.Profile, steps: int, parents: dict, roots: str = None) -> list:
    """Where profiled steps went, cumulative ms per step, largest first: the calls made by `parents` ({(file ending,
    function): label}) and, labelled `roots`, those made by the frames running when profiling began (cProfile records
    no caller for them: what a function's callers leave of its calls and time)."""
    rows = []
    for key, (_, calls, _, cumulative, callers) in pstats.Stats(profile).stats.items():
        edges = [(label, edge[1], edge[3]) for caller, edge in callers.items() for (end, name), label in parents.items()
                 if caller[0].endswith(end) and caller[2] == name]
        if roots:
            edges.append((roots, calls - sum(edge[1] for edge in callers.values()),
                          cumulative - sum(edge[3] for edge in callers.values())))
        if not key[0].endswith("bench_host.py"):  # the benchmark's own code: its timer around the data, its steps
            rows += [{"call": _where(key), "from": label, "ms_per_step": round(1e3 * seconds / steps, 3),
                      "calls_per_step": round(n / steps, 2)} for label, n, seconds in edges if n > 0 < seconds]
    return sorted(rows, key=lambda row: -row["ms_per_step"])


def cpu_ms(call, reps: int) -> float:
    seconds = []
    for _ in range(reps):
        start = time.thread_time()
        call()
        seconds.append(time.thread_time() - start)
    return round(1e3 * statistics.median(seconds), 3)


def direct_costs(trainer, bare: BareStep, reps: int = 20) -> dict:
    """CPU ms of the calls the Trainer's step makes beyond the bare step's, each timed alone (median of `reps`), beside
    what the bare step calls instead; gradients from one backward pass, so that clipping and the optimizer work."""
    model, accelerated, inner = bare.model, trainer.optimizer, bare.optimizer
    with trainer.compute_loss_context_manager():
        loss = model(**bare.batch).loss
    loss.backward()
    params = [p for p in model.parameters() if p.grad is not None]
    costs = {"model.train() (Trainer.training_step)": cpu_ms(model.train, reps),
             "accelerator.clip_grad_norm_ (the Trainer's clipping)": cpu_ms(
                 lambda: trainer.accelerator.clip_grad_norm_(model.parameters(), trainer.args.max_grad_norm), reps),
             "torch.nn.utils.clip_grad_norm_ on the parameters' list": cpu_ms(
                 lambda: torch.nn.utils.clip_grad_norm_(params, trainer.args.max_grad_norm), reps),
             "optimizer step through accelerate's wrapper": cpu_ms(accelerated.step, reps),
             "optimizer step, torch's optimizer": cpu_ms(inner.step, reps),
             "Trainer.floating_point_ops": cpu_ms(lambda: trainer.floating_point_ops(bare.batch), reps)}
    inner.zero_grad(set_to_none=True)
    costs.update({"zero_grad through accelerate's wrapper (no gradients)": cpu_ms(accelerated.zero_grad, reps),
                  "zero_grad, torch's optimizer (no gradients)": cpu_ms(inner.zero_grad, reps)})
    return costs


class FrameworkCallback(TrainerCallback):
    """The benchmark inside the Trainer's loop (this callback comes last). After each Trainer step, one step of the bare
    loop and of every other variant. The Trainer's step is timed from the end of this call to the start of the next:
    all the Trainer does for a step (data, other callbacks, logging), none of the other variants' steps. After the timed
    steps, the untimed passes over Trainer steps, then over the others' steps."""

    def __init__(self, steps: dict, warmup: int, timed: int, passes: Passes):
        self.steps, self.warmup, self.timed, self.passes = steps, warmup, timed, passes
        self.trainer = self.bare = self.mark = self.profile = self.compiled_before = None
        self.times, self.fetch, self.fetched, self.epochs, self.record = {}, [], 0.0, 0, {}

    def bind(self, trainer):
        self.trainer = trainer

    def on_train_begin(self, args, state, control, model=None, optimizer=None, lr_scheduler=None, **kwargs):
        # accelerate's wrappers, where the Trainer has them, are part of the framework: the bare loop goes around them
        self.bare = BareStep(self.trainer, model, getattr(optimizer, "optimizer", optimizer),
                             getattr(lr_scheduler, "scheduler", lr_scheduler))
        self.record["objects"] = {"optimizer": type(optimizer).__name__, "lr_scheduler": type(lr_scheduler).__name__,
                                  "model_forward": getattr(model.forward, "__qualname__", "?")}
        self.trainer.get_batch_samples = self._fetching(self.trainer.get_batch_samples)

    def on_epoch_begin(self, args, state, control, **kwargs):
        self.epochs += 1

    def _fetching(self, get_batch_samples):
        def fetch(*args, **kwargs):  # the data's share of the step, and the batch the bare step takes next
            start = time.thread_time()
            batches, items = get_batch_samples(*args, **kwargs)
            self.fetched += time.thread_time() - start
            self.bare.batch = batches[0] if batches else self.bare.batch
            return batches, items
        return fetch

    def on_step_end(self, args, state, control, **kwargs):
        from qa.training.compile import compile_stats

        now, step, last = time.thread_time(), state.global_step, self.warmup + self.timed
        if self.warmup < step <= last:
            self.times.setdefault("framework", []).append(now - self.mark)
            self.fetch.append(self.fetched)
        if step <= last:
            one_round({"bare": self.bare, **self.steps}, self.times if step > self.warmup else {})
        if step == self.warmup:
            self.compiled_before = compile_stats()
        elif step == last:
            self.record["compiles_in_window"] = compile_stats(since=self.compiled_before)["compiles"]
        self._pass(step - last)
        self.fetched, self.mark = 0.0, time.thread_time()

    def _pass(self, k: int) -> None:
        passes, n = self.passes, self.passes.steps
        if k == 0:
            passes.start_ops()
        elif k == n:
            self.record["counts"] = {"framework": passes.stop_ops()}
            passes.start_calls()
        elif k == 2 * n:
            self.record["counts"]["framework"].update(passes.stop_calls())
            # CPU time, not wall time: the machine's other jobs stretch neither
            self.profile, self.bare_profile = cProfile.Profile(time.thread_time), cProfile.Profile(time.thread_time)
            self.profile.enable()
        elif 2 * n < k <= 3 * n:  # a bare step after each profiled Trainer step, under a profile of its own
            self.profile.disable()
            self.bare_profile.runcall(self.bare)
            if k < 3 * n:
                self.profile.enable()
                return
            loop = {("transformers/trainer.py", "training_step"): "training_step", ("bench_host.py", "fetch"): "loop"}
            self.record["breakdown"] = breakdown(self.profile, n, loop, roots="loop")
            self.record["bare_breakdown"] = breakdown(self.bare_profile, n, {("bench_host.py", "__call__"): "bare"})
            self.record["direct"] = direct_costs(self.trainer, self.bare)
            self.record["counts"].update({name: passes.of(step) for name, step in {"bare": self.bare,
                                                                                    **self.steps}.items()})


def trainer_argv(args, folder: Path, work: Path, max_steps: int) -> list:
    """configs/fast.json on the CPU (tests/test_host_sync.py's switches) with the hollow BERT on generated questions,
    every batch padded to --width (the collator's one bucket), data loaded in the main process, where it is timed."""
    query = args.width // 4
    stride = (args.width - query - 3) // 2  # half the room for the context: width - question - [CLS] [SEP] [SEP]
    per_question = max(1, 64 // stride)  # windows of a generated paragraph (mostly 60-100 tokens), fewer to be safe
    examples = 50 + args.rows * max_steps // per_question  # one epoch holds every step: no epoch's end is timed
    return [str(REPO / "configs" / "fast.json"), "--model_name_or_path", str(folder), "--dataset_name", "synthetic",
            "--synthetic_train_examples", str(examples), "--max_seq_length", str(args.width), "--length_buckets",
            str(args.width), "--max_query_length", str(query), "--doc_stride", str(stride),
            "--per_device_train_batch_size", str(args.rows), "--max_steps", str(max_steps), "--do_eval", "false",
            "--use_cpu", "true", "--tf32", "false", "--torch_compile", "false", "--dataloader_num_workers", "0",
            "--dataloader_persistent_workers", "false", "--features_cache_dir", str(work / "features"),
            "--output_dir", str(work / "out"), "--resume", "never", "--report_to", "none"]


def with_trainer(args, folder: Path, work: Path, steps: dict, passes: Passes) -> dict:
    import run_qa

    callback = FrameworkCallback(steps, args.warmup, args.steps, passes)
    max_steps = args.warmup + args.steps + 3 * passes.steps
    if status := run_qa.main(trainer_argv(args, folder, work, max_steps), callbacks=[callback]):
        raise SystemExit(f"run_qa.py ended with status {status}")
    times, record = callback.times, callback.record
    cost = [trainer - bare for trainer, bare in zip(times["framework"], times["bare"])]
    framework = {"cost": spread(cost), "data_fetch": spread(callback.fetch), "epochs": callback.epochs,
                 "profiled_steps": passes.steps, **{key: record[key] for key in ("objects", "breakdown",
                                                                                 "bare_breakdown", "direct")}}
    return {"times": times, "counts": record["counts"], "compiles_in_window": record["compiles_in_window"],
            "framework": framework}


def without_trainer(args, steps: dict, passes: Passes) -> dict:
    from qa.training.compile import compile_stats

    times, before = {}, compile_stats()
    for _ in range(args.steps):
        one_round(steps, times)
    compiles = compile_stats(since=before)["compiles"]
    return {"times": times, "counts": {name: passes.of(step) for name, step in steps.items()},
            "compiles_in_window": compiles}


def measure(args) -> dict:
    """Every variant's figures; the work folder (the hollow BERT, the Trainer's output) is thrown away."""
    from safetensors import safe_open
    from transformers import AutoTokenizer

    torch.set_num_threads(args.threads)
    with tempfile.TemporaryDirectory(prefix="bench-host-") as tmp:
        work = Path(tmp)
        folder = hollow_bert(work, args.layers)
        with safe_open(str(folder / "model.safetensors"), "pt") as weights:
            tensors = len(list(weights.keys()))
        batch = random_batch(AutoTokenizer.from_pretrained(folder), args.rows, args.width)
        core = [name for name in args.variants if name in CORE]
        dynamo = compile_kwargs(args.compile_cache_dir) if set(core) - {"eager_bf16"} else {}
        steps, warm = {}, {}
        for name in core:
            steps[name] = core_step(name, folder, batch, dynamo)
            warm[name] = warm_up(steps[name], args.warmup)
        passes = Passes(args.profile_steps)
        found = (with_trainer(args, folder, work, steps, passes) if "framework" in args.variants
                 else without_trainer(args, steps, passes))
    times = found["times"]
    variants = {name: {"cpu": spread(times[name]), **found["counts"][name], "warm_up": warm.get(name)}
                for name in (*CORE, "framework", "bare") if name in times}
    for v in variants.values():
        v["cpu_kernels_ms"] = [round(ms + v["inductor_kernels_ms"], 3) for ms in v["aten_kernels_ms"]]
        v["host_own_ms"] = [round(v["cpu"]["median_ms"] - ms, 3) for ms in reversed(v["cpu_kernels_ms"])]
    return {"variants": variants, "framework": found.get("framework"),
            "compiles_in_window": found["compiles_in_window"], "parameter_tensors": tensors}


def machine() -> dict:
    from qa.results.records import environment_record

    env = environment_record({})
    cpu = next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                if line.startswith("model name")), platform.machine())
    return {"host": platform.node(), "cpu": cpu, "cores": os.cpu_count(), "versions": env["versions"],
            "git_commit": env["git_commit"], "torch_threads": torch.get_num_threads(),
            "omp_num_threads": os.environ.get("OMP_NUM_THREADS")}


LABELS = {"eager_bf16": "eager_bf16 (the model as it is, sdpa)",
          "regional": "regional (each layer compiled, as configs/fast.json)",
          "whole_model": "whole_model (torch.compile, dynamic)", "whole_model_static": "whole_model_static",
          "framework": "framework: run_qa.py's Trainer step (fast.json on the CPU)",
          "bare": "bare loop on the Trainer's objects"}


def _total(rows, label) -> float:
    return sum(row["ms_per_step"] for row in rows if row["from"] == label)


def _span(pair) -> str:
    return f"{pair[0]:.1f}-{pair[1]:.1f}"


def _cell(v, key, fmt="{:,.0f}"):
    return fmt.format(v[key]) if v.get(key) is not None else "-"


def markdown(r) -> str:
    s, m = r["settings"], r["machine"]
    eager = r["variants"].get("eager_bf16", {}).get("cpu", {}).get("median_ms")
    lines = ["# Host cost per step: the hollow BERT on a CPU", "",
             f"{r['date_utc']} on `{m['host']}` ({m['cpu']}, {m['cores']} cores, {m['torch_threads']} torch thread); "
             f"load average before {r['load_avg']['before']}, after {r['load_avg']['after']}; torch "
             f"{m['versions']['torch']}, transformers {m['versions']['transformers']}, accelerate "
             f"{m['versions'].get('accelerate')}; git {m['git_commit']}; command `{r['command']}`.", "",
             f"BERT with {s['layers']} layers at hidden size 8 ({s['parameter_tensors']} parameter tensors), a batch "
             f"of {s['rows']} x {s['width']} tokens; {s['steps']} timed steps per variant after {s['warmup']}, taken "
             f"round-robin; counts from {s['profile_steps']} more steps per pass, untimed. Compilations in the timed "
             f"steps: {r['compiles_in_window']}.", "",
             "| variant | CPU ms/step, median (p25-p75) | x eager_bf16 | top-level ATen calls/step (reaching a kernel) "
             "| ATen calls from compiled code | Python calls/step | host syncs/step | in CPU kernels, ms/step "
             "| host's own work, ms/step | first step s (compiles) |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for name, v in r["variants"].items():
        c, w = v["cpu"], v.get("warm_up") or {}
        ratio = f"{c['median_ms'] / eager:.2f}" if eager else "-"
        first = f"{w['first_step_s']} ({w['compiles']})" if w else "-"
        lines.append(f"| {LABELS.get(name, name)} | {c['median_ms']:.2f} ({c['p25_ms']:.2f}-{c['p75_ms']:.2f}) | "
                     f"{ratio} | {_cell(v, 'aten_top_level')} ({_cell(v, 'aten_top_level_doing_work')}) | "
                     f"{_cell(v, 'aten_in_compiled_code')} | {_cell(v, 'python_calls')} | "
                     f"{_cell(v, 'host_syncs', '{:g}')} | {_span(v['cpu_kernels_ms'])} | {_span(v['host_own_ms'])} | "
                     f"{first} |")
    if f := r["framework"]:
        cost, fetch = f["cost"], f["data_fetch"]
        lines += ["", f"**Framework cost**: the Trainer's step minus the bare step on the same objects and batch, "
                  f"per step: median {cost['median_ms']:.2f} ms (p25-p75 {cost['p25_ms']:.2f}-{cost['p75_ms']:.2f}, "
                  f"mean {cost['mean_ms']:.2f}); of the Trainer's step, fetching the batch (sampler, Arrow rows, "
                  f"collator, accelerate's copy) took {fetch['median_ms']:.2f} ms. {f['epochs']} epoch(s).", "",
                  f"Where the steps go (cProfile over {f['profiled_steps']} steps of each, its own overhead inflating "
                  f"Python-heavy calls: the Trainer's step came to {_total(f['breakdown'], 'loop'):.2f} ms under it, "
                  f"the bare step to {_total(f['bare_breakdown'], 'bare'):.2f}): the calls made by the training loop, "
                  f"by training_step and by the bare step, ms per step, those above {s['breakdown_floor_ms']} ms.", "",
                  "| call | made by | ms/step under cProfile | calls/step |", "|---|---|---|---|"]
        lines += [f"| `{row['call']}` | {row['from']} | {row['ms_per_step']:.3f} | {row['calls_per_step']:g} |"
                  for row in f["breakdown"] + f["bare_breakdown"] if row["ms_per_step"] >= s["breakdown_floor_ms"]]
        lines += ["", "Calls the Trainer's step makes, each timed alone (CPU ms, median of 20), beside what a bare "
                  "loop calls instead:", "", "| call | CPU ms |", "|---|---|"]
        lines += [f"| {name} | {ms:.3f} |" for name, ms in f["direct"].items()]
    lines.append("")
    return "\n".join(lines)


@command
def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--variants", nargs="+", choices=VARIANTS, default=list(VARIANTS))
    parser.add_argument("--steps", type=int, default=60, help="timed steps per variant")
    parser.add_argument("--warmup", type=int, default=5, help="untimed steps first (the first compiles)")
    parser.add_argument("--profile_steps", type=int, default=3, help="steps per untimed pass (profiler, Python calls, "
                        "cProfile)")
    parser.add_argument("--rows", type=int, default=48, help="batch size (configs/fast.json's)")
    parser.add_argument("--width", type=int, default=16, help="tokens per row: attention's work grows with its square")
    parser.add_argument("--layers", type=int, default=12, help="encoder layers (bert-base: 12; fewer in tests)")
    parser.add_argument("--threads", type=int, default=1, help="torch threads")
    parser.add_argument("--compile_cache_dir", type=Path, default=None, help="default: a training run's")
    parser.add_argument("--breakdown_floor_ms", type=float, default=0.2, help="the report lists calls above it")
    parser.add_argument("--out", type=Path, default=REPO / "bench" / "results")
    args = parser.parse_args(argv)
    if args.warmup < 1 or args.steps < 1 or args.profile_steps < 1:
        parser.error("--warmup, --steps and --profile_steps: at least 1")
    if args.width < (12 if "framework" in args.variants else 2):
        parser.error("--width: at least 2, 12 with framework (a generated question and its context need room)")

    from qa.io import atomic_write_json, atomic_write_text

    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
    load_before, started = os.getloadavg(), datetime.now(timezone.utc)
    found = measure(args)
    report = {"benchmark": "bench/bench_host.py", "command": " ".join(["python bench/bench_host.py",
              *(sys.argv[1:] if argv is None else argv)]), "date_utc": started.isoformat(timespec="seconds"),
              "machine": machine(), "settings": {**{k: v for k, v in vars(args).items() if k not in ("out",
              "compile_cache_dir")}, "parameter_tensors": found.pop("parameter_tensors")},
              **found, "load_avg": {"before": [round(x, 2) for x in load_before],
                                    "after": [round(x, 2) for x in os.getloadavg()]},
              "rules": {"host_syncs": sorted(SYNC_OPS), "compiled_code": list(COMPILED), "no_work": sorted(NO_WORK)}}
    stem = f"host-cpu-{platform.machine().lower().replace('_', '-')}-x{os.cpu_count()}-" \
           f"{started.strftime('%Y%m%dT%H%M%SZ')}"
    args.out.mkdir(parents=True, exist_ok=True)
    atomic_write_json(args.out / f"{stem}.json", report, indent=1)
    atomic_write_text(args.out / f"{stem}.md", markdown(report))
    print(json.dumps({"json": str(args.out / f"{stem}.json"), "markdown": str(args.out / f"{stem}.md")}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
