#!/usr/bin/env python
"""Predict multi-GPU, multi-node speedup from a 1-GPU run: DDP and FSDP, and what-ifs.

    python tools/scaling_predict.py RUN_DIR [--shapes "1x2 2x1 2x2 4x2 8x2"] [--strategies ddp fsdp]
        [--what_if none bf16 accum=4 batch=2] [--intra_busbw GBps] [--inter_busbw GBps]
        [--calibration MULTI_NODE_RUN_DIR] [--latency_us US] [--overlap F] [--target_speedup S]
        [--json OUT]
    python tools/scaling_predict.py --samples_per_s 275 --batch 12 [...]     # no run folder
    python tools/scaling_predict.py --step_time 0.040 --batch 12 [--data_time 0.002] [...]

RUN_DIR is the output_dir of a finished 1-GPU training run: all_results.json gives the mean step
time (train_step_time_mean_s), the data-loading time (train_data_time_total_s over the steps)
and, when recorded, the gradient size (train_trainable_params, train_grad_dtype,
train_grad_bytes); environment.json gives the per-device batch and gradient accumulation; the
config.json of the run's model (saved in RUN_DIR, else at its model_name_or_path) gives the size
of the embedding block, whose gradients are all-reduced only once backward ends. A run that
lacks the gradient size uses --params (default: bert-base-uncased's QA model) and --grad_dtype
(default float32). A run that trained on a CPU is refused unless --cpu_baseline is given (a CPU
step hides any communication: every shape would look ~100% efficient); with it, a note above
the table says so.

Bandwidths (bus bandwidth in the NCCL-tests sense, GB/s): --intra_busbw / --inter_busbw win;
else those measured by a distributed run (--calibration: comm_allreduce_busbw_GBps,
comm_intranode_busbw_GBps); else defaults for FinisTerrae III's A100 nodes, printed as
assumptions with their sources.

Shapes are NODESxGPUS_PER_NODE. What-ifs: none, bf16 (communicate 2-byte floats), accum=K
(gradient accumulation over K micro-batches), batch=M (M times the per-device batch), joined
with + (bf16+accum=4). Prints a Markdown table (one row per shape, strategy and what-if, the
1-GPU baseline first) with the model's inputs and assumptions under it; --json writes the same
figures, unrounded, atomically. The model: scaling/model.py and docs/scaling.md.

Exit status 0, or 2 with a one-line `error:` on bad input.
"""
import argparse
import sys
from pathlib import Path

from scaling.bandwidth import GB
from qa.errors import InputError, command
from qa.io import atomic_write_json, read_json
from scaling.baseline import baseline_from_records, grad_dtype_bytes, number, run_device
from scaling.model import (BACKWARD_SHARE, BERT_BASE_EMBEDDING_PARAMS, BERT_BASE_QA_PARAMS, DDP_BUCKET_BYTES,
                           FSDP_UNITS, FT3_INTER_BUSBW, FT3_INTRA_BUSBW, FT3_LATENCY_US, FT3_SOURCES, STRATEGIES,
                           Baseline, Settings, busbw_for_speedup, parse_shape, parse_what_if, predict,
                           ring_busbw)

DEFAULT_SHAPES = "1x2 2x1 2x2 4x2 8x2"
DEFAULT_WHAT_IFS = ("none", "bf16", "accum=4", "batch=2")

class _Parser(argparse.ArgumentParser):
    def error(self, message):
        raise InputError("command line", message, "see tools/scaling_predict.py --help")


def _bounded(kind=float, low=None, high=None, low_open=False):
    """An argparse type: a number of `kind` within [low, high] (or (low, high] with low_open)."""
    def convert(text):
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
        too_low = low is not None and (value <= low if low_open else value < low)
        if too_low or (high is not None and value > high):
            bounds = (f"> {low:g}" if low_open else f">= {low:g}") if high is None else f"between {low:g} and {high:g}"
            raise argparse.ArgumentTypeError(f"{text!r} must be {bounds}")
        return value
    return convert


def _positive(kind):
    return _bounded(kind, 0, low_open=True)


_fraction, _non_negative = _bounded(float, 0, 1), _bounded(float, 0)


def build_parser():
    p = _Parser(description="Predict DDP/FSDP step time, samples/s, speedup and efficiency from a 1-GPU run.")
    p.add_argument("run_dir", nargs="?", type=Path, help="output_dir of a finished 1-GPU run")
    p.add_argument("--step_time", type=_positive(float), help="without RUN_DIR: seconds per optimizer step "
                   "(forward, backward, optimizer; data loading excluded)")
    p.add_argument("--samples_per_s", type=_positive(float), help="without RUN_DIR: 1-GPU samples/s "
                   "(step time = batch / samples_per_s, data loading included)")
    p.add_argument("--batch", type=_positive(int), help="without RUN_DIR: per-device batch")
    p.add_argument("--data_time", type=_non_negative, default=0.0,
                   help="without RUN_DIR: seconds per step waiting for data [0]")
    p.add_argument("--params", type=_positive(int), default=None,
                   help=f"trainable parameters when the run does not record them [{BERT_BASE_QA_PARAMS:,}]")
    p.add_argument("--grad_dtype", default=None, help="gradient dtype when the run does not record it [float32]")
    p.add_argument("--shapes", nargs="+", default=[DEFAULT_SHAPES], help=f"NODESxGPUS_PER_NODE [{DEFAULT_SHAPES}]")
    p.add_argument("--strategies", nargs="+", default=list(STRATEGIES), choices=STRATEGIES)
    p.add_argument("--what_if", nargs="+", default=list(DEFAULT_WHAT_IFS),
                   help="none, bf16, accum=K, batch=M, or +-joined [%(default)s]")
    p.add_argument("--intra_busbw", type=_positive(float), help="GB/s between the GPUs of one node")
    p.add_argument("--inter_busbw", type=_positive(float), help="GB/s of a ring that crosses nodes")
    p.add_argument("--calibration", type=Path, help="a distributed run whose comm_* records give the bandwidths")
    p.add_argument("--latency_us", type=_non_negative, default=None,
                   help=f"per ring step, microseconds [{FT3_LATENCY_US:g}]")
    p.add_argument("--overlap", type=_fraction, default=1.0,
                   help="share of the compute window communication can hide in, 0-1 [1]")
    p.add_argument("--backward_share", type=_fraction, default=BACKWARD_SHARE,
                   help="backward's share of the compute step [2/3]")
    p.add_argument("--bucket_mb", type=_positive(float), default=DDP_BUCKET_BYTES / 2 ** 20,
                   help="DDP bucket size, MiB [25]")
    p.add_argument("--fsdp_units", type=_positive(int), default=FSDP_UNITS, help="FSDP units [13]")
    p.add_argument("--tail_params", type=_positive(int), default=None,
                   help="parameters whose gradients are ready only when backward ends [the embedding block of "
                        "RUN_DIR's model, from its config.json; without RUN_DIR "
                        f"{BERT_BASE_EMBEDDING_PARAMS:,}: bert-base's]")
    p.add_argument("--cpu_baseline", action="store_true",
                   help="accept a RUN_DIR that trained on a CPU: the predictions are then for CPU processes "
                        "(gloo), not for GPUs")
    p.add_argument("--target_speedup", type=_positive(float),
                   help="add a column: the busbw each row needs to reach this speedup")
    p.add_argument("--json", type=Path, help="also write the figures to this JSON file")
    return p


# ---------------------------------------------------------------------------------------------
# Reading runs


def _read_json(path: Path, what: str) -> dict:
    if not path.is_file():
        raise InputError(str(path), "missing", f"give the output_dir of a finished {what}")
    data = read_json(path)  # the project's reader: malformed JSON is an InputError naming the line
    if not isinstance(data, dict):
        raise InputError(str(path), "is not a JSON object", "rerun, or restore the file")
    return data


def baseline_from_run(run_dir: Path, params=None, grad_dtype=None, tail_params=None, cpu_baseline=False):
    """(Baseline, input lines, notes, whether it ran on a CPU) from a 1-GPU run's all_results.json and environment.json.

    A run that trained on a CPU is refused unless `cpu_baseline`: a CPU step is tens of times a
    GPU's, so the communication would hide behind it and every shape would come out near 100%
    efficient, figures that say nothing about the GPUs the tool is used to budget for. Accepted,
    the notes say so above the table."""
    if not run_dir.is_dir():
        raise InputError(str(run_dir), "no such folder",
                         "give the output_dir of a finished 1-GPU run, or --step_time/--samples_per_s and --batch")
    results = _read_json(run_dir / "all_results.json", "1-GPU run")
    env = _read_json(run_dir / "environment.json", "1-GPU run")
    on_cpu, device = run_device(env)
    notes = []
    if on_cpu and not cpu_baseline:
        raise InputError(str(run_dir / "environment.json"),
                         f"the run trained on a {device}, not a GPU: its step time would make the communication look "
                         "free and every shape near 100% efficient",
                         "predict from a run on one GPU (sbatch job_ft3.sh), give a GPU's figures with "
                         "--samples_per_s or --step_time and --batch, or pass --cpu_baseline to predict for CPU "
                         "processes")
    if on_cpu:
        notes.append(f"NOTE: the baseline ran on a {device}, not a GPU (--cpu_baseline). The rows predict CPU "
                     "processes exchanging gradients at the bandwidths below (gloo between CPU processes is far "
                     "slower than the GPU defaults: measure it with --calibration); a GPU computes a step tens of "
                     "times faster, so on GPUs communication weighs far more and the speedups are lower than here.")
    base, lines = baseline_from_records(results, env, run_dir, params, grad_dtype, tail_params)
    return base, lines, notes, on_cpu


def baseline_from_flags(args):
    if args.batch is None or (args.step_time is None) == (args.samples_per_s is None):
        raise InputError("command line", "without RUN_DIR, give --batch and one of --step_time or --samples_per_s",
                         "e.g. --samples_per_s 275 --batch 12, or a run folder")
    if args.samples_per_s is not None:
        per_step = args.batch / args.samples_per_s
        if args.data_time >= per_step:
            raise InputError("--data_time", f"{args.data_time} s is not less than the step ({per_step:.4f} s)",
                             "give the data-loading part of batch / samples_per_s")
        compute, how = per_step - args.data_time, f"--samples_per_s {args.samples_per_s:g} --batch {args.batch}"
    else:
        compute, how = args.step_time, f"--step_time {args.step_time:g} --batch {args.batch}"
    dbytes = grad_dtype_bytes(args.grad_dtype or "float32", "--grad_dtype")
    n_params = args.params or BERT_BASE_QA_PARAMS
    tail = args.tail_params or BERT_BASE_EMBEDDING_PARAMS
    lines = [f"1 GPU: {how}: {compute * 1e3:.2f} ms of compute + {args.data_time * 1e3:.2f} ms of data loading "
             f"per step (given)",
             f"gradients {n_params:,} parameters ({'--params' if args.params else 'bert-base-uncased QA model'}) "
             f"x {dbytes} bytes ({args.grad_dtype or 'float32'})",
             f"embedding gradients {tail:,} parameters "
             f"({'--tail_params' if args.tail_params else 'bert-base-uncased embedding block'})"]
    return Baseline(compute_s=compute, data_s=args.data_time, batch=args.batch, params=n_params,
                    grad_dtype_bytes=dbytes, tail_params=tail), lines


def bandwidths_from_calibration(run_dir: Path):
    """(intra GB/s or None, inter GB/s or None, lines) measured by a distributed run."""
    if not run_dir.is_dir():
        raise InputError(str(run_dir), "no such folder", "give --calibration the output_dir of a distributed run")
    path = run_dir / "all_results.json"
    results = _read_json(path, "distributed run")
    busbw, nodes = number(results, "comm_allreduce_busbw_GBps"), number(results, "comm_nodes")
    if not busbw or not nodes:
        raise InputError(str(path), "no comm_allreduce_busbw_GBps / comm_nodes (not a distributed run, or one that "
                         "predates the communication records)", "calibrate with a run on 2 or more GPUs, or give "
                         "--intra_busbw/--inter_busbw")
    world = number(results, "comm_world_size")
    gpus = f", {int(world)} GPUs" if world else ""
    lines = []
    if nodes > 1:
        intra = number(results, "comm_intranode_busbw_GBps")
        lines.append(f"inter-node busbw {busbw:g} GB/s: measured (comm_allreduce_busbw_GBps of {run_dir}, "
                     f"{int(nodes)} nodes{gpus})")
        if intra:
            lines.append(f"intra-node busbw {intra:g} GB/s: measured (comm_intranode_busbw_GBps of {run_dir})")
        return intra, busbw, lines
    lines.append(f"intra-node busbw {busbw:g} GB/s: measured (comm_allreduce_busbw_GBps of {run_dir}, one node{gpus})")
    return busbw, None, lines


# ---------------------------------------------------------------------------------------------
# The table


def _shapes(texts):
    shapes = []
    for text in texts:
        for token in text.replace(",", " ").split():
            try:
                shapes.append(parse_shape(token))
            except ValueError as err:
                raise InputError("--shapes", str(err), 'give shapes like "1x2 2x1 2x2 4x2 8x2"') from None
    if not shapes:
        raise InputError("--shapes", "no shape given", 'give shapes like "1x2 2x1 2x2 4x2 8x2"')
    return shapes


def _what_ifs(texts):
    out = []
    for text in texts:
        for token in text.split():
            try:
                out.append(parse_what_if(token))
            except ValueError as err:
                raise InputError("--what_if", str(err), "e.g. --what_if none bf16 accum=4 batch=2") from None
    return out


def markdown(base, rows, target, inputs, assumptions, notes=(), unit="1 GPU"):
    def ms(x):
        return f"{x * 1e3:,.1f}"

    head = ["shape", "GPUs", "strategy", "what-if", "busbw GB/s", "step ms", "comm total ms", "comm exposed ms",
            "samples/s", "speedup", "efficiency"]
    if target:
        head.append(f"busbw for {target:g}x, GB/s")
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    one = ["1x1", "1", "-", "none", "-", ms(base.compute_s + base.data_s), "0.0", "0.0",
           f"{base.samples_per_s:,.1f}", "1.00x", "100%"] + (["-"] if target else [])
    lines.append("| " + " | ".join(one) + " |")
    for r in rows:
        cells = [r["shape"], str(r["gpus"]), r["strategy"], r["what_if"],
                 "-" if r["busbw_GBps"] is None else f"{r['busbw_GBps']:g}", ms(r["step_s"]), ms(r["comm_total_s"]),
                 ms(r["comm_exposed_s"]), f"{r['samples_per_s']:,.1f}", f"{r['speedup']:.2f}x",
                 f"{r['efficiency'] * 100:.0f}%"]
        if target:
            need = r.get("busbw_for_target_GBps")
            cells.append("-" if r["gpus"] < 2 else ("unreachable" if need is None else f"{need:,.1f}"))
        lines.append("| " + " | ".join(cells) + " |")
    out = ["## Predicted scaling", "", *[f"**{note}**\n" for note in notes], *lines, "",
           f"{unit}: {ms(base.compute_s)} ms compute + {ms(base.data_s)} ms data per step at batch {base.batch} "
           f"= {base.samples_per_s:,.1f} samples/s; gradients {base.params:,} x {base.grad_dtype_bytes} bytes "
           f"= {base.grad_bytes / GB * 1e3:,.1f} MB. Speedup = samples/s over the {unit} figure; "
           "efficiency = speedup / GPUs.", "",
           "Model: ring collectives, time = latency x steps + bytes on the slowest link / busbw. DDP all-reduces "
           "the gradients in buckets during backward: exposed = max(all-reduce - overlap x backward, all-reduce of "
           "the embedding gradients). FSDP all-gathers the parameters in forward and in backward and "
           "reduce-scatters the gradients, during forward + backward: exposed = max(total - overlap x compute, "
           "first all-gather + last reduce-scatter). Step = compute + data + exposed (docs/scaling.md).", "",
           "Inputs:", *[f"- {line}" for line in inputs], "",
           "Assumptions:", *[f"- {line}" for line in assumptions], ""]
    return "\n".join(out)


@command
def main(argv=None):
    args = build_parser().parse_args(sys.argv[1:] if argv is None else argv)
    if args.run_dir is not None and (args.step_time is not None or args.samples_per_s is not None
                                     or args.batch is not None):
        raise InputError("command line", "RUN_DIR and --step_time/--samples_per_s/--batch both given",
                         "give a 1-GPU run folder, or the figures by hand, not both")
    notes, on_cpu = [], False
    if args.run_dir is None:
        base, inputs = baseline_from_flags(args)
    else:
        base, inputs, notes, on_cpu = baseline_from_run(args.run_dir, args.params, args.grad_dtype, args.tail_params,
                                                args.cpu_baseline)
    shapes, what_ifs = _shapes(args.shapes), _what_ifs(args.what_if)

    assumptions = []
    intra = inter = None
    if args.calibration is not None:
        intra, inter, lines = bandwidths_from_calibration(args.calibration)
        inputs += lines
    if args.intra_busbw is not None:
        intra = args.intra_busbw
        inputs.append(f"intra-node busbw {intra:g} GB/s: given (--intra_busbw)")
    if args.inter_busbw is not None:
        inter = args.inter_busbw
        inputs.append(f"inter-node busbw {inter:g} GB/s: given (--inter_busbw)")
    needs_intra = any(nodes == 1 or per > 1 for nodes, per in shapes if nodes * per > 1)
    needs_inter = any(nodes > 1 for nodes, per in shapes)
    if intra is None:
        intra = FT3_INTRA_BUSBW
        if needs_intra:
            assumptions.append(f"ASSUMPTION intra-node busbw {intra:g} GB/s (FinisTerrae III default): "
                               f"{FT3_SOURCES['intra']}")
    if inter is None:
        inter = FT3_INTER_BUSBW
        if needs_inter:
            assumptions.append(f"ASSUMPTION inter-node busbw {inter:g} GB/s (FinisTerrae III default): "
                               f"{FT3_SOURCES['inter']}")
    latency_us = FT3_LATENCY_US if args.latency_us is None else args.latency_us
    assumptions.append(f"{'ASSUMPTION ' if args.latency_us is None else ''}latency {latency_us:g} us per ring step"
                       + (f": {FT3_SOURCES['latency']}" if args.latency_us is None else " (given)"))
    settings = Settings(latency_s=latency_us * 1e-6, overlap=args.overlap, backward_share=args.backward_share,
                        bucket_bytes=int(args.bucket_mb * 2 ** 20), fsdp_units=args.fsdp_units)
    assumptions += [
        f"overlap {settings.overlap:g}: communication hides in {settings.overlap:.0%} of its compute window (DDP: "
        "the backward of the synchronising micro-batch; FSDP: forward + backward)"
        + (" -- an upper bound: NCCL kernels share the GPU with compute" if settings.overlap == 1 else ""),
        f"backward = {settings.backward_share:.3g} of the compute step (4N of the 6N training FLOPs per token); "
        "the optimizer step is counted inside it",
        f"DDP buckets of {settings.bucket_bytes / 2 ** 20:g} MiB (torch's default); the embedding gradients "
        f"({min(base.tail_params, base.params):,} parameters) are all-reduced after backward ends; a bf16 what-if "
        "compresses each bucket (run_qa.py --ddp_comm_hook bf16)",
        f"FSDP full shard, {settings.fsdp_units} units (job_ddp.sh: one per BertLayer + the root), parameters "
        "communicated in the gradient dtype (bf16 what-if: mixed precision with bf16 parameters and reductions); "
        "with accumulation the parameters are gathered every micro-batch, gradients reduce-scattered once",
        "batch=M: compute and data time grow M times (pessimistic: a GPU under-used at the small batch gains), "
        "communication does not; memory is not checked",
        "ring algorithm only: NCCL's tree algorithms, several NICs per node, compute slowed by communication "
        "and stragglers are not modelled",
    ]

    rows = []
    for strategy in args.strategies:
        for what in what_ifs:
            for nodes, per in shapes:
                busbw = ring_busbw(nodes, per, intra, inter)
                row = predict(base, nodes, per, strategy, what, busbw, settings)
                if args.target_speedup:
                    row["busbw_for_target_GBps"] = busbw_for_speedup(base, nodes, per, strategy, what, settings,
                                                                     args.target_speedup)
                rows.append(row)
    print(markdown(base, rows, args.target_speedup, inputs, assumptions, notes,
                   unit="1 CPU process" if on_cpu else "1 GPU"))
    if args.json is not None:
        atomic_write_json(args.json, {
            "baseline": {"compute_s": base.compute_s, "data_s": base.data_s, "batch": base.batch,
                         "params": base.params, "grad_dtype_bytes": base.grad_dtype_bytes,
                         "grad_bytes": base.grad_bytes, "tail_params": base.tail_params,
                         "samples_per_s": base.samples_per_s, "on_cpu": on_cpu},
            "bandwidths_GBps": {"intra": intra, "inter": inter},
            "settings": {"latency_s": settings.latency_s, "overlap": settings.overlap,
                         "backward_share": settings.backward_share, "bucket_bytes": settings.bucket_bytes,
                         "fsdp_units": settings.fsdp_units},
            "target_speedup": args.target_speedup,
            "notes": notes, "inputs": inputs, "assumptions": assumptions, "rows": rows})
    return 0


if __name__ == "__main__":
    sys.exit(main())
