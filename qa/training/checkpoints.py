"""Which checkpoint to resume from, and how to tell a whole checkpoint from a torn or damaged one.

A checkpoint counts once it holds COMPLETE_MARKER, written atomically after every rank finished
saving (QuestionAnsweringTrainer._save_checkpoint), so a job killed while saving never resumes
from a torn folder. The marker lists each file's size and xxh3-128 hash (a bert-base checkpoint,
1.3 GB, hashes in about 0.3 s from the page cache), so a file damaged later (a cut copy, a full
disk) is caught before resuming and the next newest checkpoint that verifies is used.

The marker also records what the checkpoint's steps mean (run_record: the model, the global
batch, the windows, the training data), so that a run whose settings would change that is
refused before anything is written (check_resume), as is a run that would train no further than
the checkpoint or than the finished run of its folder: it would overwrite that run's results with
those of a run that trained less. README, "Resuming"."""
import json
import logging
import re
import shutil
import zipfile
import zlib
from datetime import datetime
from pathlib import Path

import xxhash

from qa.errors import InputError
from qa.io import atomic_write_json, read_json
from qa.training.runlock import LOCK_NAME as LOCK

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


def write_marker(folder, global_step: int, run=None) -> None:
    """Mark `folder` complete, recording what its files are so that they can be verified, and the
    run_record of the run that wrote it."""
    folder = Path(folder)
    files = {name: {"size": path.stat().st_size, HASH: file_hash(path)} for name, path in _files(folder).items()}
    atomic_write_json(folder / COMPLETE_MARKER, {"format": MARKER_FORMAT, "global_step": global_step,
                                                 "files": files, "run": run})


def run_record(model_config, training_args, data_args, train_examples) -> dict:
    """What a checkpoint's steps mean (the model's shape, the global batch, the windows, the
    training data: another value of any of these is refused), how the run splits its batch and
    where it ends (these may change)."""
    from qa.data.cache import table_digest

    args = training_args
    shape = {k: v for k, v in model_config.to_dict().items()
             if k == "model_type" or (type(v) is int and not k.endswith("_token_id"))}
    return {"model": shape,
            "global batch": args.per_device_train_batch_size * args.gradient_accumulation_steps * args.world_size,
            "max_seq_length": data_args.max_seq_length, "doc_stride": data_args.doc_stride,
            "training data": f"{len(train_examples):,} questions, content {table_digest(train_examples)[:12]}",
            "per-device batch": f"{args.per_device_train_batch_size} x {args.gradient_accumulation_steps} accumulation "
                                f"x {args.world_size} processes",
            "num_train_epochs": args.num_train_epochs, "max_steps": args.max_steps}


MEANING = ("model", "global batch", "max_seq_length", "doc_stride", "training data")
MAY_CHANGE = ("per-device batch", "num_train_epochs", "max_steps")
# In output_dir, written once a training has finished (Trainer.save_state): its step and epoch.
FINISHED = "trainer_state.json"


def _changes(recorded: dict, run: dict, keys) -> list:
    """[(what, recorded value, this run's value)] for the `keys` that differ."""
    changed = []
    for key in keys:
        was, now = recorded.get(key), run.get(key)
        if key == "model" and isinstance(was, dict):
            changed += [(f"model {k}", was.get(k), now.get(k)) for k in sorted({*was, *now})
                        if was.get(k) != now.get(k)]
        elif was is not None and was != now:
            changed.append((key, *(f"{v:g}" if isinstance(v, float) else v for v in (was, now))))
    return changed


def _progress(path):
    """(global_step, epoch) of a trainer_state.json, or None."""
    try:
        state = read_json(path)
        return int(state["global_step"]), float(state["epoch"] or 0)
    except (InputError, KeyError, TypeError, ValueError):
        return None


def finished_run(output_dir):
    """(global_step, epoch) of the training that finished in output_dir, or None."""
    return _progress(Path(output_dir) / FINISHED)


def _checkpoint_progress(folder):
    return _progress(Path(folder) / "trainer_state.json") or (0, 0.0)


def checkpoint_step(folder) -> int:
    """The optimizer step a checkpoint was saved at."""
    return _checkpoint_progress(folder)[0]


def _run_ended(output_dir) -> bool:
    """The run of output_dir got to its end: the last thing it does is to add its wall clock to
    all_results.json (qa.results.records.finish_run)."""
    try:
        return "WALL_CLOCK_SECONDS" in read_json(Path(output_dir) / "all_results.json")
    except (InputError, TypeError):
        return False


def finished_run_error(output_dir, done, why: str, longer: str = "") -> InputError:
    """The refusal of a run that would overwrite the finished run `done` ((step, epoch)) of output_dir."""
    step, epoch = done
    return InputError(str(output_dir), f"holds a finished run (trained to step {step}, epoch {epoch:g}); {why}",
                      f"{longer}to train afresh, --resume never (moves that run to previous-<time>/ there) or another "
                      f"--output_dir; to evaluate it again, --model_name_or_path {output_dir} --do_eval with another "
                      "--output_dir")


def check_no_finished_run(output_dir) -> None:
    """A run that does not train would overwrite the results of a finished one: refused."""
    finished = finished_run(output_dir)
    if finished:
        raise finished_run_error(output_dir, finished, "a run that does not train would overwrite its results")


def check_resume(checkpoint, run: dict, finished=None) -> None:
    """Before anything is written: InputError when resuming `checkpoint` with this run's run_record
    `run` would change what its steps mean, or would train no further than the checkpoint or than
    the finished run of its folder (`finished`: finished_run), unless that run ended its training
    at this checkpoint but not its evaluation; one line for each change that stays allowed (another
    split of the same global batch, after an out-of-memory error; a longer training)."""
    checkpoint = Path(checkpoint)
    recorded = (_marker(checkpoint) or {}).get("run") or {}  # none in markers of earlier versions
    changed = "; ".join(f"{what} {was} (this run: {now})" for what, was, now in _changes(recorded, run, MEANING))
    if changed:
        raise InputError(str(checkpoint), f"was written by a run whose steps mean something else: {changed}",
                         "resume it with the settings it was written with, or start afresh: --resume never (moves the "
                         "earlier run to previous-<time>/) or another --output_dir")
    own = _checkpoint_progress(checkpoint)
    done = finished if finished and finished[0] > own[0] else own
    step, epoch = done
    # The Trainer's end: --max_steps, else the epochs (the checkpoint's epoch counts those done).
    if (run["max_steps"] > step) if run["max_steps"] > 0 else (run["num_train_epochs"] > epoch + 1e-9):
        for what, was, now in _changes(recorded, run, MAY_CHANGE):
            logger.warning("resuming %s with %s %s (it was written with %s)", checkpoint.name, what, now, was)
        return
    if finished and own[0] == finished[0] and not _run_ended(checkpoint.parent):
        # A job stopped during its final evaluation and requeued: resumed at its end, the Trainer loads the
        # trained weights and trains nothing, and run_qa.py keeps the training's records as they are.
        logger.warning("%s: the training ended here (step %d) but not the run: evaluating, the training's results "
                       "stay as they are", checkpoint.name, step)
        return
    end = (f"--max_steps {run['max_steps']}" if run["max_steps"] > 0
           else f"--num_train_epochs {run['num_train_epochs']:g}")
    longer = f"to train longer, raise --num_train_epochs above {epoch:g} (or --max_steps above {step}); "
    if done == finished:
        raise finished_run_error(checkpoint.parent, done, f"this run ({end}) would train no further", longer)
    raise InputError(str(checkpoint), f"is at step {step}, epoch {epoch:g}, where this run ({end}) ends: it would "
                     "train nothing", longer + "to train afresh, --resume never or another --output_dir")


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


def find_checkpoint(output_dir, resume: str, run=None):
    """'auto': the newest complete checkpoint in output_dir whose files verify (torn ones and
    damaged newer ones are moved aside); none to verify: None, fresh start; only damaged ones:
    InputError. 'never': none, and the earlier run (checkpoints, results, events) is moved aside
    so that nothing of it mixes into the new run. Otherwise the given checkpoint folder, which
    must verify. With this run's run_record `run`, the checkpoint must fit it (check_resume), and
    a finished run in output_dir is not started over; both are checked before anything is moved.
    Run by the main rank only (qa.distributed.on_main_rank): it moves folders."""
    if resume == "never":
        earlier = [p for p in Path(output_dir).iterdir() if p.name != LOCK and not _ASIDE.match(p.name)]
        _move_aside(output_dir, earlier, "previous")
        return None
    finished = finished_run(output_dir) if run is not None else None
    if resume != "auto":
        if not is_complete(resume):
            raise InputError(resume, "not a complete checkpoint folder (no checkpoint_complete.json)",
                             "pass --resume auto, never, or a checkpoint-N folder written by this tool")
        problem = check_checkpoint(resume)
        if problem:
            raise InputError(resume, f"damaged checkpoint: {problem}",
                             "pass --resume auto (the newest checkpoint that verifies), another checkpoint-N "
                             "folder, or --resume never to start afresh")
        if run is not None:
            check_resume(resume, run, finished)
        _warn_if_unverifiable(resume)
        return resume
    found = checkpoints(output_dir)
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
    if chosen is not None and run is not None:
        check_resume(chosen, run, finished)
    elif finished:
        raise finished_run_error(output_dir, finished, "without a checkpoint to continue from, this run would start "
                                 "afresh over it")
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


_ASIDE = re.compile(r"^(previous|incomplete|damaged)-\d{8}-\d{6}$")  # what _move_aside makes


def _move_aside(output_dir, paths, label, log=True):
    if not paths:
        return None
    aside = Path(output_dir) / f"{label}-{datetime.now():%Y%m%d-%H%M%S}"
    aside.mkdir(exist_ok=True)
    for p in paths:
        shutil.move(str(p), aside / p.name)
    if log:
        logger.warning("moved %s to %s", ", ".join(sorted(p.name for p in paths)), aside)
    return aside
