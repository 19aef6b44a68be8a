#!/usr/bin/env python
"""The whole proof of the fast path on one GPU, from one command; `--cpu` runs the same steps at
tiny size on a CPU (what the slow tests run).

    python bench/gpu_proof.py OUTDIR                          # on a GPU node, every step
    python bench/gpu_proof.py OUTDIR --steps bench,train      # a subset (allocations with a per-command limit)
    python bench/gpu_proof.py --cpu OUTDIR                    # the same code paths on a CPU, tiny sizes

Steps, in their order of value; each writes into OUTDIR/<step>/ and OUTDIR/<step>.log as soon as it
ends, and OUTDIR/proof.json + proof.md are rewritten after every step. A step that fails (or runs
past --deadline_s) is recorded with its exit status and the next one still runs:
  bench     bench/run_bench.py --size gpu: reference fp32, reference bf16, fast; every recompilation
            logged (TORCH_LOGS=recompiles) into bench.log;
  parity    bench/parity.py --size gpu: time to F1 of the reference and fast recipes, two seeds,
            the bundled MiniLM on the dev-set split (articles 0:42 / 42:, 384/128);
  train     one fast-path training through run_qa.py (configs/fast.json, a random bert-base: it costs
            what the pretrained one costs), 1 epoch of dev articles 0:42, telemetry, MFU, peak GPU
            memory, TensorBoard, and a bounded profile (profile/operators.txt);
  variants  bench/run_bench.py --variants fast_no_compile,fast_static64.
A second invocation with the same OUTDIR runs only the steps not yet finished there (--redo runs
them again): nothing finished is overwritten.

Time on one H100 (estimated, not measured: no GPU has run it yet), from the published bert-base
rate (275 samples/s on an A100 for the plain recipe), an H100's ~3x bf16 and ~2x fp32 peak over an
A100, and ~30 s of process start and tokenizing per run: bench ~5 min (fp32 reference: 7,200 samples
at ~150-250 samples/s, ~40 s; bf16 reference and fast: 20 s windows; fast's compile warm-up 1-2
min), parity ~5 min (4 runs of MiniLM, 1/8 of bert-base's FLOPs per token, 2 x 9,600 windows each,
~1 min a run), train ~3 min (compile warm-up, largely from the cache bench filled, ~10 s of training,
evaluation): a-c ~13 min of the 20 the issue allows; variants ~4 min.
"""
import argparse
import json
import os
import platform
import shlex
import signal
import subprocess
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

from run_bench import SIZES as BENCH_SIZES  # the script beside this one

from dev_set import require_squad_dev, squad_dev_path  # the script beside this one
from qa.errors import InputError, command
from qa.io import atomic_write_json, atomic_write_text, read_json
from qa.model import build_random_bert

REPO = Path(__file__).resolve().parents[1]
STEPS = ("bench", "parity", "train", "variants")

# Per device: (bench size, parity size, model shape of the training step, its data and length flags).
MODES = {
    "gpu": dict(bench="gpu", parity="gpu", model=BENCH_SIZES["gpu"]["model"],
                train=["--train_articles", "0:42", "--validation_articles", "42:", "--num_train_epochs", "1"]),
    "cpu": dict(bench="cpu", parity="smoke", model=BENCH_SIZES["cpu"]["model"],
                train=["--train_articles", "2:3", "--validation_articles", "42:43", "--num_train_epochs", "1",
                       "--max_seq_length", "128", "--doc_stride", "48", "--max_query_length", "32",
                       "--use_cpu", "true", "--tf32", "false", "--dataloader_num_workers", "1"]),
}


def step_command(step, mode, out, dev, on_cpu):
    """argv of a step (Python scripts of this repository), its output folder inside `out`."""
    m, folder = MODES[mode], out / step
    py = [sys.executable]
    bench_cpu = ["--cpu_compile", "--repeat", "1"] if on_cpu else []  # the compiled path, once
    if step in ("bench", "variants"):
        variants = ["--variants", "fast_no_compile,fast_static64"] if step == "variants" else []
        return py + [str(REPO / "bench" / "run_bench.py"), "--size", m["bench"], "--train_file", str(dev),
                     *variants, *bench_cpu, "--out", str(folder), "--work", str(out / "work" / step)]
    if step == "parity":
        return py + [str(REPO / "bench" / "parity.py"), "--size", m["parity"], "--dev", str(dev),
                     "--out", str(folder), "--work", str(out / "work" / step)]
    shape = m["model"]
    model = build_random_bert(out / "work" / "models" / ("bert-" + "-".join(map(str, shape.values()))), shape)
    return py + [str(REPO / "run_qa.py"), str(REPO / "configs" / "fast.json"), "--model_name_or_path", str(model),
                 "--train_file", str(dev), "--validation_file", str(dev), *m["train"], "--output_dir", str(folder),
                 "--resume", "never", "--report_to", "tensorboard", "--profile", "true", "--disable_tqdm", "true"]


def findings(step, folder):
    """The figures of a finished step that the proof is about, read from its own result files."""
    if step in ("bench", "variants"):
        reports = sorted(folder.glob("bench-*.json"))
        if not reports:
            return {}
        r = read_json(reports[-1])
        return {"result": str(reports[-1].relative_to(folder.parent)), "device": r["device"]["name"],
                "ratios": r["ratios"], **{f"{v}_{k}": s[k] for v, s in r["variants"].items()
                                          for k in ("samples_per_second", "mfu_real", "projected_2_epochs_s",
                                                    "compiles_in_window", "peak_memory_gib")}}
    if step == "parity":
        reports = sorted(folder.glob("time-to-f1-*/report.json"))
        if not reports:
            return {}
        r = read_json(reports[-1])
        return {"result": str(reports[-1].relative_to(folder.parent)), "target_f1": r["target_f1"],
                **{f"{k}_{x}": v.get(x) for k, v in r["recipes"].items()
                   for x in ("final_f1", "final_f1_mean", "final_f1_spread", "train_seconds_to_target",
                             "f1_minus_reference", "verdict") if x in v}}
    results = folder / "all_results.json"
    if not results.exists():
        return {}
    r = read_json(results)
    keys = ("train_samples_per_second", "train_runtime", "train_mfu", "train_real_tokens_per_second",
            "train_peak_memory_gib", "train_peak_rss_gib", "train_batches_padding_fraction", "eval_f1",
            "eval_exact_match", "compile_warmup_s")
    return {**{k: r[k] for k in keys if k in r}, "outputs": sorted(
        p.name for p in folder.iterdir() if p.suffix in (".json", ".md", ".png", ".txt") or p.name == "profile"),
        "profile_operators": (folder / "profile" / "operators.txt").exists()}


def run_step(step, argv, out, deadline):
    """Runs one step's command into OUTDIR/<step>.log; -> its record. A step past the deadline is
    stopped with its process group (its DataLoader workers and compile workers too)."""
    env = dict(os.environ, HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1", PYTHONUNBUFFERED="1")
    if step in ("bench", "variants"):
        env["TORCH_LOGS"] = "recompiles"
    if step == "train":  # its TensorBoard events belong with the proof, whatever the caller's environment says
        env["TENSORBOARD_LOGGING_DIR"] = str(out / step / "runs")
    record = {"command": shlex.join(argv), "started_utc": datetime.now(timezone.utc).isoformat(timespec="seconds")}
    started = time.perf_counter()
    with open(out / f"{step}.log", "w") as log:
        proc = subprocess.Popen(argv, cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            code = proc.wait(timeout=None if deadline is None else max(1.0, deadline - time.time()))
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            code = None
    record["wall_s"] = round(time.perf_counter() - started, 1)
    record["exit_status"] = code
    record["status"] = "ok" if code == 0 else ("stopped at the deadline" if code is None else "failed")
    try:
        record["findings"] = findings(step, out / step)
    except (OSError, KeyError, ValueError, InputError) as exc:  # a failed step can leave partial files
        record["findings"] = {"unreadable": f"{type(exc).__name__}: {exc}"}
    return record


def markdown(proof):
    lines = [f"# Proof of the fast path: {proof['mode']} mode", "",
             f"{proof['device']}; {proof['versions']}; `{proof['host']}`.", "",
             "| step | status | exit | wall s | started (UTC) | log |", "|---|---|---|---|---|---|"]
    for step, r in proof["steps"].items():
        lines.append(f"| {step} | {r['status']} | {r.get('exit_status')} | {r.get('wall_s', '')} | "
                     f"{r.get('started_utc', '')} | [{step}.log]({step}.log) |")
    lines.append("")
    for step, r in proof["steps"].items():
        if r.get("command"):
            lines += [f"## {step}", "", f"`{r['command']}`", ""]
            lines += [f"- {k}: {json.dumps(v)}" for k, v in (r.get("findings") or {}).items()] + [""]
    return "\n".join(lines)


@command
def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("outdir", type=Path)
    parser.add_argument("--cpu", action="store_true", help="tiny sizes on the CPU (no GPU needed)")
    parser.add_argument("--steps", default=",".join(STEPS), help=f"comma-separated, from {', '.join(STEPS)}")
    parser.add_argument("--dev", type=Path, default=squad_dev_path())
    parser.add_argument("--deadline_s", type=float, default=None,
                        help="stop the step running when this many seconds have passed, skip the rest (each "
                        "recorded): for allocations with a time limit per command")
    parser.add_argument("--redo", action="store_true", help="run again the steps OUTDIR has already finished")
    args = parser.parse_args(argv)
    steps = args.steps.split(",")
    for step in steps:
        if step not in STEPS:
            raise InputError("--steps", f"unknown step {step!r}", f"choose from {', '.join(STEPS)}")
    dev = require_squad_dev(args.dev)

    import torch
    import transformers

    on_gpu = torch.cuda.is_available()
    if not on_gpu and not args.cpu:
        raise InputError("bench/gpu_proof.py", "no GPU is visible (torch.cuda.is_available() is False)",
                         "run it on a GPU node, or pass --cpu for the tiny CPU mode")
    mode = "cpu" if args.cpu else "gpu"
    deadline = None if args.deadline_s is None else time.time() + args.deadline_s
    out = args.outdir.resolve()
    out.mkdir(parents=True, exist_ok=True)
    proof_file = out / "proof.json"
    proof = read_json(proof_file) if proof_file.exists() else {"steps": {}}
    if proof.get("mode", mode) != mode:
        raise InputError(str(proof_file), f"holds a {proof['mode']} proof", "give another OUTDIR for this mode")
    proof.update(mode=mode, host=platform.node(), device=torch.cuda.get_device_name(0) if on_gpu else
                 f"CPU {platform.processor() or platform.machine()} x{os.cpu_count()}",
                 versions=f"torch {torch.__version__} (CUDA {torch.version.cuda}), transformers "
                          f"{transformers.__version__}, Python {platform.python_version()}")
    for step in steps:
        if proof["steps"].get(step, {}).get("status") == "ok" and not args.redo:
            print(f"[{step}] already finished in {out}: kept (--redo runs it again)", file=sys.stderr)
            continue
        if deadline is not None and time.time() >= deadline:
            proof["steps"][step] = {"status": "skipped: deadline reached"}
        else:
            print(f"[{step}] running, log {out / (step + '.log')}", file=sys.stderr, flush=True)
            proof["steps"][step] = run_step(step, step_command(step, mode, out, dev, not on_gpu), out, deadline)
            print(f"[{step}] {proof['steps'][step]['status']} in {proof['steps'][step]['wall_s']} s",
                  file=sys.stderr, flush=True)
        atomic_write_json(proof_file, proof, indent=1)
        atomic_write_text(out / "proof.md", markdown(proof))
    failed = [s for s in steps if proof["steps"][s]["status"] != "ok"]
    print(json.dumps({"proof": str(out / "proof.md"), "not_ok": failed}))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
