"""Which checkpoint to resume from, and how to tell a whole checkpoint from a torn or damaged one.

A checkpoint counts once it holds COMPLETE_MARKER, written atomically after every rank finished
saving (QuestionAnsweringTrainer._save_checkpoint), so a job killed while saving never resumes
from a torn folder. The marker lists each file's size and xxh3-128 hash (a bert-base checkpoint,
1.3 GB, hashes in about 0.3 s from the page cache), so a file damaged later (a cut copy, a full
disk) is caught before resuming and the next newest checkpoint that verifies is used. README,
"Resuming"."""
import json
import logging
import re
import shutil
import zipfile
import zlib
from datetime import datetime
from pathlib import Path

import xxhash

from .errors import InputError
from .io import atomic_write_json, read_json

logger = logging.getLogger(__name__)
COMPLETE_MARKER = "checkpoint_complete.json"
MARKER_FORMAT = 2
HASH = "xxh3_128"
_NAME = re.compile(r"^checkpoint-(\d+)$")
_CHUNK = 8 << 20


def checkpoints(output_dir):
    """[(step, path)] of the checkpoint folders in output_dir, oldest first."""
    found = []
    for path in Path(output_dir).iterdir() if Path(output_dir).is_dir() else []:
        m = _NAME.match(path.name)
        if m and path.is_dir():
            found.append((int(m.group(1)), path))
    return sorted(found)


def is_complete(path) -> bool:
    return (Path(path) / COMPLETE_MARKER).is_file()


def file_hash(path) -> str:
    digest = xxhash.xxh3_128()
    with open(path, "rb") as f:
        while chunk := f.read(_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def _files(folder: Path) -> dict:
    """{path relative to folder: path} of every file in the checkpoint (FSDP shards live in
    subfolders), the marker left out."""
    return {p.relative_to(folder).as_posix(): p for p in sorted(folder.rglob("*"))
            if p.is_file() and p.name != COMPLETE_MARKER}


def write_marker(folder, global_step: int) -> None:
    """Mark `folder` complete, recording what its files are so that they can be verified."""
    folder = Path(folder)
    files = {name: {"size": path.stat().st_size, HASH: file_hash(path)} for name, path in _files(folder).items()}
    atomic_write_json(folder / COMPLETE_MARKER, {"format": MARKER_FORMAT, "global_step": global_step,
                                                 "files": files})


def _marker(folder: Path):
    try:
        marker = read_json(folder / COMPLETE_MARKER)
    except InputError:  # missing, unreadable or cut short: no usable marker
        return None
    return marker if isinstance(marker, dict) else None


def is_verifiable(folder) -> bool:
    """The marker records the files (written by this version), not only the step."""
    marker = _marker(Path(folder))
    return marker is not None and isinstance(marker.get("files"), dict)


def check_checkpoint(folder):
    """What is wrong with a complete checkpoint's files, in a few words, or None if they verify."""
    folder = Path(folder)
    marker = _marker(folder)
    if marker is None:
        return f"its {COMPLETE_MARKER} cannot be read"
    files = marker.get("files")
    if not isinstance(files, dict):
        return _format_problem(folder)
    for name, recorded in files.items():
        path = folder / name
        try:
            size = path.stat().st_size
            if size != recorded["size"]:
                return f"{name} has {size:,} bytes, {recorded['size']:,} when saved"
            if file_hash(path) != recorded[HASH]:
                return f"{name} differs from what was saved (content hash)"
        except FileNotFoundError:
            return f"{name} is missing"
        except OSError as err:
            return f"{name} cannot be read ({err.strerror})"
        except (KeyError, TypeError):
            return f"its {COMPLETE_MARKER} has no size or {HASH} hash for {name}"
    return None


def _format_problem(folder: Path):
    """For a marker of an earlier version: the checks each file's format allows."""
    files = _files(folder)
    if not any(name.endswith((".safetensors", ".bin", ".safetensors.index.json")) or "fsdp" in name
               for name in files):
        return "it holds no model weights"
    if "trainer_state.json" not in files:
        return "trainer_state.json is missing"
    for name, path in files.items():
        try:
            if name.endswith(".safetensors"):
                problem = _safetensors_problem(path)
            elif name.endswith((".pt", ".pth", ".bin")) and zipfile.is_zipfile(path):
                with zipfile.ZipFile(path) as archive:
                    bad = archive.testzip()  # reads every member against its CRC
                problem = None if bad is None else f"member {bad} fails its CRC"
            elif name.endswith((".pt", ".pth")):  # torch.save writes zip files (a .bin may be another format)
                problem = "is not a torch zip file (cut short?)"
            elif name.endswith(".json"):
                read_json(path)
                problem = None
            else:
                problem = None
        except InputError as err:
            problem = f"cannot be read ({err.problem})"
        except (OSError, ValueError, EOFError, zipfile.BadZipFile, zlib.error) as err:
            problem = f"cannot be read ({str(err).splitlines()[0] if str(err) else type(err).__name__})"
        if problem:
            return f"{name} {problem}"
    return None


def _safetensors_problem(path: Path):
    size = path.stat().st_size
    with open(path, "rb") as f:
        head = f.read(8)
        if len(head) < 8:
            return f"has {size} bytes, fewer than a safetensors header"
        length = int.from_bytes(head, "little")
        if length > size - 8:
            return f"has {size:,} bytes, fewer than its {length:,}-byte header"
        header = json.loads(f.read(length))
    end = max((t["data_offsets"][1] for key, t in header.items() if key != "__metadata__"), default=0)
    if 8 + length + end != size:
        return f"has {size:,} bytes, its header describes {8 + length + end:,}"
    return None


def find_checkpoint(output_dir, resume: str):
    """'auto': the newest complete checkpoint in output_dir whose files verify (torn ones and
    damaged newer ones are moved aside); none to verify: None, fresh start; only damaged ones:
    InputError. 'never': none, and old checkpoints are moved aside so they cannot mix into the
    new run. Otherwise the given checkpoint folder, which must verify.
    Run by the main rank only (qa.ranks.on_main_rank): it moves folders."""
    if resume not in ("auto", "never"):
        if not is_complete(resume):
            raise InputError(resume, "not a complete checkpoint folder (no checkpoint_complete.json)",
                             "pass --resume auto, never, or a checkpoint-N folder written by this tool")
        problem = check_checkpoint(resume)
        if problem:
            raise InputError(resume, f"damaged checkpoint: {problem}",
                             "pass --resume auto (the newest checkpoint that verifies), another checkpoint-N "
                             "folder, or --resume never to start afresh")
        _warn_if_unverifiable(resume)
        return resume
    found = checkpoints(output_dir)
    if resume == "never":
        _move_aside(output_dir, [p for _, p in found], "previous")
        return None
    complete = [p for _, p in found if is_complete(p)]
    torn = [p for _, p in found if not is_complete(p)]
    damaged, chosen = [], None
    for path in reversed(complete):
        problem = check_checkpoint(path)
        if problem is None:
            chosen = path
            break
        damaged.append((path, problem))
    if damaged and chosen is None:
        listed = "; ".join(f"{path.name}: {problem}" for path, problem in damaged)
        raise InputError(str(output_dir), f"none of its {len(damaged)} complete checkpoint(s) can be resumed "
                         f"({listed})", "pass --resume never to start afresh (the checkpoints are moved to "
                         "previous-<time>/), or restore the damaged files")
    _move_aside(output_dir, torn, "incomplete")
    aside = _move_aside(output_dir, [path for path, _ in damaged], "damaged", log=False)
    for path, problem in damaged:  # one line each
        logger.warning("%s is damaged (%s): moved to %s; resuming from %s", path.name, problem, aside, chosen.name)
    if chosen is None:
        return None
    _warn_if_unverifiable(chosen)
    logger.info("resuming from %s", chosen)
    return str(chosen)


def _warn_if_unverifiable(path) -> None:
    if not is_verifiable(path):
        logger.warning("%s was marked complete by an earlier version (no file sizes or hashes): its files were "
                       "checked by format only", Path(path).name)


def _move_aside(output_dir, paths, label, log=True):
    if not paths:
        return None
    aside = Path(output_dir) / f"{label}-{datetime.now():%Y%m%d-%H%M%S}"
    aside.mkdir(exist_ok=True)
    for p in paths:
        shutil.move(str(p), aside / p.name)
    if log:
        logger.warning("moved %d %s checkpoint(s) to %s", len(paths), label, aside)
    return aside
