#!/usr/bin/env python
"""A run's TensorBoard scalars as PNG plots and a Markdown summary, for clusters where no
TensorBoard port can be opened.

    python tools/plot_tb.py RUN_DIR [--out DIR]

Reads every TensorBoard event file under RUN_DIR/runs (recursively; RUN_DIR itself when it has
no runs/ folder), and writes into DIR (default RUN_DIR/tb_plots):
- loss.png (training loss, and evaluation loss when present), grad_norm.png, learning_rate.png,
  throughput.png (samples/s and real tokens/s), performance.png (the other train/perf/*
  figures: step time, padding, data-loading share, MFU, memory), eval_f1.png (F1 and exact
  match, when the run evaluated during or after training) — each only when its scalars exist;
- summary.md: for every scalar, its number of points, first and last step, final, min, max
  and mean value, and which plots were written.

Exit status 0, or 2 with a one-line `error:` message when there is nothing to read.
"""
import argparse
import math
import os
import sys
from pathlib import Path

from qa.errors import InputError, command

EVENT_GLOB = "events.out.tfevents.*"

# plot file -> (title, [(panel title, [curve: alternative tags, the first present is drawn])])
PLOTS = {
    "loss.png": ("Loss", [("loss", [["train/loss", "loss"], ["eval/loss", "eval_loss"]])]),
    "grad_norm.png": ("Gradient norm", [("grad norm", [["train/grad_norm", "grad_norm"]])]),
    "learning_rate.png": ("Learning rate", [("learning rate", [["train/learning_rate", "learning_rate"]])]),
    "throughput.png": ("Training throughput", [
        ("samples/s (features)", [["train/perf/samples_per_s", "perf/samples_per_s"]]),
        ("real tokens/s", [["train/perf/real_tokens_per_s", "perf/real_tokens_per_s"]])]),
    "eval_f1.png": ("Evaluation", [("F1 / exact match", [["eval/f1", "eval_f1"],
                                                         ["eval/exact_match", "eval_exact_match"]])]),
}
PERF_SHOWN_ELSEWHERE = {"samples_per_s", "real_tokens_per_s"}


def events_root(run_dir: Path) -> Path:
    return run_dir / "runs" if (run_dir / "runs").is_dir() else run_dir


def find_event_dirs(run_dir: Path) -> list:
    return sorted({p.parent for p in events_root(run_dir).rglob(EVENT_GLOB) if p.is_file()})


def load_scalars(run_dir) -> dict:
    """tag -> [(step, value)] sorted by step, from every event folder of the run. A step logged
    twice (a resumed run repeats steps) keeps its latest value."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        raise InputError(str(run_dir), "no such folder", "pass a run's output_dir")
    folders = find_event_dirs(run_dir)
    if not folders:
        raise InputError(str(run_dir), f"no TensorBoard event files ({EVENT_GLOB}) in {events_root(run_dir)} or below",
                         "pass a run's output_dir (TensorBoard writes into its runs/ unless --report_to none)")
    latest = {}  # tag -> step -> (wall_time, value)
    for folder in folders:
        acc = EventAccumulator(str(folder), size_guidance={"scalars": 0})  # 0: keep every point
        acc.Reload()
        for tag in acc.Tags().get("scalars", []):
            points = latest.setdefault(tag, {})
            for e in acc.Scalars(tag):
                if e.step not in points or e.wall_time >= points[e.step][0]:
                    points[e.step] = (e.wall_time, e.value)
    if not latest:
        raise InputError(str(run_dir), "the event files hold no scalars",
                         "pass the output_dir of a run that trained and logged (logging_steps)")
    return {tag: sorted((step, v) for step, (_, v) in points.items()) for tag, points in latest.items()}


def stats(points) -> dict:
    values = [v for _, v in points if not math.isnan(v)]
    return {"points": len(points), "first_step": points[0][0], "last_step": points[-1][0],
            "final": points[-1][1], "min": min(values) if values else math.nan,
            "max": max(values) if values else math.nan,
            "mean": sum(values) / len(values) if values else math.nan}


def _fmt(v):
    if isinstance(v, int):
        return str(v)
    if math.isnan(v):
        return "nan"
    return f"{v:.4g}" if abs(v) < 1e5 else f"{v:.3e}"


def _panels(scalars):
    """plot file -> (title, [(panel title, [tags])]), only the plots with data."""
    out = {}
    for name, (title, panels) in PLOTS.items():
        found = []
        for panel, curves in panels:
            tags = [next(t for t in alternatives if t in scalars) for alternatives in curves
                    if any(t in scalars for t in alternatives)]
            if tags:
                found.append((panel, tags))
        if found:
            out[name] = (title, found)
    perf = sorted(t for t in scalars if "perf/" in t and t.rsplit("/", 1)[-1] not in PERF_SHOWN_ELSEWHERE)
    if perf:
        out["performance.png"] = ("Training performance", [(t.rsplit("/", 1)[-1], [t]) for t in perf])
    return out


def plot(scalars, out_dir: Path) -> list:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    written = []
    for name, (title, panels) in _panels(scalars).items():
        cols = 1 if len(panels) == 1 else 2
        rows = math.ceil(len(panels) / cols)
        fig, axes = plt.subplots(rows, cols, figsize=(6.4 * cols, 3.6 * rows), squeeze=False)
        for ax, (panel, tags) in zip(axes.flat, panels):
            for tag in tags:
                steps, values = zip(*scalars[tag])
                ax.plot(steps, values, marker="o" if len(steps) < 30 else None, markersize=3, label=tag)
            ax.set_title(panel)
            ax.set_xlabel("step")
            ax.grid(alpha=0.3)
            if len(tags) > 1:
                ax.legend()
        for ax in list(axes.flat)[len(panels):]:
            ax.axis("off")
        fig.suptitle(title)
        fig.tight_layout()
        fig.savefig(out_dir / name, dpi=100)
        plt.close(fig)
        written.append(name)
    return written


def summary_markdown(run_dir, scalars, plots) -> str:
    lines = [f"# TensorBoard scalars of `{run_dir}`", "",
             "| scalar | points | steps | final | min | max | mean |", "|---|---:|---|---:|---:|---:|---:|"]
    for tag in sorted(scalars):
        s = stats(scalars[tag])
        lines.append(f"| {tag} | {s['points']} | {s['first_step']}–{s['last_step']} | {_fmt(s['final'])} | "
                     f"{_fmt(s['min'])} | {_fmt(s['max'])} | {_fmt(s['mean'])} |")
    lines += ["", "Plots: " + (", ".join(f"[{p}]({p})" for p in plots) if plots else "none"), ""]
    return "\n".join(lines)


@command
def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("run_dir", help="a run's output_dir (its TensorBoard events are in runs/)")
    parser.add_argument("--out", help="where to write the PNGs and summary.md (default RUN_DIR/tb_plots)")
    args = parser.parse_args(argv)
    run_dir = Path(args.run_dir)
    scalars = load_scalars(run_dir)
    out_dir = Path(args.out) if args.out else run_dir / "tb_plots"
    out_dir.mkdir(parents=True, exist_ok=True)
    plots = plot(scalars, out_dir)
    (out_dir / "summary.md").write_text(summary_markdown(run_dir, scalars, plots))
    print(f"{len(scalars)} scalars, {len(plots)} plots -> {os.fspath(out_dir)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
