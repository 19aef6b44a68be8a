"""A compile cache that the next job reuses, measured: run_bench.py's fast variant, compiled (--cpu_compile on a CPU),
in interleaved pairs of runs, one compiling into a fresh --compile_cache_dir (cold: torch's inductor, AOTAutograd and
Triton caches all empty) and one into a cache an untimed run filled first (warm). Each run warms up every batch shape
before its timed window; the report gives each run's compile warm-up, split into dynamo's tracing and the backends'
compiling, what came from the cache, and the compilations inside the timed window (a warm run must have none), then
the medians and their ratio. The JSON is written after every run, so a run stopped early keeps what it measured.

    python bench/compile_cache.py                 # CPU: 3 pairs, some minutes on 2 cores
    python bench/compile_cache.py --size gpu --pairs 2
"""
import argparse
import json
import shlex
import statistics
import sys
import time
from datetime import datetime, timezone
from pathlib import Path
from types import SimpleNamespace

from run_bench import RESULTS, SIZES, _device_name, _slug, build_random_bert, run_variant
from dev_set import require_squad_dev, squad_dev_path
from qa.io import atomic_write_json


def measured(raw: dict, kind: str, cache: Path) -> dict:
    r = raw["results"]
    compile_stats = r["train_setup"]["compile"]
    return {"kind": kind, "cache": cache.name, "compile_warmup_s": r.get("compile_warmup_s"),
            "tracing_s": r.get("compile_warmup_tracing_s"), "compiling_s": r.get("compile_warmup_compiling_s"),
            **{k: compile_stats[k] for k in ("fxgraph_cache_hit", "fxgraph_cache_miss", "autograd_cache_hit",
                                             "autograd_cache_miss")},
            "window_compiles": r.get("train_window_compiles"), "wall_clock_s": r["WALL_CLOCK_SECONDS"],
            "wall_clock_breakdown": r.get("wall_clock_breakdown"), "compiled": r.get("compiled")}


def summary(runs: list) -> dict:
    out = {}
    for kind in ("cold", "warm"):
        mine = [r for r in runs if r["kind"] == kind]
        out[kind] = {key: statistics.median(r[key] for r in mine) for key in
                     ("compile_warmup_s", "tracing_s", "compiling_s", "wall_clock_s")} if mine else None
    if out["cold"] and out["warm"]:
        out["warm_over_cold_compile_warmup"] = round(out["warm"]["compile_warmup_s"] / out["cold"]["compile_warmup_s"],
                                                     3)
        out["warm_windows_without_compilation"] = all(r["window_compiles"] == 0 for r in runs if r["kind"] == "warm")
    return out


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--size", choices=sorted(SIZES), default="cpu")
    parser.add_argument("--pairs", type=int, default=3, help="cold/warm pairs, interleaved")
    parser.add_argument("--train_file", type=Path, default=squad_dev_path())
    parser.add_argument("--cpu_threads", type=int, default=1, help="OMP_NUM_THREADS on a CPU, as run_bench.py")
    parser.add_argument("--out", type=Path, default=RESULTS)
    parser.add_argument("--work", type=Path, default=RESULTS / "tmp" / "compile-cache")
    args = parser.parse_args(argv)
    size = dict(SIZES[args.size])
    bench = SimpleNamespace(cpu_compile=True, timed_samples=size["timed_samples"], warmup_steps=size["warmup_steps"],
                            window_min_s=0, train_file=require_squad_dev(args.train_file, "--train_file"),
                            dataset_name=None, max_train_samples=size["max_train_samples"], synthetic_examples=0,
                            cpu_threads=args.cpu_threads)
    device, on_gpu = _device_name()
    args.work.mkdir(parents=True, exist_ok=True)
    model_dir = build_random_bert(args.work / "model", size["model"])
    log = lambda msg: print(msg, file=sys.stderr, flush=True)  # noqa: E731
    started = datetime.now(timezone.utc)
    path = args.out / f"compile-cache-{args.size}-{_slug(device)}-{started:%Y%m%dT%H%M%SZ}.json"
    report = {"benchmark": "bench/compile_cache.py", "command": "python bench/compile_cache.py " + shlex.join(
        sys.argv[1:] if argv is None else argv), "device": device, "started": started.isoformat(timespec="seconds"),
        "runs": []}
    warm = args.work / "cache-warm"
    run = lambda cache: run_variant("fast", bench, size, model_dir, args.work, on_gpu, None, log,  # noqa: E731
                                    extra_args=["--compile_cache_dir", str(cache)])
    log(f"priming {warm}")
    run(warm)
    for pair in range(args.pairs):
        for kind in ("cold", "warm"):
            cache = args.work / f"cache-cold-{pair}-{time.time_ns()}" if kind == "cold" else warm
            report["runs"].append(measured(run(cache), kind, cache))
            report["summary"] = summary(report["runs"])
            atomic_write_json(path, report, indent=1)
            log(f"[{kind}] compile warm-up {report['runs'][-1]['compile_warmup_s']} s")
    print(json.dumps({"json": str(path), **report["summary"]}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
