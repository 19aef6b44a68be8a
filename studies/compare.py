"""bert-squad-compare: one report for any set of runs: array tasks, a study's cells, single runs, side by side.

    bert-squad-compare RUN_OR_STUDY_FOLDER... [--out DIR] [--no-slurm]

A folder is a run (it holds all_results.json, environment.json, job_time.jsonl or task.json) or holds runs (an
array's output folder, a study's). Runs that differ only in their seed (and where they write) are one recipe. Per
recipe: runs finished / failed / running, F1 and EM as mean +/- standard deviation (n - 1) with min-max, median
training time (evaluations during training left out) and wall clock (every part of a requeued job), median
windows/s, median time to the target F1 where the runs recorded one, the device and world size. With several world
sizes (the scaling study): the global batch, the speedup and parallel efficiency against the 1-process recipe, the
measured communication, and studies/scaling.py's sections (measured beside predicted, time to target) and speedup
plot (compare_speedup.png). A resumed run's times cover its last part only: its F1 counts, its times do not. Every
run that did not finish is listed with its reason, and every cell of a study that never started. Two recipes whose
F1 ranges (min-max) overlap are within seed noise. Writes compare.md, compare.csv (a row per run), compare.json and
compare.png (F1 against wall clock, a dot per run, a colour per recipe) into DIR (default: the first folder), each
atomically. Exit status 0, or 2 with one line when no folder holds a run."""
import argparse
import csv
import io
import statistics
import sys
from pathlib import Path

from qa.errors import InputError, command
from qa.io import atomic_write_json, atomic_write_text, read_json, replacing
from studies import scaling
from studies.runs import Slurm, figures, is_run, read_run
from studies.task import STUDY_RECORD

OUT = {"md": "compare.md", "csv": "compare.csv", "json": "compare.json", "png": "compare.png",
       "speedup": "compare_speedup.png"}


def find_runs(folder: Path) -> list:
    """The folder if it is a run, and the runs in it (an array's tasks live in the config's own output folder)."""
    inside = sorted((p for p in folder.iterdir() if p.is_dir() and is_run(p)), key=lambda p: p.name) \
        if folder.is_dir() else []
    return [folder] * is_run(folder) + inside


def never_started(folder: Path, found: set, runs: list, slurm: Slurm) -> list:
    """The cells of a study (its study.json) without a folder, as runs with the state SLURM gives their task."""
    study = read_json(folder / STUDY_RECORD) if (folder / STUDY_RECORD).is_file() else {"cells": []}
    arrays = {r["task"].get("array_job_id") for r in runs if r["task"].get("array_job_id")}
    out = []
    for cell in study["cells"]:
        if str(folder / cell["folder"]) in found:
            continue
        status, said = slurm.verdict(f"{min(arrays)}_{cell['task']}") if len(arrays) == 1 else (
            "running", "no task of its array has started, so its state is not known")
        out.append({"folder": str(folder / cell["folder"]), "name": cell["folder"], "status": status, "env": {},
                    "results": {}, "task": cell, "job_id": None, "parts": 0, "seed": cell["seed"],
                    "recipe_key": f"cell {cell['recipe']}", "reason": f"never started: {said}"})
    return out


def collect(folders, slurm: Slurm) -> list:
    runs = []
    for folder in map(Path, folders):
        mine = [read_run(p, slurm) for p in find_runs(folder)]
        runs += mine + never_started(folder, {r["folder"] for r in mine}, mine, slurm)
    by_task = {r["task"].get("recipe"): r["recipe_key"] for r in runs
               if r["recipe_key"] and r["task"] and not r["recipe_key"].startswith("cell ")}
    for run in runs:  # a run that stopped before environment.json, or never started, joins its cell's recipe
        if not run["recipe_key"] or run["recipe_key"].startswith("cell "):
            name = (run["task"] or {}).get("recipe")
            run["recipe_key"] = by_task.get(name) or (f"cell {name}" if name else f"run {run['folder']}")
    if not runs:
        raise InputError(" ".join(map(str, folders)), "no run here (no all_results.json, environment.json, "
                         "job_time.jsonl or task.json in a folder or its subfolders)", "give run or study folders")
    for run in runs:
        run["figures"] = figures(run) if run["env"] or run["results"] else {}
    return runs


def spread(values) -> dict | None:
    values = [v for v in values if v is not None]
    if not values:
        return None
    return {"n": len(values), "mean": statistics.fmean(values), "std": statistics.stdev(values) if len(values) > 1
            else None, "min": min(values), "max": max(values), "median": statistics.median(values)}


def _label(members, others) -> str:
    names = {(m["task"] or {}).get("recipe") for m in members}
    if len(names) == 1 and None not in names:
        return names.pop()
    config = (members[0]["env"] or {}).get("config") or {}
    differ = [f"{k}={v}" for k, v in sorted(config.items()) if any(
        ((o["env"] or {}).get("config") or {}).get(k) != v for o in others) and k not in ("seed", "output_dir")]
    return ", ".join(differ[:4]) or Path(members[0]["folder"]).parent.name


def recipes(runs) -> list:
    groups = {}
    for run in runs:
        groups.setdefault(run["recipe_key"], []).append(run)
    out = []
    for key, members in groups.items():
        done = [m["figures"] for m in members if m["status"] == "finished"]
        timed = [m["figures"] for m in members if m["status"] == "finished" and not m["resumed"]]
        others = [r for r in runs if r["recipe_key"] != key and r["env"]]
        first = next((m["figures"] for m in sorted(members, key=lambda m: m["status"] != "finished")
                      if m["figures"]), {})
        row = {"recipe": _label(members, others), "runs": [m["name"] for m in members],
               **{s: sum(m["status"] == s for m in members) for s in ("finished", "failed", "running")},
               **{k: first.get(k) for k in ("world_size", "nodes", "device", "strategy", "global_batch")}}
        for name in ("f1", "em", "wall_s"):
            row[name] = spread(f[name] for f in done)
        for name in ("training_s", "windows_per_s", "to_target_s", "busbw_GBps", "exposed_comm_s"):
            row[name] = spread(f[name] for f in timed)  # a resumed run's times cover its last part only
        row["target_f1"] = sorted({f["target_f1"] for f in done if f["target_f1"] is not None})
        out.append(row)
    return sorted(out, key=lambda r: (r["world_size"] or 0, r["f1"] is None, -(r["f1"] or {}).get("mean", 0)))


def baseline(rows):
    """With several world sizes (the scaling study): the 1-process recipe with the most finished runs."""
    if len({r["world_size"] for r in rows if r["world_size"]}) > 1:
        return max((r for r in rows if r["world_size"] == 1 and r["training_s"]), key=lambda r: r["finished"],
                   default=None)
    return None


def add_speedups(rows):
    """Each recipe's median training time against the baseline's; -> the baseline (None: one world size)."""
    base = baseline(rows)
    for r in rows:
        r["speedup"] = base["training_s"]["median"] / r["training_s"]["median"] if base and r["training_s"] else None
        r["efficiency"] = r["speedup"] / r["world_size"] if r["speedup"] else None
    scaling.add_target_speedups(rows, base)
    return base


def noise(rows) -> list:
    """A line per pair of recipes with F1: within seed noise where their F1 ranges overlap."""
    rated = sorted((r for r in rows if r["f1"]), key=lambda r: -r["f1"]["mean"])
    lines = []
    for i, a in enumerate(rated):
        for b in rated[i + 1:]:
            overlap = a["f1"]["min"] <= b["f1"]["max"] and b["f1"]["min"] <= a["f1"]["max"]
            lines.append(f"- **{a['recipe']}** and **{b['recipe']}**: " + (
                "within seed noise (their F1 ranges overlap)" if overlap else
                f"{a['recipe']} is ahead by {a['f1']['mean'] - b['f1']['mean']:.2f} F1 (the ranges do not overlap)"))
    return lines


def _f(v, digits=1):
    return "—" if v is None else f"{v:,.{digits}f}"


def _ms(s, digits=2):
    if not s:
        return "—"
    pm = f" ± {_f(s['std'], digits)}" if s["std"] is not None else ""
    return f"{_f(s['mean'], digits)}{pm} ({_f(s['min'], digits)}–{_f(s['max'], digits)})"


def _med(s, digits=1):
    return _f(s and s["median"], digits)


def markdown(rows, runs, folders, scaling_lines=()) -> str:
    several = bool(scaling_lines)
    where = {f"{r['figures']['device']} ({(r['env'].get('devices') or {}).get('cpu_count')} CPU cores) on "
             f"{r['env'].get('host')}, git {str(r['env'].get('git_commit'))[:12]}" for r in runs if r["figures"]}
    head = ["recipe", "finished / failed / running", "F1 mean ± std (min–max)", "EM mean ± std (min–max)",
            "training s (median)", "wall clock s (median)", "windows/s (median)", "time to target F1 s (median)",
            "device × world size"] + ["global batch", "speedup", "efficiency", "busbw GB/s",
                                      "exposed comm. ms"] * several
    lines = [f"# Runs compared: {', '.join(f'`{f}`' for f in folders)}", "",
             f"{len(runs)} runs in {len(rows)} recipe(s) (runs that differ only in their seed), on "
             + (", ".join(sorted(where)) or "no recorded device") + ".", "",
             "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        target = f"{_med(r['to_target_s'])} (F1 {'/'.join(f'{t:g}' for t in r['target_f1'])}, " \
                 f"{r['to_target_s']['n'] if r['to_target_s'] else 0} reached)" if r["target_f1"] else "—"
        cells = [r["recipe"], f"{r['finished']} / {r['failed']} / {r['running']}", _ms(r["f1"]), _ms(r["em"]),
                 _med(r["training_s"]), _med(r["wall_s"]), _med(r["windows_per_s"]), target,
                 f"{r['device']} × {r['world_size']}" if r["device"] else "—"]
        if several:
            cells += [str(r["global_batch"] or "—"), _f(r["speedup"], 2),
                      "—" if r["efficiency"] is None else f"{100 * r['efficiency']:.0f} %", _med(r["busbw_GBps"], 2),
                      _f(r["exposed_comm_s"] and r["exposed_comm_s"]["median"] * 1e3)]
        lines.append("| " + " | ".join(c.replace("|", "&#124;") for c in cells) + " |")
    lines += ["", "Standard deviation over the finished runs (n - 1); training time leaves the evaluations during "
              "training out; wall clock adds up every part of a requeued job. " + (
                  "Speedup = the 1-process recipe's median training time / the row's; efficiency = speedup / world "
                  "size; busbw and exposed communication: the runs' own measurement (--measure_communication)."
                  if several else ""), ""]
    if several:
        lines += scaling_lines + [f"![speedup against processes]({OUT['speedup']})", ""]
    lines += ["## Seed noise", ""]
    lines += noise(rows) or ["Only one recipe has an F1: nothing to compare."]
    unfinished = [r for r in runs if r["status"] != "finished"]
    lines += ["", "## Runs not finished", ""] + ([f"- `{r['folder']}`: **{r['status']}**: {r['reason']}"
                                                   for r in unfinished] or ["None."])
    lines += ["", "## Every run", "", "| run | status | seed | F1 | EM | wall clock s | note |", "|---|---|---|---|---|"
              "---|---|"] + [f"| {r['name']} | {r['status']} | {r['seed']} | {_f(r['figures'].get('f1'), 2)} | "
                             f"{_f(r['figures'].get('em'), 2)} | {_f(r['figures'].get('wall_s'))} | "
                             f"{r['reason'] if r['status'] == 'finished' else ''} |" for r in runs]
    return "\n".join(lines + ["", f"![F1 against wall clock]({OUT['png']})", ""])


def plot(runs, rows, path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.5))
    for i, row in enumerate(rows):
        dots = [r["figures"] for r in runs if r["name"] in row["runs"] and r["status"] == "finished"
                and r["figures"].get("f1") is not None and r["figures"].get("wall_s")]
        ax.scatter([d["wall_s"] for d in dots], [d["f1"] for d in dots], color=f"C{i % 10}", label=row["recipe"])
    ax.set_xlabel("wall clock (s)")
    ax.set_ylabel("F1")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    with replacing(path) as tmp:
        fig.savefig(tmp, format="png", dpi=100)
    plt.close(fig)


def write_csv(runs, path) -> None:
    keys = ["name", "status", "seed", "recipe", "f1", "em", "training_s", "wall_s", "windows_per_s", "to_target_s",
            "world_size", "device", "reason", "folder"]
    text = io.StringIO()
    writer = csv.DictWriter(text, keys, extrasaction="ignore")
    writer.writeheader()
    for r in runs:
        writer.writerow({**r["figures"], **{k: r.get(k) for k in ("name", "status", "seed", "recipe", "reason",
                                                                     "folder")}})
    atomic_write_text(path, text.getvalue())


def build(folders, out: Path, use_slurm=True) -> dict:
    runs = collect(folders, Slurm(use_slurm))
    rows = recipes(runs)
    base = add_speedups(rows)
    for row in rows:
        for r in runs:
            if r["name"] in row["runs"]:
                r["recipe"] = row["recipe"]
    plot(runs, rows, out / OUT["png"])
    write_csv(runs, out / OUT["csv"])
    predicted, sections = [], ()
    if base:  # the scaling study's part
        predicted, notes = scaling.predictions(rows, runs, base)
        sections = scaling.markdown(rows, predicted, notes)
        scaling.plot(rows, runs, base, out / OUT["speedup"])
    atomic_write_text(out / OUT["md"], markdown(rows, runs, folders, sections))
    summary = {"folders": [str(f) for f in folders], "recipes": rows, "predictions": predicted,
               "runs": [{k: r.get(k) for k in ("name", "folder", "status", "reason", "seed", "recipe", "job_id",
                                                "parts", "figures")} for r in runs]}
    atomic_write_json(out / OUT["json"], summary)
    return summary


@command
def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="bert-squad-compare", description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    parser.add_argument("folders", nargs="+", help="run folders, or folders that hold runs")
    parser.add_argument("--out", help="where to write the report (default: the first folder)")
    parser.add_argument("--no-slurm", action="store_true", help="do not ask SLURM about unfinished runs")
    args = parser.parse_args(argv)
    out = Path(args.out or args.folders[0])
    summary = build(args.folders, out, not args.no_slurm)
    counts = {s: sum(r["status"] == s for r in summary["runs"]) for s in ("finished", "failed", "running")}
    print(f"{len(summary['runs'])} runs, {len(summary['recipes'])} recipe(s): "
          + ", ".join(f"{n} {s}" for s, n in counts.items()) + f" -> {out / OUT['md']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
