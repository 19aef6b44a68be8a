"""Tokenized features, cached on disk and shared across runs, ranks and nodes (docs/running.md, "Data"). The key hashes
the code of the function and of the project functions it calls (code_digest), so an edit elsewhere keeps the entries.
An entry, NAME.json, points to a version folder with its files' sizes and hashes; a writer switches the pointer last."""
import hashlib
import inspect
import json
import logging
import os
import re
import secrets
import shutil
import socket
import time
import weakref
from contextlib import nullcontext, suppress
from pathlib import Path

import pyarrow as pa

from qa.errors import InputError
from qa.io import DISK_FULL, atomic_write_json, disk_full, read_json, writing
from qa.manifest import check_files, record_files
from qa.training.runlock import process_start  # the run lock's test of a live process

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
    # per-call state, set from arguments the key holds as `params`: hashed, it made keys depend on earlier calls
    for key in ("truncation", "padding"):
        definition.pop(key, None)
    # settings outside the backend's definition that change the features (order, windows, token_type_ids, CLS)
    definition["python_side"] = {"padding_side": tokenizer.padding_side,
                                 "truncation_side": tokenizer.truncation_side,
                                 "model_input_names": list(tokenizer.model_input_names),
                                 "special_tokens": {name: [str(token), tokenizer.convert_tokens_to_ids(str(token))]
                                                    for name, token in sorted(tokenizer.special_tokens_map.items())
                                                    if isinstance(token, str)},
                                 "pad_token_type_id": tokenizer.pad_token_type_id}
    return hashlib.sha256(json.dumps(definition, sort_keys=True).encode()).hexdigest()


def code_digest(fn) -> str:
    """Hash of the source of `fn` and of every project function and plain constant it names, transitively."""
    digest, seen, todo = hashlib.sha256(), set(), [fn]
    while todo:
        fn = todo.pop()
        if fn in seen:
            continue
        seen.add(fn)
        digest.update(f"{fn.__module__}.{fn.__qualname__}\n{inspect.getsource(fn)}".encode())
        for name in sorted(_names(fn.__code__)):  # globals loaded by it and by the code nested in it (comprehensions)
            value = fn.__globals__.get(name)
            if inspect.isfunction(value) and value.__module__.split(".")[0] in ("qa", "utils_qa"):
                todo.append(value)
            elif isinstance(value, (bool, int, float, str, bytes, tuple)):
                digest.update(f"{name}={value!r}\n".encode())
    return digest.hexdigest()


def _names(code) -> set:
    return set(code.co_names).union(*(_names(c) for c in code.co_consts if inspect.iscode(c)))


def features_key(examples, tokenizer, fn, params: dict) -> str:
    parts = {"examples": table_digest(examples), "tokenizer": _tokenizer_digest(tokenizer), "function": fn.__name__,
             "code": code_digest(fn), "params": params}
    return hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()[:24]


def cached_features(examples, tokenizer, fn, params: dict, *, cache_dir=None, num_proc=None,
                    overwrite=False, main_process_first=None, desc="tokenizing"):
    """Map `fn(batch, tokenizer, **params)` over `examples`, reusing a cached result."""
    from datasets import load_from_disk

    cache_dir = Path(cache_dir) if cache_dir else default_cache_dir()
    pointer = cache_dir / f"{fn.__name__}-{features_key(examples, tokenizer, fn, params)}.json"
    with main_process_first(desc=desc) if main_process_first else nullcontext():
        _clean(cache_dir)
        if pointer.exists() and not overwrite:
            feats, problem = _load(pointer)
            if problem is None:
                logger.info("features cache hit: %s", pointer)
                return feats, True
            logger.warning("features cache entry %s is damaged (%s): rebuilding it", pointer, problem)
        else:
            logger.info("features cache miss: %s", pointer)
        work, feats = dict(batched=True, num_proc=num_proc, remove_columns=examples.column_names, desc=desc,
                           fn_kwargs=dict(tokenizer=tokenizer, **params), load_from_cache_file=False), None
        try:  # datasets writes the map of a dataset read from disk beside it: in HF_HOME too, for a Hub dataset
            feats = examples.map(fn, **work)
            return load_from_disk(str(_publish(feats, pointer))), False
        except Exception as exc:  # a cache is an optimisation: on a full disk the run goes on without it
            if (code := disk_full(exc)) is None:
                raise
        logger.warning("features cache %s: %s: this run goes on with its features in memory, uncached", cache_dir,
                       DISK_FULL[code])
        return (examples.map(fn, keep_in_memory=True, **work) if feats is None else feats), False


KEEP_REPLACED_S = 7 * 86400  # longer than a job's time limit: no job that loaded a replaced version still reads it
FOREIGN_TMP_S = 86400  # a save takes minutes: a staging folder of another node untouched for a day has no writer
_NAME = r"[A-Za-z_]\w*-[0-9a-f]{24}"  # function-key, as cached_features names an entry
_TMP = re.compile(rf"^{_NAME}\.tmp-(?:(?P<host>.+)-)?(?P<pid>\d+)$")  # no host: written by an earlier release
_VERSION = re.compile(rf"^(?P<name>{_NAME})\.v-[0-9a-f]+$")


def _entry(pointer: Path):
    """(version folder, files record) the pointer names; ValueError when it is unreadable or names nothing."""
    try:
        record = read_json(pointer)
        folder, files = record["folder"], record["files"]
    except (InputError, KeyError, TypeError) as err:
        raise ValueError(f"its pointer {pointer.name} cannot be read") from err
    version = _VERSION.match(folder) if isinstance(folder, str) else None
    if not (version and version["name"] == pointer.name.removesuffix(".json") and isinstance(files, dict) and files):
        raise ValueError(f"its pointer {pointer.name} names no version folder and files")
    return pointer.parent / folder, files


def _load(pointer: Path):
    """(features, None) when the entry verifies and loads; (None, what is wrong) otherwise."""
    from datasets import load_from_disk

    try:
        folder, files = _entry(pointer)
    except ValueError as err:
        return None, str(err)
    if problem := check_files(folder, files):
        return None, f"{folder.name}/{problem}"
    try:
        return load_from_disk(str(folder)), None
    except (OSError, ValueError, pa.ArrowException) as err:  # verified, yet unreadable: a datasets release apart
        return None, f"{folder.name} cannot be loaded ({type(err).__name__})"


def _publish(feats, pointer: Path) -> Path:
    name = pointer.name.removesuffix(".json")
    tmp = pointer.with_name(f"{name}.tmp-{socket.gethostname()}-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)  # this process's own, from a try that failed
    folder = pointer.with_name(f"{name}.v-{secrets.token_hex(6)}")
    # A full disk leaves neither the staging nor the version folder behind, and the pointer as it was
    with writing(pointer.parent, pointer.name, undo=lambda: (shutil.rmtree(tmp, True), shutil.rmtree(folder, True))):
        feats.save_to_disk(str(tmp))
        files = record_files(tmp)
        os.replace(tmp, folder)
        with suppress(ValueError, OSError):  # the replaced version's KEEP_REPLACED_S starts before the switch
            os.utime(_entry(pointer)[0])
        atomic_write_json(pointer, {"format": 1, "folder": folder.name, "files": files})
    return folder


def _clean(cache_dir: Path) -> None:
    host, now = socket.gethostname(), time.time()
    for path in (cache_dir.iterdir() if cache_dir.is_dir() else []):
        tmp, version = _TMP.match(path.name), _VERSION.match(path.name)
        try:
            age = now - path.stat().st_mtime
        except OSError:  # removed by another cleaner meanwhile
            continue
        why = current = None
        if tmp:  # only this node can tell whether its writer lives; elsewhere (or a pid taken again) age decides
            why = ("its writer died" if tmp["host"] == host and process_start(int(tmp["pid"])) is None
                   else "left for a day" if age > FOREIGN_TMP_S else None)
        elif version and age > KEEP_REPLACED_S:
            with suppress(ValueError):
                current = _entry(cache_dir / f"{version['name']}.json")[0].name
            why = "replaced" if current != path.name else None
        if why and path.is_dir():
            logger.info("features cache: removing %s (%s)", path.name, why)
            shutil.rmtree(path, ignore_errors=True)
