"""File writes that a reader can trust and others can use.

Atomic: a reader sees the old file or the new one, never half of one. Permissions: a file the
run writes gets what the user's umask gives any new file (0644 under umask 022), so a group
member or a teacher on a shared cluster can read the results and load the model; the temporary
files behind atomic writes (and safetensors' own writer) would otherwise leave them at 0600.
"""
import json
import os
import tempfile
from pathlib import Path


def umask() -> int:
    """The process's umask, read without changing it where the system allows."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    except (OSError, ValueError):
        pass
    mask = os.umask(0o022)  # elsewhere the only way to read it is to set it, then put it back
    os.umask(mask)
    return mask


def new_file_mode() -> int:
    """The mode `open()` gives a new file under the current umask."""
    return 0o666 & ~umask()


def give_new_file_modes(folder) -> None:
    """The files directly in `folder` (just written by a library, e.g. model weights) get the
    mode a new file gets under the umask."""
    mode = new_file_mode()
    for entry in os.scandir(folder):
        if entry.is_file(follow_symlinks=False):
            os.chmod(entry.path, mode)


def atomic_write_text(path, text: str) -> None:
    path = os.fspath(path)
    folder = os.path.dirname(os.path.abspath(path))
    os.makedirs(folder, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=".tmp-", suffix="-" + os.path.basename(path), dir=folder)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, new_file_mode())  # mkstemp makes it 0600
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def atomic_write_json(path, obj, indent: int = 2) -> None:
    atomic_write_text(path, json.dumps(obj, indent=indent, sort_keys=False) + "\n")
