#!/usr/bin/env python
"""CPU side: where feature preparation spends its time, and what a cached rerun costs.

    python bench/bench_features.py [--dev PATH] [--out bench/results]

On the SQuAD v1.1 dev set (10,570 questions; the train set is not available offline) with the
bert-base-uncased vocabulary (the bundled MiniLM's tokenizer), at 384/128/64:

1. `prepare_train_features` taken apart, as one batch: question truncation (a tokenizer
   call), the pair tokenization into windows (the tokenizer, Rust, plus its conversion to
   Python lists), and the labelling (per window: sequence ids, context range, answer span);
   plus the cost of merely converting the windows' offsets to a numpy array, the first step
   of any numpy labelling;
2. the whole path run_qa.py takes (`qa.data.cache.cached_features`: datasets.map in batches of
   1,000, written as Arrow) for training features padded to 384 (reference) and unpadded
   (fast path), first a miss (tokenizes), then a hit (hashes the examples, memory-maps the
   Arrow files, never calls the tokenizer);
3. projections to the 87,599 training questions, in proportion to the questions.

Times are wall clock and process CPU time (the CPU time tells when a busy machine stretched
the wall clock); the load average is recorded. Writes features-<time>.json and .md.
"""
import argparse
import json
import os
import platform
import sys
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path

from dev_set import require_squad_dev, squad_dev_path  # the script beside this one
from qa.errors import command

REPO = Path(__file__).resolve().parents[1]

SQUAD_TRAIN_QUESTIONS = 87_599
PARAMS = dict(max_seq_length=384, doc_stride=128, max_query_length=64)


def timed(fn, *args, **kwargs):
    wall, cpu = time.perf_counter(), time.process_time()
    result = fn(*args, **kwargs)
    return result, {"wall_s": round(time.perf_counter() - wall, 3), "cpu_s": round(time.process_time() - cpu, 3)}


def breakdown(examples, tokenizer):
    import numpy as np

    import utils_qa as F

    batch = {k: examples[k] for k in ("id", "question", "context", "answers")}
    out = {}
    questions, out["truncate_questions"] = timed(F.truncate_questions, batch["question"], tokenizer,
                                                 PARAMS["max_query_length"])
    enc, out["pair_tokenization_padded"] = timed(
        tokenizer, questions, batch["context"], truncation="only_second", max_length=PARAMS["max_seq_length"],
        stride=PARAMS["doc_stride"], return_overflowing_tokens=True, return_offsets_mapping=True,
        padding="max_length")
    sample_of = enc["overflow_to_sample_mapping"]

    def labelling():
        return [F._labels(enc, i, batch["answers"][s]) for i, s in enumerate(sample_of)]

    labels, out["labelling_loop"] = timed(labelling)
    _, out["sequence_ids_only"] = timed(lambda: [enc.sequence_ids(i) for i in range(len(sample_of))])
    _, out["offsets_to_numpy_only"] = timed(np.asarray, enc["offset_mapping"], dtype=np.int32)
    _, out["prepare_train_features_total"] = timed(F.prepare_train_features, batch, tokenizer, **PARAMS)
    out["features"] = len(labels)
    return out


def cache_path(examples, tokenizer, pad, cache_dir):
    from qa.data.cache import cached_features
    from utils_qa import prepare_train_features

    params = dict(PARAMS, pad_to_max_length=pad)
    run = lambda: cached_features(examples, tokenizer, prepare_train_features, params, cache_dir=cache_dir)  # noqa
    (feats, hit1), miss = timed(run)
    (feats2, hit2), hit = timed(run)
    assert not hit1 and hit2, (hit1, hit2)
    assert feats2.num_rows == feats.num_rows
    size = sum(f.stat().st_size for f in Path(cache_dir).rglob("*.arrow"))
    return {"miss": miss, "hit": hit, "features": feats.num_rows, "arrow_bytes": size}


def markdown(r):
    b, q = r["breakdown"], r["questions"]
    scale = SQUAD_TRAIN_QUESTIONS / q

    def row(name, key):
        t = b[key]
        return f"| {name} | {t['wall_s']:.2f} | {t['cpu_s']:.2f} | {t['cpu_s'] * scale:.1f} |"

    lines = [
        "# Feature preparation (CPU side)", "",
        f"{r['date_utc']} on `{r['host']}` ({r['cpu']}, {r['cores']} cores, load average {r['load_avg']}); "
        f"command `{r['command']}`.", "",
        f"SQuAD v1.1 dev: {q:,} questions -> {b['features']:,} training features at 384/128/64, "
        "bert-base-uncased vocabulary. Last column: CPU seconds scaled to the 87,599 training questions.", "",
        "| step (one batch of all questions) | wall s | CPU s | CPU s, train set |", "|---|---|---|---|",
        row("question truncation (tokenizer)", "truncate_questions"),
        row("pair tokenization into windows, padded (tokenizer)", "pair_tokenization_padded"),
        row("labelling loop (sequence ids, context range, span)", "labelling_loop"),
        row("  of which: sequence ids alone", "sequence_ids_only"),
        row("offsets -> numpy array alone (no labelling yet)", "offsets_to_numpy_only"),
        row("prepare_train_features, whole", "prepare_train_features_total"),
        "", "Through run_qa.py's path (`qa.data.cache.cached_features`, datasets.map, Arrow on disk):", "",
        "| training features | miss: wall s | miss: CPU s | hit: wall s | hit: CPU s | on disk |",
        "|---|---|---|---|---|---|",
    ]
    for name, c in r["cache"].items():
        lines.append(f"| {name} | {c['miss']['wall_s']:.2f} | {c['miss']['cpu_s']:.2f} | {c['hit']['wall_s']:.2f} | "
                     f"{c['hit']['cpu_s']:.2f} | {c['arrow_bytes'] / 2**20:.0f} MiB |")
    lab = b["labelling_loop"]["cpu_s"] / b["prepare_train_features_total"]["cpu_s"]
    lines += ["", f"The labelling loop is {lab:.0%} of `prepare_train_features`; converting the offsets to numpy "
              f"alone costs {b['offsets_to_numpy_only']['cpu_s'] / max(b['labelling_loop']['cpu_s'], 1e-9):.1f}x "
              "the whole loop, so a numpy labelling cannot pay here: the tokenizer (Rust, plus the conversion of its "
              "output to Python lists) is the cost. `--preprocessing_num_workers N` splits it over N processes, "
              "and the cache makes every later run (and every other rank) skip it: a hit costs a hash of the "
              "examples and a memory map.", ""]
    return "\n".join(lines)


@command
def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--dev", type=Path, default=squad_dev_path())
    parser.add_argument("--out", type=Path, default=REPO / "bench" / "results")
    args = parser.parse_args(argv)
    args.dev = require_squad_dev(args.dev)

    from transformers import AutoTokenizer

    from qa.data.sources import read_squad
    from qa.model import bundled_minilm_dir

    load = [os.getloadavg()]
    examples = read_squad(args.dev).dataset
    tokenizer = AutoTokenizer.from_pretrained(bundled_minilm_dir())
    tokenizer(["warm up"], ["the tokenizer"])
    columns = {k: examples[k][:] for k in ("id", "question", "context", "answers")}
    report = {"benchmark": "bench/bench_features.py", "command": ("python bench/bench_features.py " + " ".join(
        sys.argv[1:] if argv is None else argv)).strip(), "date_utc": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "host": platform.node(), "cpu": platform.processor() or platform.machine(), "cores": os.cpu_count(),
        "questions": examples.num_rows, "params": PARAMS}
    report["breakdown"] = breakdown(columns, tokenizer)
    report["cache"] = {}
    for name, pad in (("padded to 384 (reference)", True), ("unpadded (fast path)", False)):
        with tempfile.TemporaryDirectory() as tmp:
            report["cache"][name] = cache_path(examples, tokenizer, pad, tmp)
    load.append(os.getloadavg())
    report["load_avg"] = [[round(x, 2) for x in la] for la in load]
    now = datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / f"features-{now}.json").write_text(json.dumps(report, indent=1) + "\n")
    (args.out / f"features-{now}.md").write_text(markdown(report))
    print(json.dumps({"json": str(args.out / f"features-{now}.json"),
                      "labelling_share": report["breakdown"]["labelling_loop"]["cpu_s"]
                      / report["breakdown"]["prepare_train_features_total"]["cpu_s"],
                      "cache": {k: (v["miss"], v["hit"]) for k, v in report["cache"].items()}}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
