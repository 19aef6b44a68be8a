"""Benchmark: post-processing the whole SQuAD v1.1 dev set, reference loop vs vectorised.

Tokenizes every dev question (10,784 features at max_seq_length 384, doc_stride 128, with the
bert-base-uncased vocabulary of the bundled MiniLM) into a datasets table, as the QA Trainer passes them,
draws random logits with a fixed seed, times both implementations (the reference loop is
bench/postprocess_reference.py) in this one process (best of --repeat, wall clock and CPU time), checks that
they give identical results, and prints one JSON line. Exits 1 if the results differ.

    python bench/bench_postprocess.py [--v2] [--repeat 3] [--seed 0] [--dev PATH]

Wall time counts waiting for a busy CPU; the CPU times (and load_avg_1m) tell when it did.
"""
import argparse
import json
import os
import platform
import sys
import time
from pathlib import Path

import numpy as np

from dev_set import require_squad_dev, squad_dev_path  # these two beside this script
from postprocess_reference import postprocess_qa_predictions_reference
from qa.data.sources import read_squad
from qa.errors import command
from utils_qa import prepare_validation_features
from qa.model import bundled_minilm_dir
from utils_qa import rank_answers


def load_examples(path):
    return read_squad(path).dataset.select_columns(["id", "question", "context"]).to_dict()


def best_of(repeat, fn, *args, **kwargs):
    """(result, best wall seconds, best CPU seconds) over `repeat` runs."""
    walls, cpus = [], []
    for _ in range(repeat):
        wall, cpu = time.perf_counter(), time.process_time()
        result = fn(*args, **kwargs)
        walls.append(time.perf_counter() - wall)
        cpus.append(time.process_time() - cpu)
    return result, min(walls), min(cpus)


@command
def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--dev", type=Path, default=squad_dev_path(), help="SQuAD v1.1 dev JSON (.gz)")
    parser.add_argument("--v2", action="store_true", help="post-process as SQuAD v2 (null answers)")
    parser.add_argument("--repeat", type=int, default=3, help="runs per implementation (best kept)")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)

    from datasets import Dataset
    from transformers import AutoTokenizer

    t0 = time.perf_counter()
    examples = load_examples(require_squad_dev(args.dev))
    tokenizer = AutoTokenizer.from_pretrained(bundled_minilm_dir())
    features = prepare_validation_features(examples, tokenizer, max_seq_length=384, doc_stride=128,
                                           max_query_length=64, pad_to_max_length=True)
    features = Dataset.from_dict({k: features[k] for k in ("example_id", "offset_mapping")})
    tokenize_s = time.perf_counter() - t0
    n = len(features)
    rng = np.random.default_rng(args.seed)
    start = rng.standard_normal((n, 384), dtype=np.float32)
    end = rng.standard_normal((n, 384), dtype=np.float32)

    kwargs = {"version_2_with_negative": args.v2}
    reference, ref_s, ref_cpu = best_of(args.repeat, postprocess_qa_predictions_reference,
                                        examples, features, start, end, **kwargs)
    vectorised, vec_s, vec_cpu = best_of(args.repeat, rank_answers,
                                         examples, features, start, end, **kwargs)
    identical = vectorised == reference
    print(json.dumps({
        "benchmark": "rank_answers, SQuAD v1.1 dev, random logits",
        "version_2_with_negative": args.v2,
        "examples": len(examples["id"]),
        "features": n,
        "seed": args.seed,
        "repeat": args.repeat,
        "reference_s": round(ref_s, 3),
        "vectorised_s": round(vec_s, 3),
        "speedup": round(ref_s / vec_s, 1),
        "reference_cpu_s": round(ref_cpu, 3),
        "vectorised_cpu_s": round(vec_cpu, 3),
        "identical": identical,
        "non_empty_predictions": sum(p != "" for p in vectorised[0].values()),
        "tokenize_s": round(tokenize_s, 1),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "numpy": np.__version__,
        "cpu_count": os.cpu_count(),
        "load_avg_1m": round(os.getloadavg()[0], 2),
    }))
    return 0 if identical else 1


if __name__ == "__main__":
    sys.exit(main())
