"""The one error type for what a user must fix, and the one way every command reports it: a line that names the
culprit and the fix (docs/running.md, "Bad input and exit statuses"); a bug keeps its traceback. torchrun ends with 1
whatever its workers' statuses, so rank 0 writes how it ended into QA_OUTCOME_FILE, for the launcher."""
import functools
import json
import os
import signal
import sys
import threading

EXIT_INPUT_ERROR = 2
EXIT_OUT_OF_MEMORY = 3  # the device ran out of memory (training step or evaluation): a smaller per-device batch
EXIT_DISK_FULL = 4  # no space or quota left where a run writes (qa.io.writing): free space, or write elsewhere
EXIT_INTERRUPTED = 143  # 128 + SIGTERM, as a shell says it: stopped on SIGTERM, resumable (qa/training/preemption.py)
EXIT_CTRL_C = 130  # 128 + SIGINT: a first Ctrl-C in training saves a checkpoint; a second, or one outside, stops now
CTRL_C = "interrupted by Ctrl-C: stopped at once, nothing more saved; the same command goes on from what was saved"
OUTCOMES = {0: ("completed", "done"), EXIT_INPUT_ERROR: ("refused", ""), EXIT_OUT_OF_MEMORY: ("out_of_memory", ""),
            EXIT_DISK_FULL: ("disk_full", ""),
            EXIT_CTRL_C: ("interrupted", "stopped by Ctrl-C (SIGINT): rerun to continue"),
            EXIT_INTERRUPTED: ("interrupted", "stopped by SIGTERM (a time limit or preemption): rerun to continue")}


class InputError(Exception):
    said = False  # already told (the check job's verdict): `command` writes no second line

    def __init__(self, where: str, problem: str, fix: str, exit_code: int = EXIT_INPUT_ERROR):
        self.where, self.problem, self.fix, self.exit_code = where, problem, fix, exit_code
        super().__init__(f"{where}: {problem}. Fix: {fix}")

    def __reduce__(self):  # whole across processes (datasets.map with num_proc, DataLoader workers), a subclass too:
        return type(self).__new__, (type(self), *self.args), self.__dict__  # its state, not its __init__'s arguments


class Interrupted(Exception):
    """SIGTERM or USR1 outside the training's steps (loading, tokenizing, the warm-up, evaluation, saving): nothing
    there to checkpoint, the rerun goes on from what was saved. Its argument: the signal's name."""


def raise_again_if_lost() -> None:
    """A handler's exception raised where Python ignores exceptions (a __del__ or weakref callback: often under torch)
    is lost, with a traceback: so it is hidden, and its signal sent again."""
    if sys.unraisablehook is not _lost:
        _lost.hook, sys.unraisablehook = sys.unraisablehook, _lost


def _lost(unraisable):
    if not isinstance(exc := unraisable.exc_value, (Interrupted, KeyboardInterrupt)):
        return _lost.hook(unraisable)
    signum = signal.SIGINT if isinstance(exc, KeyboardInterrupt) else signal.Signals[str(exc)]
    again = threading.Timer(0.1, os.kill, (os.getpid(), signum))  # sent now, it would be raised in this hook: lost
    again.daemon = True
    again.start()


def _ctrl_c(signum, frame):
    raise_again_if_lost()
    raise KeyboardInterrupt


def plural(n: int, noun: str) -> str:
    return f"{n:,} {noun}" + ("" if n == 1 else "s")


def short(value, limit: int = 60) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[:limit - 4] + "..." + text[-1]  # keep the closing quote or bracket


def require_packages(*names) -> None:
    """A shell in which the project's environment is not active: one line, not a traceback, before the imports (seconds,
    so a Ctrl-C during them is one line too; find_spec imports nothing)."""
    import importlib.util

    sys.excepthook = functools.partial(_ctrl_c_in_one_line, sys.excepthook)
    if signal.getsignal(signal.SIGINT) is signal.default_int_handler:  # a Ctrl-C in an import's __del__ is not lost
        signal.signal(signal.SIGINT, _ctrl_c)
    if missing := [name for name in names if importlib.util.find_spec(name) is None]:
        found = environment_file()
        fix = f"source {found}" if found else ("run ./setup_bert.sh (README.md, the two commands), then source the "
                                               "file it names")
        sys.stderr.write(f"error: {sys.executable} has no {', '.join(missing)}: the project's environment is not "
                         f"active in this shell. Fix: {fix}\n")
        sys.exit(EXIT_INPUT_ERROR)


def environment_file() -> str | None:
    """The file setup_bert.sh wrote for shells and jobs to source, one that exists: ENV_FILE, the README's local one
    (VENV_DIR=.venv in the repository) or the cluster's default; None before setup_bert.sh has run."""
    candidates = (os.environ.get("ENV_FILE"), os.path.join(os.path.dirname(os.path.dirname(__file__)), ".venv.env.sh"),
                  os.path.join(os.environ.get("STORE") or os.path.expanduser("~"), "venvs", "bert-squad.env.sh"))
    return next((os.path.abspath(path) for path in candidates if path and os.path.isfile(path)), None)


def _ctrl_c_in_one_line(hook, kind, value, traceback):
    if not issubclass(kind, KeyboardInterrupt):
        return hook(kind, value, traceback)
    sys.stderr.write(f"{CTRL_C}\n")


def command(main, ends_the_run=True):
    """`ends_the_run` False: a check before the command proper, whose passing is no outcome (QA_OUTCOME_FILE)."""
    @functools.wraps(main)
    def run(*args, **kwargs):
        status, reason = 1, ""
        try:
            status = main(*args, **kwargs) or 0
        except InputError as err:
            # One write: print's text and newline are two when unbuffered, and ranks sharing a stderr interleave them
            if not err.said:
                sys.stderr.write(f"error: {err}\n")
                sys.stderr.flush()
            status, reason = err.exit_code, str(err)
        except KeyboardInterrupt:  # Ctrl-C before run_qa's run, or in another command
            for sig in (signal.SIGINT, signal.SIGTERM):  # stopping: one more changes nothing
                signal.signal(sig, signal.SIG_IGN)
            sys.stderr.write(f"{CTRL_C}\n")
            status, reason = EXIT_CTRL_C, CTRL_C
        except BaseException as exc:
            if not isinstance(exc, SystemExit) or exc.code not in (0, None):  # a bug: its type and first line
                reason = f"{type(exc).__name__}: {(str(exc).strip().splitlines() or [''])[0]}"
                raise
            status = 0
        finally:
            if (path := os.environ.get("QA_OUTCOME_FILE")) and os.environ.get("RANK", "0") == "0" and (
                    status or ends_the_run):
                outcome, default = OUTCOMES.get(status, ("failed", f"exit status {status}"))
                tmp = f"{path}.{os.getpid()}.tmp"
                try:
                    with open(tmp, "w") as f:  # whole, then renamed; not with qa.io, above us
                        json.dump({"status": status, "outcome": outcome, "reason": reason or default}, f)
                    os.replace(tmp, path)
                except OSError as err:  # a full disk: the launcher reads the exit status instead
                    if os.path.exists(tmp):
                        os.unlink(tmp)
                    sys.stderr.write(f"warning: {path}: how the run ended is not recorded ({err.strerror or err})\n")
        return status
    return run
