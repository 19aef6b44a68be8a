"""One run per output folder: rank 0 takes `output_dir/run.lock` (RunLock.acquire) before writing there and releases
it at the end; another run refuses with one line naming the holder. docs/running.md."""
import contextlib
import json
import logging
import os
import socket
import threading
import time
from pathlib import Path

from qa.errors import InputError
from qa.io import writing

logger = logging.getLogger(__name__)
LOCK_NAME = "run.lock"
HEARTBEAT_SECONDS = 60
STALE_AFTER_SECONDS = 10 * 60


def process_start(pid: int):
    """When process `pid` started (clock ticks since boot: with the pid it names one process), None if it ended."""
    with contextlib.suppress(OSError):
        stat = Path(f"/proc/{pid}/stat").read_text()
        fields = stat[stat.rindex(")") + 2:].split()  # the command name may hold spaces and parentheses
        return None if fields[0] == "Z" else int(fields[19])  # a zombie has ended
    return None


def this_run() -> dict:
    return {"host": socket.gethostname(), "pid": os.getpid(), "process_start": process_start(os.getpid()),
            "slurm_job_id": os.environ.get("SLURM_JOB_ID"),
            "slurm_restart_count": int(os.environ.get("SLURM_RESTART_COUNT") or 0),
            "started_utc": time.strftime("%Y-%m-%dT%H:%M:%S+00:00", time.gmtime())}


def describe(holder: dict) -> str:
    job = holder.get("slurm_job_id")
    job = f"SLURM job {job} restart {holder.get('slurm_restart_count')}, " if job else ""
    return f"host {holder.get('host')}, pid {holder.get('pid')}, {job}started {holder.get('started_utc')}"


def stale_reason(holder: dict, age_seconds: float, me: dict):
    """Why the run holding a lock refreshed `age_seconds` ago is gone, as seen by the run `me`; None if it may run."""
    job, restart = holder.get("slurm_job_id"), holder.get("slurm_restart_count")
    if job and job == me["slurm_job_id"] and restart != me["slurm_restart_count"]:
        return f"it is an earlier run of this SLURM job (restart {restart})"
    if holder.get("host") == me["host"] and me["process_start"]:  # its pid and start name it; no /proc: heartbeat
        return None if process_start(holder.get("pid")) == holder.get("process_start") else "its process has ended"
    return f"its heartbeat stopped {age_seconds / 60:.0f} min ago" if age_seconds > STALE_AFTER_SECONDS else None


class RunLock:
    def __init__(self, output_dir):
        self.output_dir = os.fspath(output_dir)
        self.path = os.path.join(self.output_dir, LOCK_NAME)
        self._text = None  # what this run writes into the lock
        self._stop = threading.Event()
        self._ours = False  # the lock file is this run's

    def acquire(self) -> None:
        folder = Path(os.path.abspath(self.output_dir))
        self._created = [p for p in (folder, *folder.parents) if not p.exists()]  # deepest first
        me = this_run()
        self._text = json.dumps(me)
        while True:
            # A lock cut short by a full disk would hold the folder for STALE_AFTER_SECONDS: it goes, with its folders
            try:
                with contextlib.suppress(FileExistsError), writing(self.output_dir, LOCK_NAME, undo=self._remove):
                    folder.mkdir(parents=True, exist_ok=True)
                    with open(self.path, "x") as f:  # only if there is none: atomic
                        self._ours = True
                        f.write(self._text)
                    break
            except OSError as err:  # what access() could not foresee (qa.arguments.Folder): /proc, a network mount
                self._remove()
                raise InputError(self.output_dir, f"cannot be created or written ({err.strerror}: {err.filename})",
                                 "give a folder this user can create and write to") from None
            seen, holder, age = self._read()  # so the folder existed: nothing to remove on refusal
            if seen is None:  # given back meanwhile
                continue
            if (reason := stale_reason(holder, age, me)) is None:
                raise InputError(self.output_dir, f"is in use by another run ({describe(holder)}; its lock {self.path} "
                                 f"was refreshed {age:.0f} s ago)", "wait for that run to end, or give another "
                                 f"--output_dir; if no such run is alive, delete {self.path}")
            aside = f"{self.path}.stale-{me['host']}-{me['pid']}"
            with contextlib.suppress(FileNotFoundError):  # given back meanwhile
                os.rename(self.path, aside)
                if Path(aside).read_text() == seen:
                    logger.warning("%s: taking over the lock of a run that is gone (%s): %s", self.output_dir,
                                   describe(holder), reason)
                else:  # another run took it over first: its lock goes back
                    os.link(aside, self.path)
                os.unlink(aside)
        threading.Thread(target=self._beat, name="run-lock-heartbeat", daemon=True).start()

    def release(self) -> None:
        if self._text is not None:  # None on the other ranks
            self._stop.set()
            self._ours = self._read()[0] == self._text  # not a lock another run took over
            self._remove()

    def _remove(self) -> None:
        if self._ours:
            os.unlink(self.path)
        with contextlib.suppress(OSError):  # stops at a folder that is not empty: a run that wrote there keeps it
            for folder in self._created:
                folder.rmdir()

    def _beat(self) -> None:
        while not self._stop.wait(HEARTBEAT_SECONDS):
            with contextlib.suppress(OSError):  # given back or taken over meanwhile
                if self._read()[0] == self._text:  # a lock another run took over is left alone
                    os.utime(self.path)

    def _read(self):
        """(text, holder record ({} while empty), seconds since last refreshed); text None if there is none."""
        try:
            text, age = Path(self.path).read_text(), time.time() - os.stat(self.path).st_mtime
        except FileNotFoundError:
            return None, {}, 0.0
        return text, json.loads(text or "{}"), age  # one small write: empty (being written) or whole
