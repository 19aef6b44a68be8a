"""The cluster's default path, the one a student's first real job takes: configs/reference.json's Hub model
(google-bert/bert-base-uncased) and Hub dataset (rajpurkar/squad), read offline from the Hugging Face cache that
setup_bert.sh's prefetch (tools/prefetch.py) wrote. The cache is the real one: prefetch itself downloads into it,
with the real huggingface_hub and datasets, from a small Hub served on 127.0.0.1 (HF_ENDPOINT) whose two repositories
hold a tiny random BERT under the model's id and a few dozen questions of the official SQuAD v1.1 dev set in
rajpurkar/squad's own layout (plain_text/{train,validation}-00000-of-00001.parquet and its card's YAML). Then, with
HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1, as a job sources them, and the Hub still serving but never asked: the job
trains and evaluates on exactly those questions, the check job says ready, and a cache that holds the model but not the
dataset is refused in one line naming the fix. Every test here needs prefetch's download end to end: all are slow."""
import hashlib
import json
import math
import re
import shutil
import subprocess
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qs, unquote, urlsplit

import pytest

from tests.helpers import DEV_SET, NO_DEV_SET, REPO, losses, offline_env, one_error_line, results, run_qa, tiny_bert

MODEL, DATASET = "google-bert/bert-base-uncased", "rajpurkar/squad"
REFERENCE = str(REPO / "configs" / "reference.json")
TRAIN_QUESTIONS, EVAL_QUESTIONS = 36, 20  # the dev set's first questions: train, then the next ones for validation
# The reference job, as small as a CPU runs it in seconds; everything else (the Hub ids, the recipe) is the config's.
SMALL = ["--use_cpu", "true", "--max_seq_length", "128", "--doc_stride", "32", "--max_query_length", "32",
         "--num_train_epochs", "1", "--logging_steps", "1", "--report_to", "none"]
# The served model's shape: unlike bundled:tiny-bert's (qa.model.TINY_BERT_SHAPE), so a run shows which it had.
SHAPE = dict(hidden_size=32, intermediate_size=96)
SLURM = ("SLURM_JOB_ID", "SLURM_STEP_GPUS", "SLURM_JOB_GPUS", "SLURM_GPUS_ON_NODE")
pytestmark = pytest.mark.slow

# rajpurkar/squad's dataset card, as on the Hub: the features, and the one configuration's parquet files.
CARD = """---
pretty_name: SQuAD
language:
- en
task_categories:
- question-answering
dataset_info:
  config_name: plain_text
  features:
  - name: id
    dtype: string
  - name: title
    dtype: string
  - name: context
    dtype: string
  - name: question
    dtype: string
  - name: answers
    sequence:
    - name: text
      dtype: string
    - name: answer_start
      dtype: int32
  splits:
  - name: train
    num_bytes: {train_bytes}
    num_examples: {train}
  - name: validation
    num_bytes: {validation_bytes}
    num_examples: {validation}
  download_size: {download_size}
  dataset_size: {dataset_size}
configs:
- config_name: plain_text
  data_files:
  - split: train
    path: plain_text/train-*
  - split: validation
    path: plain_text/validation-*
  default: true
---

# Dataset Card for SQuAD
"""
LFS = (".safetensors", ".parquet", ".bin", ".ot")  # what the Hub stores with Git LFS (.gitattributes)


# ---------------------------------------------------------------------------------------------
# A Hub on 127.0.0.1: the API and file routes that prefetch's huggingface_hub and datasets call (no Xet, no
# parquet export: the libraries then download over plain HTTP and read the repository's own files)

class Repo:
    def __init__(self, kind, repo_id, files):
        self.kind, self.repo_id, self.files = kind, repo_id, dict(sorted(files.items()))
        self.sha = hashlib.sha1(f"{kind}/{repo_id}".encode()).hexdigest()  # the one commit, on main

    def etag(self, path):
        """What the Hub says a file is: the sha256 of an LFS file, else the git blob's sha1 (the cache's blob names)."""
        data = self.files[path]
        if path.endswith(LFS):
            return hashlib.sha256(data).hexdigest()
        return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()

    def entry(self, path):
        if path not in self.files:  # a folder
            return {"type": "directory", "oid": hashlib.sha1(path.encode()).hexdigest(), "size": 0, "path": path}
        data = self.files[path]
        entry = {"type": "file", "oid": hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest(), "size": len(data),
                 "path": path}
        if path.endswith(LFS):
            entry["lfs"] = {"oid": self.etag(path), "size": len(data), "pointerSize": 134}
        return entry

    def tree(self, folder, recursive):
        prefix = f"{folder}/" if folder else ""
        below = [p[len(prefix):] for p in self.files if p.startswith(prefix)]
        if recursive:
            names = {prefix + "/".join(p.split("/")[:i]) for p in below for i in range(1, p.count("/") + 2)}
        else:
            names = {prefix + p.split("/")[0] for p in below}
        return [self.entry(p) for p in sorted(names)]

    def folders(self):
        return {"/".join(p.split("/")[:i]) for p in self.files for i in range(1, p.count("/") + 1)}

    def info(self):
        return {"id": self.repo_id, "_id": self.sha[:24], "sha": self.sha, "private": False, "gated": False,
                "disabled": False, "lastModified": "2024-01-04T16:13:07.000Z", "tags": [], "downloads": 0,
                "likes": 0, "siblings": [{"rfilename": p} for p in self.files]}


class FakeHub(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, repos):
        self.repos = {(r.kind, r.repo_id): r for r in repos}
        self.requests = []
        super().__init__(("127.0.0.1", 0), Handler)

    @property
    def endpoint(self):
        return f"http://127.0.0.1:{self.server_address[1]}"


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *args):
        pass

    def _send(self, status, body=b"", headers=(), content_type="application/json"):
        self.send_response(status)
        for key, value in dict(headers).items():
            self.send_header(key, value)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def _json(self, value):
        self._send(200, json.dumps(value).encode())

    def _not_found(self, code):
        self._send(404, json.dumps({"error": code}).encode(), {"X-Error-Code": code})

    def do_HEAD(self):
        self._route()

    def do_GET(self):
        self._route()

    def _route(self):
        hub, url = self.server, urlsplit(self.path)
        hub.requests.append(f"{self.command} {self.path}")
        parts, query = [unquote(p) for p in url.path.strip("/").split("/")], parse_qs(url.query)
        if parts == [""]:
            return self._send(200, b"fake hub", content_type="text/plain")
        api = parts[0] == "api"
        if api:
            parts = parts[1:]
            kind = {"models": "model", "datasets": "dataset"}.get(parts[0])
            parts = parts[1:]
        else:
            kind = "dataset" if parts[0] == "datasets" else "model"
            parts = parts[1:] if kind == "dataset" else parts
        repo = hub.repos.get((kind, "/".join(parts[:2])))
        if repo is None:
            return self._not_found("RepoNotFound")
        rest = parts[2:]
        if api and (not rest or rest[0] == "revision"):
            return self._check_revision(repo, rest[1:2]) or self._json(repo.info())
        if api and rest[0] == "tree":
            folder = "/".join(rest[2:])
            if folder and folder not in repo.folders():
                return self._not_found("EntryNotFound")
            recursive = query.get("recursive", ["false"])[0].lower() == "true"
            return self._check_revision(repo, rest[1:2]) or self._json(repo.tree(folder, recursive))
        if not api and rest[0] == "resolve":
            path = "/".join(rest[2:])
            if self._check_revision(repo, rest[1:2]):
                return
            if path not in repo.files:
                return self._not_found("EntryNotFound")
            headers = {"X-Repo-Commit": repo.sha, "ETag": f'"{repo.etag(path)}"', "Accept-Ranges": "bytes"}
            if path.endswith(LFS):
                headers.update({"X-Linked-Etag": f'"{repo.etag(path)}"', "X-Linked-Size": str(len(repo.files[path]))})
            return self._send(200, repo.files[path], headers, "application/octet-stream")
        return self._not_found("NotFound")

    def _check_revision(self, repo, revision):
        if revision and revision[0] not in ("main", repo.sha):
            self._not_found("RevisionNotFound")
            return True
        return False


# ---------------------------------------------------------------------------------------------
# The repositories, and the cache prefetch makes of them

def dev_questions(n):
    """The official dev set's first n questions, in file order, as rajpurkar/squad's rows (the project's reader)."""
    from qa.data.sources import read_squad

    return read_squad(DEV_SET).dataset.select(range(n)).to_list()


def parquet(rows):
    """rajpurkar/squad's parquet file of these rows (its features), and the rows' size in Arrow."""
    import io

    from datasets import Dataset

    from qa.data.table import squad_features

    dataset, buffer = Dataset.from_list(rows, features=squad_features()), io.BytesIO()
    dataset.to_parquet(buffer)
    return buffer.getvalue(), dataset.data.nbytes


def model_repo(folder):
    """A tiny random BERT (the bundled MiniLM's uncased vocabulary) and the files of google-bert/bert-base-uncased
    that prefetch leaves on the Hub: its card, another framework's weights, a file below the top level."""
    files = {p.name: p.read_bytes() for p in tiny_bert(folder, **SHAPE).iterdir() if p.is_file()}
    files.update({".gitattributes": b"*.safetensors filter=lfs diff=lfs merge=lfs -text\n",
                  "README.md": b"---\nlicense: apache-2.0\n---\n# BERT base model (uncased)\n",
                  "rust_model.ot": b"\0" * 64, "coreml/fill-mask/float32_model.mlpackage/Manifest.json": b"{}"})
    return Repo("model", MODEL, files)


def dataset_repo(rows):
    """rajpurkar/squad as the Hub holds it: its card and one parquet file per split of its plain_text config."""
    (train, train_bytes), (validation, validation_bytes) = (
        parquet(rows[:TRAIN_QUESTIONS]), parquet(rows[TRAIN_QUESTIONS:TRAIN_QUESTIONS + EVAL_QUESTIONS]))
    card = CARD.format(train=TRAIN_QUESTIONS, validation=EVAL_QUESTIONS, train_bytes=train_bytes,
                       validation_bytes=validation_bytes, download_size=len(train) + len(validation),
                       dataset_size=train_bytes + validation_bytes)
    return Repo("dataset", DATASET, {".gitattributes": b"*.parquet filter=lfs diff=lfs merge=lfs -text\n",
                                     "README.md": card.encode(),
                                     "plain_text/train-00000-of-00001.parquet": train,
                                     "plain_text/validation-00000-of-00001.parquet": validation})


def prefetch(hub, cache_dir, timeout=300):
    env = offline_env(cache_dir, HF_ENDPOINT=hub.endpoint)  # prefetch turns the offline variables off itself
    return subprocess.run([sys.executable, str(REPO / "tools" / "prefetch.py"), MODEL, DATASET, "--cache-dir",
                           str(cache_dir)], cwd=REPO, env=env, capture_output=True, text=True, timeout=timeout)


@pytest.fixture(scope="module")
def hub(tmp_path_factory):
    """The Hub, its two repositories, and HF_HOME as prefetch left it (hub.home, hub.prefetched: its process). The
    Hub keeps serving, so that a job that asked it for anything would be seen asking (hub.requests)."""
    if not DEV_SET.exists():
        pytest.skip(NO_DEV_SET)
    base = tmp_path_factory.mktemp("hub")
    questions = dev_questions(TRAIN_QUESTIONS + EVAL_QUESTIONS)
    hub = FakeHub([model_repo(base / "tiny-bert"), dataset_repo(questions)])
    hub.questions = questions
    threading.Thread(target=hub.serve_forever, daemon=True).start()
    try:
        hub.home = base / "hf_home"
        hub.prefetched = prefetch(hub, hub.home)
        assert hub.prefetched.returncode == 0, hub.prefetched.stderr[-4000:] + "\n" + "\n".join(hub.requests)
        yield hub
    finally:
        hub.shutdown()
        hub.server_close()


def _env(home, hub):
    """Offline, as a job that sourced setup_bert.sh's env file, outside any SLURM job, HF_ENDPOINT this Hub."""
    return offline_env(home, drop=SLURM, HF_ENDPOINT=hub.endpoint)


def test_prefetch_leaves_the_cache_a_compute_node_reads(hub):
    """prefetch's own offline proof (a fresh offline process: the fixture needs its exit 0) counts the questions
    served; the model's snapshot for the Hub's commit holds the config, the tokenizer and one weights format (not the
    repository's other files), each a link to its blob, named by the etag the Hub sent, with the bytes it served."""
    model = hub.repos[("model", MODEL)]
    assert hub.prefetched.stdout == (f"model {MODEL} (4 files), dataset {DATASET} (train {TRAIN_QUESTIONS}, "
                                     f"validation {EVAL_QUESTIONS}) in {hub.home}\n")
    repo_dir = hub.home / "hub" / "models--google-bert--bert-base-uncased"
    snapshot = repo_dir / "snapshots" / model.sha
    fetched = sorted(p.relative_to(snapshot).as_posix() for p in snapshot.rglob("*") if not p.is_dir())
    assert fetched == ["config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json"]
    for name in fetched:
        link = snapshot / name
        assert link.is_symlink() and link.resolve() == (repo_dir / "blobs" / model.etag(name)).resolve(), name
        assert link.read_bytes() == model.files[name], name


def test_the_reference_job_trains_and_evaluates_offline_on_the_prefetched_questions(hub, tmp_path):
    """configs/reference.json as it is (its Hub ids) with a CPU's sizes: it asks the Hub for nothing, loads the tiny
    BERT saved under the model's id, trains on the 36 cached training questions and evaluates exactly the 20 cached
    validation questions, scored against the cached answers; its records name the Hub ids."""
    from utils_qa import scores_from_examples

    out, asked = tmp_path / "run", len(hub.requests)
    proc = run_qa([REFERENCE, *SMALL, "--output_dir", str(out)], _env(hub.home, hub), timeout=600)
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert hub.requests[asked:] == []
    figures, validation = results(out), hub.questions[TRAIN_QUESTIONS:]
    assert (figures["train_examples"], figures["eval_examples"]) == (TRAIN_QUESTIONS, EVAL_QUESTIONS)
    logged = losses(out)  # one a step: batches of 12 windows
    assert len(logged) == math.ceil(figures["train_features"] / 12) and all(0 < x < 20 for x in logged), logged
    predictions = json.loads((out / "predictions.json").read_text())
    assert sorted(predictions) == sorted(q["id"] for q in validation)
    scores = scores_from_examples(validation, predictions, version_2_with_negative=False)
    assert figures["eval_f1"] > 0  # (a random model's few overlapping words: something to compare)
    assert figures["eval_f1"] == pytest.approx(scores["f1"], abs=1e-4)
    config = json.loads((out / "config.json").read_text())  # the cache's tiny BERT, not one from elsewhere
    assert {key: config[key] for key in SHAPE} == SHAPE
    environment = json.loads((out / "environment.json").read_text())
    assert (environment["config"]["model_name_or_path"], environment["config"]["dataset_name"]) == (MODEL, DATASET)
    summary = (out / "results.md").read_text()
    for row in (f"| model | {MODEL} |", f"| training data | {DATASET}, split train |",
                f"| evaluation data | {DATASET}, split validation |", f"| evaluation questions | {EVAL_QUESTIONS} |"):
        assert row in summary, row


def test_the_check_job_is_ready_on_the_prefetched_cache(hub, tmp_path):
    """The check job on the same cache and sizes: ready, its model-and-data line naming the model, the cached
    questions and offline mode, and no request to the Hub."""
    out, asked = tmp_path / "check", len(hub.requests)
    proc = run_qa([REFERENCE, *SMALL, "--output_dir", str(out), "--check"], _env(hub.home, hub), timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert hub.requests[asked:] == []
    lines = proc.stdout.strip().splitlines()
    assert lines[-1] == "ready", lines
    line = next(line for line in lines if line.startswith("check model and data:"))
    assert re.fullmatch(rf"check model and data: {MODEL} and the questions \(train {TRAIN_QUESTIONS}, validation "
                        rf"{EVAL_QUESTIONS}\) in \d+\.\d s, offline", line), line
    assert json.loads((out / "check.json").read_text())["ready"] is True


def test_a_cache_without_the_dataset_is_refused_in_one_line_naming_the_fix(hub, tmp_path):
    """Prefetch stopped after the model (the cache holds it, not the dataset): the job stops at its data, before
    anything is written, with the project's one line that says where it looked and how to fetch it."""
    home = tmp_path / "hf_home"
    model_dir = Path("hub") / "models--google-bert--bert-base-uncased"
    shutil.copytree(hub.home / model_dir, home / model_dir, symlinks=True)
    out, asked = tmp_path / "run", len(hub.requests)
    proc = run_qa([REFERENCE, *SMALL, "--output_dir", str(out)], _env(home, hub), timeout=300)
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert hub.requests[asked:] == []
    assert one_error_line(proc.stderr) == (
        f"error: Hub dataset '{DATASET}': cannot be loaded: offline mode is on (HF_*_OFFLINE), and the cache "
        f"{home / 'datasets'} lacks it. Fix: fetch it on a login node (`DATASET={DATASET} ./setup_bert.sh`), source "
        "the env file it writes; or pass --train_file / --validation_file")
    assert not out.exists()
