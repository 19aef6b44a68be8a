"""The project's one reader (gzip by content, UTF-8, every problem a one-line InputError naming the file and the fix)
and its atomic writes, whose files get the umask's mode (0644 under 022: the group reads results on a shared cluster;
temporary files and safetensors would be 0600). `writing` is where a full disk or quota becomes one line (DiskFull);
`optional_output` where it costs only an output the run can do without."""
import contextlib
import errno
import gzip
import json
import logging
import os
import re
import tempfile
import zlib
from pathlib import Path
from types import SimpleNamespace
from typing import Iterator, Optional, Tuple

from qa.errors import EXIT_DISK_FULL, InputError

logger = logging.getLogger(__name__)

GZIP_MAGIC = b"\x1f\x8b"


def require_file(path, what: str = "file") -> None:
    path = os.fspath(path)
    if not os.path.exists(path):
        raise InputError(path, "file not found", f"check the path (a relative path is taken from {os.getcwd()})")
    if os.path.isdir(path):
        raise InputError(path, "is a directory, not a file", f"give the path of the {what}")


def read_bytes(path, what: str = "file") -> bytes:
    path = os.fspath(path)
    require_file(path, what)
    try:
        data = Path(path).read_bytes()
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
    try:
        return read_bytes(path, what).decode("utf-8-sig")  # a byte-order mark is dropped
    except UnicodeDecodeError as exc:
        raise InputError(os.fspath(path), f"is not UTF-8 text (bad byte at offset {exc.start})",
                         "save the file as UTF-8") from exc


def json_error(path, exc: json.JSONDecodeError, lineno: Optional[int] = None, hint: str = "") -> InputError:
    return InputError(f"{os.fspath(path)}, line {lineno or exc.lineno} column {exc.colno}",
                      f"malformed JSON: {exc.msg}",
                      "correct the JSON syntax at that point" + (f" ({hint})" if hint else ""))


def read_json(path, what: str = "file"):
    try:
        return json.loads(read_text(path, what))
    except json.JSONDecodeError as exc:
        raise json_error(path, exc) from exc


def read_record(path) -> dict:
    """The JSON object in `path`; {} when it is missing, unreadable, cut short or not an object: a record that
    another job may have left torn, or never written, is as good as none."""
    try:
        found = read_json(path)
    except InputError:
        return {}
    return found if isinstance(found, dict) else {}


def parse_json_lines(text: str, path) -> Iterator[Tuple[int, object]]:
    for lineno, line in enumerate(text.splitlines(), start=1):
        if line.strip():
            try:
                yield lineno, json.loads(line)
            except json.JSONDecodeError as exc:
                raise json_error(path, exc, lineno) from exc


def new_file_mode() -> int:
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


DISK_FULL = {errno.ENOSPC: "no space left on its file system (ENOSPC)",
             errno.EDQUOT: "the disk quota is exceeded (EDQUOT)"}
WRITE_ELSEWHERE = "free space there and rerun, or write elsewhere: another --output_dir (in a SLURM job: OUTPUT_DIR " \
                  "on the scratch file system)"


class DiskFull(InputError):
    """A write into `folder` found no space or quota left (`code`: ENOSPC or EDQUOT): one line, EXIT_DISK_FULL. A
    cache's write catches it and goes on without the cache."""

    def __init__(self, folder, what: str, code: int, then: str = ""):
        self.folder, self.what, self.code, self.then = os.fspath(folder), what, code, then
        super().__init__(self.folder, f"{DISK_FULL[code]} while writing {what}",
                         WRITE_ELSEWHERE + (f"; {then}" if then else ""), EXIT_DISK_FULL)


def disk_full(exc: BaseException, folder=None) -> Optional[int]:
    """ENOSPC or EDQUOT when `exc`, or an error it came from, says the disk or the quota is full; else None.
    safetensors gives the errno in its message only ("os error 28"), and torch.save's C++ writer not at all ("unexpected
    pos"): for such a RuntimeError, a small write into `folder`, where it was writing, asks the file system."""
    seen = exc
    while seen is not None:
        found = re.search(r"\(os error (\d+)\)", str(seen))
        code = (seen.code if isinstance(seen, DiskFull) else seen.errno if isinstance(seen, OSError)
                else int(found[1]) if found else None)
        if code in DISK_FULL:
            return code
        seen = seen.__cause__ or seen.__context__
    return refuses_writes(folder) if folder is not None and isinstance(exc, RuntimeError) else None


def refuses_writes(folder) -> Optional[int]:
    try:
        os.makedirs(folder, exist_ok=True)
        with tempfile.TemporaryFile(dir=folder) as probe:
            probe.write(b"\0" * 4096)
            probe.flush()
            os.fsync(probe.fileno())
    except OSError as err:
        return err.errno if err.errno in DISK_FULL else None
    return None


@contextlib.contextmanager
def writing(folder, what: str, then: str = "", undo=None):
    """Around a write into `folder`: a full disk or quota ends it with DiskFull (one line naming `folder`, `what` was
    written and the fix; `then`: what a rerun does) in place of whatever the writer raised, after `undo()` removed
    what the write left (a partial folder)."""
    try:
        yield
    except Exception as exc:
        if (code := disk_full(exc, folder)) is None:
            raise
        if undo is not None:
            undo()
        raise DiskFull(folder, what, code, then) from None  # an inner one too: the outer write says more


@contextlib.contextmanager
def optional_output(folder, what: str):
    """Around a write of what a run can do without (TensorBoard events, profiles, plots, n-best predictions): a full
    disk or quota there is one warning and the run goes on; the block's `.stopped` tells a writer to write no more."""
    said = SimpleNamespace(stopped=False)
    try:
        yield said
    except Exception as exc:
        if (code := disk_full(exc, folder)) is None:
            raise
        said.stopped = True
        logger.warning("%s: %s while writing %s: no more of them in this run, which goes on (free space there for the "
                       "next run's)", os.fspath(folder), DISK_FULL[code], what)


@contextlib.contextmanager
def replacing(path):
    """A temporary path beside `path` for the block to write (also a library's save that takes a path): renamed to
    `path` with a new file's mode when the block ends well, removed otherwise, so `path` is whole or as it was."""
    path = os.fspath(path)
    folder = os.path.dirname(path) or "."
    with writing(folder, os.path.basename(path)):
        os.makedirs(folder, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=".tmp-", suffix="-" + os.path.basename(path), dir=folder)
        os.close(fd)
        try:
            yield tmp
            os.chmod(tmp, new_file_mode())  # mkstemp makes it 0600
            os.replace(tmp, path)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise


def atomic_write_text(path, text: str) -> None:
    with replacing(path) as tmp, open(tmp, "w", encoding="utf-8") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())


def atomic_write_json(path, obj, indent: int = 2) -> None:
    atomic_write_text(path, json.dumps(obj, indent=indent) + "\n")
