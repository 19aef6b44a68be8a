"""The scaling study's part of bert-squad-compare, for runs of several world sizes (a study file with shapes, or any
runs of DDP/FSDP beside a 1-process one): each multi-process recipe's measured step time and its parts beside the
communication model's prediction (scaling/model.py), its speedup to the target F1 beside its throughput speedup,
and speedup against processes as a plot (a line per strategy and node count through the medians, a dot per run)."""
import statistics

from qa.errors import InputError
from qa.io import replacing
from scaling.baseline import as_number, baseline_from_records
from scaling.model import FT3_INTER_BUSBW, FT3_INTRA_BUSBW, Settings, WhatIf, predict, ring_busbw

MARGIN = 0.25  # a recipe whose median step time departs from the model's by more than this is flagged
# Time-to-target and throughput speedups that part by more than this are flagged: the larger global batch (or
# anything else) costs the recipe accuracy per step, or gains it.
TARGET_DISAGREEMENT = 0.10


def _median(members, key):
    values = [v for v in (as_number(m["results"].get(key)) for m in members) if v is not None]
    return statistics.median(values) if values else None


def _timed(row, runs):
    return [r for r in runs if r["name"] in row["runs"] and r["status"] == "finished" and not r.get("resumed")]


def add_target_speedups(rows, base) -> None:
    """Each row's speedup in median time to the target F1 against the 1-process recipe's, and whether it parts
    from the throughput speedup by more than TARGET_DISAGREEMENT."""
    first = base and base["to_target_s"] and base["to_target_s"]["median"]
    for r in rows:
        mine = r["to_target_s"] and r["to_target_s"]["median"]
        r["target_speedup"] = first / mine if first and mine else None
        r["target_disagrees"] = bool(r["target_speedup"] and r["speedup"] and
                                     abs(r["target_speedup"] / r["speedup"] - 1) > TARGET_DISAGREEMENT)


def predictions(rows, runs, base) -> tuple:
    """(an entry per multi-process recipe, notes). The model starts from the 1-process run of median step time and
    takes each recipe's own measured bus bandwidth (its comm_* records) where it has one."""
    timed = sorted((m for m in _timed(base, runs) if as_number(m["results"].get("train_step_time_mean_s"))),
                   key=lambda m: m["results"]["train_step_time_mean_s"]) if base else []
    if not timed:
        return [], ["No 1-process run recorded its step time (train_step_time_mean_s): nothing to predict from."]
    first = timed[(len(timed) - 1) // 2]
    try:
        model_base, _ = baseline_from_records(first["results"], first["env"], first["folder"])
    except InputError as err:
        return [], [f"The 1-process run {first['name']} cannot be modelled: {err}"]
    out, assumed = [], []
    for row in rows:
        members = _timed(row, runs)
        step = _median(members, "train_step_time_mean_s")
        if row["world_size"] in (None, 1) or step is None:
            continue
        nodes = row["nodes"] or 1
        per = row["world_size"] // nodes
        busbw, intra = _median(members, "comm_allreduce_busbw_GBps"), _median(members, "comm_intranode_busbw_GBps")
        if busbw is None:
            assumed.append(row["recipe"])
            intra, inter = FT3_INTRA_BUSBW, FT3_INTER_BUSBW
        elif nodes > 1:
            inter, intra = busbw, intra or FT3_INTRA_BUSBW
        else:
            intra, inter = busbw, FT3_INTER_BUSBW
        config = members[0]["env"].get("config") or {}
        strategy = row["strategy"]
        what = WhatIf(bf16=config.get("ddp_comm_hook") in ("bf16", "fp16") if strategy == "ddp"
                      else config.get("fsdp_reduce_dtype") == "bf16",
                      accum=int(config.get("gradient_accumulation_steps") or 1),
                      batch_mult=(config.get("per_device_train_batch_size") or model_base.batch) / model_base.batch)
        bucket = config.get("ddp_bucket_cap_mb")
        busbw = ring_busbw(nodes, per, intra, inter)
        model = predict(model_base, nodes, per, strategy, what, busbw,
                        Settings(bucket_bytes=int(bucket * 2 ** 20)) if bucket else Settings())
        compute, exposed = _median(members, "comm_step_nosync_s"), _median(members, "comm_exposed_s")
        departure = step / model["step_s"] - 1
        out.append({"recipe": row["recipe"], "strategy": strategy, "nodes": nodes, "gpus_per_node": per,
                    "busbw_GBps": busbw, "busbw_source": "assumed" if row["recipe"] in assumed else "measured",
                    "what_if": what.name, "step_s": step, "predicted_step_s": model["step_s"],
                    "departure": departure, "flagged": abs(departure) > MARGIN, "compute_s": compute,
                    "exposed_s": exposed, "rest_s": None if compute is None or exposed is None else
                    step - compute - exposed, "predicted_exposed_s": model["comm_exposed_s"],
                    "speedup": row["speedup"], "predicted_speedup": model["speedup"]})
    notes = [f"Model baseline: {first['name']} ({model_base.compute_s * 1e3:,.1f} ms per micro-batch, batch "
             f"{model_base.batch}, {model_base.params:,} parameters x {model_base.grad_dtype_bytes} bytes)."]
    if assumed:
        notes.append(f"No measured bandwidth for {', '.join(assumed)}: FinisTerrae III's assumed "
                     f"({FT3_INTRA_BUSBW:g} GB/s within a node, {FT3_INTER_BUSBW:g} GB/s across nodes).")
    return out, notes


def _f(v, digits=1):
    return "—" if v is None else f"{v:,.{digits}f}"


def _ms(v):
    return _f(None if v is None else v * 1e3)


def markdown(rows, entries, notes) -> list:
    lines = ["## Measured and predicted", ""]
    if entries:
        lines += ["| recipe | busbw GB/s | what-if | step ms, measured | predicted | departure | compute ms "
                  "| exposed comm. ms, measured | predicted | rest ms | speedup, measured | predicted |",
                  "|---|---|---|---|---|---|---|---|---|---|---|---|"]
        lines += [f"| {e['recipe']} | {_f(e['busbw_GBps'], 2)} ({e['busbw_source']}) | {e['what_if']} | "
                  f"{_ms(e['step_s'])} | {_ms(e['predicted_step_s'])} | {e['departure']:+.0%}"
                  f"{' **beyond ' + format(MARGIN, '.0%') + '**' if e['flagged'] else ''} | {_ms(e['compute_s'])} | "
                  f"{_ms(e['exposed_s'])} | {_ms(e['predicted_exposed_s'])} | {_ms(e['rest_s'])} | "
                  f"{_f(e['speedup'], 2)} | {_f(e['predicted_speedup'], 2)} |" for e in entries]
        lines += ["", "Step: the median optimizer step time (train_step_time_mean_s). Its parts, measured by the runs "
                  "on one batch before training (--measure_communication, scaling/comm_measure.py): compute = forward "
                  "+ backward without gradient synchronisation, exposed communication = with minus without, rest = "
                  "step - both. Predicted: the model of docs/scaling.md from the 1-process run's records, the "
                  f"recipe's measured bandwidth, batch, accumulation and compression; beyond {MARGIN:.0%} the model "
                  "misses something there.", ""]
    lines += notes + [""]
    targets = sorted({t for r in rows for t in r["target_f1"]})
    if not targets:
        return lines
    lines += [f"## Time to F1 {'/'.join(f'{t:g}' for t in targets)}", "",
              "| recipe | reached / finished | time to target s (median) | speedup to target | speedup |",
              "|---|---|---|---|---|"]
    flag = f" **differ by more than {TARGET_DISAGREEMENT:.0%}**"
    lines += [f"| {r['recipe']} | {r['to_target_s']['n'] if r['to_target_s'] else 0} / {r['finished']} | "
              f"{_f(r['to_target_s'] and r['to_target_s']['median'])} | {_f(r['target_speedup'], 2)} | "
              f"{_f(r['speedup'], 2)}{flag if r['target_disagrees'] else ''} |" for r in rows]
    lines += ["", "Time to target: training seconds (evaluations left out) to the first evaluation at or above the "
              "target, interpolated from the one before (train_seconds_to_target_f1). Where the two speedups part, "
              "the recipe needs more (or fewer) steps to answer as well: a larger global batch, typically."]
    return lines + ["**The runs had different targets**: their times do not compare."] * (len(targets) > 1) + [""]


def plot(rows, runs, base, path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.8))
    top = max(r["world_size"] or 1 for r in rows)
    ax.plot([1, top], [1, top], ":", color="grey", label="ideal")
    first = base["training_s"]["median"]
    lines = sorted({(r["strategy"], r["nodes"] or 1) for r in rows if r["speedup"] and r["world_size"] > 1})
    for i, (strategy, nodes) in enumerate(lines):
        mine = sorted((r for r in rows if (r["strategy"], r["nodes"] or 1) == (strategy, nodes) and r["speedup"]
                       and r["world_size"] > 1), key=lambda r: r["world_size"])
        ax.plot([1] + [r["world_size"] for r in mine], [1] + [r["speedup"] for r in mine], "-o", color=f"C{i}",
                label=f"{strategy}, {nodes} node{'s' * (nodes > 1)}: median")
        for r in mine:
            dots = [first / m["figures"]["training_s"] for m in _timed(r, runs) if m["figures"].get("training_s")]
            ax.scatter([r["world_size"] + 0.05 * (i + 1)] * len(dots), dots, s=12, color=f"C{i}", alpha=0.6)
    ax.set_xticks(sorted({r["world_size"] for r in rows if r["world_size"]}))
    ax.set_xlabel("processes (GPUs)")
    ax.set_ylabel("speedup over 1 process (median training time)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, loc="upper left")
    fig.tight_layout()
    with replacing(path) as tmp:
        fig.savefig(tmp, format="png", dpi=100)
    plt.close(fig)
