"""How a `--torch_compile` run compiles: a cache shared across jobs, sdpa attention that always gets its mask, a
failed compilation that falls back to eager code, and the warm-up (`--compile_warmup`), a pass of every batch shape
before the first step, so no compilation lands in a timed window. docs/telemetry.md."""
import inspect
import itertools
import logging
import os
import tempfile
import time
from pathlib import Path

import torch
import torch._dynamo
import torch._functorch.config
import torch.fx.experimental._config as shapes
from transformers import AttentionInterface, AttentionMaskInterface, TrainerCallback
from transformers.masking_utils import sdpa_mask

from qa.data.collate import feature_lengths
from qa.evaluation.time_to_accuracy import rng_kept
from qa.io import DISK_FULL, DiskFull, atomic_write_json, disk_full, read_record, refuses_writes
from qa.manifest import check_files, record_files

logger = logging.getLogger(__name__)

# Static graphs, one per (batch, length) shape and grad mode, need more than torch's default of 8
# compilations per function, or the shapes past the limit silently run eagerly: 6 buckets x 2 modes x 2 batches.
STATIC_RECOMPILE_LIMIT = 64
SDPA_WITH_MASK = "sdpa_with_mask"
CACHE_RECORD = "verified.json"  # in the compile cache: each file's size and hash when a compiled run ended well


def configure_compile(model_args, features_cache) -> None:
    """--compile_dynamic and --compile_regional as the ACCELERATE_DYNAMO_* variables (accelerate's TorchDynamoPlugin
    fills from them what the Trainer leaves unset); torch's caches where the next job, on any node, finds them
    (docs/telemetry.md, "Compiled code reused across jobs")."""
    cache = Path(model_args.compile_cache_dir or Path(features_cache) / "torch_compile").expanduser().resolve()
    if code := refuses_writes(cache):  # a cache is an optimisation: compiled without it, in torch's per-node default
        logger.warning("compile cache %s: %s: this run compiles without it", cache, DISK_FULL[code])
        cache = Path(tempfile.mkdtemp(prefix="torchinductor-"))
    elif cache.is_relative_to(tempfile.gettempdir()):
        logger.warning("the compile cache %s is under %s: a job on another node will compile again (set "
                       "--compile_cache_dir or HF_HOME to a shared file system)", cache, tempfile.gettempdir())
    os.environ["TORCHINDUCTOR_CACHE_DIR"], os.environ["TRITON_CACHE_DIR"] = str(cache), str(cache / "triton")
    if int(os.environ.get("LOCAL_RANK") or 0) == 0:  # once per node: all ranks meet at a collective before compiling
        drop_damaged(cache)
    # the model's floats (dropout, scales) as constants: as symbols, specialized later, the frame restarts uncached
    torch._dynamo.config.specialize_float = True
    dynamic = model_args.compile_dynamic
    if dynamic != "auto":
        os.environ["ACCELERATE_DYNAMO_USE_DYNAMIC"] = dynamic
    # both ways: a value left in the environment by an earlier run in this process (or its parent's) is not this run's
    os.environ["ACCELERATE_DYNAMO_USE_REGIONAL_COMPILATION"] = "true" if model_args.compile_regional else "false"
    if dynamic == "false":
        torch._dynamo.config.recompile_limit = max(torch._dynamo.config.recompile_limit, STATIC_RECOMPILE_LIMIT)
    else:
        # no "duck sizing": sizes equal when traced (48 features of 48 tokens) would share a symbol, then recompile
        shapes.use_duck_shape = False


def drop_damaged(cache: Path) -> None:
    """Removes the compile cache's files that no longer match their record (a cut copy, a file changed on the shared
    file system): torch recompiles a graph entry it cannot unpickle, but runs eagerly after a damaged module."""
    damaged = [name for name, entry in read_record(cache / CACHE_RECORD).items()
               if (cache / name).is_file() and check_files(cache, {name: entry}) is not None]
    for name in damaged:
        (cache / name).unlink(missing_ok=True)
    if damaged:
        logger.warning("compile cache %s: %d damaged file(s) removed (e.g. %s), compiled again", cache, len(damaged),
                       damaged[0])


def record_compile_cache() -> None:
    """After a run whose compilation went well: every file of the compile cache, for drop_damaged to check (a file
    another job adds meanwhile is simply not checked); what drop_damaged verified is not hashed again."""
    cache = Path(os.environ["TORCHINDUCTOR_CACHE_DIR"])
    files = record_files(cache, skip=(CACHE_RECORD,), verified=read_record(cache / CACHE_RECORD))
    try:
        atomic_write_json(cache / CACHE_RECORD, {name: entry for name, entry in files.items()
                                                 if not name.startswith("locks/")})  # torch's lock files: rewritten
    except DiskFull as err:  # the cache as it was: the next job uses it, checked against the record it had
        logger.warning("compile cache %s: %s: what this run added is not recorded", cache, DISK_FULL[err.code])


def _sdpa_mask_always(*args, **kwargs):
    # sdpa gets no mask where nothing is padding: a layer compiled with one would recompile (2% of SQuAD fills 384)
    return sdpa_mask(*args, **{**kwargs, "allow_is_bidirectional_skip": False, "allow_is_causal_skip": False})


def keep_mask_when_compiled(model) -> None:
    if model.config._attn_implementation == "sdpa":
        AttentionInterface.register(SDPA_WITH_MASK, AttentionInterface()["sdpa"])
        AttentionMaskInterface.register(SDPA_WITH_MASK, _sdpa_mask_always)
        model.set_attn_implementation(SDPA_WITH_MASK)


class _CompileFailures(logging.Filter):
    """On dynamo's logger: a compilation it gave up (a warning and its traceback) becomes one line, once."""

    reason = None

    def filter(self, record):
        if record.levelno < logging.WARNING or not record.exc_info:
            return True
        if self.reason is None:
            error = record.exc_info[1]
            error = getattr(error, "inner_exception", None) or error  # the backend's own error (inductor's)
            self.reason = f"{type(error).__name__}: {(str(error).strip().splitlines() or [''])[0]}"[:300]
            if code := disk_full(error):  # where it compiles: its cache (configure_compile)
                self.reason = f"{DISK_FULL[code]} in the compile cache {os.environ.get('TORCHINDUCTOR_CACHE_DIR')}"
            logger.warning("torch.compile failed (%s): the code it was compiling runs eagerly, the run goes on",
                           self.reason)
        return False


COMPILE_FAILURES = _CompileFailures()


def fall_back_when_compile_fails() -> None:
    """A failed compilation leaves that code eager instead of ending the run (dynamo's suppress_errors); the
    backward graph is compiled with the forward one, not at the first backward pass, outside that fallback."""
    torch._dynamo.config.suppress_errors = True
    torch._functorch.config.force_non_lazy_backward_lowering = True
    COMPILE_FAILURES.reason = None
    logging.getLogger("torch._dynamo.convert_frame").addFilter(COMPILE_FAILURES)  # once: addFilter skips a repeat


_RECOMPILES = {"count": 0}


def _count_recompile(start):
    # Compile ids read 'frame/attempt': attempt > 0 once the guards of the frame's graphs failed (a new shape)
    attempt = str(start.compile_id).rpartition("/")[2]
    if start.callback_trigger.name == "DYNAMO" and attempt.isdigit() and int(attempt) > 0:
        _RECOMPILES["count"] += 1


def compile_stats(since=None) -> dict:
    """What torch.compile has done so far in this process (torch._dynamo's counters), or after `since` (an earlier
    reading); `recompiles` is counted from the first call on by a hook (registered again after a reset)."""
    from torch._dynamo.utils import compilation_time_metrics, counters

    def seconds(timer):  # one of torch's own compile timers
        return sum(compilation_time_metrics.get(timer, ()))

    handler = torch._dynamo.callback_handler
    if _count_recompile not in handler.start_callbacks:
        handler.register_start_callback(_count_recompile)
    stats = {"compiles": int(counters["frames"].get("total", 0)),
             "frames_compiled": int(counters["frames"].get("ok", 0)),
             "unique_graphs": int(counters["stats"].get("unique_graphs", 0)),
             "recompiles": _RECOMPILES["count"], "graph_breaks": int(sum(counters["graph_break"].values())),
             # a frame past the limit runs eagerly from then on; dynamo files it under the "unimplemented" counters
             "recompile_limit_hits": int(sum(n for msg, n in counters["unimplemented"].items()
                                             if "recompile limit" in msg.lower())),
             "cudagraph_skips": int(counters["inductor"].get("cudagraph_skips", 0)),  # graphs run without them
             **{f"{name}_{outcome}": int(counters[kind].get(f"{name}_{outcome}", 0))
                for kind, name in (("inductor", "fxgraph_cache"), ("aot_autograd", "autograd_cache"))
                for outcome in ("hit", "miss")},
             # torch's own timers, cache loads included; a backward graph is compiled when it first runs
             "tracing_s": round(seconds("_compile.compile_inner") - seconds("OutputGraph.call_user_compiler"), 3),
             "compiling_s": round(seconds("OutputGraph.call_user_compiler") + seconds("backward._backward_impl"), 3)}
    return stats if since is None else {k: v - since[k] for k, v in stats.items()}


def compile_outcome() -> str:
    """For a compiled run's results, from dynamo's counters: 'yes' only when it made graphs and every frame it
    tried compiled; else 'fell back: <why>' (an error, the recompile limit, a frame left eager, no graph)."""
    stats = compile_stats()
    if COMPILE_FAILURES.reason is not None:
        return f"fell back: {COMPILE_FAILURES.reason}"
    if stats["recompile_limit_hits"]:
        return (f"fell back: the recompile limit was hit {stats['recompile_limit_hits']} time(s): those frames ran "
                "eagerly")
    if failed := stats["compiles"] - stats["frames_compiled"]:
        return f"fell back: {failed} of {stats['compiles']} frames failed to compile and ran eagerly"
    if not stats["unique_graphs"]:
        return "fell back: no graph was compiled"
    return "yes"


def cuda_graphs_outcome() -> str:
    """'yes', or 'skipped' where inductor ran a graph it could not record (any on a CPU) as compiled code."""
    if skips := compile_stats()["cudagraph_skips"]:
        logger.warning("CUDA graphs were skipped by %d compiled graph(s), which ran without them (on a GPU, "
                       "TORCH_LOGS=cudagraphs says why)", skips)
        return "skipped"
    return "yes"


def forward_backward(trainer, model, batch: dict):
    """One forward and backward pass as Trainer.training_step runs it (so a compiled model meets the graphs
    training uses), without an optimizer step; the loss, detached. The model's mode is put back."""
    was_training = model.training
    model.train()
    try:
        with trainer.compute_loss_context_manager():
            loss = trainer.compute_loss(model, batch)
        trainer.accelerator.backward(loss)
    finally:
        model.train(was_training)
    return loss.detach()


def collate_rows(trainer, indices) -> dict:
    accepted = set(inspect.signature(trainer.model.forward).parameters)
    rows = [{k: v for k, v in trainer.train_dataset[int(i)].items() if k in accepted} for i in indices]
    return {k: v.to(trainer.args.device) for k, v in trainer.data_collator(rows).items()}


def batch_shapes(lengths, batch_size: int, width_of, last_batch: int = 0) -> list:
    """[(width, rows)]: one batch of each shape training can produce from features of token counts `lengths`, each
    `width_of(its longest feature)` wide (the collator's bucket); `last_batch`: the epoch's last, smaller one, or 0."""
    buckets = {}
    for index, length in enumerate(lengths):
        rows = buckets.setdefault(width_of(int(length)), [])
        if len(rows) < batch_size:
            rows.append(index)
    sizes = [batch_size] + ([last_batch] if 0 < last_batch < batch_size else [])
    return [(width, list(itertools.islice(itertools.cycle(buckets[width]), size)))
            for width in sorted(buckets) for size in sizes]


def training_shapes(trainer) -> list:
    """batch_shapes of the run (a collator without buckets pads a batch to its longest feature)."""
    args = trainer.args
    lengths = feature_lengths(trainer.train_dataset)
    width_of = getattr(trainer.data_collator, "target_length", lambda longest: longest)
    # Under DDP accelerate fills every rank's last batch up to full size (even_batches), a collator with rows too
    filled = args.dataloader_drop_last or args.world_size > 1 or getattr(trainer.data_collator, "rows", None)
    last = 0 if filled else len(lengths) % args.per_device_train_batch_size
    return batch_shapes(lengths, args.per_device_train_batch_size, width_of, last)


class CompileWarmupCallback(TrainerCallback):
    """Before step 1, `passes` of every batch shape training will produce (gradients cleared, RNGs kept)."""

    def __init__(self, passes: int = 1):
        self.trainer, self.record, self.passes = None, {}, passes

    def bind(self, trainer) -> None:
        self.trainer = trainer

    def on_train_begin(self, args, state, control, **kwargs):
        trainer = self.trainer
        started, before = time.perf_counter(), compile_stats()
        shapes = training_shapes(trainer)
        model = trainer.model_wrapped
        with trainer.clock.phase("compile_warmup"), rng_kept():
            for _, rows in shapes * self.passes:
                forward_backward(trainer, model, collate_rows(trainer, rows))
            model.zero_grad(set_to_none=True)
        seconds = time.perf_counter() - started
        compiled = compile_stats(since=before)
        self.record = {"compile_warmup_shapes": [[len(rows), width] for width, rows in shapes],
                       "compile_warmup_s": round(seconds, 3),
                       **{f"compile_warmup_{k}": compiled[k] for k in ("compiles", "recompiles")},
                       **{f"compile_warmup_{k}": round(compiled[k], 3) for k in ("tracing_s", "compiling_s")}}
        logger.info("compile warm-up: %d batch shapes (batch x width) in %.1f s, %s compilations", len(shapes),
                    seconds, compiled["compiles"])

    def summary(self) -> dict:  # for train_results.json
        return dict(self.record)
