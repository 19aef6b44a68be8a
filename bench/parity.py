#!/usr/bin/env python
"""Accuracy parity: fine-tune the bundled pretrained MiniLM (a 6-layer BERT on the bert-base-uncased
vocabulary) with the reference path and with the fast path on the same split of the SQuAD v1.1
dev set (train on some articles, evaluate on the others), and report both F1s.

    python bench/parity.py --size gpu     # 384/128, train articles 0:36 (8,123 questions), evaluate 36: (2,447)
    python bench/parity.py --size cpu     # 192/64, train 1:4 (870 questions), evaluate 44: (756); ~10 min on 2 cores

Runs (plain `run_qa.py` processes, the same data, seed and number of epochs):
- `reference`: configs/reference.json's recipe: padded to max_seq_length, batch 12, lr 3e-5, fp32;
- `fast_b12`: the fast path's speed switches (bf16, sdpa, dynamic padding, length grouping, fused
  AdamW, compile on a GPU...) with the reference's batch 12 and lr 3e-5: isolates what the
  switches do to the numbers;
- `fast`: configs/fast.json as it is (batch 48, lr 1e-4, 10% warm-up).
On a CPU: no TF32 and no torch.compile (as in bench/run_bench.py), one thread per run, two runs
at a time. MiniLM on a part of the dev set is not bert-base on the training set: this checks
that the fast path learns as well as the reference on real data; the F1 target (within 0.5 of
the reference) is for the full bert-base run (see bench/README.md).
"""
import argparse
import json
import os
import platform
import shlex
import shutil
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime, timezone
from pathlib import Path

from run_bench import RESULTS, REFERENCE, _slug, variant_settings  # the script beside this one

from qa.cmdline import to_flags
from qa.data.sources import require_squad_dev, squad_dev_path
from qa.errors import command
from qa.io import read_json

REPO = Path(__file__).resolve().parents[1]

SIZES = {
    "gpu": dict(max_seq_length=384, doc_stride=128, max_query_length=64, train_articles="0:36",
                validation_articles="36:", epochs=2, jobs=1),
    "cpu": dict(max_seq_length=192, doc_stride=64, max_query_length=32, train_articles="1:4",
                validation_articles="44:", epochs=2, jobs=2),
}
RUNS = ("reference", "fast_b12", "fast")


def settings_of(name, on_gpu, fast_overrides=None):
    if name == "reference":
        return dict(REFERENCE), []
    settings, notes = variant_settings("fast", on_gpu, cpu_compile=False)
    if name == "fast_b12":
        settings.update(per_device_train_batch_size=REFERENCE["per_device_train_batch_size"],
                        learning_rate=REFERENCE["learning_rate"])
        settings.pop("warmup_steps", None)
    elif fast_overrides:
        settings.update(fast_overrides)
        notes = notes + [f"fast run with {json.dumps(fast_overrides)}"]
    return settings, notes


def run_one(name, args, size, work, on_gpu):
    settings, notes = settings_of(name, on_gpu, args.fast_overrides)
    out = work / name
    shutil.rmtree(out, ignore_errors=True)
    argv = ["--model_name_or_path", args.model, "--train_file", str(args.dev), "--validation_file", str(args.dev),
            "--train_articles", size["train_articles"], "--validation_articles", size["validation_articles"],
            "--do_train", "--do_eval", "--num_train_epochs", str(size["epochs"]),
            "--max_seq_length", str(size["max_seq_length"]), "--doc_stride", str(size["doc_stride"]),
            "--max_query_length", str(size["max_query_length"]), "--per_device_eval_batch_size",
            str(args.eval_batch_size), "--seed", str(args.seed), "--output_dir", str(out), "--resume", "never",
            "--report_to", "none", "--save_strategy", "no", "--logging_steps", "50", "--disable_tqdm", "true",
            "--features_cache_dir", str(work / "features"), *to_flags(settings)]
    if not on_gpu:
        argv += ["--use_cpu", "true"]
    env = dict(os.environ, HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1", PYTHONUNBUFFERED="1")
    if not on_gpu:
        env["OMP_NUM_THREADS"] = "1"
    print(f"[{name}] python run_qa.py {' '.join(shlex.quote(a) for a in argv)}", file=sys.stderr, flush=True)
    started = time.perf_counter()
    with open(work / f"log-{name}.txt", "w") as log:
        proc = subprocess.run([sys.executable, str(REPO / "run_qa.py"), *argv], cwd=REPO, env=env, stdout=log,
                              stderr=subprocess.STDOUT)
    if proc.returncode != 0:
        raise SystemExit(f"{name} failed (exit {proc.returncode}):\n{(work / f'log-{name}.txt').read_text()[-3000:]}")
    r = read_json(out / "all_results.json")
    steps = read_json(out / "trainer_state.json")["global_step"]
    for f in out.glob("*.safetensors"):
        f.unlink()
    keys = ("eval_f1", "eval_exact_match", "eval_loss", "train_loss", "train_runtime", "train_samples_per_second",
            "eval_runtime", "train_examples", "train_features", "eval_examples", "epoch", "WALL_CLOCK_SECONDS")
    return {"settings": settings, "notes": notes, "run_qa_args": argv, "optimizer_steps": steps, "wall_s": round(time.perf_counter() - started, 1),
            **{k: r.get(k) for k in keys}}


def markdown(report):
    lines = [f"# Accuracy parity: {report['size']} size on {report['device']}", "",
             f"{report['date_utc']} on `{report['host']}`; torch {report['versions']['torch']}, transformers "
             f"{report['versions']['transformers']}. Command: `{report['command']}`", "",
             f"Model: {report['model']} (pretrained MiniLM, 6 layers, hidden 384). Data: {report['data']}.", "",
             "| run | batch | lr | optimizer steps | eval F1 | eval EM | eval loss | train loss (mean) | train s | samples/s |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for name, r in report["runs"].items():
        s = r["settings"]
        lines.append(f"| {name} | {s.get('per_device_train_batch_size')} | {s.get('learning_rate')} | {r['optimizer_steps']} | "
                     f"{r['eval_f1']:.2f} | {r['eval_exact_match']:.2f} | {r['eval_loss']:.3f} | {r['train_loss']:.3f} | "
                     f"{r['train_runtime']:.0f} | {r['train_samples_per_second']:.1f} |")
    if report["f1_minus_reference"]:
        lines += ["", "F1 differences from the reference: " + ", ".join(
            f"{k} {v:+.2f}" for k, v in report["f1_minus_reference"].items()) + ".", ""]
    else:
        lines += [""]
    lines += ["`fast_b12` has every speed switch of the fast path at the reference's batch and learning rate; "
              "`fast` is configs/fast.json's recipe (see its batch and lr above), with 4x fewer optimizer steps: "
              "a few dozen on a split this small, 3,700 on the full training set.", ""]
    if report["notes"]:
        lines += ["Adjustments for this device: " + "; ".join(report["notes"]) + ".", ""]
    if not report["gpu_available"]:
        lines += ["No GPU was available: the runs ran on the CPU, without TF32 and without torch.compile.", ""]
    return "\n".join(lines)


@command
def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--size", choices=sorted(SIZES), default="gpu")
    parser.add_argument("--dev", type=Path, default=squad_dev_path())
    parser.add_argument("--model", default="bundled:minilm")
    parser.add_argument("--runs", default=",".join(RUNS), help=f"comma-separated, from {', '.join(RUNS)}")
    parser.add_argument("--epochs", type=float, default=None)
    parser.add_argument("--train_articles", default=None)
    parser.add_argument("--validation_articles", default=None)
    parser.add_argument("--eval_batch_size", type=int, default=64)
    parser.add_argument("--seed", type=int, default=42)
    parser.add_argument("--fast_overrides", type=json.loads, default=None,
                        help='JSON of run_qa settings for the "fast" run, e.g. \'{"learning_rate": 1e-4}\'')
    parser.add_argument("--jobs", type=int, default=None, help="runs at a time (default: 1 on a GPU, 2 on a CPU)")
    parser.add_argument("--out", type=Path, default=RESULTS)
    parser.add_argument("--work", type=Path, default=RESULTS / "tmp" / "parity")
    args = parser.parse_args(argv)
    args.dev = require_squad_dev(args.dev)
    size = dict(SIZES[args.size])
    for key in ("epochs", "train_articles", "validation_articles"):
        if getattr(args, key) is not None:
            size[key] = getattr(args, key)

    import torch
    import transformers

    on_gpu = torch.cuda.is_available()
    device = torch.cuda.get_device_name(0) if on_gpu else f"CPU {platform.processor() or platform.machine()} x{os.cpu_count()}"
    runs = args.runs.split(",")
    args.work.mkdir(parents=True, exist_ok=True)
    jobs = args.jobs or (1 if on_gpu else size["jobs"])
    if on_gpu:
        jobs = 1  # one device: concurrent runs would time each other
    # In order: with 2 at a time, reference and fast_b12 start together; fast follows and reuses
    # fast_b12's cached features (the same unpadded windows).
    with ThreadPoolExecutor(max_workers=jobs) as pool:
        futures = {name: pool.submit(run_one, name, args, size, args.work, on_gpu) for name in runs}
        results = {name: f.result() for name, f in futures.items()}
    ref = results.get("reference")
    now = datetime.now(timezone.utc)
    notes = sorted({n for r in results.values() for n in r["notes"]})
    report = {
        "benchmark": "bench/parity.py", "size": args.size,
        "command": "python bench/parity.py " + " ".join(shlex.quote(a) for a in (sys.argv[1:] if argv is None else argv)),
        "date_utc": now.isoformat(timespec="seconds"), "host": platform.node(), "device": device,
        "gpu_available": on_gpu,
        "versions": {"torch": torch.__version__, "transformers": transformers.__version__, "cuda": torch.version.cuda},
        "model": args.model,
        "data": f"{args.dev.name}, train articles {size['train_articles']}, evaluation articles "
                f"{size['validation_articles']}, {size['max_seq_length']}/{size['doc_stride']}/"
                f"{size['max_query_length']}, {size['epochs']} epochs, seed {args.seed}",
        "runs": results,
        "f1_minus_reference": {k: round(v["eval_f1"] - ref["eval_f1"], 2) for k, v in results.items()
                               if ref and k != "reference"},
        "notes": notes,
        "parallel_runs": jobs,
    }
    args.out.mkdir(parents=True, exist_ok=True)
    stem = f"parity-{args.size}-{_slug(device)}-{now.strftime('%Y%m%dT%H%M%SZ')}"
    (args.out / f"{stem}.json").write_text(json.dumps(report, indent=1) + "\n")
    (args.out / f"{stem}.md").write_text(markdown(report))
    print(json.dumps({"json": str(args.out / f"{stem}.json"),
                      "f1": {k: v["eval_f1"] for k, v in results.items()}}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
