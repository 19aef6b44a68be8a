#!/usr/bin/env python
"""Time to F1 on real text: the reference recipe and the fast recipe, side by side, with seeds.

    python bench/parity.py --size cpu     # ~2 h on 2 cores: MiniLM, 256/96, train articles 0:12, 2 epochs
    python bench/parity.py --size gpu     # 384/128, train articles 0:42 (9,425 questions), on a GPU node
    python bench/parity.py --size smoke   # a few minutes on a CPU: the end-to-end check the slow tests run

The bundled pretrained MiniLM (a 6-layer BERT on the bert-base-uncased vocabulary) is fine-tuned on
some articles of the official SQuAD v1.1 dev set and scored on articles it never saw (42: = 1,145
questions, split by article, for every size). Each run is a plain `run_qa.py` process that evaluates
every `eval_every` of an epoch during training (`--eval_every`, on a clock that stops while it
evaluates), so each run is an F1-against-training-seconds curve; the final evaluation scores every
held-out question. Recipes:
- `reference`: configs/reference.json's recipe: every feature padded to max_seq_length, batch 12,
  lr 3e-5, fp32;
- `fast`: configs/fast.json as it is (its batch, lr and warm-up, with its speed switches; on a CPU
  without TF32 and torch.compile);
- `fast_b12`: the fast path's speed switches with the reference's batch and lr: tells whether the
  switches or the batch/lr moved the F1;
- `fast_b128`, `fast_b256`: fast with larger batches, the lr by the square-root rule from fast's
  (bench/run_bench.py); on a CPU a batch over CPU_MICRO_BATCH is accumulated from micro-batches of
  that size (memory), the same optimizer steps;
- `fast_whole_model`: run_bench.py's variant, the whole model compiled over fixed widths and full batches (on a CPU
  uncompiled: what it changes in the numbers, the widths' padding and the filled batches' rows).
Every recipe runs with every seed (`--seeds`), in the order seed by seed, so that runs sharing the
machine at a time are of different recipes and see the same load. Each finished run is written at
once to `bench/results/time-to-f1-<size>-<device>/runs/<recipe>-seed<N>.json`, and the report
(`report.json`, `report.md`, `f1_vs_time.png` beside it) is rebuilt from every run there: a later
invocation adds the runs that are missing (or `--redo` them) to the same result. On a CPU each run
gets one thread, two at a time; on a GPU one at a time.
"""
import argparse
import json
import os
import platform
import shlex
import shutil
import statistics
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime, timezone
from pathlib import Path

from run_bench import (BATCH_VARIANTS, RESULTS, REFERENCE, _slug, data_source, fit_widths,  # the script beside this one
                       variant_settings)

from dev_set import require_squad_dev, squad_dev_path  # the script beside this one
from qa.arguments import to_flags
from qa.errors import InputError, command
from qa.evaluation.time_to_accuracy import time_to_target
from qa.io import atomic_write_json, atomic_write_text, read_json

REPO = Path(__file__).resolve().parents[1]

# eval_questions: held-out questions of each evaluation during training (None: all); the final
# evaluation always scores all of them.
SIZES = {
    "gpu": dict(max_seq_length=384, doc_stride=128, max_query_length=64, train_articles="0:42",
                validation_articles="42:", epochs=2, eval_every=0.1, eval_questions=None, jobs=1),
    "cpu": dict(max_seq_length=256, doc_stride=96, max_query_length=64, train_articles="0:12",
                validation_articles="42:", epochs=2, eval_every=0.25, eval_questions=400, jobs=2),
    "smoke": dict(max_seq_length=128, doc_stride=48, max_query_length=32, train_articles="2:3",
                  validation_articles="42:43", epochs=1, eval_every=0.5, eval_questions=60, jobs=2),
}
RECIPES = ("reference", "fast", "fast_b12", *BATCH_VARIANTS, "fast_whole_model")
CPU_MICRO_BATCH = 16
SEEDS = (42, 43)
RUN_KEYS = ("eval_f1", "eval_exact_match", "eval_loss", "train_loss", "train_runtime", "train_samples_per_second",
            "train_seconds_excluding_evaluation", "eval_runtime", "train_examples", "train_features",
            "eval_examples", "epoch", "compiled")  # compiled: None when the recipe does not compile


def recipe_settings(name, on_gpu):
    if name == "reference":
        return dict(REFERENCE), []
    settings, notes = variant_settings("fast", on_gpu, cpu_compile=False)
    if name == "fast_b12":
        settings.update(per_device_train_batch_size=REFERENCE["per_device_train_batch_size"],
                        learning_rate=REFERENCE["learning_rate"])
        settings.pop("warmup_steps", None)
    elif name in BATCH_VARIANTS:
        settings, notes = variant_settings(name, on_gpu, cpu_compile=False)
        batch = settings["per_device_train_batch_size"]
        if not on_gpu and batch > CPU_MICRO_BATCH:
            settings.update(per_device_train_batch_size=CPU_MICRO_BATCH, global_batch=batch)
            notes.append(f"batch {batch} as {batch // CPU_MICRO_BATCH} accumulated micro-batches of {CPU_MICRO_BATCH} "
                         "(a CPU run's memory)")
    elif name == "fast_whole_model":  # on a CPU uncompiled: fast with its fixed widths and full batches
        settings, notes = variant_settings(name, on_gpu, cpu_compile=False)
    elif name != "fast":
        raise InputError("--recipes", f"unknown recipe {name!r}", f"choose from {', '.join(RECIPES)}")
    return settings, notes


def run_argv(name, seed, args, size, out, on_gpu):
    settings, notes = recipe_settings(name, on_gpu)
    fit_widths(settings, size["max_seq_length"])
    argv = ["--model_name_or_path", args.model, "--train_file", str(args.dev), "--validation_file", str(args.dev),
            "--train_articles", size["train_articles"], "--validation_articles", size["validation_articles"],
            "--do_train", "--do_eval", "--num_train_epochs", str(size["epochs"]),
            "--max_seq_length", str(size["max_seq_length"]), "--doc_stride", str(size["doc_stride"]),
            "--max_query_length", str(size["max_query_length"]), "--per_device_eval_batch_size",
            str(args.eval_batch_size), "--seed", str(seed), "--output_dir", str(out), "--resume", "never",
            "--report_to", "none", "--save_strategy", "no", "--logging_steps", "50", "--disable_tqdm", "true",
            "--eval_every", str(size["eval_every"]), "--features_cache_dir", str(args.work / "features"),
            *to_flags(settings)]
    if size["eval_questions"]:
        argv += ["--eval_every_questions", str(size["eval_questions"])]
    if not on_gpu:
        argv += ["--use_cpu", "true"]
    return argv, settings, notes


def run_one(name, seed, args, size, on_gpu, context):
    out = args.work / f"{name}-seed{seed}"
    shutil.rmtree(out, ignore_errors=True)
    argv, settings, notes = run_argv(name, seed, args, size, out, on_gpu)
    env = dict(os.environ, HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1", PYTHONUNBUFFERED="1")
    if not on_gpu:
        env["OMP_NUM_THREADS"] = "1"
    log_path = args.work / f"log-{name}-seed{seed}.txt"
    print(f"[{name} seed {seed}] python run_qa.py {shlex.join(argv)}", file=sys.stderr, flush=True)
    load_before, started = os.getloadavg()[0], time.perf_counter()
    with open(log_path, "w") as log:
        proc = subprocess.run([sys.executable, str(REPO / "run_qa.py"), *argv], cwd=REPO, env=env, stdout=log,
                              stderr=subprocess.STDOUT)
    if proc.returncode != 0:
        raise SystemExit(f"{name} seed {seed} failed (exit {proc.returncode}), log {log_path}:\n"
                         f"{log_path.read_text()[-3000:]}")
    results = read_json(out / "all_results.json")
    curve = read_json(out / "time_to_accuracy.json")["evaluations"]
    for f in out.glob("*.safetensors"):
        f.unlink()
    return {"recipe": name, "seed": seed, "settings": settings, "notes": notes,
            "optimizer_steps": read_json(out / "trainer_state.json")["global_step"],
            "wall_s": round(time.perf_counter() - started, 1),
            "load_average_1min": [round(load_before, 2), round(os.getloadavg()[0], 2)],
            **{k: results.get(k) for k in RUN_KEYS}, "curve": curve,
            "run_qa_args": argv, **context, "finished_utc": datetime.now(timezone.utc).isoformat(timespec="seconds")}


def spread(values):
    return max(values) - min(values) if len(values) > 1 else None


def common_target(runs, given):
    """The target F1 of the time comparison: the one given, else 90% of the lowest final F1 of any
    run, rounded down (every recipe then reaches it, and it lies on the curves' rising part)."""
    if given is not None:
        return given
    return float(int(0.9 * min(r["eval_f1"] for r in runs)))


def summarise(runs, target):
    """Per recipe: final F1 and EM over the seeds (mean, spread = max - min), training seconds and
    steps to the target F1 over the seeds."""
    recipes = {}
    for name in RECIPES:
        mine = sorted((r for r in runs if r["recipe"] == name), key=lambda r: r["seed"])
        if not mine:
            continue
        to_target = [time_to_target(r["curve"], target) for r in mine]
        seconds = [t["train_seconds_to_target_f1"] for t in to_target]
        # The same interpolation on the windows trained on: comparable across batch sizes, and free of the load
        by_windows = [time_to_target([{**e, "train_seconds": e["features"]} for e in r["curve"]], target) for r in mine]
        f1 = [r["eval_f1"] for r in mine]
        recipes[name] = {
            "seeds": [r["seed"] for r in mine], "final_f1": f1, "final_f1_mean": statistics.mean(f1),
            "final_f1_spread": spread(f1), "final_em_mean": statistics.mean(r["eval_exact_match"] for r in mine),
            "train_seconds": [r["train_seconds_excluding_evaluation"] for r in mine],
            "train_seconds_to_target": seconds, "steps_to_target": [t["step_at_target_f1"] for t in to_target],
            "windows_to_target": [t["train_seconds_to_target_f1"] for t in by_windows],
            "train_seconds_to_target_mean": (statistics.mean(seconds) if None not in seconds else None),
            "batch": mine[0]["settings"].get("global_batch") or mine[0]["settings"].get("per_device_train_batch_size"),
            "learning_rate": mine[0]["settings"].get("learning_rate")}
    for base in ("reference", "fast"):  # fast's own variants (batches, whole model) are weighed against fast's too
        for name, rec in recipes.items():
            fast_own = name in (*BATCH_VARIANTS, "fast_whole_model")
            if base in recipes and name != base and (base == "reference" or fast_own):
                rec.update({k if base == "reference" or k.startswith("f1_minus") else f"{k}_vs_fast": v
                            for k, v in compare(rec, recipes[base], base).items()})
    return recipes


def compare(rec, base_rec, base) -> dict:
    """F1 against another recipe's, judged against the larger of the two spreads between seeds."""
    diff = rec["final_f1_mean"] - base_rec["final_f1_mean"]
    spreads = [s for s in (rec["final_f1_spread"], base_rec["final_f1_spread"]) if s is not None]
    out = {f"f1_minus_{base}": diff, "seed_spread": max(spreads) if spreads else None}
    if out["seed_spread"] is None:
        out["verdict"] = "one seed: no spread to compare with"
    elif abs(diff) <= out["seed_spread"]:
        out["verdict"] = "no difference measured (the difference is within the spread between seeds)"
    else:
        out["verdict"] = (("lower" if diff < 0 else "higher") + f" F1 than {'the reference' if base == 'reference' else base}"
                          ", by more than the seed spread")
    if rec["train_seconds_to_target_mean"] and base_rec["train_seconds_to_target_mean"]:
        out["time_to_target_speedup"] = base_rec["train_seconds_to_target_mean"] / rec["train_seconds_to_target_mean"]
    return out


def _fmt(x, spec=".1f"):
    return "n/a" if x is None else format(x, spec)


def markdown(report):
    s, rec = report["split"], report["recipes"]
    lines = [f"# Time to F1 on real text: {report['size']} size on {report['device']}", "",
             f"Model: {report['model']} (pretrained MiniLM: 6 layers, hidden 384, the bert-base-uncased vocabulary). "
             f"Data: {s['data']}, trained on articles {s['train_articles']} ({report['train_questions']} questions), "
             f"scored on articles {s['validation_articles']} ({report['eval_questions']} questions never trained on); "
             f"{s['max_seq_length']}/{s['doc_stride']}/{s['max_query_length']}, {s['epochs']} epochs, an evaluation "
             f"every {s['eval_every']} epoch during training on "
             f"{s['eval_questions'] or 'all the'} held-out questions, the final one on all of them.", "",
             f"Versions: {', '.join(sorted(report['versions']))}. Commands: "
             + "; ".join(f"`{c}`" for c in report["commands"]) + ".", "",
             f"Common target: F1 {report['target_f1']:g} ({report['target_method']}).", "",
             "| recipe | batch, lr | seeds | final F1 (each seed) | mean F1 | seed spread | mean EM | "
             f"train s to F1 {report['target_f1']:g} (each seed) | windows trained on to it | train s (all) |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for name, r in rec.items():
        lines.append(f"| {name} | {r['batch']}, {r['learning_rate']:g} | {', '.join(map(str, r['seeds']))} | "
                     f"{', '.join(_fmt(f, '.2f') for f in r['final_f1'])} | {r['final_f1_mean']:.2f} | "
                     f"{_fmt(r['final_f1_spread'], '.2f')} | {r['final_em_mean']:.2f} | "
                     f"{', '.join(_fmt(t, '.0f') for t in r['train_seconds_to_target'])} | "
                     f"{', '.join(_fmt(t, ',.0f') for t in r['windows_to_target'])} | "
                     f"{', '.join(_fmt(t, '.0f') for t in r['train_seconds'])} |")
    lines.append("")
    for name, r in rec.items():
        for base, key in (("reference", ""), ("fast", "_vs_fast")):
            if f"f1_minus_{base}" not in r:
                continue
            speed, who = r.get(f"time_to_target_speedup{key}"), "the reference" if base == "reference" else base
            lines.append(f"- **{name}** against {who}: F1 {r[f'f1_minus_{base}']:+.2f}, seed spread "
                         f"{_fmt(r[f'seed_spread{key}'], '.2f')}: {r[f'verdict{key}']}. Time to F1 {report['target_f1']:g}: "
                         + (f"{speed:.2f}x {who}'s speed." if speed else "n/a (not reached by every seed).")
                         + " The spread between seeds of the time: " + ", ".join(
                             f"{n} {_fmt(spread(rec[n]['train_seconds_to_target']) if None not in rec[n]['train_seconds_to_target'] else None, '.0f')} s"
                             for n in (base, name)) + ".")
    lines += ["", "Every run's curve (training seconds, step, F1) is in `report.json`; the picture is "
              "[f1_vs_time.png](f1_vs_time.png). Training seconds exclude the evaluations during training and "
              "include start-up of the training loop.", ""]
    if report["notes"]:
        lines += ["Adjustments for this device: " + "; ".join(report["notes"]) + ".", ""]
    if not report["gpu_available"]:
        lines += [f"No GPU: every run ran on the CPU ({report['device']}), one thread per run, up to "
                  f"{report['parallel_runs']} runs of an invocation at a time; the 1-minute load average at each "
                  "run's start and end is below. Seconds on a shared CPU move with the load: the windows "
                  "trained on to the target do not.", ""]
    lines += ["| run | finished (UTC) | steps | final F1 | final EM | train s | load at start, end |", "|---|---|---|---|---|---|---|"]
    for r in report["runs"]:
        lines.append(f"| {r['recipe']} seed {r['seed']} | {r['finished_utc']} | {r['optimizer_steps']} | "
                     f"{r['eval_f1']:.2f} | {r['eval_exact_match']:.2f} | "
                     f"{_fmt(r['train_seconds_excluding_evaluation'], '.0f')} | "
                     f"{r['load_average_1min'][0]}, {r['load_average_1min'][1]} |")
    return "\n".join(lines) + "\n"


def plot(report, path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    colours = dict(zip(RECIPES, ("tab:blue", "tab:orange", "tab:green", "tab:red", "tab:purple", "tab:brown")))
    fig, ax = plt.subplots(figsize=(8, 5))
    for r in report["runs"]:
        xs = [0] + [e["train_seconds"] for e in r["curve"]]
        ys = [0] + [e["f1"] for e in r["curve"]]
        ax.plot(xs, ys, marker="o", ms=3, color=colours[r["recipe"]], linestyle="-" if r["seed"] == min(
            x["seed"] for x in report["runs"]) else "--", label=f"{r['recipe']} seed {r['seed']}")
    # The final evaluation scores every held-out question, the curve a subset: drawn apart, not joined to it
    for i, r in enumerate(report["runs"]):
        ax.scatter([r["train_seconds_excluding_evaluation"]], [r["eval_f1"]], marker="*", s=90, zorder=3,
                   color=colours[r["recipe"]], label=f"final, all {report['eval_questions']:,} questions" if i == 0 else None)
    ax.axhline(report["target_f1"], color="grey", linewidth=0.8, linestyle=":",
               label=f"target F1 {report['target_f1']:g}")
    ax.set_xlabel("training seconds (evaluations excluded)")
    during = report["split"]["eval_questions"]
    ax.set_ylabel(f"F1 on held-out questions (%){f', curves on the first {during}' if during else ''}")
    ax.set_ylim(bottom=0)
    ax.set_xlim(left=0)
    ax.set_title(f"MiniLM on SQuAD v1.1 dev articles {report['split']['train_articles']}: F1 against training "
                 f"time\n{report['size']} size, {report['device']}", fontsize=10)
    ax.legend(fontsize=8)
    fig.tight_layout()
    tmp = path.with_name(".tmp-" + path.name)
    fig.savefig(tmp, dpi=110)
    plt.close(fig)
    os.replace(tmp, path)


def write_report(folder, head, target_f1):
    runs = [read_json(p) for p in sorted((folder / "runs").glob("*.json"))]
    if not runs:
        return None
    runs.sort(key=lambda r: (r["seed"], RECIPES.index(r["recipe"])))
    target = common_target(runs, target_f1)
    last = runs[-1]
    report = {**head, "commands": sorted({r["command"] for r in runs}), "versions": sorted({r["versions"] for r in runs}),
              "train_questions": last["train_examples"], "eval_questions": last["eval_examples"],
              "target_f1": target, "target_method": "given with --target_f1" if target_f1 is not None else
              "90% of the lowest final F1 of any run, rounded down",
              "notes": sorted({n for r in runs for n in r["notes"]}),
              "recipes": summarise(runs, target), "runs": runs}
    atomic_write_json(folder / "report.json", report, indent=1)
    atomic_write_text(folder / "report.md", markdown(report))
    plot(report, folder / "f1_vs_time.png")
    return report


@command
def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--size", choices=sorted(SIZES), default="gpu")
    parser.add_argument("--dev", type=Path, default=squad_dev_path())
    parser.add_argument("--model", default="bundled:minilm")
    parser.add_argument("--recipes", default="reference,fast", help=f"comma-separated, from {', '.join(RECIPES)}")
    parser.add_argument("--seeds", default=",".join(map(str, SEEDS)))
    parser.add_argument("--target_f1", type=float, default=None,
                        help="the common target F1 (default: 90%% of the lowest final F1 of any run)")
    parser.add_argument("--eval_batch_size", type=int, default=64)
    parser.add_argument("--jobs", type=int, default=None, help="runs at a time (default: 1 on a GPU, 2 on a CPU)")
    parser.add_argument("--redo", action="store_true", help="run again the runs the result already has")
    parser.add_argument("--out", type=Path, default=RESULTS, help="the result folder goes in here")
    parser.add_argument("--work", type=Path, default=RESULTS / "tmp" / "parity")
    args = parser.parse_args(argv)
    args.dev = require_squad_dev(args.dev)
    try:
        seeds = [int(s) for s in args.seeds.split(",")]
    except ValueError:
        raise InputError("--seeds", f"{args.seeds!r} is not a comma-separated list of integers", "e.g. --seeds 42,43")
    recipes = args.recipes.split(",")
    size = SIZES[args.size]

    import torch
    import transformers

    on_gpu = torch.cuda.is_available()
    device = torch.cuda.get_device_name(0) if on_gpu else f"CPU {platform.processor() or platform.machine()} x{os.cpu_count()}"
    for name in recipes:
        recipe_settings(name, on_gpu)
    folder = args.out / f"time-to-f1-{args.size}-{_slug(device)}"
    (folder / "runs").mkdir(parents=True, exist_ok=True)
    args.work.mkdir(parents=True, exist_ok=True)
    jobs = 1 if on_gpu else (args.jobs or size["jobs"])  # one GPU: concurrent runs would time each other
    head = {"benchmark": "bench/parity.py", "size": args.size, "device": device, "gpu_available": on_gpu,
            "model": args.model, "parallel_runs": jobs,
            "split": {"data": data_source(args.dev), **{k: v for k, v in size.items() if k != "jobs"}}}
    context = {"command": "python bench/parity.py " + shlex.join(sys.argv[1:] if argv is None else argv),
               "versions": f"torch {torch.__version__}, transformers {transformers.__version__}"
                           + (f", CUDA {torch.version.cuda}" if on_gpu else ""),
               "host": platform.node()}
    todo = [(name, seed) for seed in seeds for name in recipes
            if args.redo or not (folder / "runs" / f"{name}-seed{seed}.json").exists()]
    lock = threading.Lock()

    def one(name, seed):
        record = run_one(name, seed, args, size, on_gpu, context)
        with lock:
            atomic_write_json(folder / "runs" / f"{name}-seed{seed}.json", record, indent=1)
            write_report(folder, head, args.target_f1)
        print(f"[{name} seed {seed}] F1 {record['eval_f1']:.2f}, {record['train_seconds_excluding_evaluation']:.0f} "
              "training seconds", file=sys.stderr, flush=True)

    with ThreadPoolExecutor(max_workers=jobs) as pool:
        for future in [pool.submit(one, name, seed) for name, seed in todo]:
            future.result()
    report = write_report(folder, head, args.target_f1)
    if report is None:
        raise InputError("--recipes/--seeds", "no run to report", "name at least one recipe and one seed")
    print(json.dumps({"result": str(folder / "report.md"),
                      "final_f1": {k: v["final_f1"] for k, v in report["recipes"].items()}}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
