#!/usr/bin/env python
"""The proof of the fast path on one GPU, in pieces that add up across calls: each call runs a preflight, then
the pieces still missing, in order of value, while its time budget lasts; what comes back is packed small.

    python bench/gpu_proof.py run OUT [--budget_s 420]   # on the GPU machine: OUT gets 3 files
    python bench/gpu_proof.py collect DIR                # here: a call's files into bench/results/gpu/
    python bench/gpu_proof.py report                     # proof.md rebuilt from every committed piece
    python bench/gpu_proof.py run OUT --cpu ...          # the CPU rehearsal: the same call at tiny size

Pieces, in order of value (bench/README.md has the prepared call and the estimates):
  bench       run_bench.py: reference_bf16 against fast, one process each, same call and device (the ratio,
              MFU on real tokens, the projected 2 epochs, compilations in the window, peak memory, compile outcome)
  train       one run_qa.py training with configs/fast.json (a random bert-base: it costs what the pretrained one
              costs), dev articles 0:42, 1 epoch, evaluated on 42:, telemetry, a bounded profile, TensorBoard
  parity-*    parity.py, one run per piece: the reference and the fast recipe, seeds 42 and 43 (the MiniLM): the
              accuracy half of the claim (the rehearsal fine-tunes the tiny BERT: its runs, not its F1, are rehearsed)
  attempts    run_bench.py: reference_bf16, fast and the changes the GPU profile points to (ATTEMPT_VARIANTS, the
              cheapest first) in one process each, with each variant's GPU-busy share from a profile of the steps
              before its window; as many as fit its estimates (about 6 minutes on an H100), the rest in later calls
              (each beside that call's own reference_bf16 and fast), merged into one record by `collect`
  train-warm  the same training again from the compile cache train filled (cold against warm compile warm-up, and
              the wall-clock breakdown of both); after train, in the same call (train runs again first if done)
  check       the check job (`--check`) of train's command, compiling into a cache of its own: its verdict, the GPU
              lines, and its predicted time against train's measured wall clock; after train, in the same call (the
              rehearsal's check reads train's cache: see CHECK_CACHE)
  variants    run_bench.py: reference (fp32), fast_no_compile, fast_static64
Each piece records the hash of the settings it ran (recipe_hash: configs/fast.json's included): a piece, or an attempt,
of an older recipe counts as missing again, and the report says which.
The run_bench.py pieces of a call share one compile cache (bench's own, not train's): fast, in bench and in each
attempt, is compiled once per call (its compile warm-up is cold only in the first of them).
A piece counts as done only when it ran to its end and every compiled variant compiled (dynamo's counters show
graphs and no frame fell back to eager) with nothing compiled in a timed window. The deadline counts from the
process's start; each step runs in its own process group, stopped with it at the deadline or on SIGTERM; each
piece's record and the packed files are written as soon as it ends, so a stopped call keeps what it finished.
"""
import argparse
import hashlib
import json
import os
import platform
import shlex
import shutil
import signal
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path

import psutil

from dev_set import require_squad_dev, squad_dev_path  # the script beside this one
from qa.errors import InputError, command
from qa.io import atomic_write_json, atomic_write_text, read_json

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "bench" / "results" / "gpu"
PARITY = [f"parity-{recipe}-{seed}" for seed in (42, 43) for recipe in ("reference", "fast")]
# train-warm: the same training again, after train in the same call, from the compile cache train filled
# First what the host-bound GPU step needs measured (docs/benchmarks.md, "Host cost per step"): the attempts, then the
# fast recipe's accuracy on the GPU
PIECES = ["attempts", "parity-fast-42", "bench", "train", *(p for p in PARITY if p != "parity-fast-42"), "train-warm",
          "check", "variants"]
# The changes the GPU profile points to, the largest expected gain first: CUDA graphs over the whole model (where the
# capture fails the variant measures the whole-model compile alone, and its cuda_graphs record says so).
ATTEMPT_VARIANTS = ["fast_cudagraphs", "fast_whole_model", "fast_b128", "fast_b256"]
BASE_VARIANTS = ["reference_bf16", "fast"]  # beside every attempt, in its call
# run_bench.py's variants of the pieces that benchmark (attempts: BASE_VARIANTS and the attempts that fit).
BENCH_VARIANTS = {"bench": "reference_bf16,fast", "attempts": None, "variants": "reference,fast_no_compile,fast_static64"}
ATTEMPTS_S = 480  # what the attempts piece may take in one call (the prepared call's 540 s, less the preflight)
# Seconds each piece is expected to take before it ran to its end (GPU: measured on one H100 where a piece has
# run, 2026-11-26, else from the published A100 rate and an H100's ~3x bf16; CPU: the rehearsal's tiny sizes on 2
# cores). Measured ones replace them (estimate()).
ESTIMATES = {"gpu": {"preflight": 45, "bench": 200, "train": 110, "train-warm": 90, "check": 150, "variants": 300,
                     "parity-reference-42": 105, "parity-reference-43": 105, "parity-fast-42": 240,
                     "parity-fast-43": 240},
             "cpu": {"preflight": 30, "bench": 90, "train": 100, "train-warm": 60, "check": 60, "variants": 150,
                     **dict.fromkeys(PARITY, 30)}}
# The attempts piece's variants, each in seconds with its 10-s window. On one H100 (bench piece, 2026-11-26): the
# data and model before the first variant 18 s; reference_bf16 26 s outside its warm-up and window; fast 48 s, and
# 54 s of cold compile warm-up. Warm compiles (the call's shared cache) and the whole-model compiles (one graph with
# symbolic lengths, 12 layers where fast compiles one; CUDA graphs recorded at 6 widths) are guesses.
# CPU: the rehearsal on the 2-core VM, 2026-11-27 (its 8 variants took 500 s with other jobs on the cores).
VARIANT_ESTIMATES = {"gpu": {"setup": 18, "reference_bf16": 40, "fast": 112, "fast_b256": 80, "fast_b128": 75,
                             "fast_whole_model": 200, "fast_cudagraphs": 250},
                     "cpu": {"setup": 5, "reference_bf16": 10, "fast": 70, "fast_b256": 30, "fast_b128": 20,
                             "fast_whole_model": 45, "fast_cudagraphs": 55}}
ATTEMPT_WINDOW = {"gpu": ["--timed_samples", "2400", "--window_min_s", "10", "--profile_steps", "3"],
                  "cpu": ["--warmup_steps", "3", "--profile_steps", "1"]}
PACK_MARGIN_S = 15  # kept back at the end of a call for packing
LIMITS = {"files": 8, "file_bytes": 16 * 2**20, "total_bytes": 64 * 2**20}
KEEP = {".json", ".md", ".txt", ".log", ".png", ".csv"}  # what comes back; never weights or caches
SKIP_DIRS = {"models", "features", "hf"}
SKIP_FILES = {"tokenizer.json", "tokenizer_config.json", "vocab.txt", "special_tokens_map.json", "predictions.json",
              "nbest_predictions.json"}  # the model's files and the answers: large, and no figure of the proof
TRACE_BUDGET = 12 * 2**20  # compressed traces go in while the archive stays under this

CPU_TRAIN = ["--train_articles", "2:3", "--validation_articles", "42:43", "--max_seq_length", "128", "--doc_stride",
             "48", "--max_query_length", "32", "--use_cpu", "true", "--tf32", "false", "--dataloader_num_workers", "1",
             "--per_device_eval_batch_size", "64"]
CPU_BENCH = ["--cpu_compile", "--repeat", "1", "--max_train_samples", "120", "--timed_samples", "48",
             "--warmup_steps", "1"]
# The parity pieces' model: on a GPU parity.py's own (the MiniLM: its F1 is the claim). The rehearsal checks the
# runs, curves and report, not the F1: the tiny BERT takes them through the same recipes and trains about 20 times
# faster on a CPU (a piece about 14 s instead of 80-130).
PARITY_MODEL = {"gpu": None, "cpu": "bundled:tiny-bert"}
# The check job's compile cache, under work/work. On a GPU a cold one of its own: its prediction includes the compile
# warm-up it measured, set against train's cold compile in the same call. The rehearsal's check reads the cache train
# filled (run_qa.py's default under --features_cache_dir): there the ratio is computed but never held to its 30%, and
# a second cold compile was about a third of the check piece's time on a CPU.
CHECK_CACHE = {"gpu": "check-compile", "cpu": "features/torch_compile"}


def piece_command(piece, mode, work, dev, attempts=()):
    """argv of a piece (this repository's scripts) writing into work/<piece> (parity pieces: work/parity)."""
    py, cpu = [sys.executable], mode == "cpu"
    folder = work / piece
    if piece in BENCH_VARIANTS:
        variants = BENCH_VARIANTS[piece] or ",".join([*BASE_VARIANTS, *attempts])
        extra = ATTEMPT_WINDOW[mode] if piece == "attempts" else []
        return py + [str(REPO / "bench" / "run_bench.py"), "--size", mode, "--train_file", str(dev), "--variants",
                     variants, *(CPU_BENCH if cpu else []), *extra, "--out", str(folder),
                     "--work", str(work / "work" / piece),  # and bench's compile cache, where run_qa.py puts it
                     "--compile_cache_dir", str(work / "work" / "bench" / "features" / "torch_compile")]
    if piece.startswith("parity-"):
        _, recipe, seed = piece.split("-")
        model = ["--model", PARITY_MODEL[mode]] if PARITY_MODEL[mode] else []
        return py + [str(REPO / "bench" / "parity.py"), "--size", "smoke" if cpu else "gpu", "--dev", str(dev),
                     "--recipes", recipe, "--seeds", seed, "--out", str(work / "parity"),
                     "--work", str(work / "work" / piece), *model]
    from run_bench import SIZES  # the script beside this one

    from qa.model import build_random_bert

    shape = SIZES[mode]["model"]
    model = build_random_bert(work / "work" / "models" / ("bert-" + "-".join(map(str, shape.values()))), shape)
    check = ["--check", "--compile_cache_dir", str(work / "work" / CHECK_CACHE[mode])] if piece == "check" else []
    return py + [str(REPO / "run_qa.py"), str(REPO / "configs" / "fast.json"), "--model_name_or_path", str(model),
                 "--train_file", str(dev), "--validation_file", str(dev), "--num_train_epochs", "1",
                 *(CPU_TRAIN if cpu else ["--train_articles", "0:42", "--validation_articles", "42:"]),
                 "--output_dir", str(folder), "--resume", "never", "--disable_tqdm", "true",
                 "--report_to", *(["tensorboard", "--profile", "true"] if piece == "train" else ["none"]),
                 "--features_cache_dir", str(work / "work" / "features"), *check]  # its compile cache: train-warm's too


def verdict(piece, folder, code) -> tuple:
    """-> (status, findings) of a piece that ended with exit status `code`, from its own result files."""
    if piece in BENCH_VARIANTS:
        reports = sorted(folder.glob("bench-*.json"))
        if not reports:
            return "failed", {"why": f"exit status {code}, no report"}
        r = read_json(reports[-1])
        keys = ("samples_per_second", "real_tokens_per_second", "mfu_real", "tflops_per_second_real_6n",
                "projected_2_epochs_s", "compiles_in_window", "peak_memory_gib", "compiled", "cuda_graphs",
                "warmup_s", "compile_warmup_s", "padding_fraction", "device_busy_share", "host_waits", "process_wall_s")
        found = {"report": reports[-1].name, "variants": {v: {k: s.get(k) for k in keys} for v, s in r["variants"].items()},
                 "ratios": r["ratios"], "failed": {v: f["why"] for v, f in r.get("failed", {}).items()},
                 "peak_tflops": r["peak"]["tflops"]}
        for v, figures in found["variants"].items():  # each ratio within this call
            figures.update(recipe_hash=recipe_hash(v), **{f"x_{base}": (r["ratios"].get(f"{v}/{base}") or {}).get(
                "real_tokens_per_second") for base in BASE_VARIANTS if v != base})
        windows_clean = all(s.get("compiles_in_window") == 0 for s in r["variants"].values())
        ok = code == 0 and not found["failed"] and windows_clean
        return ("ok" if ok else "failed"), found
    if piece.startswith("parity-"):
        _, recipe, seed = piece.split("-")
        runs = sorted(folder.parent.glob(f"parity/time-to-f1-*/runs/{recipe}-seed{seed}.json"))
        if code != 0 or not runs:
            return "failed", {"why": f"exit status {code}"}
        r = read_json(runs[-1])
        found = {k: r.get(k) for k in ("eval_f1", "eval_exact_match", "train_seconds_excluding_evaluation",
                                        "train_examples", "eval_examples", "compiled")}
        if found["compiled"] not in (None, "yes"):  # a recipe that compiles and fell back is no figure of it
            return "failed", {**found, "why": f"torch.compile {found['compiled']}"}
        return "ok", found
    if piece == "check":
        if not (folder / "check.json").exists():
            return "failed", {"why": f"exit status {code}, no check.json"}
        r = read_json(folder / "check.json")
        found = {"verdict": r["verdict"], "checks": {c["check"]: c["text"] for c in r["checks"]},
                 "predicted": r["predicted"], "measured": r["measured"]}
        return ("ok" if code == 0 and r["ready"] else "failed"), found
    results = folder / "all_results.json"
    if not results.exists():
        return "failed", {"why": f"exit status {code}, no all_results.json"}
    r = read_json(results)
    keys = ("compiled", "train_samples_per_second", "train_runtime", "train_mfu", "train_real_tokens_per_second",
            "train_real_tokens_per_second_measured", "train_data_loading_share", "train_profile_device_busy_share",
            "train_profile_host_waits",
            "train_peak_memory_gib", "train_batches_padding_fraction", "compile_warmup_s", "compile_warmup_compiles",
            "eval_f1", "eval_exact_match", "WALL_CLOCK_SECONDS", "train_profiled_steps")
    found = {k: r[k] for k in keys if k in r}
    compiled = (r.get("train_setup") or {}).get("compile") or {}
    found.update({k: r.get(k) for k in ("compile_warmup_tracing_s", "compile_warmup_compiling_s",
                                        "wall_clock_breakdown")},
                 **{k: compiled.get(k) for k in ("fxgraph_cache_hit", "fxgraph_cache_miss", "autograd_cache_hit",
                                                 "autograd_cache_miss")})
    if piece == "train":
        found["profile_operators"] = (folder / "profile" / "operators.txt").exists()
        events = sorted(folder.glob("runs/events.out.tfevents.*"))
        found["tensorboard_events"] = {e.name: e.stat().st_size for e in events}
        why = None if found["profile_operators"] else "no profile"
    else:  # from the cache train filled: no graph compiled again
        why = None if found["fxgraph_cache_miss"] == 0 and found["fxgraph_cache_hit"] else \
            "the compile cache was not warm (train-warm runs after train, in the same call)"
    if r.get("compiled") != "yes":
        why = f"torch.compile: {r.get('compiled') or 'not recorded'}"
    if why:
        found["why"] = why
    return ("ok" if code == 0 and not why else "failed"), found


def provenance(mode) -> dict:
    import torch
    import transformers

    on_gpu = torch.cuda.is_available() and mode == "gpu"
    git = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True, text=True)
    # a copy of the tree sent to a machine may carry an older .git: its HEAD alone would name the wrong code
    changed = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=REPO, capture_output=True,
                             text=True).stdout.strip()
    return {"device": torch.cuda.get_device_name(0) if on_gpu else f"CPU {platform.machine()} x{os.cpu_count()}",
            "versions": {"torch": torch.__version__, "cuda": torch.version.cuda if on_gpu else None,
                         "transformers": transformers.__version__, "python": platform.python_version()},
            "host": platform.node(), "mode": mode,
            "git_commit": (git.stdout.strip() + (" with uncommitted changes" if changed else "")) or None}


def recipe(piece) -> dict:
    """The settings a piece, or a run_bench.py variant, runs with on a GPU: its recipe."""
    from parity import SIZES as PARITY_SIZES, recipe_settings  # the scripts beside this one
    from run_bench import FAST_CONFIG, variant_settings

    if piece in BENCH_VARIANTS:
        names = (BENCH_VARIANTS[piece] or ",".join(BASE_VARIANTS + ATTEMPT_VARIANTS)).split(",")
        return {name: recipe(name) for name in names}
    if piece.startswith("parity-"):
        split = {k: v for k, v in PARITY_SIZES["gpu"].items() if k != "jobs"}  # jobs: how many run at once
        return {"recipe": recipe_settings(piece.split("-")[1], True)[0], "split": split}
    if piece in ("train", "train-warm", "check"):
        return {k: v for k, v in read_json(FAST_CONFIG).items() if k != "_comment"}
    return variant_settings(piece, True, False)[0]


def recipe_hash(piece) -> str:
    text = json.dumps(recipe(piece), sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()[:12]


def older_recipe(piece, record) -> str | None:
    """Why a piece's (or, for attempts, an attempt's) record is not of today's recipe; None when it is."""
    if piece == "attempts":
        old = [v for v, f in measured_attempts(record).items() if f.get("recipe_hash") != recipe_hash(v)]
        return f"attempts {', '.join(old)} ran an older recipe" if old else None
    if record.get("recipe_hash") != recipe_hash(piece):
        return f"ran recipe {record.get('recipe_hash') or 'not recorded'}, today's is {recipe_hash(piece)}"
    return None


def measured_attempts(record) -> dict:
    """{attempt: figures} that ran cleanly in a record of the attempts piece (each with its call)."""
    variants = (record.get("findings") or {}).get("variants") or {}
    return {v: f for v, f in variants.items()
            if v in ATTEMPT_VARIANTS and f.get("compiles_in_window") == 0 and f.get("x_fast") is not None}


def attempts_left(results: Path) -> list:
    """The attempts still to measure with today's recipe, in order."""
    path = results / "attempts.json"
    return missing_attempts(read_json(path) if path.exists() else {})


def missing_attempts(record) -> list:
    have = measured_attempts(record)
    return [v for v in ATTEMPT_VARIANTS if have.get(v, {}).get("recipe_hash") != recipe_hash(v)]


def attempt_plan(mode, results: Path, left: float) -> tuple:
    """-> (the attempts this call measures, their estimated seconds): beside reference_bf16 and fast, in order, each
    that still fits within ATTEMPTS_S and the time left (the first within the time left alone)."""
    est = VARIANT_ESTIMATES[mode]
    room = min(left, ATTEMPTS_S if mode == "gpu" else left)
    need = est["setup"] + sum(est[v] for v in BASE_VARIANTS)
    plan = []
    for variant in attempts_left(results):
        if need + est[variant] <= (room if plan else left):
            plan.append(variant)
            need += est[variant]
    return plan, need


def minilm_weights() -> bool:
    from qa.model import bundled_minilm_dir

    try:
        return (bundled_minilm_dir() / "model.safetensors").exists()
    except InputError:
        return False


def finished(results: Path) -> dict:
    """The pieces already done, by the records committed in `results`."""
    done = {}
    for path in results.glob("*.json"):
        if path.stem in PIECES:
            record = read_json(path)
            if record.get("status") == "ok" and not older_recipe(path.stem, record):
                done[path.stem] = record
    return done


def estimate(piece, mode, results: Path, ran: dict) -> float:
    """Seconds a piece should take: as long as it took when it last ran to its end, else the default scaled by how
    this call's pieces so far compared with theirs (a failure's time says nothing of a whole run's)."""
    earlier = read_json(results / f"{piece}.json") if (results / f"{piece}.json").exists() else {}
    if earlier.get("status") == "ok":
        return earlier["wall_s"]
    expected = {p: r.get("estimate_s") or ESTIMATES[mode].get(p) for p, r in ran.items()}
    scale = [r["wall_s"] / expected[p] for p, r in ran.items() if r.get("status") == "ok" and expected[p]]
    guess = ESTIMATES[mode][piece] * (statistics.median(scale) if scale else 1.0)
    if earlier.get("status") == "stopped at the deadline":  # it needed more than it had then
        guess = max(guess, 1.5 * earlier["wall_s"])
    return guess


class Step:
    """One child process in its own session, stopped with its whole group at a deadline or when the proof is."""

    current = None

    @classmethod
    def run(cls, argv, log_path, timeout, env):
        with open(log_path, "w") as log:
            proc = subprocess.Popen(argv, cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT,
                                    start_new_session=True)
            cls.current = proc
            try:
                return proc.wait(timeout=max(1.0, timeout))
            except subprocess.TimeoutExpired:
                cls.stop()
                return None
            finally:
                cls.current = None

    @classmethod
    def stop(cls):
        proc = cls.current
        if proc is not None and proc.poll() is None:
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            proc.wait()


def pack(work: Path, out: Path, call: str) -> dict:
    """One call's results into OUT as at most three files: proof-<call>.tar.gz (JSON, Markdown, logs, the operators
    table, TensorBoard events, then compressed traces while the archive stays small), call.json and call.md."""
    files, traces, left_out = [], [], []
    for path in sorted(work.rglob("*")):
        rel = path.relative_to(work)
        if (not path.is_file() or path.name in SKIP_FILES or SKIP_DIRS & set(rel.parts[:-1])
                or any(p.startswith("checkpoint-") for p in rel.parts)):
            continue
        if path.name.startswith("trace") and path.suffix == ".json":
            traces.append(path)
        elif path.suffix in KEEP or path.name.startswith("events.out.tfevents"):
            (files if path.stat().st_size < 4 * 2**20 else left_out).append(path)
    out.mkdir(parents=True, exist_ok=True)
    archive = out / f"proof-{call}.tar.gz"
    tmp = out / f".tmp-{archive.name}"
    with tarfile.open(tmp, "w:gz") as tar:
        for path in files:
            tar.add(path, arcname=str(path.relative_to(work)))
        for path in traces:
            if tmp.stat().st_size + path.stat().st_size // 8 < TRACE_BUDGET:  # traces compress about 10x
                tar.add(path, arcname=str(path.relative_to(work)))
            else:
                left_out.append(path)
    os.replace(tmp, archive)
    for name in ("call.json", "call.md"):
        if (work / name).exists():
            shutil.copyfile(work / name, out / f".tmp-{name}")
            os.replace(out / f".tmp-{name}", out / name)
    return {"archive": archive.name, "bytes": archive.stat().st_size,
            "left_out": [str(p.relative_to(work)) for p in left_out]}


def check_packed(out: Path) -> list:
    """What breaks the limits on what comes back (empty: nothing)."""
    problems, total, files = [], 0, [p for p in out.rglob("*") if p.is_file()]
    if len(files) > LIMITS["files"]:
        problems.append(f"{len(files)} files (at most {LIMITS['files']})")
    for p in files:
        total += p.stat().st_size
        rel = p.relative_to(out)
        if p.stat().st_size >= LIMITS["file_bytes"]:
            problems.append(f"{rel}: {p.stat().st_size} bytes")
        if len(rel.parts) > 3 or not all(c.isalnum() or c in "._-" for c in str(rel).replace("/", "")):
            problems.append(f"{rel}: too deep or a name with other characters")
    if total > LIMITS["total_bytes"]:
        problems.append(f"{total} bytes in all")
    return problems


def run(args) -> int:
    mode = "cpu" if args.cpu else "gpu"
    started = psutil.Process().create_time()  # the budget counts the imports too
    deadline = started + args.budget_s
    import torch

    if mode == "gpu" and not torch.cuda.is_available():
        raise InputError("bench/gpu_proof.py", "no GPU is visible (torch.cuda.is_available() is False)",
                         "run it on a GPU node, or pass --cpu for the rehearsal")
    results = args.results or (RESULTS if mode == "gpu" else None)
    if results is None:
        raise InputError("--results", "the CPU rehearsal has no committed results", "give a folder with --results")
    wanted = args.pieces.split(",") if args.pieces else PIECES
    for piece in wanted:
        if piece not in PIECES:
            raise InputError("--pieces", f"unknown piece {piece!r}", f"choose from {', '.join(PIECES)}")
    dev = require_squad_dev(args.dev)  # after the arguments' own checks: a wrong flag is said first
    done = finished(results)
    work = Path(args.work or tempfile.mkdtemp(prefix="gpu-proof-")).resolve()
    work.mkdir(parents=True, exist_ok=True)
    out = args.out.resolve()
    call = f"{datetime.now(timezone.utc):%Y%m%dT%H%M%SZ}"
    record = {"call": call, "command": "python bench/gpu_proof.py " + shlex.join(sys.argv[1:]), "budget_s": args.budget_s,
              **provenance(mode), "already_done": sorted(done), "pieces": {},
              # what `collect` turns into names: the folders of this machine stay out of the committed results
              "paths": {"repo": str(REPO), "work": str(work), "out": str(out), "gpu_site": os.environ.get("GPU_SITE"),
                        "python": sys.executable, "python_env": sys.prefix}}
    seed_parity(results, work)
    env = dict(os.environ, HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1", PYTHONUNBUFFERED="1",
               TENSORBOARD_LOGGING_DIR=str(work / "train" / "runs"), TORCH_LOGS="recompiles")

    def save(note=None):
        record["wall_s"] = round(time.time() - started, 1)
        if note:
            record["stopped"] = note
        atomic_write_json(work / "call.json", record, indent=1)
        atomic_write_text(work / "call.md", call_markdown(record))
        record["packed"] = pack(work, out, call)

    def on_signal(signum, frame):
        Step.stop()
        save(f"signal {signum}: the piece running then was stopped, the finished ones are kept")
        sys.exit(128 + signum)

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    todo = ["preflight"] + [p for p in wanted if p not in done]
    after_train = [p for p in ("train-warm", "check") if p in todo]  # train-warm: its cache is the one train fills
    if after_train and "train" not in todo:  # in the same call; check: predicts it. collect keeps the train piece
        todo.insert(todo.index(after_train[0]), "train")  # already done as it is
    for piece in todo:
        left = deadline - time.time() - PACK_MARGIN_S
        plan = []
        if piece == "attempts":
            plan, need = attempt_plan(mode, results, left)
            need = need if plan else max(need + min(VARIANT_ESTIMATES[mode][v] for v in ATTEMPT_VARIANTS), left + 1)
        else:
            need = estimate(piece, mode, results, record["pieces"]) if piece != "preflight" else ESTIMATES[mode][piece]
        why = (f"needs about {need:.0f} s, {max(left, 0):.0f} s left" if need > left else
               "the MiniLM's weights were not carried (.gpu-minilm)" if piece.startswith("parity-")
               and PARITY_MODEL[mode] is None and not minilm_weights()
               else None)
        if why:
            record["pieces"][piece] = {"status": "waits", "why": why}
            print(f"[{piece}] waits for a later call: {why}", flush=True)
            continue
        try:
            if piece == "preflight":
                argv = [sys.executable, str(REPO / "bench" / "preflight.py"), str(work / "preflight" / "preflight.json")]
                (work / "preflight").mkdir(exist_ok=True)
            else:
                argv = piece_command(piece, mode, work, dev, plan)
        except InputError as err:  # this piece cannot start here; the next ones may
            record["pieces"][piece] = {"status": "failed", "why": str(err), **provenance(mode)}
            print(f"[{piece}] failed: {err}", flush=True)
            continue
        (work / "logs").mkdir(exist_ok=True)
        print(f"[{piece}] running (about {need:.0f} s, {left:.0f} s left)", flush=True)
        began = time.time()
        code = Step.run(argv, work / "logs" / f"{piece}.log", left, env)
        entry = {"status": "stopped at the deadline" if code is None else None, "exit_status": code,
                 "command": shlex.join(argv).replace(str(work), "$WORK").replace(str(REPO) + "/", ""),
                 "started_utc": datetime.fromtimestamp(began, timezone.utc).isoformat(timespec="seconds"),
                 "wall_s": round(time.time() - began, 1), "estimate_s": round(need, 1), **provenance(mode),
                 **({"attempts_run": plan} if piece == "attempts" else
                    {"recipe_hash": recipe_hash(piece)} if piece in PIECES else {})}
        if piece == "preflight":
            pf = work / "preflight" / "preflight.json"
            entry["findings"] = read_json(pf) if pf.exists() else {}
            entry["status"] = entry["status"] or ("ok" if code == 0 else "failed")
        else:
            status, entry["findings"] = verdict(piece, work / piece, code)
            entry["status"] = entry["status"] or status
        if entry["status"] != "ok":
            entry["log_tail"] = (work / "logs" / f"{piece}.log").read_text(errors="replace")[-2000:]
        record["pieces"][piece] = entry
        print(f"[{piece}] {entry['status']} in {entry['wall_s']} s", flush=True)
        save()
    save()  # the pieces that wait are in the record too
    problems = check_packed(out)
    record["packed"]["problems"] = problems
    print(call_markdown(record))
    print(json.dumps({"out": str(out), "packed": record["packed"]}))
    return 1 if problems else 0


def seed_parity(results: Path, work: Path) -> None:
    """The parity runs committed so far into the call's parity folder: its report is rebuilt from all of them."""
    for runs in results.glob("parity/time-to-f1-*/runs"):
        target = work / "parity" / runs.parent.name / "runs"
        target.mkdir(parents=True, exist_ok=True)
        for path in runs.glob("*.json"):
            shutil.copy(path, target)


def _figures(piece, f) -> str:
    if not f:
        return ""
    if piece in BENCH_VARIANTS:
        parts = [f"{v}: {s['samples_per_second']} samples/s, MFU {s['mfu_real']}, compiled {s['compiled']}, "
                 f"{s['compiles_in_window']} compiles in window"
                 + (f", GPU busy {s['device_busy_share']}" if s.get("device_busy_share") is not None else "")
                 + (f", host waits {s['host_waits']}" if s.get("host_waits") else "")
                 + (f", {s['x_fast']}x fast (call {s.get('call', 'this')})" if s.get("x_fast") else "")
                 for v, s in (f.get("variants") or {}).items()]
        ratio = (f.get("ratios") or {}).get("fast/reference_bf16")
        parts += [f"fast/reference_bf16 {ratio['real_tokens_per_second']}x"] if ratio else []
        parts += [f"{v} FAILED: {why}" for v, why in (f.get("failed") or {}).items()]
        return "; ".join(parts)
    if piece == "preflight":
        checks = f.get("checks") or {}
        return ", ".join(f"{k} {'ok' if c.get('ok') else 'FAILED'}" for k, c in checks.items()) + (
            f"; bf16 matmul {f.get('matmul_bf16_tflops')} TFLOP/s" if f.get("matmul_bf16_tflops") else "")
    if piece == "check":
        p = f.get("predicted") or {}
        return f"{f.get('verdict')}; predicted {p.get('total_s')} s, --time={p.get('time_limit')}; " + "; ".join(
            f"{k}: {v}" for k, v in (f.get("checks") or {}).items() if k in ("GPUs", "training"))
    return ", ".join(f"{k} {v}" for k, v in f.items() if k != "train_profiled_steps")


def call_markdown(record) -> str:
    lines = [f"# GPU proof call {record['call']} ({record['mode']})", "",
             f"{record['device']}; torch {record['versions']['torch']} (CUDA {record['versions']['cuda']}), "
             f"transformers {record['versions']['transformers']}; git {record['git_commit']}; budget "
             f"{record['budget_s']} s; already done before: {', '.join(record['already_done']) or 'nothing'}.", "",
             "| piece | status | wall s | figures |", "|---|---|---|---|"]
    for piece, r in record["pieces"].items():
        lines.append(f"| {piece} | {r['status']}{': ' + r['why'] if r.get('why') else ''} | {r.get('wall_s', '')} | "
                     f"{_figures(piece, r.get('findings'))} |")
    if record.get("stopped"):
        lines += ["", f"Stopped: {record['stopped']}"]
    return "\n".join(lines) + "\n"


def collect(args) -> int:
    """A call's archive into the results folder: each piece's record and files, never over a piece that is done."""
    results = args.results or RESULTS
    archives = sorted(Path(args.dir).glob("proof-*.tar.gz"))
    if not archives:
        raise InputError(str(args.dir), "holds no proof-*.tar.gz", "give the folder a `run` call's files came back in")
    done = finished(results)
    for archive in archives:
        with tempfile.TemporaryDirectory() as tmp, tarfile.open(archive) as tar:
            tar.extractall(tmp, filter="data")
            tmp = Path(tmp)
            paths = read_json(tmp / "call.json").get("paths") or dict(x.split("=", 1) for x in args.paths.split(",")
                                                                      if "=" in x)
            scrub(tmp, paths)
            call = read_json(tmp / "call.json")
            call.pop("paths", None)
            (results / "calls").mkdir(parents=True, exist_ok=True)
            atomic_write_json(results / "calls" / f"{call['call']}.json", call, indent=1)
            for piece, entry in call["pieces"].items():
                if entry["status"] == "waits":
                    continue
                if piece in done:
                    print(f"{piece}: already done in {results}, kept", file=sys.stderr)
                    continue
                if piece == "attempts":
                    entry = merge_attempts(results, entry, call["call"])
                if piece != "preflight":
                    atomic_write_json(results / f"{piece}.json", {**entry, "call": call["call"]}, indent=1)
                source = tmp / ("parity" if piece.startswith("parity-") else piece)
                target = results / ("parity" if piece.startswith("parity-") else f"{piece}-{call['call']}"
                                    if piece == "preflight" else f"attempts/{call['call']}" if piece == "attempts"
                                    else piece)
                copies = [(p, target / p.relative_to(source)) for p in source.rglob("*")] if source.exists() else []
                copies.append((tmp / "logs" / f"{piece}.log", target / "logs" / f"{piece}.log"))
                for path, dest in copies:
                    # Traces and TensorBoard events stay out of the tree: large, and binary files that name the
                    # folders of the machine that ran them. The archive keeps them.
                    if path.is_file() and not path.name.startswith(("trace", "events.out.tfevents")):
                        dest.parent.mkdir(parents=True, exist_ok=True)
                        shutil.copyfile(path, dest)
    write_report(results)
    return 0


def merge_attempts(results: Path, entry: dict, call: str) -> dict:
    """A call's attempts into the committed record: each attempt that ran cleanly beside its call's reference_bf16 and
    fast replaces an older measurement of it; the record is ok once every attempt has one of today's recipe."""
    path = results / "attempts.json"
    old = read_json(path) if path.exists() else {}
    found = entry.get("findings") or {}
    variants = {**measured_attempts(old), **{v: {**f, "call": call} for v, f in measured_attempts(entry).items()}}
    calls = {**(old.get("findings") or {}).get("calls", {}), call: {
        "status": entry["status"], "wall_s": entry.get("wall_s"), "device": entry.get("device"),
        "versions": entry.get("versions"), "attempts_run": entry.get("attempts_run"), "why": entry.get("why"),
        "base": {v: f for v, f in (found.get("variants") or {}).items() if v in BASE_VARIANTS},
        "failed": found.get("failed"), "peak_tflops": found.get("peak_tflops")}}
    merged = {**entry, "findings": {"variants": variants, "calls": calls}}
    merged["status"] = "partial" if missing_attempts(merged) else "ok"
    return merged


def scrub(folder: Path, paths: dict) -> None:
    """The folders of the machine that ran a call, in its text files, as names: $WORK, $OUT, $GPU_SITE, and the
    repository's own paths relative to it (the results are the project's, not that machine's)."""
    names = {"work": "$WORK", "out": "$OUT", "gpu_site": "$GPU_SITE", "repo": ".", "python": "python",
             "python_env": "$PYTHON_ENV"}
    pairs = sorted(((paths[k], v) for k, v in names.items() if paths.get(k)), key=lambda kv: -len(kv[0]))
    for path in folder.rglob("*"):
        if path.is_file() and path.suffix in KEEP:
            text = original = path.read_text(errors="replace")
            for old, new in pairs:
                text = text.replace(old + "/", "" if new == "." else new + "/").replace(old, new)
            if text != original:
                path.write_text(text)


def write_report(results: Path) -> dict:
    """proof.md and proof.json from every committed piece, each with its own provenance."""
    pieces = {p: read_json(results / f"{p}.json") for p in PIECES if (results / f"{p}.json").exists()}
    calls = [read_json(p) for p in sorted((results / "calls").glob("*.json"))] if (results / "calls").exists() else []
    preflights = {c["call"]: c["pieces"]["preflight"] for c in calls if "preflight" in c.get("pieces", {})}
    older = {p: why for p, r in pieces.items() if (why := older_recipe(p, r))}
    targets = assess({p: r for p, r in pieces.items() if p not in older}, preflights)  # today's recipe only
    report = {"pieces": pieces, "preflights": preflights, "targets": targets, "older_recipe": older,
              "missing": [p for p in PIECES if pieces.get(p, {}).get("status") != "ok" or p in older]}
    lines = ["# The fast path on a GPU: the proof so far", "",
             "Rebuilt by `python bench/gpu_proof.py report` from every piece committed in this folder; each row names "
             "the device, versions, date and call that produced it. Ratios are computed only within one call on one "
             "device.", "", "## Targets", "", "| target | measured | met |", "|---|---|---|"]
    lines += [f"| {t['target']} | {t['measured']} | {t['met']} |" for t in targets]
    lines += ["", "## Pieces", "", "| piece | status | device | versions | date (UTC) | call | wall s | figures |",
              "|---|---|---|---|---|---|---|---|"]
    for p in PIECES:
        r = pieces.get(p)
        if r is None:
            lines.append(f"| {p} | not run yet | | | | | | |")
            continue
        v = r.get("versions", {})
        status = r["status"] + (f" (older recipe: {older[p]}; runs again)" if p in older else "")
        lines.append(f"| {p} | {status} | {r.get('device')} | torch {v.get('torch')}, CUDA {v.get('cuda')}, "
                     f"transformers {v.get('transformers')} | {r.get('started_utc')} | {r.get('call')} | "
                     f"{r.get('wall_s')} | {_figures(p, r.get('findings'))} |")
    lines += ["", "## Preflights", ""]
    lines += [f"- {call}: {pf['status']}; {_figures('preflight', pf.get('findings'))}" for call, pf in preflights.items()]
    lines += ["", "Commands: each piece's record (`<piece>.json`) holds its exact command; its files are in the folder "
              "of the same name.", ""]
    atomic_write_json(results / "proof.json", report, indent=1)
    atomic_write_text(results / "proof.md", "\n".join(lines))
    return report


def assess(pieces: dict, preflights: dict) -> list:
    """The issue's targets against what the committed pieces measured."""
    out = []
    bench = pieces.get("bench", {})
    f = bench.get("findings") or {}
    fast = (f.get("variants") or {}).get("fast")
    ratio = (f.get("ratios") or {}).get("fast/reference_bf16", {}).get("real_tokens_per_second")
    out.append({"target": "fast >= 3x the bf16 reference (real tokens/s, one call)", "measured": ratio,
                "met": None if ratio is None else ratio >= 3})
    mfu = fast.get("mfu_real") if fast else None
    matmul = next((pf["findings"].get("matmul_bf16_tflops") for pf in preflights.values()
                   if pf.get("findings", {}).get("device") == bench.get("device")), None)
    out.append({"target": "MFU on real tokens >= 45% of the spec bf16 peak",
                "measured": None if mfu is None else f"{mfu:.1%} ({fast.get('tflops_per_second_real_6n')} TFLOP/s of "
                f"{f.get('peak_tflops')} spec; measured matmul {matmul} TFLOP/s)", "met": None if mfu is None else mfu >= 0.45})
    projected = fast.get("projected_2_epochs_s") if fast else None
    out.append({"target": "2 epochs of SQuAD v1.1 projected at <= 60 s", "measured": projected,
                "met": None if projected is None else projected <= 60})
    attempts = pieces.get("attempts", {}).get("findings") or {}
    tried = measured_attempts(pieces.get("attempts", {}))
    best = min(tried, key=lambda v: tried[v].get("projected_2_epochs_s") or float("inf"), default=None)
    out.append({"target": "2 epochs projected at <= 60 s by an attempt (its ratio to fast from its own call)",
                "measured": None if best is None else f"{best}: {tried[best]['projected_2_epochs_s']} s, "
                f"{tried[best]['x_fast']}x fast", "met": None if best is None else tried[best]["projected_2_epochs_s"] <= 60})
    busy = {v: f.get("device_busy_share") for v, f in tried.items()}
    busy.update({f"{v} (call {c})": f.get("device_busy_share") for c, run in (attempts.get("calls") or {}).items()
                 for v, f in run.get("base", {}).items()})
    shares = {k: v for k, v in busy.items() if v is not None}
    out.append({"target": "the GPU busy >= 90% of the profiled steps' wall time (per variant)",
                "measured": shares or None, "met": None if not shares else max(shares.values()) >= 0.9})
    train_f = (pieces.get("train", {}).get("findings") or {})
    steady = train_f.get("train_real_tokens_per_second_measured")
    same = pieces.get("train", {}).get("call") == bench.get("call") and fast and steady
    out.append({"target": "a real configs/fast.json training's steady rate >= 90% of the bench window's (one call)",
                "measured": None if not same else f"{steady / fast['real_tokens_per_second']:.2f} ({steady:,.0f} against "
                f"{fast['real_tokens_per_second']:,.0f} real tokens/s)",
                "met": None if not same else steady / fast["real_tokens_per_second"] >= 0.9})
    windows = [s.get("compiles_in_window") for p in BENCH_VARIANTS for s in
               ((pieces.get(p, {}).get("findings") or {}).get("variants") or {}).values()]
    out.append({"target": "no compilation inside any timed window", "measured": windows or None,
                "met": None if not windows else all(w == 0 for w in windows)})
    check, train = pieces.get("check", {}), pieces.get("train", {})
    same_call = check.get("status") == train.get("status") == "ok" and check.get("call") == train.get("call")
    ratio = check["findings"]["predicted"]["total_s"] / train["findings"]["WALL_CLOCK_SECONDS"] if same_call else None
    out.append({"target": "the check job's predicted time within 30% of the train piece's wall clock (one call)",
                "measured": None if ratio is None else f"{ratio:.2f} (predicted "
                f"{check['findings']['predicted']['total_s']} s, measured {train['findings']['WALL_CLOCK_SECONDS']} s)",
                "met": None if ratio is None else abs(ratio - 1) <= 0.3})
    f1 = {r: [pieces[p]["findings"]["eval_f1"] for p in PARITY if p.startswith(f"parity-{r}-")
              and pieces.get(p, {}).get("status") == "ok"] for r in ("reference", "fast")}
    if all(len(v) == 2 for v in f1.values()):
        spread = max(max(v) - min(v) for v in f1.values())
        gap = statistics.mean(f1["reference"]) - statistics.mean(f1["fast"])
        out.append({"target": "fast F1 no lower than the reference's by more than the seed spread",
                    "measured": f"reference {f1['reference']}, fast {f1['fast']}, spread {spread:.2f}",
                    "met": gap <= spread})
    else:
        out.append({"target": "fast F1 no lower than the reference's by more than the seed spread",
                    "measured": f"runs so far: {f1}", "met": None})
    return out


@command
def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="action", required=True)
    r = sub.add_parser("run", help="on the GPU machine (or --cpu): a preflight, then the missing pieces")
    r.add_argument("out", type=Path, help="where the packed files go (at most 3)")
    r.add_argument("--cpu", action="store_true", help="the rehearsal: tiny sizes on the CPU")
    r.add_argument("--budget_s", type=float, default=420, help="seconds for the whole call, counted from its start")
    r.add_argument("--results", type=Path, default=None, help=f"the committed pieces [{RESULTS.relative_to(REPO)}]")
    r.add_argument("--pieces", default=None, help=f"comma-separated, from {', '.join(PIECES)} [all missing]")
    r.add_argument("--work", type=Path, default=None, help="scratch folder [a new temporary one]")
    r.add_argument("--dev", type=Path, default=squad_dev_path())
    c = sub.add_parser("collect", help="here: a call's files into the results folder, then the report")
    c.add_argument("dir", type=Path)
    c.add_argument("--results", type=Path, default=None)
    c.add_argument("--paths", default="", help="repo=PATH,work=PATH,out=PATH,gpu_site=PATH,python=PATH,python_env=PATH: "
                   "the folders of the machine that ran a call that did not record them")
    w = sub.add_parser("report", help="here: proof.md from the committed pieces")
    w.add_argument("--results", type=Path, default=None)
    args = parser.parse_args(argv)
    if args.action == "run":
        return run(args)
    if args.action == "collect":
        return collect(args)
    write_report(args.results or RESULTS)
    return 0


if __name__ == "__main__":
    sys.exit(main())
