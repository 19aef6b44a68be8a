#!/usr/bin/env python
"""The input pipeline's rate apart from the model: windows/s the fast config's training DataLoader delivers.

    python bench/bench_input.py [--dev PATH] [--workers 0 1 2] [--repeat 3] [--epochs 3] [--out bench/results]

The dev set's features at 384/128/64 come through run_qa.py's own path (features cache included), and the
DataLoader is the one a real Trainer builds for configs/fast.json (sampler, collator, workers, pinning, prefetch,
accelerate's wrapper). The model never runs: the bundled MiniLM stands in for bert-base (same vocabulary and
forward arguments, so the Trainer keeps the same columns). Each worker count gets a fresh DataLoader, in interleaved
rounds: its start-up (time to the first batch) apart, its rate over the epochs after the first, the CPU time per
batch of the main process and of the workers; in-process, the Arrow row reading and the collator apart. The GPU
machine's figure is a projection from the per-worker rate, with what it assumes.
"""
import argparse
import json
import multiprocessing
import os
import platform
import statistics
import sys
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path

from dev_set import require_squad_dev, squad_dev_path  # the script beside this one
from qa.errors import command

REPO = Path(__file__).resolve().parents[1]
TARGET = 2 * 2 * 88_524 / 60  # twice the GPU's rate: 2 epochs of SQuAD v1.1's training windows in 60 s


def fast_trainer(args, output_dir):
    """The Trainer run_qa.py builds for the config, on the dev set, with the features from its cache."""
    import torch

    import run_qa
    from qa.arguments import parse_args
    from qa.model import bundled_minilm_dir
    from qa.results.wall_clock import PhaseClock

    argv = [str(args.config), "--model_name_or_path", str(bundled_minilm_dir()), "--train_file", str(args.dev),
            "--do_eval", "false", "--output_dir", output_dir, "--report_to", "none", "--resume", "never",
            "--torch_compile", "false"]  # the model never runs: compiling it would only cost time
    if args.features_cache_dir:
        argv += ["--features_cache_dir", str(args.features_cache_dir)]
    if args.max_train_samples:
        argv += ["--max_train_samples", str(args.max_train_samples)]
    if not torch.cuda.is_available():  # as run_bench.py: bf16 on a CPU is refused without it
        argv += ["--use_cpu", "true"]
    setup = run_qa.load(*parse_args(argv)[:4], PhaseClock())
    features, collator = run_qa.features_for(setup, train=True)
    return run_qa.trainer_for(setup, features, collator)[2], setup.clock.seconds["features"]


def children() -> set:
    return {int(p) for task in Path(f"/proc/{os.getpid()}/task").glob("*") if (task / "children").exists()
            for p in (task / "children").read_text().split()}


def cpu_seconds(pids) -> float:
    """User + system CPU of live processes (the workers are never waited for, so os.times() misses them)."""
    ticks = sum(sum(map(int, Path(f"/proc/{p}/stat").read_text().rsplit(")", 1)[1].split()[11:13])) for p in pids)
    return ticks / os.sysconf("SC_CLK_TCK")


def train_loader(trainer, workers: int):
    """The Trainer's own training DataLoader, with `workers` instead of the config's."""
    from trainer_qa import attributes_set

    with attributes_set(trainer.args, dataloader_num_workers=workers,
                        dataloader_persistent_workers=trainer.args.dataloader_persistent_workers and workers > 0):
        return trainer.get_train_dataloader()


def measure(trainer, workers: int, epochs: int) -> dict:
    loader = train_loader(trainer, workers)
    before, start = children(), time.perf_counter()
    batch_iter = iter(loader)
    next(batch_iter)
    startup, pids = time.perf_counter() - start, children() - before
    for _ in batch_iter:  # the rest of the first epoch, untimed: it ends with every worker started and idle
        pass
    # Whole epochs from here, the turn between them included as in a run: every batch counted was made and
    # received inside the window, so the CPU times match the windows.
    windows = batches = 0
    wall, cpu, worker_cpu = time.perf_counter(), time.process_time(), cpu_seconds(pids)
    for _ in range(epochs - 1):
        for batch in loader:
            windows, batches = windows + len(batch["input_ids"]), batches + 1
    seconds, main_cpu = time.perf_counter() - wall, time.process_time() - cpu
    worker_cpu = cpu_seconds(pids) - worker_cpu
    del batch_iter, batch, loader  # persistent workers end here, before the next count starts its own
    return {"workers": workers, "startup_s": round(startup, 3), "windows": int(windows), "seconds": round(seconds, 3),
            "windows_per_s": round(windows / seconds), "per_worker": round(windows / seconds / max(workers, 1)),
            "main_cpu_ms_per_batch": round(1e3 * main_cpu / batches, 3),
            "workers_cpu_ms_per_batch": round(1e3 * worker_cpu / batches, 3) if workers else None,
            "windows_per_batch": round(windows / batches, 2), "load_1m": round(os.getloadavg()[0], 2)}


def in_process(trainer) -> dict:
    """What one batch costs inside a worker, apart: the rows read out of Arrow as the DataLoader's fetcher reads
    them (`__getitems__`), and the collator on them; CPU time, which a busy machine does not stretch."""
    loader, fetch, collate = train_loader(trainer, 0), 0.0, 0.0
    order = list(loader.batch_sampler)
    for indices in order:
        t0 = time.process_time()
        rows = loader.dataset.__getitems__(indices)
        t1 = time.process_time()
        loader.collate_fn(rows)
        fetch, collate = fetch + t1 - t0, collate + time.process_time() - t1
    return {"batches": len(order), "fetch_rows_ms_per_batch": round(1e3 * fetch / len(order), 3),
            "collator_ms_per_batch": round(1e3 * collate / len(order), 3),
            "collator": type(loader.collate_fn).__name__, "sampler": type(loader.batch_sampler.sampler).__name__}


def summary(runs, config_workers, mean_batch, breakdown) -> dict:
    """Medians by worker count, and the projection to the config's workers on their own cores."""
    def median(key, counts):
        return statistics.median(r[key] for n in counts for r in runs[n]) if counts else None

    med = {str(n): {k: median(k, [n]) for k in ("startup_s", "windows_per_s", "per_worker", "main_cpu_ms_per_batch")}
           for n in runs}
    basis = 1 if 1 in runs else max(runs)
    with_workers = [n for n in runs if n > 0]
    main_ms, worker_ms = median("main_cpu_ms_per_batch", with_workers), median("workers_cpu_ms_per_batch", with_workers)
    per_worker, ceiling = med[str(basis)]["per_worker"], round(1e3 / main_ms * mean_batch) if main_ms else None
    projected = round(min(config_workers * per_worker, ceiling or float("inf")))
    return {"median": med, "per_worker_basis_workers": basis, "per_worker": round(per_worker),
            "config_workers": config_workers, "main_cpu_ms_per_batch": main_ms, "main_process_ceiling": ceiling,
            "worker_cpu_ms_per_batch": worker_ms,
            "per_worker_on_own_core": round(1e3 * mean_batch / worker_ms) if worker_ms else None,
            "worker_handover_ms_per_batch": round(worker_ms - breakdown["fetch_rows_ms_per_batch"]
                                                  - breakdown["collator_ms_per_batch"], 3) if worker_ms else None,
            "main_share_at_target": round(TARGET / mean_batch * main_ms / 1e3, 3) if main_ms else None,
            "projected": projected, "target": round(TARGET), "meets": projected >= TARGET}


def markdown(r) -> str:
    s, b = r["summary"], r["in_process"]
    lines = ["# Input pipeline: the fast config's DataLoader, without the model", "",
             f"{r['date_utc']} on `{r['host']}` ({r['cpu']}, {r['cores']} cores; load average before "
             f"{r['load_avg']['before']}, after {r['load_avg']['after']}: other jobs shared the machine); torch "
             f"{r['versions']['torch']}, transformers {r['versions']['transformers']}, datasets "
             f"{r['versions']['datasets']}; command `{r['command']}`.", "",
             f"{r['features']:,} training features of the SQuAD v1.1 dev set at 384/128/64 ({r['features_s']:.1f} s "
             f"through the features cache); batch {r['batch']}, {b['sampler']}, {b['collator']}, pin memory "
             f"{r['pin_memory']}, prefetch factor {r['prefetch_factor'] or 'default'}, start method "
             f"{r['start_method']}. Median of {r['repeat']} interleaved rounds, each a fresh DataLoader timed over "
             f"{r['epochs'] - 1} epoch(s) after its first.", "",
             "| workers | start-up s | windows/s | windows/s per worker | main process CPU ms/batch | "
             "workers' CPU ms/batch |", "|---|---|---|---|---|---|"]
    for n, m in s["median"].items():
        wcpu = statistics.median(x["workers_cpu_ms_per_batch"] for x in r["runs"][n]) if int(n) else None
        lines.append(f"| {n}{'' if int(n) else ' (in-process)'} | {m['startup_s']:.3f} | {m['windows_per_s']:,.0f} | "
                     f"{m['per_worker']:,.0f} | {m['main_cpu_ms_per_batch']:.2f} | {f'{wcpu:.2f}' if wcpu else '-'} |")
    lines += ["", f"In-process, per batch (CPU time): reading the rows out of Arrow {b['fetch_rows_ms_per_batch']:.2f} "
              f"ms, the collator {b['collator_ms_per_batch']:.2f} ms."]
    if s["worker_cpu_ms_per_batch"] is not None:  # some run had workers
        if s["worker_handover_ms_per_batch"] is not None:  # else under one clock tick of CPU in the whole window
            lines[-1] += (f" A worker spends {s['worker_cpu_ms_per_batch']:.2f} ms of CPU per batch: the rest, "
                          f"{s['worker_handover_ms_per_batch']:.2f} ms, is its loop handing the batch over (tensors "
                          f"moved to shared memory, pickled, queued). The main process spends "
                          f"{s['main_cpu_ms_per_batch']:.2f} ms receiving it: {s['main_share_at_target']:.0%} of one "
                          "core at the required rate.")
        pinning = "measured with it" if r["pin_memory"] else "pinning, not measured (no GPU here), costs no more " \
            "than one more copy of the batch in the pin-memory thread"
        lines += ["", f"**Projection, not a measurement:** {s['config_workers']} workers x {s['per_worker']:,} "
                  f"windows/s per worker (wall clock, the {s['per_worker_basis_workers']}-worker run; on its CPU time "
                  f"alone a worker never kept waiting for a core makes {s['per_worker_on_own_core'] or 0:,}) = "
                  f"{s['config_workers'] * s['per_worker']:,} windows/s, capped by what the main process can receive "
                  f"({s['main_process_ceiling']:,}): **{s['projected']:,} windows/s** against the required "
                  f"{s['target']:,} (twice the GPU's 2,950): **{'meets it' if s['meets'] else 'falls short'}**. "
                  f"Assumed: each worker has a core of its own (16 cores hold the {s['config_workers']} workers, the "
                  f"main process and its pin-memory thread), as fast as this one; {pinning}."]
    lines.append("")
    return "\n".join(lines)


@command
def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--dev", type=Path, default=squad_dev_path())
    parser.add_argument("--config", type=Path, default=REPO / "configs" / "fast.json")
    parser.add_argument("--workers", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--repeat", type=int, default=3, help="interleaved rounds (medians reported)")
    parser.add_argument("--epochs", type=int, default=3, help="epochs per DataLoader, the first untimed (the "
                        "workers persist)")
    parser.add_argument("--max_train_samples", type=int, default=None, help="first N questions (tests)")
    parser.add_argument("--features_cache_dir", type=Path, default=None, help="default: a training run's")
    parser.add_argument("--out", type=Path, default=REPO / "bench" / "results")
    args = parser.parse_args(argv)
    if args.epochs < 2:
        parser.error("--epochs: at least 2 (the first is not timed)")
    args.dev = require_squad_dev(args.dev)

    from qa.io import atomic_write_json, atomic_write_text
    from qa.results.records import environment_record

    load_before = os.getloadavg()
    with tempfile.TemporaryDirectory(prefix="bench-input-") as tmp:
        trainer, features_s = fast_trainer(args, tmp)
        config_workers, config_args = trainer.args.dataloader_num_workers, trainer.args
        runs = {n: [] for n in args.workers}
        for _ in range(args.repeat):
            for n in args.workers:
                runs[n].append(measure(trainer, n, args.epochs))
        breakdown = in_process(trainer)
    env = environment_record({})
    cpu = next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                if line.startswith("model name")), platform.machine())
    mean_batch = statistics.mean(r["windows_per_batch"] for rs in runs.values() for r in rs)
    report = {"benchmark": "bench/bench_input.py", "command": " ".join(["python bench/bench_input.py",
              *(sys.argv[1:] if argv is None else argv)]), "date_utc": datetime.now(timezone.utc).isoformat(
              timespec="seconds"), "host": platform.node(), "cpu": cpu, "cores": os.cpu_count(),
              "versions": env["versions"], "git_commit": env["git_commit"], "config": str(args.config.name),
              "features": len(trainer.train_dataset), "features_s": round(features_s, 2),
              "batch": config_args.per_device_train_batch_size, "pin_memory": config_args.dataloader_pin_memory,
              "prefetch_factor": config_args.dataloader_prefetch_factor,
              "start_method": config_args.dataloader_multiprocessing_context or multiprocessing.get_start_method(),
              "repeat": args.repeat, "epochs": args.epochs, "runs": {str(n): rs for n, rs in runs.items()},
              "in_process": breakdown, "summary": summary(runs, config_workers, mean_batch, breakdown),
              "load_avg": {"before": [round(x, 2) for x in load_before],
                           "after": [round(x, 2) for x in os.getloadavg()]}}
    stem = f"input-cpu-{platform.machine().lower().replace('_', '-')}-x{os.cpu_count()}-" \
           f"{datetime.now(timezone.utc).strftime('%Y%m%dT%H%M%SZ')}"
    args.out.mkdir(parents=True, exist_ok=True)
    atomic_write_json(args.out / f"{stem}.json", report, indent=1)
    atomic_write_text(args.out / f"{stem}.md", markdown(report))
    print(json.dumps({"json": str(args.out / f"{stem}.json"), "markdown": str(args.out / f"{stem}.md"),
                      "projected": report["summary"]["projected"], "meets": report["summary"]["meets"]}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
