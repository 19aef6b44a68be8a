"""Shared test fixtures: where the real data is, the bundled tokenizer, and run_qa.py run as a
process (in the foreground or the background, by python or torchrun) and its output read back."""
import contextlib
import functools
import json
import os
import pwd
import subprocess
import sys
from pathlib import Path

from bench.dev_set import squad_dev_path

REPO = Path(__file__).resolve().parents[1]
# The official SQuAD v1.1 dev set: $SQUAD_DEV, or ../shared/data/squad/dev-v1.1.json.gz beside the
# repository (docs/data.md, "The SQuAD dev set"; bench/dev_set.py); tests that need it skip without it.
DEV_SET = squad_dev_path()
# Two processes on this machine (gloo on the CPU), for run_qa.py and other scripts.
TORCHRUN = (sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2")


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


def results(out):
    return json.loads((out / "all_results.json").read_text())


def losses(out):
    """The training losses a run logged, in order (trainer_state.json's log_history)."""
    return [e["loss"] for e in json.loads((out / "trainer_state.json").read_text())["log_history"] if "loss" in e]


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


def go_offline(monkeypatch, hf_home, drop=()):
    """For run_qa.main in-process: no network, the Hugging Face cache in `hf_home`, and the
    variables named in `drop` unset."""
    for key, value in (("HF_HUB_OFFLINE", "1"), ("HF_DATASETS_OFFLINE", "1"), ("HF_HOME", str(hf_home))):
        monkeypatch.setenv(key, value)
    for key in drop:
        monkeypatch.delenv(key, raising=False)


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
