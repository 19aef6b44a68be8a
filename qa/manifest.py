"""The sizes and hashes of a folder's files, recorded when it is written and checked before it is used. Checkpoints
and the features cache live on shared file systems where a copy can be cut short or a file changed later; a size
catches the first, an xxh3-128 hash (1.3 GB in about 0.3 s from the page cache) the second."""
import hashlib
from pathlib import Path

import xxhash

HASH = "xxh3_128"


def file_hash(path) -> str:
    with open(path, "rb") as f:
        return hashlib.file_digest(f, xxhash.xxh3_128).hexdigest()


def record_files(folder, skip=(), verified=None) -> dict:
    """{relative path: {"size", HASH}} of every file under `folder` (subfolders too), but those named in `skip`;
    an entry of `verified` (checked against its file earlier in this process) is kept while the size still fits."""
    folder, verified = Path(folder), verified or {}
    out = {}
    for p in sorted(folder.rglob("*")):
        name = p.relative_to(folder).as_posix()
        if p.is_file() and p.name not in skip:
            size = p.stat().st_size
            known = verified.get(name)
            out[name] = known if known and known["size"] == size else {"size": size, HASH: file_hash(p)}
    return out


def check_files(folder, files: dict):
    """What is wrong with the files of `folder` against `files` (record_files), in a few words, or None."""
    folder = Path(folder)
    for name, recorded in files.items():
        path = folder / name
        try:
            if (size := path.stat().st_size) != recorded["size"]:
                return f"{name} has {size:,} bytes, {recorded['size']:,} when saved"
            if file_hash(path) != recorded[HASH]:
                return f"{name} differs from what was saved (content hash)"
        except FileNotFoundError:
            return f"{name} is missing"
        except OSError as err:
            return f"{name} cannot be read ({err.strerror})"
    return None
