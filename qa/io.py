"""The project's one reader (gzip by content, UTF-8, every problem a one-line InputError naming the file
and the fix) and its atomic writes, whose files get what the umask gives any new file (0644 under 022:
the group can read results on a shared cluster; temporary files and safetensors would leave 0600)."""
import gzip
import json
import os
import tempfile
import zlib
from pathlib import Path
from typing import Iterator, Optional, Tuple

from qa.errors import InputError

GZIP_MAGIC = b"\x1f\x8b"


def require_file(path, what: str = "file") -> None:
    """`path` exists and is a file (`what` names it in the fix: "data file", "config file")."""
    path = os.fspath(path)
    if not os.path.exists(path):
        raise InputError(path, "file not found", f"check the path (a relative path is taken from {os.getcwd()})")
    if os.path.isdir(path):
        raise InputError(path, "is a directory, not a file", f"give the path of the {what}")


def read_bytes(path, what: str = "file") -> bytes:
    """The file's content, decompressed when its content is gzip, whatever its name."""
    path = os.fspath(path)
    require_file(path, what)
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError as exc:
        raise InputError(path, f"cannot be read ({exc.strerror or exc})", "check the file's permissions") from exc
    if path.lower().endswith(".gz") and data[:2] != GZIP_MAGIC:
        raise InputError(path, "is named .gz but is not gzip-compressed",
                         "drop the .gz suffix, or compress the file with gzip")
    if data[:2] == GZIP_MAGIC:
        try:
            data = gzip.decompress(data)
        except (OSError, EOFError, zlib.error) as exc:
            raise InputError(path, f"is not a valid gzip file ({exc})",
                             "re-create it with gzip (it starts like one but is damaged or truncated)") from exc
    return data


def read_text(path, what: str = "file") -> str:
    """The file's content as UTF-8 text (a byte-order mark is dropped)."""
    try:
        return read_bytes(path, what).decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise InputError(os.fspath(path), f"is not UTF-8 text (bad byte at offset {exc.start})",
                         "save the file as UTF-8") from exc


def json_error(path, exc: json.JSONDecodeError, lineno: Optional[int] = None, hint: str = "") -> InputError:
    """The one message for malformed JSON: the file, line and column, and the fix."""
    return InputError(f"{os.fspath(path)}, line {lineno or exc.lineno} column {exc.colno}",
                      f"malformed JSON: {exc.msg}",
                      "correct the JSON syntax at that point" + (f" ({hint})" if hint else ""))


def read_json(path, what: str = "file"):
    try:
        return json.loads(read_text(path, what))
    except json.JSONDecodeError as exc:
        raise json_error(path, exc) from exc


def parse_json_lines(text: str, path) -> Iterator[Tuple[int, object]]:
    """(line number, parsed value) for each non-blank line of JSON Lines `text` read from `path`."""
    for lineno, line in enumerate(text.splitlines(), start=1):
        if line.strip():
            try:
                yield lineno, json.loads(line)
            except json.JSONDecodeError as exc:
                raise json_error(path, exc, lineno) from exc


def read_json_lines(path, what: str = "file") -> list:
    return [value for _, value in parse_json_lines(read_text(path, what), path)]


def new_file_mode() -> int:
    """The mode `open()` gives a new file under the process's umask."""
    try:  # read without setting it (setting it is not thread-safe) where the system says it
        status = Path("/proc/self/status").read_text()
        mask = int(next(line for line in status.splitlines() if line.startswith("Umask:")).split()[1], 8)
    except (OSError, ValueError, StopIteration):
        mask = os.umask(0o022)
        os.umask(mask)
    return 0o666 & ~mask


def give_new_file_modes(folder) -> None:
    """The files directly in `folder` (just written by a library) get the mode of a new file."""
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
    atomic_write_text(path, json.dumps(obj, indent=indent) + "\n")
