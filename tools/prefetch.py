#!/usr/bin/env python3
"""Download a model and a dataset into a Hugging Face cache, for compute nodes without internet.

    python tools/prefetch.py MODEL DATASET [--dataset-config C] --cache-dir DIR

Run it on a login node. Afterwards, with HF_HOME=DIR HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1,
`AutoModelForQuestionAnswering.from_pretrained(MODEL)`, `AutoTokenizer.from_pretrained(MODEL)`
and `load_dataset(DATASET, C)` work offline; this script checks that before it reports success.
Prints one summary line on stdout; on failure, the project's one line `error: ... Fix: ...` on
stderr and exit status 2 (qa.errors).
"""
import argparse
import json
import os
import subprocess
import sys

from qa.errors import InputError, command

OFFLINE_VARS = ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE", "TRANSFORMERS_OFFLINE")
# Top-level files that from_pretrained needs: config, tokenizer and one weights format (the
# bert-base-uncased repo also holds TF, Flax, ONNX, Core ML and Rust weights: ~2 GB we skip).
CONFIG_SUFFIXES = (".json", ".txt", ".model")
WEIGHT_FORMATS = (".safetensors", ".bin")
NETWORK_ERRORS = ("ConnectError", "ConnectTimeout", "ConnectionError", "ReadTimeout", "Timeout",
                  "TimeoutError", "ProxyError", "gaierror", "OfflineModeIsEnabled",
                  "LocalEntryNotFoundError")

# Run in a fresh offline process: the proof that a compute node will find everything.
VERIFY = """
import json, sys
import datasets, transformers
model, dataset, config = sys.argv[1:]
transformers.AutoConfig.from_pretrained(model)
transformers.AutoTokenizer.from_pretrained(model)
ds = datasets.load_dataset(dataset, config or None)
print(json.dumps({split: ds[split].num_rows for split in ds}))
"""


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("model", help="Hub model id, e.g. google-bert/bert-base-uncased")
    p.add_argument("dataset", help="Hub dataset id, e.g. rajpurkar/squad or rajpurkar/squad_v2")
    p.add_argument("--dataset-config", default=None, help="dataset configuration name, if any")
    p.add_argument("--cache-dir", required=True, help="becomes HF_HOME (hub/ and datasets/ in it)")
    return p.parse_args(argv)


def files_to_fetch(repo_files):
    """The top-level config/tokenizer files plus the weights in one format (safetensors first)."""
    top = [f for f in repo_files if "/" not in f]
    for fmt in WEIGHT_FORMATS:
        weights = [f for f in top if f.endswith(fmt)]
        if weights:
            break
    else:
        raise InputError("the model repository", "holds no .safetensors or .bin weights at its top level",
                         "check MODEL (a Hub id of a transformers model)")
    return sorted(f for f in top if f.endswith(CONFIG_SUFFIXES)) + sorted(weights)


def explain(exc, model, dataset, endpoint) -> InputError:
    """A library's exception as the project's one-line error, with what to do about it."""
    if isinstance(exc, InputError):
        return exc
    chain, e = [], exc
    while e is not None and e not in chain:
        chain.append(e)
        e = e.__cause__ or e.__context__
    names = {type(c).__name__ for c in chain}
    first = " ".join((str(exc).strip().splitlines() or [type(exc).__name__])[0].split()) or type(exc).__name__
    where = f"{model} / {dataset}"
    if "GatedRepoError" in names:
        return InputError(where, "access is gated", "accept its terms on the Hub, then `hf auth login` or export "
                          "HF_TOKEN, and run again")
    if names & {"RepositoryNotFoundError", "DatasetNotFoundError"}:
        return InputError(where, f"not found on the Hub ({first})", "check the MODEL/DATASET name")
    if names & set(NETWORK_ERRORS):
        return _unreachable(endpoint, first)
    if any(isinstance(c, OSError) and c.errno == 28 for c in chain):
        return InputError(where, "no space left in the cache directory", "choose another with HF_CACHE_DIR "
                          "(e.g. under $LUSTRE)")
    return InputError(where, f"{type(exc).__name__}: {first}", "see the message; run again once it is fixed")


def _unreachable(endpoint, why) -> InputError:
    return InputError(f"the Hugging Face Hub at {endpoint}", f"cannot be reached ({why})",
                      "run this on a login node with internet access (compute nodes have none)")


def check_hub(endpoint):
    """Fail in seconds when offline (the libraries would retry for about a minute)."""
    from huggingface_hub.utils import get_session

    try:
        get_session().head(endpoint, timeout=15)  # any HTTP answer means the Hub is reachable
    except Exception as exc:
        raise _unreachable(endpoint, f"{type(exc).__name__}: {' '.join(str(exc).split())}") from exc


def prefetch(model, dataset, config, cache_dir):
    from huggingface_hub import HfApi, constants, snapshot_download

    check_hub(constants.ENDPOINT)
    wanted = files_to_fetch(HfApi().list_repo_files(model))
    snapshot_download(model, allow_patterns=wanted)

    import datasets

    datasets.load_dataset(dataset, config)

    env = {**os.environ, **{v: "1" for v in OFFLINE_VARS}}
    proc = subprocess.run([sys.executable, "-c", VERIFY, model, dataset, config or ""],
                          env=env, capture_output=True, text=True)
    if proc.returncode != 0:
        lines = proc.stderr.strip().splitlines() or ["no message"]
        raise InputError(f"{model} / {dataset}", f"downloaded, but loading offline from {cache_dir} failed: "
                         f"{lines[-1]}", "see the message; run again to complete the download")
    rows = json.loads(proc.stdout.strip().splitlines()[-1])
    splits = ", ".join(f"{k} {v}" for k, v in rows.items())
    return f"model {model} ({len(wanted)} files), dataset {dataset} ({splits}) in {cache_dir}"


@command
def main(argv=None):
    args = parse_args(argv)
    cache_dir = os.path.abspath(args.cache_dir)
    # The libraries read these at import time, so set them before importing anything of theirs.
    token = os.path.join(os.environ.get("HF_HOME", os.path.expanduser("~/.cache/huggingface")),
                         "token")
    if "HF_TOKEN_PATH" not in os.environ and os.path.exists(token):
        os.environ["HF_TOKEN_PATH"] = token  # keep an earlier `hf auth login` working
    os.environ["HF_HOME"] = cache_dir
    for var in OFFLINE_VARS:  # a sourced env.sh sets these; downloading needs them off
        os.environ.pop(var, None)
    endpoint = os.environ.get("HF_ENDPOINT", "https://huggingface.co")
    try:
        os.makedirs(cache_dir, exist_ok=True)
        if not os.access(cache_dir, os.W_OK):
            raise InputError(cache_dir, "cannot be written to", "choose another cache with HF_CACHE_DIR")
        print(prefetch(args.model, args.dataset, args.dataset_config, cache_dir))
    except Exception as exc:  # whatever the libraries raise becomes one line that says what to do
        raise explain(exc, args.model, args.dataset, endpoint) from exc
    return 0


if __name__ == "__main__":
    sys.exit(main())
