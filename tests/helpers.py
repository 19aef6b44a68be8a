"""What the test modules share (no test module imports another): where the real data is, the bundled tokenizer, the
offline environment, tiny models, run_qa.py run as a process (in the foreground or the background, by python or
torchrun) and its output read back, hash trees, error lines, wait loops, Markdown rendering and the local SLURM
cluster's jobs. Fixtures live in tests/conftest.py."""
import contextlib
import functools
import json
import os
import pwd
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from bench.dev_set import squad_dev_path

REPO = Path(__file__).resolve().parents[1]
# The official SQuAD v1.1 dev set: $SQUAD_DEV, or ../shared/data/squad/dev-v1.1.json.gz beside the
# repository (docs/data.md, "The SQuAD dev set"; bench/dev_set.py); tests that need it skip without it.
DEV_SET = squad_dev_path()
NO_DEV_SET = f"the SQuAD v1.1 dev set is not at {DEV_SET} (SQUAD_DEV)"
# Two processes on this machine (gloo on the CPU), for run_qa.py and other scripts.
TORCHRUN = (sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2")
# The SLURM tests' job config (a tiny random BERT on generated questions, checkpoints every 10 steps).
SMOKE_TINY = str(REPO / "configs" / "smoke_tiny.json")


# ---------------------------------------------------------------------------------------------
# Data and the tokenizer

@functools.lru_cache(maxsize=None)
def dev_set_columns():
    """The official dev set as columns (id, title, context, question, answers), in file order,
    read by the project's own loader. Callers must not modify it."""
    from qa.data.sources import read_squad

    return read_squad(DEV_SET).dataset.to_dict()


@functools.lru_cache(maxsize=None)
def minilm_tokenizer():
    from transformers import AutoTokenizer

    from qa.model import bundled_minilm_dir

    return AutoTokenizer.from_pretrained(bundled_minilm_dir())


# Feature settings for generated questions: seconds of tokenizing.
FEATURE_PARAMS = dict(max_seq_length=128, doc_stride=32, max_query_length=32, pad_to_max_length=False)


def synthetic_examples(n=60, seed=0):
    """`n` generated training questions (the synthetic dataset), as run_qa.py loads them."""
    from qa.arguments import DataArguments
    from qa.data.sources import load_raw_datasets

    args = DataArguments(dataset_name="synthetic", synthetic_train_examples=n, synthetic_seed=seed)
    return load_raw_datasets(args, splits=("train",))["train"]


QUESTION = "what is here?"


def question_record(i, length):
    """A question whose single feature is exactly `length` tokens long with the bundled vocabulary
    ([CLS] 4 question tokens [SEP] context [SEP]; 'word' is one token, the last sentence five)."""
    context = "word " * (length - 12) + "The answer is Paris."
    return {"id": f"q{i}", "title": "t", "context": context, "question": QUESTION,
            "answers": {"text": ["Paris"], "answer_start": [context.index("Paris")]}}


def train_file(path, lengths):
    """A JSON-lines training file at `path` of question_record()s of these feature lengths, in order."""
    tok = minilm_tokenizer()
    records = [question_record(i, n) for i, n in enumerate(lengths)]
    for r, n in zip(records, lengths):
        assert len(tok(r["question"], r["context"])["input_ids"]) == n
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return str(path)


def train_features(lengths):
    """The training features of question_record()s of these lengths, in order (128/32/16 windows, unpadded)."""
    from datasets import Dataset

    from utils_qa import prepare_train_features

    examples = Dataset.from_list([question_record(i, n) for i, n in enumerate(lengths)])
    return examples.map(prepare_train_features, batched=True, remove_columns=examples.column_names,
                        fn_kwargs=dict(tokenizer=minilm_tokenizer(), max_seq_length=128, doc_stride=32,
                                       max_query_length=16, pad_to_max_length=False))


# ---------------------------------------------------------------------------------------------
# The offline environment

def offline_env(hf_home, drop=(), **extra):
    """os.environ for a run_qa.py process: no network, the Hugging Face cache in `hf_home` (a folder, or a
    TempPathFactory for the session's shared one, BASETEMP/hf_home), unbuffered output, no TENSORBOARD_LOGGING_DIR
    from outside (the run's own folder), none of the variables in `drop`, and `extra` set."""
    if hasattr(hf_home, "getbasetemp"):
        hf_home = hf_home.getbasetemp() / "hf_home"
    env = dict(os.environ, HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1", HF_HOME=str(hf_home), PYTHONUNBUFFERED="1")
    for key in ("TENSORBOARD_LOGGING_DIR", *drop):
        env.pop(key, None)
    env.update(extra)
    return env


def go_offline(monkeypatch, hf_home, drop=()):
    """For run_qa.main in-process: no network, the Hugging Face cache in `hf_home`, and the
    variables named in `drop` unset."""
    for key, value in (("HF_HUB_OFFLINE", "1"), ("HF_DATASETS_OFFLINE", "1"), ("HF_HOME", str(hf_home))):
        monkeypatch.setenv(key, value)
    for key in drop:  # set first, so that monkeypatch puts back its absence too: run_qa.finalize's setdefault fills it
        monkeypatch.setenv(key, "")
        monkeypatch.delenv(key)


# ---------------------------------------------------------------------------------------------
# Tiny models

def tiny_bert(folder, **shape):
    """A tiny random BERT QA model (qa.model.TINY_BERT_SHAPE, with `shape`'s changes) and its tokenizer in `folder`."""
    from qa.model import TINY_BERT_SHAPE, build_random_bert

    return build_random_bert(folder, {**TINY_BERT_SHAPE, **shape})


def base_bert(folder):
    """A tiny *base* BERT checkpoint, as a pretrained encoder is published: BertModel weights
    with a pooler and no QA head, beside its tokenizer."""
    from transformers import AutoTokenizer, BertConfig, BertModel

    tiny = tiny_bert(folder.parent / "tiny-qa")
    BertModel(BertConfig.from_pretrained(tiny)).save_pretrained(folder)
    AutoTokenizer.from_pretrained(tiny).save_pretrained(folder)
    return folder


# ---------------------------------------------------------------------------------------------
# run_qa.py runs

# A tiny random BERT on generated data: seconds per run; used where only agreement matters.
TINY = [
    "--model_name_or_path", "bundled:tiny-bert", "--dataset_name", "synthetic",
    "--synthetic_train_examples", "400", "--synthetic_eval_examples", "100",
    "--max_seq_length", "128", "--doc_stride", "32", "--max_query_length", "32",
    "--per_device_train_batch_size", "32", "--per_device_eval_batch_size", "64",
    "--learning_rate", "2e-3", "--num_train_epochs", "2", "--logging_steps", "5", "--use_cpu", "true",
    "--seed", "1",
]
# configs/smoke_tiny.json compiled whole with static shapes and warmed up: 4 steps.
COMPILED_TINY = [SMOKE_TINY, "--max_steps", "4", "--save_strategy", "no",
                 "--synthetic_eval_examples", "10", "--pad_to_max_length", "true", "--max_seq_length", "64",
                 "--doc_stride", "16", "--max_query_length", "16", "--torch_compile", "true",
                 "--compile_dynamic", "false", "--compile_warmup", "true"]


def run_qa(args, env, launcher=(sys.executable,), timeout=900):
    """run_qa.py to the end: the CompletedProcess, with its output as text."""
    return subprocess.run([*launcher, str(REPO / "run_qa.py"), *args], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=timeout)


@contextlib.contextmanager
def running(args, env, launcher=(sys.executable,), **popen):
    """run_qa.py in the background (output piped, as text, unless `popen` says otherwise): the
    Popen, killed on the way out if it is still running."""
    popen = {"stdout": subprocess.PIPE, "stderr": subprocess.PIPE, "text": True, **popen}
    proc = subprocess.Popen([*launcher, str(REPO / "run_qa.py"), *args], cwd=REPO, env=env, **popen)
    try:
        yield proc
    finally:
        if proc.poll() is None:
            proc.kill()


# The session's shared tiny runs (tiny_run): train and evaluate, logging every 2 steps.
TINY_RUN = [
    "--model_name_or_path", "bundled:tiny-bert", "--dataset_name", "synthetic",
    "--synthetic_train_examples", "200", "--synthetic_eval_examples", "50",
    "--max_seq_length", "128", "--doc_stride", "32", "--max_query_length", "32",
    "--do_train", "--do_eval", "--use_cpu", "true", "--per_device_train_batch_size", "16",
    "--logging_steps", "2", "--num_train_epochs", "1", "--seed", "3",
]
_TINY_RUNS = {}
# The plain run reports MFU against a made-up peak (CPUs have none in the table).
PLAIN = ("plain", "--peak_tflops", "0.5")


def tiny_run(tmp_path_factory, name, *extra):
    """The output folder of `run_qa.py TINY_RUN + extra`, run once per session and name (about 10 s of imports
    alone: the modules that read the same run share it)."""
    key = (str(tmp_path_factory.getbasetemp()), name)
    if key not in _TINY_RUNS:
        env = offline_env(tmp_path_factory)
        out = tmp_path_factory.mktemp(name)
        proc = subprocess.run([sys.executable, str(REPO / "run_qa.py"), *TINY_RUN, *extra, "--output_dir", str(out)],
                              cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
        assert proc.returncode == 0, proc.stderr[-4000:]
        _TINY_RUNS[key] = out
    return _TINY_RUNS[key]


# The compiled runs take 30-90 s each on 2 cores; QA_TEST_COMPILE=0 skips them.
needs_compile = pytest.mark.skipif(os.environ.get("QA_TEST_COMPILE") == "0", reason="QA_TEST_COMPILE=0")


def compiled_run(tmp_path, lengths, *extra):
    """run_qa.py, the layers compiled regionally, on a file whose features come in this order (sequential sampling,
    batches of 4): its all_results.json and the CompletedProcess."""
    tmp_path.mkdir(parents=True, exist_ok=True)
    out = tmp_path / "out"
    env = offline_env(tmp_path / "hf", OMP_NUM_THREADS="1")
    args = ["--model_name_or_path", "bundled:tiny-bert", "--train_file", train_file(tmp_path / "train.jsonl", lengths),
            "--do_train", "--max_seq_length", "128", "--doc_stride", "32", "--max_query_length", "16",
            "--pad_to_max_length", "false", "--train_sampling_strategy", "sequential",
            "--per_device_train_batch_size", "4", "--use_cpu", "true", "--dataloader_num_workers", "0",
            "--torch_compile", "true", "--compile_regional", "true", "--report_to", "none", "--save_strategy", "no",
            "--output_dir", str(out), *extra]
    proc = subprocess.run([sys.executable, str(REPO / "run_qa.py"), *args], cwd=REPO, env=env, capture_output=True,
                          text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return json.loads((out / "all_results.json").read_text()), proc


# The oldest transformers of the supported range, in a second environment: .ci/run builds it
# (tools/transformers_env.sh) and sets QA_TRANSFORMERS_OLDEST_PYTHON to its Python.
OLDEST = "5.17"
OLDEST_PYTHON = os.environ.get("QA_TRANSFORMERS_OLDEST_PYTHON")
needs_dev = pytest.mark.skipif(not DEV_SET.exists(), reason=NO_DEV_SET)
needs_oldest = pytest.mark.skipif(not OLDEST_PYTHON, reason=f"no transformers {OLDEST} environment: .ci/run builds "
                                  "one with tools/transformers_env.sh and sets QA_TRANSFORMERS_OLDEST_PYTHON")


# ---------------------------------------------------------------------------------------------
# What a run left

def results(out):
    return json.loads((out / "all_results.json").read_text())


def losses(out):
    """The training losses a run logged, in order (trainer_state.json's log_history)."""
    return [e["loss"] for e in json.loads((out / "trainer_state.json").read_text())["log_history"] if "loss" in e]


def scalars(out):
    """Every scalar of the run's TensorBoard events: {tag: [values, in order]}."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    found = {}
    for folder in sorted({p.parent for p in (out / "runs").rglob("events.out.tfevents.*")}):
        acc = EventAccumulator(str(folder), size_guidance={"scalars": 0})
        acc.Reload()
        for tag in acc.Tags()["scalars"]:
            found.setdefault(tag, []).extend(e.value for e in acc.Scalars(tag))
    return found


def assert_complete_checkpoint(folder, step):
    """`folder` is a checkpoint the project would resume from at `step`: marked complete there, its marker listing
    the weights, the optimizer and the trainer state, and every listed file as it was saved (Checkpoints.verify)."""
    from qa.training.checkpoints import COMPLETE_MARKER, Checkpoints

    folder = Path(folder)
    marker = json.loads((folder / COMPLETE_MARKER).read_text())
    assert marker["global_step"] == step, (folder.name, marker["global_step"])
    listed = set(marker["files"])
    assert {"model.safetensors", "optimizer.pt", "trainer_state.json"} <= listed, (folder.name, sorted(listed))
    assert (problem := Checkpoints.verify(folder)) is None, f"{folder.name}: {problem}"
    assert json.loads((folder / "trainer_state.json").read_text())["global_step"] == step, folder.name


def hash_tree(folder, skip=()):
    """Every file below `folder` (those named in `skip` aside): {relative path: content hash}."""
    from qa.manifest import file_hash

    return {p.relative_to(folder).as_posix(): file_hash(p) for p in Path(folder).rglob("*")
            if p.is_file() and p.name not in skip}


def same_as_predict(answers, predicted_dir, contexts, top_k=3):
    """`answers` (answer_qa results, with top_k alternatives) are the answers --do_predict wrote in
    `predicted_dir`: the prediction, and the n-best with the same offsets and scores."""
    predictions = json.loads((predicted_dir / "predict_predictions.json").read_text())
    nbest = json.loads((predicted_dir / "predict_nbest_predictions.json").read_text())
    assert [a["id"] for a in answers] == list(predictions)
    for a in answers:
        qid = a["id"]
        assert a["answer"] == predictions[qid], qid
        if a["start"] is not None:
            assert contexts[qid][a["start"]:a["end"]] == a["answer"]
        expected = [{"answer": e["text"], "start": e["answer_start"], "end": e["answer_end"],
                     "score": pytest.approx(e["probability"], rel=1e-5)} for e in nbest[qid]]
        assert a["answers"] == expected[:top_k], qid
        assert {k: a[k] for k in ("answer", "start", "end", "score")} in expected  # (v2's null may rank lower)


# ---------------------------------------------------------------------------------------------
# Error lines and waiting

def error_lines(err):
    """The `error:` lines of a command's stderr (model loading draws progress bars there too)."""
    return [line for line in err.splitlines() if line.startswith("error:")]


def one_error_line(err):
    """The one `error:` line of a command's stderr; no traceback, no other error line."""
    assert "Traceback" not in err and "Exception in thread" not in err, err[-3000:]
    lines = error_lines(err)
    assert len(lines) == 1, err[-3000:]
    return lines[0]


def wait_until(condition, proc, what, output=lambda: "", timeout=300, every=0.1):
    """Poll `condition` every `every` s until it holds; fail (with the tail of `output()`) if the process `proc` ends
    first or `timeout` s pass."""
    deadline = time.monotonic() + timeout
    while not condition():
        assert proc.poll() is None, f"the run ended before {what}:\n{output()[-3000:]}"
        assert time.monotonic() < deadline, f"no {what} in {timeout} s:\n{output()[-3000:]}"
        time.sleep(every)


# ---------------------------------------------------------------------------------------------
# Markdown as GitHub renders it (CommonMark with tables)

FENCE = re.compile(r"^ {0,3}(`{3,}|~{3,})(.*)$")
HEADING = re.compile(r"^ {0,3}#{1,6}(\s|$)")
TABLE_ROW = re.compile(r"^ {0,3}\|.*\|\s*$")


def _covered(tokens, kind):
    """Line numbers (0-based) inside the blocks of token type `kind`."""
    lines = set()
    for token in tokens:
        if token.type == kind and token.map:
            lines.update(range(*token.map))
    return lines


def written_outside_code(lines):
    """(line number, line) of the lines outside code fences, read the way an author writes them:
    a fence line opens a block, the next fence line of the same character closes it."""
    open_fence = None
    for number, line in enumerate(lines):
        fence = FENCE.match(line)
        if fence:
            char = fence.group(1)[0]
            if open_fence is None:
                open_fence = char
                continue
            if char == open_fence:
                open_fence = None
                continue
        if open_fence is None:
            yield number, line


def rendering_problems(text: str) -> list:
    """What renders differently from how it is written, one message per problem."""
    from markdown_it import MarkdownIt

    md = MarkdownIt("commonmark").enable("table")
    tokens = md.parse(text)
    md.render(text)  # must not raise
    lines = text.splitlines()
    problems = []
    for token in tokens:
        if token.type != "fence":
            continue
        first, end = token.map
        closing = lines[end - 1].strip() if end - 1 > first else ""
        closed = (end - 1 > first and closing and set(closing) == {token.markup[0]}
                  and len(closing) >= len(token.markup))
        if not closed:
            problems.append(f"line {first + 1}: code fence {token.markup}{token.info} is never closed by a bare "
                            f"{token.markup} line (it runs to line {end})")
        body = lines[first + 1:end - 1 if closed else end]
        inner = [first + 1 + i for i, line in enumerate(body) if FENCE.match(line)]
        if inner:
            problems.append(f"line {first + 1}: the code block opened here holds fence-like line(s) "
                            f"{', '.join(str(n + 1) for n in inner)}: a fence glued to text or a missing closing fence")
    headings, tables = _covered(tokens, "heading_open"), _covered(tokens, "table_open")
    for number, line in written_outside_code(lines):
        if HEADING.match(line) and number not in headings:
            problems.append(f"line {number + 1}: heading {line.strip()!r} does not render as a heading")
        if TABLE_ROW.match(line) and number not in tables:
            problems.append(f"line {number + 1}: table row {line.strip()[:60]!r} does not render as a table")
    return problems


# ---------------------------------------------------------------------------------------------
# The local SLURM cluster (bench/local_slurm.py; the session's one is the slurm_cluster fixture, tests/conftest.py)

OFFLINE_VARS = ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE", "TRANSFORMERS_OFFLINE")
SBATCH_CPU = ["-c", "2", "--mem=3G", "--time=15"]  # the job scripts' header's -c 32 --mem=64G do not fit the test nodes


def require_slurm() -> None:
    """Skip the calling test/fixture unless a local SLURM cluster can be run here (Linux, root, slurm-wlm installed
    or installable: tools/slurm_local.sh exits 3 where it cannot be)."""
    from bench.local_slurm import slurm_script

    if os.name != "posix" or not hasattr(os, "geteuid"):
        pytest.skip("local SLURM cluster needs Linux")
    if os.geteuid() != 0:
        pytest.skip("local SLURM cluster needs root (apt-get install, SlurmUser=root)")
    r = slurm_script("install", timeout=600)
    if r.returncode == 3:
        pytest.skip((r.stderr.strip() or r.stdout.strip()).splitlines()[-1])
    if r.returncode != 0:
        pytest.fail(f"slurm_local.sh install failed ({r.returncode}): {r.stderr}")


def clear_slurm_leftovers(cluster, timeout=60):
    """After a test on the shared cluster: cancel the jobs it left queued or running (a test that failed before its
    job ended) and resume a node it left drained or down, so that the next test, of any module, finds both nodes idle.
    -> what was found, for the report."""
    found = []
    r = cluster.run("squeue", "-h", "-r", "-o", "%A", check=False)
    jobs = sorted(set(r.stdout.split())) if r.returncode == 0 else []
    if jobs:
        found.append(f"jobs left: {' '.join(jobs)}")
        cluster.run("scancel", *jobs, check=False)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            r = cluster.run("squeue", "-h", "-r", "-o", "%A", check=False)
            if r.returncode == 0 and not r.stdout.strip():
                break
            time.sleep(0.5)
    r = cluster.run("sinfo", "-h", "-N", "-o", "%N %t", check=False)
    for line in r.stdout.splitlines() if r.returncode == 0 else []:
        node, state = line.split()
        if state.rstrip("*~#!%$@^-") in ("drain", "drng", "drained", "down", "inval", "fail", "failg"):
            found.append(f"{node} {state}")
            cluster.run("scontrol", "update", f"nodename={node}", "state=resume", check=False)
    return found


def write_job_env_file(folder: Path, offline: bool = True) -> Path:
    """What setup_bert.sh writes, for the running interpreter's environment; `offline`: the offline
    variables exported whatever OFFLINE says (as env files written before OFFLINE=0 was honoured do)."""
    folder.mkdir(parents=True, exist_ok=True)
    activate = Path(sys.prefix) / "bin" / "activate"
    lines = [f"source {activate}" if activate.is_file() else f'export PATH="{Path(sys.executable).parent}:$PATH"',
             f"export HF_HOME={folder / 'hf_home'}",
             *([f"export {'=1 '.join(OFFLINE_VARS)}=1"] if offline else []),
             # 2 shared cores: more than one thread per process only oversubscribes them (10x slower)
             "export OMP_NUM_THREADS=1"]
    path = folder / "env.sh"
    path.write_text("\n".join(lines) + "\n")
    return path


def job_times(out: Path) -> list:
    """The lines of a run's job_time.jsonl (one per job run: the launcher's record)."""
    return [json.loads(line) for line in (out / "job_time.jsonl").read_text().splitlines()]


# ---------------------------------------------------------------------------------------------
# Others

def bench_module(name):
    """bench/NAME.py as a module; the scripts import the ones beside them."""
    import importlib.util

    sys.path.insert(0, str(REPO / "bench"))
    try:
        spec = importlib.util.spec_from_file_location(name, REPO / "bench" / f"{name}.py")
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        return module
    finally:
        sys.path.remove(str(REPO / "bench"))


@contextlib.contextmanager
def unprivileged():
    """The block runs as the user nobody when this process is root (CI runs as root, and root passes every
    permission check, access() included); root stays the saved id, to come back to. Another user is unprivileged
    already. access() asks with the real ids: both real and effective ones change."""
    if os.geteuid() != 0:
        yield
        return
    nobody, groups = pwd.getpwnam("nobody"), os.getgroups()
    os.setgroups([])
    os.setresgid(nobody.pw_gid, nobody.pw_gid, 0)
    os.setresuid(nobody.pw_uid, nobody.pw_uid, 0)
    try:
        yield
    finally:
        os.setresuid(0, 0, 0)
        os.setresgid(0, 0, 0)
        os.setgroups(groups)
