"""Tokenized features, cached on disk and shared across runs and ranks.

The key hashes everything the features depend on: the examples themselves (so a changed file,
a different subset or article slice is a different key, whatever its source), the tokenizer's
full definition, the preprocessing function and its parameters, and the code version of the
feature functions. Per node, local rank 0 tokenizes while the other ranks wait, then all
memory-map the same Arrow files. A cache entry appears by an atomic rename, so a run killed
while writing leaves no half-written entry behind.
"""
import hashlib
import inspect
import json
import logging
import os
import shutil
import weakref
from contextlib import nullcontext
from pathlib import Path

import pyarrow as pa

from qa.data import features as features_module

logger = logging.getLogger(__name__)


def default_cache_dir() -> Path:
    hf_home = os.environ.get("HF_HOME") or os.path.join(os.path.expanduser("~"), ".cache", "huggingface")
    return Path(hf_home) / "squad_features"


_DIGESTS = weakref.WeakKeyDictionary()  # a run's training split is hashed for its checkpoints and its cache key


def table_digest(dataset) -> str:
    if dataset in _DIGESTS:
        return _DIGESTS[dataset]
    h = hashlib.sha256()
    sink = pa.BufferOutputStream()
    table = dataset.with_format("arrow")[:]  # the rows it holds, also for a select()ed view
    with pa.ipc.new_stream(sink, table.schema) as writer:
        writer.write_table(table)
    h.update(sink.getvalue().to_pybytes())
    _DIGESTS[dataset] = h.hexdigest()
    return _DIGESTS[dataset]


# Per-call state of a fast tokenizer: every call sets it from its own arguments (which the key
# holds as `params`), and tokenizing leaves it changed; hashing it made the key of a split depend
# on what the process had tokenized before, so a rerun whose training split was a cache hit
# missed the cache of its validation split.
_TOKENIZER_CALL_STATE = ("truncation", "padding")


def _tokenizer_digest(tokenizer) -> str:
    definition = json.loads(tokenizer.backend_tokenizer.to_str())
    for key in _TOKENIZER_CALL_STATE:
        definition.pop(key, None)
    # Settings that live on the Python side, not in the backend's definition, and change the
    # features: the padding side picks the question/context order, the truncation side which end
    # of a context the windows start from, the input names whether token_type_ids are made, and
    # the special tokens what padding and the CLS label are.
    definition["python_side"] = {
        "padding_side": getattr(tokenizer, "padding_side", None),
        "truncation_side": getattr(tokenizer, "truncation_side", None),
        "model_input_names": list(getattr(tokenizer, "model_input_names", []) or []),
        "special_tokens": {name: [str(token), tokenizer.convert_tokens_to_ids(str(token))]
                           for name, token in sorted(tokenizer.special_tokens_map.items())
                           if isinstance(token, str)},
        "pad_token_type_id": getattr(tokenizer, "pad_token_type_id", None),
    }
    return hashlib.sha256(json.dumps(definition, sort_keys=True).encode()).hexdigest()


def features_key(examples, tokenizer, fn, params: dict) -> str:
    parts = {
        "examples": table_digest(examples),
        "tokenizer": _tokenizer_digest(tokenizer),
        "function": fn.__name__,
        "code": hashlib.sha256(inspect.getsource(features_module).encode()).hexdigest(),
        "params": params,
    }
    return hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()[:24]


def cached_features(examples, tokenizer, fn, params: dict, *, cache_dir=None, num_proc=None,
                    overwrite=False, main_process_first=None, desc="tokenizing"):
    """Map `fn(batch, tokenizer, **params)` over `examples`, reusing a cached result."""
    from datasets import load_from_disk

    cache_dir = Path(cache_dir) if cache_dir else default_cache_dir()
    entry = cache_dir / f"{fn.__name__}-{features_key(examples, tokenizer, fn, params)}"
    guard = main_process_first(desc=desc) if main_process_first else nullcontext()
    with guard:
        if entry.exists() and not overwrite:
            logger.info("features cache hit: %s", entry)
            return load_from_disk(str(entry)), True
        logger.info("features cache miss: %s", entry)
        feats = examples.map(
            fn, batched=True, num_proc=num_proc, remove_columns=examples.column_names,
            fn_kwargs=dict(tokenizer=tokenizer, **params), desc=desc, load_from_cache_file=False,
        )
        tmp = entry.with_name(entry.name + f".tmp-{os.getpid()}")
        feats.save_to_disk(str(tmp))
        if entry.exists():  # overwrite asked for, or another node won the race
            shutil.rmtree(entry, ignore_errors=True)
        os.replace(tmp, entry)
        return load_from_disk(str(entry)), False

