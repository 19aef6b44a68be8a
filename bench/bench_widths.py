#!/usr/bin/env python
"""What static batch widths cost in padding: SQuAD v1.1 dev's training windows, batched as configs/fast.json batches
them (the Trainer's own length-grouped sampler, batch 48, its seed), each batch padded to the smallest width of a set
that holds it, the epoch's last batch filled to 48 rows with ignored ones (BucketPaddingCollator's `rows`).

    python bench/bench_widths.py [--dev PATH] [--widths 128,192,256,384 ...] [--epochs 2]

Reported per set: the distinct batch shapes (graphs a static whole-model compile makes), the share of the batches'
tokens that are padding, and the tokens computed against fast.json's multiples of 8 (symbolic lengths). No model runs.
"""
import argparse
import json
import sys
import tempfile
from datetime import datetime, timezone
from pathlib import Path

import numpy as np

from bench_input import REPO, fast_trainer  # the script beside this one
from dev_set import squad_dev_path, require_squad_dev
from qa.errors import command

# the least tokens computed for 4, 5 and 6 widths in multiples of 16 (searched on this data), and 8
CANDIDATES = ("multiple_of_8", "144,192,256,384", "144,176,224,288,384", "128,160,192,224,288,384",
              "128,160,192,224,256,288,320,384")


def batches(trainer, epochs: int) -> list:
    """The feature indices of each training batch, epoch after epoch, as the Trainer's sampler draws them."""
    import torch

    sampler, size, out = trainer._get_train_sampler(), trainer.args.per_device_train_batch_size, []
    for epoch in range(epochs):
        torch.manual_seed(trainer.args.seed + epoch)  # the sampler draws from torch's generator
        order = list(sampler)
        out += [order[i:i + size] for i in range(0, len(order), size)]
    return out


def padding(lengths, groups, width_of, rows: int) -> dict:
    widths = np.array([width_of(int(lengths[g].max())) for g in groups])
    real = sum(int(lengths[g].sum()) for g in groups)
    computed = int((widths * rows).sum())  # every batch full: the last one's ignored rows are computed too
    return {"shapes": sorted({int(w) for w in widths}), "padding_fraction": round(1 - real / computed, 4),
            "tokens_computed": computed}


def measure(trainer, epochs: int, candidates) -> dict:
    from qa.data.collate import feature_lengths

    lengths, groups = feature_lengths(trainer.train_dataset), batches(trainer, epochs)
    collator, rows = trainer.data_collator, trainer.args.per_device_train_batch_size
    out = {}
    for name in candidates:
        collator.buckets = () if name == "multiple_of_8" else tuple(int(w) for w in name.split(","))
        out[name] = padding(lengths, groups, collator.target_length, rows)
    base = out["multiple_of_8"]["tokens_computed"]
    for figures in out.values():
        figures["tokens_vs_multiple_of_8"] = round(figures["tokens_computed"] / base, 4)
    return {"features": len(lengths), "batches": len(groups), "rows": rows,
            "length_percentiles": {p: int(np.percentile(lengths, p)) for p in (10, 25, 50, 75, 90, 99)},
            "at_max_length": round(float((lengths == lengths.max()).mean()), 4), "sets": out}


def markdown(r) -> str:
    lines = [f"# Static batch widths: padding on SQuAD v1.1 dev ({r['date_utc']})", "",
             f"`{r['command']}`; {r['features']} training windows at 384/128, {r['batches']} batches of {r['rows']} "
             f"over {r['epochs']} epochs (the Trainer's length-grouped sampler, torch seeded 42 + epoch). Window "
             "lengths: percentiles "
             + ", ".join(f"p{p} {v}" for p, v in r["length_percentiles"].items())
             + f"; {r['at_max_length']:.1%} at 384.", "",
             "| widths | shapes | padding | tokens computed vs multiples of 8 |", "|---|---|---|---|"]
    for name, s in r["sets"].items():
        lines.append(f"| {name} | {len(s['shapes'])} | {s['padding_fraction']:.1%} | "
                     f"{s['tokens_vs_multiple_of_8']:.3f} |")
    return "\n".join(lines) + "\n"


@command
def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--dev", type=Path, default=squad_dev_path())
    parser.add_argument("--config", type=Path, default=REPO / "configs" / "fast.json")
    parser.add_argument("--widths", nargs="+", default=list(CANDIDATES),
                        help="sets of widths, each comma-separated ('multiple_of_8' is always measured)")
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--max_train_samples", type=int, default=None, help="first N questions (tests)")
    parser.add_argument("--features_cache_dir", type=Path, default=None, help="default: a training run's")
    parser.add_argument("--out", type=Path, default=REPO / "bench" / "results")
    args = parser.parse_args(argv)
    args.dev = require_squad_dev(args.dev)
    from qa.io import atomic_write_json, atomic_write_text

    with tempfile.TemporaryDirectory(prefix="bench-widths-") as tmp:
        trainer = fast_trainer(args, tmp)[0]
        candidates = ["multiple_of_8", *(w for w in args.widths if w != "multiple_of_8")]
        report = {"benchmark": "bench/bench_widths.py", "command": " ".join(
                  ["python bench/bench_widths.py", *(sys.argv[1:] if argv is None else argv)]),
                  "date_utc": datetime.now(timezone.utc).isoformat(timespec="seconds"), "epochs": args.epochs,
                  **measure(trainer, args.epochs, candidates)}
    stem = f"widths-squad-dev-{datetime.now(timezone.utc).strftime('%Y%m%dT%H%M%SZ')}"
    args.out.mkdir(parents=True, exist_ok=True)
    atomic_write_json(args.out / f"{stem}.json", report, indent=1)
    atomic_write_text(args.out / f"{stem}.md", markdown(report))
    print(markdown(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
