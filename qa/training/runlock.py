"""One run per output folder: `output_dir/run.lock`, taken before anything is written there.

Two runs in one folder (a job submitted twice, a rerun while the first still trains) would
overwrite each other's checkpoints and results. Global rank 0 creates the lock with O_EXCL
(other ranks learn the outcome through qa.distributed) and records host, pid and its start time, SLURM
job and restart count; a second run refuses with one line naming the holder. A lock whose run is
gone (same SLURM job requeued; same host and the process ended; another host and no heartbeat
for STALE_AFTER_SECONDS) is taken over with a warning. README, "One run per output folder"."""
import json
import logging
import os
import socket
import sys
import threading
import time
from datetime import datetime, timezone

from qa.errors import InputError

logger = logging.getLogger(__name__)
LOCK_NAME = "run.lock"
HEARTBEAT_SECONDS = 60
STALE_AFTER_SECONDS = 10 * 60


def process_start(pid: int):
    """When process `pid` started (clock ticks since boot, /proc/PID/stat), or None where that
    cannot be read; with the pid it names one process, even after the pid is reused."""
    try:
        stat = open(f"/proc/{pid}/stat").read()
    except OSError:
        return None
    fields = stat[stat.rindex(")") + 2:].split()  # the command name may hold spaces and parentheses
    return None if fields[0] == "Z" else int(fields[19])  # a zombie has ended


def process_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's process
        return True
    return not os.path.exists(f"/proc/{pid}") or process_start(pid) is not None


def this_run() -> dict:
    """What a lock records about the run holding it."""
    return {"host": socket.gethostname(), "pid": os.getpid(), "process_start": process_start(os.getpid()),
            "slurm_job_id": os.environ.get("SLURM_JOB_ID"),
            "slurm_restart_count": int(os.environ.get("SLURM_RESTART_COUNT") or 0),
            "started_utc": datetime.now(timezone.utc).isoformat(timespec="seconds"),
            "command": " ".join(sys.argv)}


def describe(holder: dict) -> str:
    parts = [f"host {holder.get('host', '?')}", f"pid {holder.get('pid', '?')}"]
    if holder.get("slurm_job_id"):
        parts.append(f"SLURM job {holder['slurm_job_id']} restart {holder.get('slurm_restart_count', 0)}")
    parts.append(f"started {holder.get('started_utc', '?')}")
    return ", ".join(parts)


def stale_reason(holder: dict, age_seconds: float, me: dict):
    """Why the run that holds a lock (`holder`, its lock last refreshed `age_seconds` ago) is gone,
    as seen by the run `me`; None while it may still be running."""
    job = holder.get("slurm_job_id")
    if job and job == me.get("slurm_job_id") \
            and holder.get("slurm_restart_count") != me.get("slurm_restart_count"):
        return f"it is an earlier run of this SLURM job (restart {holder.get('slurm_restart_count')})"
    pid = holder.get("pid")
    if holder.get("host") == me["host"] and isinstance(pid, int):
        if not process_alive(pid):
            return "its process has ended"
        recorded, now = holder.get("process_start"), process_start(pid)
        if recorded is not None and now is not None and recorded != now:
            return "its process id now belongs to another process"
        return None
    if age_seconds > STALE_AFTER_SECONDS:
        return f"its heartbeat stopped {age_seconds / 60:.0f} min ago"
    return None


class RunLock:
    """The lock of `output_dir`: acquire() before writing there, release() at the end."""

    def __init__(self, output_dir):
        self.output_dir = os.fspath(output_dir)
        self.path = os.path.join(self.output_dir, LOCK_NAME)
        self._text = None
        self._created = []  # folders acquire() created, removed again if the run leaves them empty
        self._stop = threading.Event()
        self._heartbeat = None

    def acquire(self) -> None:
        self._make_folder()
        me = this_run()
        text = json.dumps(me)
        for _ in range(5):
            try:
                fd = os.open(self.path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o666)
            except FileExistsError:
                held = self._read()
                if held is None:  # released meanwhile
                    continue
                held_text, holder, age = held
                reason = stale_reason(holder, age, me)
                if reason is None:
                    self._remove_created()
                    raise InputError(
                        self.output_dir, f"is in use by another run ({describe(holder)}; its lock {self.path} "
                        f"was refreshed {age:.0f} s ago)",
                        f"wait for that run to end, or give another --output_dir; if no such run is alive, "
                        f"delete {self.path}") from None
                if self._take_over(held_text):
                    logger.warning("%s: taking over the lock of a run that is gone (%s): %s", self.output_dir,
                                   describe(holder), reason)
                continue
            except OSError as err:
                self._remove_created()
                raise InputError(self.output_dir, f"cannot write the run's lock there ({err.strerror})",
                                 "give an --output_dir this user can write to") from None
            with os.fdopen(fd, "w") as f:
                f.write(text)
                f.flush()
                os.fsync(f.fileno())
            self._text = text
            self._heartbeat = threading.Thread(target=self._beat, name="run-lock-heartbeat", daemon=True)
            self._heartbeat.start()
            return
        raise InputError(self.output_dir, "its run lock kept changing hands while this run tried to take it",
                         "start one run per output folder")

    def release(self) -> None:
        if self._text is None:
            return
        self._stop.set()
        held = self._read()
        if held is not None and held[0] == self._text:
            os.unlink(self.path)
        self._text = None
        self._remove_created()

    def _beat(self) -> None:
        warned = False
        while not self._stop.wait(HEARTBEAT_SECONDS):
            held = self._read()
            if held is not None and held[0] == self._text:
                try:
                    os.utime(self.path)
                except OSError:
                    pass
            elif not warned:
                warned = True
                holder = "nobody" if held is None else describe(held[1])
                logger.warning("%s: this run's lock was taken over (now held by %s): another run may be writing "
                               "into this folder", self.output_dir, holder)

    def _read(self):
        """(text, holder record, seconds since last refreshed), or None when there is no lock."""
        try:
            with open(self.path) as f:
                text = f.read()
            age = time.time() - os.stat(self.path).st_mtime
        except FileNotFoundError:
            return None
        try:
            holder = json.loads(text)
        except ValueError:  # being written right now, or not ours: judged by its age alone
            holder = {}
        return text, holder if isinstance(holder, dict) else {}, age

    def _take_over(self, held_text) -> bool:
        """Move the stale lock out of the way, unless another run replaced it since it was read."""
        aside = f"{self.path}.stale-{socket.gethostname()}-{os.getpid()}"
        try:
            os.rename(self.path, aside)
        except FileNotFoundError:
            return False
        with open(aside) as f:
            moved = f.read()
        if moved != held_text:  # another run took it over first: give its lock back
            try:
                os.link(aside, self.path)
            except OSError:
                pass
        os.unlink(aside)
        return moved == held_text

    def _make_folder(self) -> None:
        missing, folder = [], os.path.abspath(self.output_dir)
        while not os.path.exists(folder):
            missing.append(folder)
            folder = os.path.dirname(folder)
        try:
            for folder in reversed(missing):
                try:
                    os.mkdir(folder)
                    self._created.append(folder)
                except FileExistsError:  # made by another process meanwhile: not this run's to remove
                    pass
        except OSError as err:
            self._remove_created()
            raise InputError(self.output_dir, f"cannot be created ({err.strerror})",
                             "give an --output_dir this user can create and write to") from None

    def _remove_created(self) -> None:
        for folder in reversed(self._created):
            try:
                os.rmdir(folder)  # only if empty: a run that wrote something keeps its folder
            except OSError:
                break
        self._created = []

    def __enter__(self):
        self.acquire()
        return self

    def __exit__(self, *exc):
        self.release()
