"""Checkpoints, a run's one object for them. A checkpoint counts once COMPLETE_MARKER, written after every rank saved,
lists its files' sizes and hashes and what its steps mean: a job killed while saving, a file damaged since or a run
with other settings never resumes it. What is refused, and why: docs/running.md, "Resuming"."""
import contextlib
import logging
import re
import shutil
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

from qa.distributed import on_main_rank
from qa.errors import InputError
from qa.io import atomic_write_json, give_new_file_modes, read_record, replacing, writing
from qa.manifest import check_files, record_files
from qa.training.runlock import LOCK_NAME

logger = logging.getLogger(__name__)
COMPLETE_MARKER = "checkpoint_complete.json"
MEANING = ("model", "global batch", "max_seq_length", "doc_stride", "training data")  # another value is refused
MAY_CHANGE = ("per-device batch", "num_train_epochs", "max_steps")
_NAME = re.compile(r"^checkpoint-(\d+)$")
TRAINING_ONLY = ("optimizer", "scheduler", "scaler", "rng_state", COMPLETE_MARKER)  # what a model folder leaves out
_ASIDE = re.compile(r"^(previous|incomplete|damaged)-\d{8}-\d{6}$")  # what _move_aside makes


def checkpoints(output_dir):
    folder = Path(output_dir)
    named = [(_NAME.match(p.name), p) for p in (folder.iterdir() if folder.is_dir() else [])]
    return sorted((int(m.group(1)), p) for m, p in named if m and p.is_dir())


def _changes(recorded: dict, run: dict, keys) -> list:
    changed = []
    for key in keys:
        was, now = recorded.get(key), run.get(key)
        if key == "model" and isinstance(was, dict):
            changed += [(f"model {k}", was.get(k), now.get(k)) for k in sorted({*was, *now})
                        if was.get(k) != now.get(k)]
        elif was is not None and was != now:
            changed.append((key, *(f"{v:g}" if isinstance(v, float) else v for v in (was, now))))
    return changed


def progress(folder):
    """(global_step, epoch) of the trainer_state.json in `folder`, or None. In a checkpoint: where it was
    saved; in an output_dir: where its training finished (Trainer.save_state, once it has)."""
    state = read_record(Path(folder) / "trainer_state.json")
    try:
        return int(state["global_step"]), float(state["epoch"] or 0)
    except (KeyError, TypeError, ValueError):
        return None


def _trains_further(run: dict, done) -> bool:
    """Whether the run of record `run` ends past `done` ((step, epoch)): the Trainer's end is --max_steps, else
    the epochs (a checkpoint's epoch counts those done)."""
    step, epoch = done
    return (run["max_steps"] > step) if run["max_steps"] > 0 else (run["num_train_epochs"] > epoch + 1e-9)


def finished_run_error(output_dir, done, why: str, longer: str = "") -> InputError:
    step, epoch = done
    return InputError(str(output_dir), f"holds a finished run (trained to step {step}, epoch {epoch:g}); {why}",
                      f"{longer}--resume never moves it to previous-<time>/ and starts afresh; to evaluate it, "
                      f"--model_name_or_path {output_dir} --do_eval, another --output_dir")


def _check_resume(checkpoint, run: dict, finished=None) -> bool:
    """Before anything is written: InputError when resuming `checkpoint` for the run `run` would change what its steps
    mean, or train no further than it or the finished run of its folder (`finished`: its progress). False when the
    training ended there but its model never reached output_dir (a full disk or a kill while it was saved)."""
    checkpoint = Path(checkpoint)
    recorded = read_record(checkpoint / COMPLETE_MARKER).get("run") or {}
    if changed := "; ".join(f"{what} {was} (now {now})" for what, was, now in _changes(recorded, run, MEANING)):
        raise InputError(str(checkpoint), f"its steps mean something else: {changed}",
                         "resume with its own settings, or start afresh: --resume never (moves it to previous-<time>/) "
                         "or another --output_dir")
    own = progress(checkpoint)
    done = finished if finished and finished[0] > own[0] else own
    step, epoch = done
    if _trains_further(run, done):
        for what, was, now in _changes(recorded, run, MAY_CHANGE):
            logger.warning("resuming %s with %s %s (it was written with %s)", checkpoint.name, what, now, was)
        return True
    if finished is None:
        return False
    end = (f"--max_steps {run['max_steps']}" if run["max_steps"] > 0
           else f"--num_train_epochs {run['num_train_epochs']:g}")
    longer = f"{end.split()[0]} above {step if run['max_steps'] > 0 else format(epoch, 'g')} trains longer; "
    if done == finished:
        raise finished_run_error(checkpoint.parent, done, f"{end} trains no further", longer)
    raise InputError(str(checkpoint), f"is at step {step}, epoch {epoch:g}, where this run ({end}) ends: it would "
                     "train nothing", longer + "to train afresh, --resume never or another --output_dir")


@dataclass
class Checkpoints:
    """The checkpoints of output_dir, for a run whose steps mean `run` (None for a run that does not train)."""
    output_dir: str
    run: dict | None = None
    resume_from: str | None = None  # None: a fresh start
    trained_here: bool = False  # the training of output_dir ended but its run did not: its model is evaluated

    @classmethod
    def open(cls, model_config, training_args, data_args, resume: str, train_examples):
        """This run's checkpoints, the one to resume chosen on the main rank (it moves folders) for every rank."""
        from qa.data.cache import table_digest

        opened, args = cls(training_args.output_dir), training_args
        if args.do_train:
            opened.run = {
                "model": {k: v for k, v in model_config.to_dict().items()
                          if k == "model_type" or (type(v) is int and not k.endswith("_token_id"))},
                "global batch": args.per_device_train_batch_size * args.gradient_accumulation_steps * args.world_size,
                "max_seq_length": data_args.max_seq_length, "doc_stride": data_args.doc_stride,
                "training data": f"{len(train_examples):,} questions, content {table_digest(train_examples)[:12]}",
                "per-device batch": f"{args.per_device_train_batch_size} x {args.gradient_accumulation_steps} "
                                    f"accumulation x {args.world_size} processes",
                "num_train_epochs": args.num_train_epochs, "max_steps": args.max_steps}
        if resume is not None:  # None: the check job, which neither resumes nor moves anything in output_dir
            opened.resume_from = on_main_rank(lambda: opened.choose(resume))
        opened.trained_here = opened.resume_from is not None and Path(opened.resume_from) == Path(opened.output_dir)
        return opened

    def choose(self, resume: str, move: bool = True):
        """The checkpoint to resume from, None for a fresh start, output_dir itself when its training ended but its run
        did not (docs/running.md, "Resuming"); every refusal comes before anything is moved. `move` False (the check
        job, check_qa.py): the same answer and refusals, nothing moved or copied."""
        output_dir, run = self.output_dir, self.run
        if resume == "never":
            if move:
                _move_aside(output_dir, [p for p in Path(output_dir).iterdir()
                                         if p.name != LOCK_NAME and not _ASIDE.match(p.name)], "previous")
            return None
        finished = progress(output_dir)
        if run is None:
            if finished:
                raise finished_run_error(output_dir, finished, "a run that does not train would overwrite its results")
            return None
        # The run's last act adds its wall clock to all_results.json (records.finish_run)
        run_ended = "WALL_CLOCK_SECONDS" in read_record(Path(output_dir) / "all_results.json")
        if finished and not run_ended and not _trains_further(run, finished):
            # Not from its last checkpoint: the Trainer checks its end after a step, so a resume there can train
            # one step past --max_steps. Without checkpoints (save_strategy no) there is only this model anyway.
            logger.warning("%s: the training ended (step %d) but not the run: evaluating the model it trained; the "
                           "training's records stay as they are", output_dir, finished[0])
            return str(output_dir)
        if resume != "auto":
            if not (Path(resume) / COMPLETE_MARKER).is_file():
                raise InputError(resume, "not a complete checkpoint folder (no checkpoint_complete.json)",
                                 "pass --resume auto, never, or a checkpoint-N folder written by this tool")
            if problem := self.verify(resume):
                raise InputError(resume, f"damaged checkpoint: {problem}",
                                 "pass --resume auto (the newest checkpoint that verifies), another checkpoint-N "
                                 "folder, or --resume never to start afresh")
            if _check_resume(resume, run, finished):
                return resume
            return self._trained_in(Path(resume)) if move else str(output_dir)
        found = [path for _, path in checkpoints(output_dir)]
        complete = [p for p in found if (p / COMPLETE_MARKER).is_file()]
        damaged, chosen = [], None
        for path in reversed(complete):
            if (problem := self.verify(path)) is None:
                chosen = path
                break
            damaged.append((path, problem))
        if damaged and chosen is None:
            more = f"; {len(damaged) - 1} more damaged" if len(damaged) > 1 else ""  # the newest: the line stays short
            listed = f"{damaged[0][0].name}: {damaged[0][1]}{more}"
            raise InputError(str(output_dir), f"none of its {len(damaged)} complete checkpoint(s) can be resumed "
                             f"({listed})", "pass --resume never to start afresh (the checkpoints are moved to "
                             "previous-<time>/), or restore the damaged files")
        ended = chosen is not None and not _check_resume(chosen, run, finished)
        if chosen is None and finished:
            raise finished_run_error(output_dir, finished, "without a checkpoint to continue from, this run would "
                                     "start afresh over it")
        if not move:
            return str(output_dir) if ended else chosen and str(chosen)
        _move_aside(output_dir, [p for p in found if p not in complete], "incomplete")
        aside = _move_aside(output_dir, [path for path, _ in damaged], "damaged", log=False)
        for path, problem in damaged:
            logger.warning("%s is damaged (%s): moved to %s; resuming from %s", path.name, problem, aside, chosen.name)
        if ended:
            return self._trained_in(chosen)
        if chosen is not None:
            logger.info("resuming from %s", chosen)
        return chosen and str(chosen)

    def _trained_in(self, checkpoint: Path) -> str:
        """output_dir, given the model and trainer_state.json (last: the training ended) of `checkpoint`, where the
        training ended; the run evaluates it as one stopped in its final evaluation."""
        names = [p.name for p in checkpoint.iterdir() if p.is_file() and not p.name.startswith(TRAINING_ONLY)]
        for name in sorted(names, key=lambda name: name == "trainer_state.json"):
            with replacing(Path(self.output_dir) / name) as tmp:
                shutil.copyfile(checkpoint / name, tmp)
        logger.warning("%s: the training ended in %s but its model was not saved (a full disk, or stopped while "
                       "saving): evaluating the model of %s; that training's figures (train_results.json) are lost",
                       self.output_dir, checkpoint.name, checkpoint.name)
        return str(self.output_dir)

    def mark(self, folder, global_step: int) -> None:
        """Marks `folder` complete: its files' sizes and hashes (FSDP shards in subfolders too), what its steps mean."""
        files = record_files(folder, skip=(COMPLETE_MARKER,))
        atomic_write_json(Path(folder) / COMPLETE_MARKER,
                          {"format": 2, "global_step": global_step, "files": files, "run": self.run})

    @contextlib.contextmanager
    def saving(self, folder, global_step: int, writer: bool):
        """Around a checkpoint's save by every rank: incomplete while written, then marked complete by the `writer`.
        A full disk ends the run with one line; the writer removes the torn folder (its space, for the rerun)."""
        folder = Path(folder)
        with writing(folder.parent, folder.name, self.rerun(folder),
                     undo=lambda: writer and shutil.rmtree(folder, ignore_errors=True)):
            if writer:
                (folder / COMPLETE_MARKER).unlink(missing_ok=True)
            yield
            if writer:
                give_new_file_modes(folder)  # safetensors writes weights 0600 whatever the umask
                self.mark(folder, global_step)

    def rerun(self, saving=None) -> str:
        """What the same command does next, in words: it goes on from the newest complete checkpoint (not `saving`)."""
        done = [p.name for _, p in checkpoints(self.output_dir) if p != saving and (p / COMPLETE_MARKER).is_file()]
        return f"the rerun goes on from {done[-1]}" if done else "the rerun starts afresh"

    @staticmethod
    def verify(folder):
        """What is wrong with a complete checkpoint's files, in a few words, or None if they verify."""
        files = read_record(Path(folder) / COMPLETE_MARKER).get("files")
        if not isinstance(files, dict):  # unreadable, or a marker of an earlier version: nothing to verify against
            return f"its {COMPLETE_MARKER} lists no files to verify"
        return check_files(folder, files)

    def remove_incomplete(self) -> None:
        """Once the training has ended: the incomplete-<time> folders of saves cut short (_move_aside), which nothing
        resumes from. Complete checkpoints, previous-<time> and damaged-<time> (complete when saved) stay."""
        torn = sorted(p for p in Path(self.output_dir).glob("incomplete-*") if _ASIDE.match(p.name))
        for path in torn:
            shutil.rmtree(path, ignore_errors=True)
        if removed := [p.name for p in torn if not p.exists()]:
            logger.info("removed %d folder(s) of checkpoint saves cut short (never resumed from) in %s: %s",
                        len(removed), self.output_dir, ", ".join(removed))


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
