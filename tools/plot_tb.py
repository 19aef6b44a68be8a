#!/usr/bin/env python
"""A run's TensorBoard scalars as PNG plots and a Markdown summary, for clusters where no
TensorBoard port can be opened.

    python tools/plot_tb.py RUN_DIR [--out DIR]

Reads every TensorBoard event file under RUN_DIR/runs (recursively; RUN_DIR itself when it has
no runs/ folder), and writes into DIR (default RUN_DIR/tb_plots):
- loss.png (training loss, and evaluation loss when present), grad_norm.png, learning_rate.png,
  throughput.png (samples/s and real tokens/s), performance.png (the other train/perf/*
  figures: step time, padding, data-loading share, MFU, memory), eval_f1.png (F1 and exact
  match, when the run evaluated more than once; a run that evaluated during training, on the
  first --eval_every_questions questions, shows its final evaluation on all of them as a point
  apart, in loss.png too), f1_vs_time.png (the evaluations during training
  against training seconds, with the target F1 and when it was reached: --eval_every,
  --target_f1) — each only when its scalars exist. One title
  per figure; each panel names its value and unit on its y axis, over optimizer steps. A value
  logged once beside curves is a labelled point; a figure of values all logged once is not
  drawn. Quantities that cannot be negative are drawn from zero, and other panels over at
  least MIN_RELATIVE_SPAN of their size, so small changes look small;
- summary.md: for every scalar logged more than once, its number of points, first and last
  step, final, min, max and mean value; the scalars logged once with their step and value;
  and which plots were written.

Exit status 0, or 2 with a one-line `error:` message when there is nothing to read.
"""
import argparse
import math
import os
import sys
from pathlib import Path

from qa.errors import InputError, command
from qa.io import read_json, read_record
from qa.results.records import draw_series  # the run's own plots (plots/*.png) draw their curves so too

EVENT_GLOB = "events.out.tfevents.*"

TIME_PLOT = "f1_vs_time.png"  # its x axis is the training seconds, and it shows the target
TIME_TAG = "eval_by_train_seconds"  # time_to_accuracy.json's evaluations, among the scalars: step = training seconds

# How a value is drawn: "plain" (matplotlib's limits, widened when the values barely move),
# "zero" (a quantity >= 0: the axis starts at zero, so its size reads true), "share" (a fraction
# in [0, 1], shown in percent from zero), "percent" (a score out of 100: the axis is 0-100).
# Curve: (the tags that may hold it, the first present is drawn; legend label).
# Panel: (y-axis label with its unit, kind, [curves]). Plot file: (figure title, [panels]).
PLOTS = {
    "loss.png": ("Loss", [("loss: cross-entropy (nats)", "plain",
                           [(["train/loss", "loss"], "training"), (["eval/loss", "eval_loss"], "evaluation")])]),
    "grad_norm.png": ("Gradient norm", [("L2 norm of the gradients", "zero",
                                         [(["train/grad_norm", "grad_norm"], "")])]),
    "learning_rate.png": ("Learning rate", [("learning rate (per optimizer step)", "zero",
                                             [(["train/learning_rate", "learning_rate"], "")])]),
    "throughput.png": ("Training throughput", [
        ("samples/s (features, whole job)", "zero", [(["train/perf/samples_per_s", "perf/samples_per_s"], "")]),
        ("real (non-padding) tokens/s", "zero", [(["train/perf/real_tokens_per_s", "perf/real_tokens_per_s"], "")])]),
    "eval_f1.png": ("Evaluation", [("score (%)", "percent", [(["eval/f1", "eval_f1"], "F1"),
                                                             (["eval/exact_match", "eval_exact_match"],
                                                              "exact match")])]),
    TIME_PLOT: ("Time to accuracy: the evaluations during training", [
        ("score (%)", "percent", [([f"{TIME_TAG}/f1"], "F1"), ([f"{TIME_TAG}/exact_match"], "exact match")])]),
}
# Plots whose x axis is not the optimizer step (TIME_TAG's step is the training seconds).
X_LABELS = {TIME_PLOT: "training seconds (evaluations excluded)"}
# The other train/perf/* figures (performance.png), by the last part of their tag.
PERF_PANELS = {
    "step_time_s": ("optimizer step time (s)", "zero"),
    "padding_fraction": ("padding (% of batch tokens)", "share"),
    "data_time_share": ("waiting for data (% of step + data time)", "share"),
    "tflops_per_device": ("model TFLOP/s per device", "zero"),
    "mfu": ("MFU (% of the device's peak)", "share"),
    "peak_rss_gib": ("peak host memory, RSS (GiB)", "zero"),
    "peak_mem_gib": ("peak GPU memory (GiB)", "zero"),
}
PERF_SHOWN_ELSEWHERE = {"samples_per_s", "real_tokens_per_s"}
# A panel whose values span less than this share of their size is drawn over at least this
# span, so that noise in the last digits does not look like a large swing.
MIN_RELATIVE_SPAN = 0.2
X_LABEL = "optimizer step"


def events_root(run_dir: Path) -> Path:
    return run_dir / "runs" if (run_dir / "runs").is_dir() else run_dir


def find_event_dirs(run_dir: Path) -> list:
    return sorted({p.parent for p in events_root(run_dir).rglob(EVENT_GLOB) if p.is_file()})


def load_scalars(run_dir) -> dict:
    """tag -> [(step, value)] sorted by step, from every event folder of the run. A step logged
    twice (a resumed run repeats steps) keeps its latest value, but the last step keeps every value
    in the order logged: the last evaluation during training and the final evaluation share it."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        raise InputError(str(run_dir), "no such folder", "pass a run's output_dir")
    folders = find_event_dirs(run_dir)
    if not folders:
        raise InputError(str(run_dir), f"no TensorBoard event files ({EVENT_GLOB}) in {events_root(run_dir)} or below",
                         "pass a run's output_dir (TensorBoard writes into its runs/ unless --report_to none)")
    logged = {}  # tag -> step -> [(wall_time, value)]
    for folder in folders:
        acc = EventAccumulator(str(folder), size_guidance={"scalars": 0})  # 0: keep every point
        acc.Reload()
        for tag in acc.Tags().get("scalars", []):
            for e in acc.Scalars(tag):
                logged.setdefault(tag, {}).setdefault(e.step, []).append((e.wall_time, e.value))
    if not logged:
        raise InputError(str(run_dir), "the event files hold no scalars",
                         "pass the output_dir of a run that trained and logged (logging_steps)")
    out = {}
    for tag, points in logged.items():
        last = max(points)
        out[tag] = [(step, max(values)[1]) for step, values in sorted(points.items()) if step != last]
        out[tag] += [(last, value) for _, value in sorted(points[last])]
    # the evaluations during training by training seconds are the run's time_to_accuracy.json, not events
    evaluations = read_record(run_dir / "time_to_accuracy.json").get("evaluations") or []
    for name in ("f1", "exact_match") if evaluations else ():
        out[f"{TIME_TAG}/{name}"] = [(e["train_seconds"], e[name]) for e in evaluations]
    return out


def _results_key(tag: str) -> str:
    """The all_results.json key of an evaluation scalar: eval/f1 -> eval_f1."""
    return tag.replace("/", "_", 1)


def split_final_evaluation(scalars, results=None, config=None):
    """(scalars, final): the final evaluation taken out of the curves of the evaluations during
    training. A run with --eval_every evaluates during training (on the first
    --eval_every_questions questions, or all) and once more after training, on every validation
    question, at the same last step, under the same tags: its value would read as one more point
    of the curve, and the change of question set as a regression. `final`: {"points": tag ->
    (step, value), "during": ..., "final": ...}, the words for both in the legends; empty when the
    run did not evaluate during training. The curves keep their other points (a tag whose only
    point was the final one keeps an empty list)."""
    results, config = results or {}, config or {}
    if not results.get("eval_during_training_count"):
        return scalars, {}
    plotted = {t for _, panels in PLOTS.values() for _, _, curves in panels for tags, _ in curves for t in tags}
    points = {}
    for tag, series in scalars.items():
        value = results.get(_results_key(tag))
        if tag in plotted and tag.startswith("eval") and isinstance(value, (int, float)) and \
                math.isclose(series[-1][1], value, rel_tol=1e-4, abs_tol=1e-4):
            points[tag] = series[-1]
    if not points:
        return scalars, {}
    subset, total = config.get("eval_every_questions"), results.get("eval_examples")
    final = {"points": points,
             "during": f"during training ({f'first {subset:,}' if subset else 'all'} questions)",
             "final": f"final evaluation ({f'all {total:,}' if total else 'all'} questions)"}
    return {tag: series[:-1] if tag in points else series for tag, series in scalars.items()}, final


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
    """plot file -> (title, [(y label, kind, [(tag, legend label)])]), only the plots with data."""
    out = {}
    for name, (title, panels) in PLOTS.items():
        found = []
        for ylabel, kind, curves in panels:
            present = [(next(t for t in tags if t in scalars), label) for tags, label in curves
                       if any(t in scalars for t in tags)]
            if present:
                found.append((ylabel, kind, present))
        if found:
            out[name] = (title, found)
    perf = sorted(t for t in scalars if "perf/" in t and t.rsplit("/", 1)[-1] not in PERF_SHOWN_ELSEWHERE
                  and any(math.isfinite(v) for _, v in scalars[t]))  # no empty panel for a figure never measured
    if perf:
        out["performance.png"] = ("Training performance", [
            (*PERF_PANELS.get(t.rsplit("/", 1)[-1], (t.rsplit("/", 1)[-1], "plain")), [(t, "")]) for t in perf])
    return out


def logged_once(scalars, tags, final=None) -> bool:
    apart = (final or {}).get("points", {})
    return all(len(scalars[t]) + (t in apart) == 1 for t in tags)


def y_limits(values, kind):
    """(bottom, top) of a panel's y axis for its values, or None to leave matplotlib's choice.
    From zero for quantities that cannot be negative, 0-100 for scores; otherwise at least
    MIN_RELATIVE_SPAN of the values' size, centred on them."""
    values = [v for v in values if math.isfinite(v)]
    if not values:
        return None
    low, high = min(values), max(values)
    if kind == "percent":
        return 0.0, max(100.0, high)
    if kind in ("zero", "share") and low >= 0:
        top = high * 1.08 if high > 0 else 1.0
        return 0.0, (min(max(top, 0.01), 1.0) if kind == "share" and high <= 1 else top)
    size = max(abs(low), abs(high))
    if size == 0 or high - low >= MIN_RELATIVE_SPAN * size:
        return None
    centre, half = (low + high) / 2, MIN_RELATIVE_SPAN * size / 2
    return centre - half, centre + half


def _point_label(label, value, step, kind):
    return f"{label + ': ' if label else ''}{_fmt(value)}{'%' if kind == 'percent' else ''} at step {step}"


def _draw_panel(ax, scalars, ylabel, kind, curves, xlabel=X_LABEL, final=None):
    from matplotlib.ticker import PercentFormatter

    final = final or {}
    apart = final.get("points", {})
    values = []
    for tag, name in curves:
        # The evaluations during training as a curve, and the final evaluation as a point of its own.
        label = f"{name} {final['during']}".strip() if tag in apart else name
        if scalars[tag]:
            steps, ys = zip(*scalars[tag])
            values += ys
            draw_series(ax, scalars[tag], label, _point_label(label, ys[0], steps[0], kind))
        if tag in apart:
            step, value = apart[tag]
            values.append(value)
            named = f"{name}, " if name and "evaluation" not in name else ""  # not "evaluation, final evaluation"
            # Final F1 and exact match are often a point apart: each later one smaller, the earlier shows around it
            later = [t for t, _ in curves if t in apart].index(tag)
            ax.plot([step], [value], "D", markersize=10 - 4 * later, markeredgecolor="black",
                    label=_point_label(named + final["final"], value, step, kind))
    limits = y_limits(values, kind)
    if limits is not None:
        ax.set_ylim(*limits)
    if kind == "share":
        ax.yaxis.set_major_formatter(PercentFormatter(xmax=1))
    ax.set_ylabel(ylabel)
    ax.set_xlabel(xlabel)
    ax.grid(alpha=0.3)
    if any(label for _, label in curves) or any(len(scalars[tag]) == 1 or tag in apart for tag, _ in curves):
        legend_below(ax)


def legend_below(ax) -> None:
    """Under the panel and its x-axis label, where it covers neither a curve nor the label (savefig's tight box keeps
    it in the picture). Placed in points below the axes, as the tick labels and the axis label are: it stays clear of
    them whatever size the panel takes."""
    from matplotlib.transforms import offset_copy

    renderer = ax.figure.canvas.get_renderer()
    axis = (ax.get_window_extent(renderer).y0 - ax.xaxis.get_tightbbox(renderer).y0) * 72 / ax.figure.dpi
    ax.legend(loc="upper center", bbox_to_anchor=(0.5, 0), fontsize="small", frameon=False,
              bbox_transform=offset_copy(ax.transAxes, fig=ax.figure, y=-(axis + 4), units="points"))


def draw_target(ax, target: dict) -> None:
    """The target F1 as a line across the F1-against-time panel, and where the run reached it."""
    f1, seconds = target.get("target_f1"), target.get("train_seconds_to_target_f1")
    if f1 is None:
        return
    reached = "not reached" if seconds is None else f"reached at {seconds:,.1f} s"
    ax.axhline(f1, color="grey", linestyle="--", linewidth=1, label=f"target F1 {f1:g}: {reached}")
    if seconds is not None:
        ax.plot([seconds], [f1], "x", color="black", markersize=9)
    legend_below(ax)


def figures(scalars, target=None, config=None) -> dict:
    """plot file -> matplotlib Figure. One title per figure (its panels have none: each names
    its value and unit on its y axis). A figure whose values were all logged once is left out:
    summary.md lists them. `target`: the run's all_results.json: the target F1 and when it was
    reached, drawn on the F1-against-time plot, and the final evaluation, drawn apart from the
    evaluations during training (split_final_evaluation, with the run's configuration `config`)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    scalars, final = split_final_evaluation(scalars, target, config)
    out = {}
    for name, (title, panels) in _panels(scalars).items():
        if logged_once(scalars, [tag for _, _, curves in panels for tag, _ in curves], final):
            continue
        cols = 1 if len(panels) == 1 else 2
        rows = math.ceil(len(panels) / cols)
        fig, axes = plt.subplots(rows, cols, figsize=(6.4 * cols, 3.6 * rows), squeeze=False)
        for ax, (ylabel, kind, curves) in zip(axes.flat, panels):
            _draw_panel(ax, scalars, ylabel, kind, curves, X_LABELS.get(name, X_LABEL), final)
            if name == TIME_PLOT and target:
                draw_target(ax, target)
        for ax in list(axes.flat)[len(panels):]:
            ax.axis("off")
        fig.suptitle(title)
        fig.tight_layout()
        out[name] = fig
    return out


def plot(scalars, out_dir: Path, target=None, config=None) -> list:
    import matplotlib.pyplot as plt

    written = []
    for name, fig in figures(scalars, target, config).items():
        fig.savefig(out_dir / name, dpi=100, bbox_inches="tight")
        plt.close(fig)
        written.append(name)
    return written


def summary_markdown(run_dir, scalars, plots) -> str:
    over_time = sorted(t for t in scalars if len(scalars[t]) > 1)
    once = sorted(t for t in scalars if len(scalars[t]) == 1)
    lines = [f"# TensorBoard scalars of `{run_dir}`", ""]
    if over_time:
        lines += ["| scalar | points | steps | final | min | max | mean |", "|---|---:|---|---:|---:|---:|---:|"]
        for tag in over_time:
            s = stats(scalars[tag])
            lines.append(f"| {tag} | {s['points']} | {s['first_step']}–{s['last_step']} | {_fmt(s['final'])} | "
                         f"{_fmt(s['min'])} | {_fmt(s['max'])} | {_fmt(s['mean'])} |")
        lines.append("")
    if once:
        lines += ["Logged once:", "", "| scalar | step | value |", "|---|---:|---:|"]
        lines += [f"| {tag} | {scalars[tag][0][0]} | {_fmt(scalars[tag][0][1])} |" for tag in once]
        lines.append("")
    lines += ["Plots: " + (", ".join(f"[{p}]({p})" for p in plots) if plots else "none"), ""]
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
    results, environment = run_dir / "all_results.json", run_dir / "environment.json"
    config = read_json(environment).get("config") if environment.is_file() else None
    plots = plot(scalars, out_dir, read_json(results) if results.is_file() else None, config)
    (out_dir / "summary.md").write_text(summary_markdown(run_dir, scalars, plots))
    print(f"{len(scalars)} scalars, {len(plots)} plots -> {os.fspath(out_dir)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
