#!/usr/bin/env python
"""The scaling study's report: a Markdown table and a speedup plot from what the runs recorded.

    python tools/scaling_report.py STUDY [--out DIR] [--no-slurm]

STUDY is the folder tools/scaling_submit.sh made: STUDY/manifest.json lists every submitted
job, and each run's output folder holds all_results.json and environment.json (qa/results/records.py).
Writes into DIR (default STUDY), atomically:
- scaling_report.md: a header (GPUs, hosts, versions, dates, config, git commit, from the runs'
  environment.json), one row per (strategy, nodes, GPUs per node): runs ok / expected, global
  batch, median training time (train_runtime) and its min-max, median wall clock
  (WALL_CLOCK_SECONDS), median samples/s, speedup (baseline median training time / this median
  training time) and parallel efficiency (speedup / GPUs) against the 1x1 baseline, F1 (median,
  and min-max when they differ); then, for every multi-GPU cell, its median step time beside
  the communication model's prediction (scaling/model.py, from the baseline run's records and
  the cell's own measured bus bandwidth, batch and switches), with the step's measured parts
  (compute, exposed communication, the rest: scaling/comm_measure.py) and a flag where measurement
  and model part by more than 25 %; then every failed, incomplete or missing run with its reason
  (none is dropped silently), and one line per completed run;
- scaling_speedup.png: speedup against number of GPUs, a line per strategy and node count
  through the medians, a dot per repeat, and the ideal y = x;
- scaling_summary.json: the same figures, unrounded.

A run counts only when its all_results.json has train_runtime, and environment.json shows the
world size, node count, strategy and job id its cell asked for, in one go (not resumed after a
requeue; else "mismatch" or "resumed"). A run without results is reported with the job's state
from `scontrol show job` (or `sacct` once slurmctld has forgotten the job): "incomplete" or
"failed"; where SLURM does not answer, as "no results" ("missing" when its output folder does
not exist). --no-slurm skips asking.

Exit status 0, or 2 with a one-line `error:` message when STUDY has no manifest or no run has
usable results.
"""
import argparse
import os
import statistics
import sys
import tempfile
from collections import Counter
from datetime import datetime, timezone
from pathlib import Path

from qa.errors import InputError, command
from qa.io import atomic_write_json, atomic_write_text, read_json, read_json_lines
from scaling.baseline import as_number, baseline_from_records
from scaling.model import FT3_INTER_BUSBW, FT3_INTRA_BUSBW, Settings, WhatIf, predict, ring_busbw
from studies.runs import ACTIVE, Slurm, last_error as _last_error

REPORT, PLOT, SUMMARY = "scaling_report.md", "scaling_speedup.png", "scaling_summary.json"


# ---------------------------------------------------------------------------------------------
# Reading


def load_manifest(study: Path) -> dict:
    path = study / "manifest.json"
    if not study.is_dir():
        raise InputError(str(study), "no such folder", "give the study folder tools/scaling_submit.sh made")
    if not path.is_file():
        raise InputError(str(study), "no manifest.json, so not a study folder",
                         "give the folder tools/scaling_submit.sh made (it writes manifest.json when it "
                         "submits the jobs)")
    try:
        manifest = read_json(path)
    except InputError as err:  # the reader's words, this tool's fix
        raise InputError(err.where, f"unreadable ({err.problem})",
                         "restore it: tools/scaling_submit.sh rewrites it after each submission") from None
    runs = manifest.get("runs") if isinstance(manifest, dict) else None
    if not runs:
        raise InputError(str(path), "lists no runs", "submit the study with tools/scaling_submit.sh")
    for i, run in enumerate(runs):
        missing = [k for k in ("name", "strategy", "nodes", "gpus_per_node") if k not in run]
        if missing:
            raise InputError(str(path), f"run #{i + 1} lacks {', '.join(missing)}",
                             "restore the manifest tools/scaling_submit.sh wrote")
    return manifest


def _read_json(path: Path):
    """(object, None), or (None, why not)."""
    if not path.is_file():
        return None, f"no {path.name}"
    try:
        return read_json(path), None
    except InputError as err:
        return None, f"{path.name} unreadable ({err.problem})"


def read_run(study: Path, entry: dict) -> dict:
    """The manifest entry plus what its folder holds, and `problem` when it does not count."""
    folder = study / entry["name"]
    if not folder.is_dir() and entry.get("output_dir"):
        folder = Path(entry["output_dir"])   # a study moved elsewhere keeps its runs beside the manifest
    run = dict(entry, folder=str(folder), gpus=int(entry["nodes"]) * int(entry["gpus_per_node"]),
               results=None, env=None, problem=None, missing=False, log_tail="")
    if not folder.is_dir():
        run.update(problem="no output folder", missing=True)
        return run
    run["env"], _ = _read_json(folder / "environment.json")
    results, why = _read_json(folder / "all_results.json")
    logs = sorted(folder.glob("slurm-*.*"))
    if results is None and run["env"] is None and not logs:   # tools/scaling_submit.sh made it empty
        run.update(problem="output folder empty: the job never started", missing=True)
    elif results is None and run["env"] is None:
        run["problem"] = f"the job started ({logs[0].name}) but run_qa.py wrote nothing"
    elif results is None:
        run["problem"] = f"started (environment.json written) but {why}: training did not finish"
    elif as_number(results.get("train_runtime")) is None:
        run["problem"] = "all_results.json has no train_runtime"
    else:
        run["results"] = results
        run["problem"] = mismatch(run)
        # A line per run of the job (a requeued job keeps its id); a line of another job id is a duplicate
        # submission that the run's lock refused, not a part of this run.
        parts = [p for p in _job_parts(folder / "job_time.jsonl")
                 if not entry.get("job_id") or str(p.get("job_id")) == str(entry["job_id"])]
        if run["problem"] is None and len(parts) > 1:   # job_ddp.sh appends a line per run of the job
            run["problem"] = (f"resumed: ran in {len(parts)} parts (job_time.jsonl: "
                              + ", ".join(f"job {p.get('job_id')} {p.get('outcome')}" for p in parts)
                              + "), train_runtime covers the last part only")
    if run["problem"] and run["results"] is None:
        run["log_tail"] = _last_error(folder, entry.get("job_id"))
    return run


def _job_parts(path: Path) -> list:
    try:
        return read_json_lines(path)
    except InputError:
        return []


def mismatch(run):
    """Why a run with results does not measure its cell, or None: another world size, node
    count or strategy than asked (from environment.json), or a run resumed after a requeue
    (its train_runtime covers the last part only)."""
    env = run["env"] or {}
    if not env:
        return None
    world = (env.get("distributed") or {}).get("WORLD_SIZE") or "1"
    slurm = env.get("slurm") or {}
    cfg = env.get("config") or {}
    if int(world) != run["gpus"]:
        return f"ran with WORLD_SIZE={world}, the shape asks for {run['gpus']}"
    if slurm.get("SLURM_NNODES") and int(slurm["SLURM_NNODES"]) != int(run["nodes"]):
        return f"ran on {slurm['SLURM_NNODES']} node(s), the shape asks for {run['nodes']}"
    if "fsdp" in cfg and bool(cfg["fsdp"]) != (run["strategy"] == "fsdp"):
        return f"config fsdp={cfg['fsdp']!r} but the strategy is {run['strategy']}"
    if run.get("job_id") and slurm.get("SLURM_JOB_ID") and slurm["SLURM_JOB_ID"] != str(run["job_id"]):
        return f"results are from job {slurm['SLURM_JOB_ID']}, not from the submitted job {run['job_id']}"
    if int(slurm.get("SLURM_RESTART_COUNT") or 0) > 0:
        return (f"resumed after {slurm['SLURM_RESTART_COUNT']} requeue(s): train_runtime covers the "
                "last part only")
    return None


def classify(run: dict, slurm: Slurm) -> None:
    _classify(run, slurm)
    run["reason"] += run["log_tail"]


def _classify(run: dict, slurm: Slurm) -> None:
    """Sets run['status'] (ok, incomplete, failed, missing, no results, mismatch, resumed) and run['reason']."""
    if run["problem"] is None:
        run["status"], run["reason"] = "ok", ""
        return
    if run["results"] is not None:   # results, but not a measurement of this cell
        run["status"] = "resumed" if run["problem"].startswith("resumed") else "mismatch"
        run["reason"] = run["problem"]
        return
    info = slurm.state(run.get("job_id"))
    job = f"job {run.get('job_id', '?')}"
    if info is None:
        run["status"] = "missing" if run["missing"] else "no results"
        known = "SLURM not asked" if not slurm.asked else (
            "job unknown to SLURM" if slurm.reachable else "SLURM not reachable")
        run["reason"] = f"{run['problem']}; {job} state unknown ({known})"
        return
    state = info["JobState"]
    reason = info.get("Reason") if info.get("Reason") not in (None, "", "None") else None
    if state in ACTIVE:
        run["status"] = "incomplete"
        run["reason"] = f"{job} {state}" + (f" ({reason})" if reason else "") + f"; {run['problem']}"
    else:
        run["status"] = "failed"
        exit_code = info.get("ExitCode")
        run["reason"] = (f"{job} {state}" + (f", exit code {exit_code}" if exit_code else "")
                         + (f" ({reason})" if reason else "") + f"; {run['problem']}")


# ---------------------------------------------------------------------------------------------
# Figures


def _spread(values):
    return {"median": statistics.median(values), "min": min(values), "max": max(values)} if values else None


def global_batch(run):
    cfg = (run["env"] or {}).get("config") or {}
    per_device = as_number(cfg.get("per_device_train_batch_size"))
    if per_device is None:
        return None
    return int(per_device * run["gpus"] * (as_number(cfg.get("gradient_accumulation_steps")) or 1))


def group_rows(runs):
    """One row per (strategy, nodes, gpus_per_node), in submission order of first appearance."""
    groups = {}
    for run in runs:
        groups.setdefault((run["strategy"], int(run["nodes"]), int(run["gpus_per_node"])), []).append(run)
    rows = []
    for (strategy, nodes, per_node), members in groups.items():
        ok = [r for r in members if r["status"] == "ok"]
        res = [r["results"] for r in ok]

        def col(key):
            return [v for v in (as_number(x.get(key)) for x in res) if v is not None]

        targets = sorted(set(col("target_f1")))
        to_target = col("train_seconds_to_target_f1")
        times = [training_seconds(x) for x in res]

        rows.append({
            "strategy": strategy, "nodes": nodes, "gpus_per_node": per_node, "gpus": nodes * per_node,
            "expected": len(members), "ok": len(ok), "runs": [r["name"] for r in ok],
            "global_batch": sorted({b for b in map(global_batch, ok) if b is not None}),
            "train_runtime": _spread(times),
            "wall_clock": _spread(col("WALL_CLOCK_SECONDS")),
            "samples_per_second": _spread(col("train_samples_per_second")),
            "real_tokens_per_second": _spread(col("train_real_tokens_per_second")),
            "eval_f1": _spread(col("eval_f1")), "eval_exact_match": _spread(col("eval_exact_match")),
            "repeat_train_runtime": times,
            "target_f1": targets, "target_reached": len(to_target), "time_to_target": _spread(to_target),
        })
    return rows


def training_seconds(results) -> float:
    """A run's training time: train_runtime, less the evaluations during training when it made
    some (--eval_every: train_seconds_excluding_evaluation), so they do not count as training."""
    clock = as_number(results.get("train_seconds_excluding_evaluation"))
    return clock if clock is not None else as_number(results["train_runtime"])


def pick_baseline(rows, manifest):
    want = manifest.get("baseline") or {}
    candidates = [r for r in rows if r["gpus"] == 1 and r["ok"]]
    for r in candidates:
        if r["strategy"] == want.get("strategy", "ddp"):
            return r
    return candidates[0] if candidates else None


def add_speedups(rows, baseline):
    base = baseline["train_runtime"]["median"] if baseline else None
    for r in rows:
        r["baseline"] = r is baseline
        if base and r["train_runtime"]:
            r["speedup"] = base / r["train_runtime"]["median"]
            r["efficiency"] = r["speedup"] / r["gpus"]
            r["repeat_speedups"] = [base / t for t in r["repeat_train_runtime"]]
        else:
            r["speedup"] = r["efficiency"] = None
            r["repeat_speedups"] = []
        add_target_speedup(r, baseline)
    rows.sort(key=lambda r: (not r["baseline"], r["strategy"], r["gpus"], r["nodes"]))


# Time-to-target and throughput speedups of a cell that part by more than this are flagged: the
# larger global batch (or anything else) costs the cell accuracy per step, or gains it.
TARGET_DISAGREEMENT = 0.10


def add_target_speedup(row, baseline) -> None:
    """The cell's speedup in time to the target F1 (baseline median / the cell's median, over the
    repeats that reached it) and whether it parts from the throughput speedup by more than
    TARGET_DISAGREEMENT."""
    base = baseline and baseline["time_to_target"] and baseline["time_to_target"]["median"]
    mine = row["time_to_target"] and row["time_to_target"]["median"]
    row["target_speedup"] = base / mine if base and mine else None
    row["target_disagrees"] = (row["target_speedup"] is not None and row["speedup"] is not None and
                               abs(row["target_speedup"] / row["speedup"] - 1) > TARGET_DISAGREEMENT)


# ---------------------------------------------------------------------------------------------
# Writing


def _f(v, digits=1):
    return "—" if v is None else f"{v:,.{digits}f}"


def _counted(values):
    """'a' or 'a (3 runs), b (2 runs)' when the runs disagree."""
    c = Counter(v for v in values if v)
    if not c:
        return "unknown"
    if len(c) == 1:
        return next(iter(c))
    return ", ".join(f"{v} ({n} run{'s' * (n > 1)})" for v, n in c.most_common())


def _device(env):
    dev = env.get("devices") or {}
    gpus = dev.get("gpus") or []
    if gpus:
        mem = gpus[0].get("memory_gib")
        return f"{gpus[0].get('name')}" + (f" ({mem} GiB)" if mem else "")
    return f"no GPU: CPU ({dev.get('cpu_count')} cores)"


def header(study, manifest, runs, slurm):
    envs = [r["env"] for r in runs if r["env"] and r["status"] == "ok"]   # what the table is made of
    versions = [e.get("versions") or {} for e in envs]
    devs = [e.get("devices") or {} for e in envs]
    cfgs = [e.get("config") or {} for e in envs]
    started = sorted(e["started_utc"] for e in envs if e.get("started_utc"))
    lines = [f"# Scaling study `{study.name}`", "",
             f"Report written {datetime.now(timezone.utc).isoformat(timespec='seconds')} by "
             f"`tools/scaling_report.py {study}`; {len(runs)} job(s) in `manifest.json` "
             f"(submitted {manifest.get('created_utc', '?')} from {manifest.get('submit_host', '?')}).", ""]
    items = [
        ("runs started", f"{started[0]} … {started[-1]} (UTC)" if started else "unknown"),
        ("GPUs", _counted(_device(e) for e in envs)),
        ("hosts (rank 0)", _counted(e.get("host") for e in envs)),
        ("node lists", ", ".join(sorted({(e.get("slurm") or {}).get("SLURM_JOB_NODELIST", "")
                                         for e in envs} - {""})) or "unknown"),
        ("Python / torch / CUDA", _counted(
            f"{v.get('python')} / {v.get('torch')} / {d.get('torch_cuda') or 'no CUDA'}"
            for v, d in zip(versions, devs))),
        ("transformers / datasets / accelerate", _counted(
            f"{v.get('transformers')} / {v.get('datasets')} / {v.get('accelerate')}" for v in versions)),
        ("git commit", _counted(e.get("git_commit") for e in envs)),
        ("config", f"`{manifest.get('config')}`" + (f" + `{' '.join(manifest['run_args'])}`"
                                                    if manifest.get("run_args") else "")),
        ("model / data", _counted(f"{c.get('model_name_or_path')} / {c.get('dataset_name') or c.get('train_file')}"
                                  for c in cfgs)),
        ("epochs / max_seq_length / per-device batch", _counted(
            f"{c.get('num_train_epochs')} / {c.get('max_seq_length')} / {c.get('per_device_train_batch_size')}"
            for c in cfgs)),
        ("GLOBAL_BATCH asked", manifest.get("global_batch") or "not set (the config's per-device batch on every GPU)"),
        ("job script / sbatch options", f"`{manifest.get('job_script')}` "
                                        f"`{' '.join(manifest.get('sbatch_args') or []) or '(none)'}`"),
        ("job states", "from SLURM (scontrol/sacct)" if slurm.asked and slurm.reachable else
         "SLURM not reachable" if slurm.asked else "not asked (every run has results, or --no-slurm)"),
    ]
    lines += ["| | |", "|---|---|"] + [f"| {k} | {v} |" for k, v in items] + [""]
    return lines


def table(rows, baseline):
    lines = ["## Scaling", "",
             "| strategy | nodes × GPUs | GPUs | runs ok / expected | global batch | training time, median (s) "
             "| training time, min–max (s) | wall clock, median (s) | samples/s, median | speedup | efficiency "
             "| F1, median (min–max) |",
             "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        t, f1 = r["train_runtime"], r["eval_f1"]
        spread = f"{_f(t['min'])}–{_f(t['max'])}" if t else "—"
        f1_text = "—" if not f1 else _f(f1["median"], 2) + (
            f" ({_f(f1['min'], 2)}–{_f(f1['max'], 2)})" if f1["min"] != f1["max"] else "")
        shape = f"{r['nodes']}×{r['gpus_per_node']}" + (" (baseline)" if r["baseline"] else "")
        eff = "—" if r["efficiency"] is None else f"{100 * r['efficiency']:.1f} %"
        lines.append(
            f"| {r['strategy']} | {shape} | {r['gpus']} | {r['ok']} / {r['expected']} | "
            f"{'/'.join(map(str, r['global_batch'])) or '—'} | {_f(t and t['median'])} | {spread} | "
            f"{_f(r['wall_clock'] and r['wall_clock']['median'])} | "
            f"{_f(r['samples_per_second'] and r['samples_per_second']['median'])} | "
            f"{_f(r['speedup'], 2)} | {eff} | "
            f"{f1_text} |")
    lines.append("")
    if baseline:
        lines.append(f"Speedup = median training time (`train_runtime`, without the evaluations during training "
                     f"when the runs made some) of the {baseline['nodes']}×"
                     f"{baseline['gpus_per_node']} {baseline['strategy']} baseline "
                     f"({_f(baseline['train_runtime']['median'])} s, {baseline['ok']} run(s)) / the row's median "
                     "training time; efficiency = speedup / GPUs (100 % = ideal). Medians over the completed "
                     "repeats; the wall clock also counts start-up, data loading, evaluation and saving.")
    else:
        lines.append("**No completed 1×1 baseline run: speedup and efficiency cannot be computed.**")
    batches = {b for r in rows for b in r["global_batch"]}
    if len(batches) > 1:
        lines.append("")
        lines.append(f"**The global batch differs between rows ({', '.join(map(str, sorted(batches)))})**: "
                     "those rows take different numbers of optimizer steps, so their speedups compare "
                     "different training runs (see F1). Submit with `--global-batch N` to hold it fixed.")
    return lines + [""]


def target_section(rows, baseline):
    """Time to the target F1 beside the throughput speedup, for studies whose runs evaluated during
    training with a target (tools/scaling_submit.sh --target-f1)."""
    targets = sorted({t for r in rows for t in r["target_f1"]})
    if not targets:
        return []
    target = "/".join(f"{t:g}" for t in targets)
    lines = [f"## Time to F1 {target}", "",
             "| strategy | nodes × GPUs | GPUs | reached / runs ok | time to target, median (s) | min–max (s) "
             "| speedup to target | speedup (training time) | |",
             "|---|---|---:|---:|---:|---:|---:|---:|---|"]
    for r in rows:
        t = r["time_to_target"]
        flag = (f"**differ by more than {TARGET_DISAGREEMENT:.0%}**" if r["target_disagrees"] else "")
        lines.append(f"| {r['strategy']} | {r['nodes']}×{r['gpus_per_node']}{' (baseline)' if r['baseline'] else ''} "
                     f"| {r['gpus']} | {r['target_reached']} / {r['ok']} | {_f(t and t['median'])} | "
                     f"{_f(t['min']) + '–' + _f(t['max']) if t else '—'} | {_f(r['target_speedup'], 2)} | "
                     f"{_f(r['speedup'], 2)} | {flag} |")
    lines += ["", "Time to target = training seconds (evaluations excluded) until the first evaluation during "
              "training at or above the target F1, interpolated from the one before (`train_seconds_to_target_f1`); "
              "median over the repeats that reached it. Speedup to target = the baseline's median / the row's. "
              f"Where it parts from the throughput speedup by more than {TARGET_DISAGREEMENT:.0%}, the cell needs "
              "more (or fewer) steps to answer as well as the baseline: a larger global batch, typically."]
    if len(targets) > 1:
        lines.append("**The runs had different targets**: their times are not comparable.")
    return lines + [""]


def problems_section(runs):
    bad = [r for r in runs if r["status"] != "ok"]
    lines = ["## Failed, incomplete and missing runs", ""]
    if not bad:
        return lines + [f"None: all {len(runs)} runs completed.", ""]
    lines += ["Not counted in the table above.", "", "| run | job | status | reason |", "|---|---|---|---|"]
    lines += [f"| {r['name']} | {r.get('job_id', '?')} | {r['status']} | {r['reason'].replace('|', '&#124;')} |"
              for r in bad]
    return lines + [""]


def runs_section(runs, base_median):
    ok = [r for r in runs if r["status"] == "ok"]
    lines = ["## Completed runs", "",
             "| run | job | node list | training time (s) | wall clock (s) | samples/s | real tokens/s | speedup* "
             "| F1 | EM | time to target F1 (s) |", "|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in ok:
        x = r["results"]
        node_list = ((r["env"] or {}).get("slurm") or {}).get("SLURM_JOB_NODELIST", "—")
        seconds = training_seconds(x)
        speed = base_median / seconds if base_median else None
        to_target = "—" if x.get("target_f1") is None else (
            "not reached" if x.get("train_seconds_to_target_f1") is None else _f(x["train_seconds_to_target_f1"]))
        lines.append(f"| {r['name']} | {r.get('job_id', '?')} | {node_list} | {_f(seconds)} | "
                     f"{_f(as_number(x.get('WALL_CLOCK_SECONDS')))} | {_f(as_number(x.get('train_samples_per_second')))} | "
                     f"{_f(as_number(x.get('train_real_tokens_per_second')), 0)} | {_f(speed, 2)} | "
                     f"{_f(as_number(x.get('eval_f1')), 2)} | {_f(as_number(x.get('eval_exact_match')), 2)} | "
                     f"{to_target} |")
    return lines + ["", "\\* this run against the baseline's median.", ""]


# ---------------------------------------------------------------------------------------------
# Measured beside predicted


MARGIN = 0.25  # a cell whose median step time departs from the model's by more than this is flagged


def _median_of(members, key):
    values = [v for v in (as_number((m["results"] or {}).get(key)) for m in members) if v is not None]
    return statistics.median(values) if values else None


def predictions(rows, runs, baseline):
    """(one entry per multi-GPU cell: measured step time and its parts beside the communication
    model's prediction, notes). The model (scaling/model.py) starts from the baseline run
    whose step time is the median of the baseline's, and takes each cell's own measured bus
    bandwidth (its comm_* records) where there is one."""
    if baseline is None:
        return [], ["No completed baseline: nothing to predict from."]
    by_name = {r["name"]: r for r in runs}
    timed = sorted((m for m in (by_name[n] for n in baseline["runs"])
                    if as_number(m["results"].get("train_step_time_mean_s"))),
                   key=lambda m: m["results"]["train_step_time_mean_s"])
    if not timed:
        return [], ["The baseline runs recorded no step time (train_step_time_mean_s: telemetry off?): "
                    "nothing to predict from."]
    base_run = timed[(len(timed) - 1) // 2]
    try:
        base, _ = baseline_from_records(base_run["results"], base_run["env"] or {}, base_run["folder"])
    except InputError as err:
        return [], [f"The baseline run {base_run['name']} cannot be modelled: {err}"]
    out, assumed = [], set()
    for row in rows:
        if row["baseline"] or not row["ok"]:
            continue
        members = [by_name[n] for n in row["runs"]]
        step = _median_of(members, "train_step_time_mean_s")
        if step is None:
            continue
        nodes, per = row["nodes"], row["gpus_per_node"]
        busbw, intra = _median_of(members, "comm_allreduce_busbw_GBps"), _median_of(members, "comm_intranode_busbw_GBps")
        if busbw is None:
            source = "assumed"
            intra, inter = FT3_INTRA_BUSBW, FT3_INTER_BUSBW
            assumed.add(row["strategy"] + f" {nodes}×{per}")
        elif nodes > 1:
            source, inter, intra = "measured", busbw, intra or FT3_INTRA_BUSBW
        else:
            source, intra, inter = "measured", busbw, FT3_INTER_BUSBW
        cfg = (members[0]["env"] or {}).get("config") or {}
        what = WhatIf(bf16=cfg.get("ddp_comm_hook") in ("bf16", "fp16") if row["strategy"] == "ddp"
                      else cfg.get("fsdp_reduce_dtype") == "bf16",
                      accum=int(cfg.get("gradient_accumulation_steps") or 1),
                      batch_mult=(cfg.get("per_device_train_batch_size") or base.batch) / base.batch)
        bucket = cfg.get("ddp_bucket_cap_mb")
        settings = Settings(bucket_bytes=int(bucket * 2 ** 20)) if bucket else Settings()
        model = predict(base, nodes, per, row["strategy"], what, ring_busbw(nodes, per, intra, inter), settings)
        compute, exposed = _median_of(members, "comm_step_nosync_s"), _median_of(members, "comm_exposed_s")
        departure = step / model["step_s"] - 1
        out.append({"strategy": row["strategy"], "nodes": nodes, "gpus_per_node": per, "gpus": row["gpus"],
                    "busbw_GBps": ring_busbw(nodes, per, intra, inter), "busbw_source": source,
                    "what_if": what.name, "step_s": step, "predicted_step_s": model["step_s"],
                    "departure": departure, "flagged": abs(departure) > MARGIN,
                    "compute_s": compute, "exposed_s": exposed,
                    "rest_s": None if compute is None or exposed is None else step - compute - exposed,
                    "predicted_exposed_s": model["comm_exposed_s"], "speedup": row["speedup"],
                    "predicted_speedup": model["speedup"]})
    notes = [f"Baseline for the model: {base_run['name']} ({base.compute_s * 1e3:,.1f} ms per micro-batch, "
             f"batch {base.batch}, {base.params:,} parameters x {base.grad_dtype_bytes} bytes)."]
    if assumed:
        notes.append(f"No measured bandwidth for {', '.join(sorted(assumed))}: FinisTerrae III defaults assumed "
                     f"({FT3_INTRA_BUSBW:g} GB/s within a node, {FT3_INTER_BUSBW:g} GB/s across nodes).")
    return out, notes


def predictions_section(entries, notes):
    lines = ["## Measured and predicted", ""]
    if not entries:
        return lines + notes + [""]
    lines += ["| strategy | nodes × GPUs | busbw (GB/s) | what-if | step, measured (ms) | step, predicted (ms) "
              "| departure | compute (ms) | exposed communication, measured (ms) | predicted (ms) | rest (ms) "
              "| speedup, measured | predicted | |",
              "|---|---|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|"]

    def ms(v):
        return "—" if v is None else f"{v * 1e3:,.1f}"

    for e in entries:
        flag = f"**departs by more than {MARGIN:.0%}**" if e["flagged"] else ""
        lines.append(f"| {e['strategy']} | {e['nodes']}×{e['gpus_per_node']} | {_f(e['busbw_GBps'], 2)} "
                     f"({e['busbw_source']}) | {e['what_if']} | {ms(e['step_s'])} | {ms(e['predicted_step_s'])} | "
                     f"{e['departure']:+.0%} | {ms(e['compute_s'])} | {ms(e['exposed_s'])} | "
                     f"{ms(e['predicted_exposed_s'])} | {ms(e['rest_s'])} | {_f(e['speedup'], 2)} | "
                     f"{_f(e['predicted_speedup'], 2)} | {flag} |")
    lines += ["", "Step = the median optimizer step time of the cell's runs (train_step_time_mean_s). Its parts, "
              "from the runs' own records (scaling/comm_measure.py, measured before training on one batch): compute = "
              "forward + backward without gradient synchronisation (comm_step_nosync_s); exposed communication = "
              "with minus without (comm_exposed_s); rest = step - both (the optimizer step, waits, stragglers). "
              "Predicted: the communication model of docs/scaling.md from the baseline run's records, the cell's "
              "measured bus bandwidth (comm_allreduce_busbw_GBps) and its batch, accumulation and compression "
              f"(what-if). A departure beyond {MARGIN:.0%} is flagged: the model misses something there.", ""]
    return lines + notes + [""]


def unlisted(study, manifest):
    listed = {r["name"] for r in manifest["runs"]}
    return sorted(p.name for p in study.iterdir()
                  if p.is_dir() and p.name not in listed and (p / "all_results.json").is_file())


def plot(rows, baseline, path: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7.5, 5.2))
    top = max(r["gpus"] for r in rows)
    ax.plot([1, top], [1, top], ":", color="grey", label="ideal (speedup = GPUs)")
    ax.scatter([1 - 0.06] * len(baseline["repeat_speedups"]), baseline["repeat_speedups"], s=12,
               color="black", alpha=0.6, zorder=3, label="a repeat (baseline median / its time)")
    strategies = sorted({r["strategy"] for r in rows if not r["baseline"]})
    series = 0
    for i, strategy in enumerate(strategies):
        color = f"C{i}"
        mine = [r for r in rows if r["strategy"] == strategy and not r["baseline"] and r["speedup"]]
        for j, nodes in enumerate(sorted({r["nodes"] for r in mine})):
            line = sorted((r for r in mine if r["nodes"] == nodes), key=lambda r: r["gpus"])
            xs, ys = [1] + [r["gpus"] for r in line], [1.0] + [r["speedup"] for r in line]
            marker = "os^D"[j % 4]
            ax.plot(xs, ys, ["-", "--", "-.", ":"][j % 4], marker=marker, color=color, lw=1.5, ms=5,
                    label=f"{strategy}, {nodes} node{'s' * (nodes > 1)}: median")
            series += 1
            for r in line:   # each series' repeats in its own small column right of the medians
                ax.scatter([r["gpus"] + 0.07 * series] * len(r["repeat_speedups"]), r["repeat_speedups"],
                           s=12, color=color, alpha=0.6, marker=marker, zorder=3)
    ax.set_xticks(sorted({r["gpus"] for r in rows}))
    ax.set_xlabel("GPUs (nodes × GPUs per node)")
    ax.set_ylabel("speedup over 1 GPU (median training time)")
    ax.set_title(title, fontsize=10)
    ax.set_xlim(0.6, top + 0.3 + 0.07 * series)
    ax.set_ylim(0, top + 0.5)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, loc="upper left")
    fig.tight_layout()
    fd, tmp = tempfile.mkstemp(prefix=".tmp-", suffix=".png", dir=path.parent)
    os.close(fd)
    try:
        fig.savefig(tmp, dpi=110)
        os.replace(tmp, path)
    finally:
        plt.close(fig)
        if os.path.exists(tmp):
            os.unlink(tmp)


def build(study: Path, out: Path, use_slurm: bool = True) -> dict:
    manifest = load_manifest(study)
    runs = [read_run(study, e) for e in manifest["runs"]]
    slurm = Slurm(use_slurm)
    for run in runs:
        classify(run, slurm)
    if not any(r["status"] == "ok" for r in runs):
        counts = Counter(r["status"] for r in runs)
        raise InputError(str(study), f"none of the {len(runs)} runs in manifest.json has usable results ("
                         + ", ".join(f"{n} {s}" for s, n in counts.most_common()) + "); nothing to report",
                         "wait for the jobs to finish (squeue --me), or see their slurm-*.err logs")
    rows = group_rows(runs)
    baseline = pick_baseline(rows, manifest)
    add_speedups(rows, baseline)
    base_median = baseline["train_runtime"]["median"] if baseline else None

    out.mkdir(parents=True, exist_ok=True)
    gpu_names = sorted({g.get("name") for r in runs if r["env"]
                        for g in (r["env"].get("devices") or {}).get("gpus") or []} - {None})
    title = (f"{study.name}: {Path(str(manifest.get('config'))).name}, "
             f"{', '.join(gpu_names) or 'no GPU'}")
    plotted = baseline is not None and any(r["speedup"] for r in rows if not r["baseline"])
    if plotted:
        plot(rows, baseline, out / PLOT, title)
    lines = header(study, manifest, runs, slurm) + table(rows, baseline)
    lines += [f"![speedup against GPUs]({PLOT})" if plotted else
              "No plot: it needs a completed baseline and at least one other completed shape.", ""]
    predicted, notes = predictions(rows, runs, baseline)
    lines += predictions_section(predicted, notes)
    lines += target_section(rows, baseline)
    lines += problems_section(runs) + runs_section(runs, base_median)
    extra = unlisted(study, manifest)
    if extra:
        lines += ["## Not in the manifest", "", "These folders hold results but were not submitted by this "
                  "study's manifest, so they are not counted: " + ", ".join(f"`{n}`" for n in extra), ""]
    atomic_write_text(out / REPORT, "\n".join(lines))
    summary = {
        "study": str(study), "written_utc": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "baseline": baseline and {k: baseline[k] for k in ("strategy", "nodes", "gpus_per_node")},
        "predictions": predicted, "prediction_margin": MARGIN,
        "rows": [{k: v for k, v in r.items() if k != "repeat_train_runtime"} for r in rows],
        "runs": [{k: r.get(k) for k in ("name", "job_id", "strategy", "nodes", "gpus_per_node", "repeat",
                                        "status", "reason", "folder")} for r in runs],
        "plot": PLOT if plotted else None,
    }
    atomic_write_json(out / SUMMARY, summary)
    return summary


@command
def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    parser.add_argument("study", help="the study folder (holds manifest.json)")
    parser.add_argument("--out", help="where to write the report, plot and summary (default STUDY)")
    parser.add_argument("--no-slurm", action="store_true", help="do not ask SLURM for the state of unfinished jobs")
    args = parser.parse_args(argv)
    study = Path(args.study)
    out = Path(args.out) if args.out else study
    summary = build(study, out, use_slurm=not args.no_slurm)
    ok = sum(r["status"] == "ok" for r in summary["runs"])
    print(f"{ok}/{len(summary['runs'])} runs usable -> {out / REPORT}"
          + (f", {out / PLOT}" if summary["plot"] else " (no plot)"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
