"""Which checkpoint to resume from, and how to tell a complete checkpoint from a torn one.

The Trainer writes a checkpoint's files one by one into `checkpoint-N/`; a job killed at its
time limit while saving leaves a folder that looks like a checkpoint but is not one. So a
checkpoint counts only once it holds COMPLETE_MARKER, written atomically after every rank has
finished saving (see QuestionAnsweringTrainer._save_checkpoint).
"""
import logging
import os
import re
import shutil
from datetime import datetime
from pathlib import Path

from .errors import InputError

logger = logging.getLogger(__name__)
COMPLETE_MARKER = "checkpoint_complete.json"
_NAME = re.compile(r"^checkpoint-(\d+)$")


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


def _is_main_rank() -> bool:
    return os.environ.get("RANK", "0") == "0"


def find_checkpoint(output_dir, resume: str):
    """'auto': the last complete checkpoint in output_dir (torn ones are moved aside);
    'never': none, and old checkpoints are moved aside so they cannot mix into the new run;
    otherwise the given checkpoint folder."""
    if resume not in ("auto", "never"):
        if not is_complete(resume):
            raise InputError(resume, "not a complete checkpoint folder (no checkpoint_complete.json)",
                             "pass --resume auto, never, or a checkpoint-N folder written by this tool")
        return resume
    found = checkpoints(output_dir)
    complete = [p for _, p in found if is_complete(p)]
    torn = [p for _, p in found if not is_complete(p)]
    if resume == "never":
        _move_aside(output_dir, [p for _, p in found], "previous")
        return None
    _move_aside(output_dir, torn, "incomplete")
    if complete:
        logger.info("resuming from %s", complete[-1])
    return str(complete[-1]) if complete else None


def _move_aside(output_dir, paths, label):
    if not paths or not _is_main_rank():
        return
    aside = Path(output_dir) / f"{label}-{datetime.now():%Y%m%d-%H%M%S}"
    aside.mkdir(exist_ok=True)
    for p in paths:
        shutil.move(str(p), aside / p.name)
    logger.warning("moved %d %s checkpoint(s) to %s", len(paths), label, aside)
