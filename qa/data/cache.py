"""Tokenized features, cached on disk and shared across runs and ranks.

The key hashes all the features depend on: the examples themselves, the tokenizer's full definition,
the function, its parameters and the code of qa/data/features.py. Per node, local rank 0 tokenizes
while the other ranks wait; an entry appears by an atomic rename, so a killed run leaves no half of one.
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
    if dataset not in _DIGESTS:
        sink = pa.BufferOutputStream()
        table = dataset.with_format("arrow")[:]  # the rows it holds, also for a select()ed view
        with pa.ipc.new_stream(sink, table.schema) as writer:
            writer.write_table(table)
        _DIGESTS[dataset] = hashlib.sha256(sink.getvalue()).hexdigest()
    return _DIGESTS[dataset]


def _tokenizer_digest(tokenizer) -> str:
    definition = json.loads(tokenizer.backend_tokenizer.to_str())
    # Per-call state, set by each call from arguments the key holds as `params`: hashed, it made a
    # split's key depend on what the process had tokenized before.
    for key in ("truncation", "padding"):
        definition.pop(key, None)
    # Settings outside the backend's definition that change the features (question/context order,
    # where windows start, whether token_type_ids are made, padding and the CLS label).
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
    parts = {"examples": table_digest(examples), "tokenizer": _tokenizer_digest(tokenizer), "function": fn.__name__,
             "code": hashlib.sha256(inspect.getsource(features_module).encode()).hexdigest(), "params": params}
    return hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()[:24]


def cached_features(examples, tokenizer, fn, params: dict, *, cache_dir=None, num_proc=None,
                    overwrite=False, main_process_first=None, desc="tokenizing"):
    """Map `fn(batch, tokenizer, **params)` over `examples`, reusing a cached result."""
    from datasets import load_from_disk

    cache_dir = Path(cache_dir) if cache_dir else default_cache_dir()
    entry = cache_dir / f"{fn.__name__}-{features_key(examples, tokenizer, fn, params)}"
    with main_process_first(desc=desc) if main_process_first else nullcontext():
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

