"""The project's one error type for what a user must fix, and the one way a command reports it.

An `InputError`'s message is a single line that names the file, record or setting at fault and
says how to fix it (`plural` words its counts, `short` quotes its values). Every command of the project
(run_qa.py, utils_qa.py score, tools/prefetch.py, tools/scaling_report.py, ...) runs its main function
through `command`, which prints the message as `error: <message>` on stderr and exits with the error's
status: 2, or the distinct status of a failure the user fixes the same way (EXIT_OUT_OF_MEMORY); anything
else is a bug and keeps its traceback.
"""
import functools
import sys

EXIT_INPUT_ERROR = 2
EXIT_OUT_OF_MEMORY = 3  # the device ran out of memory (training step or evaluation): a smaller per-device batch


class InputError(Exception):
    def __init__(self, where: str, problem: str, fix: str, exit_code: int = EXIT_INPUT_ERROR):
        self.where, self.problem, self.fix, self.exit_code = where, problem, fix, exit_code
        super().__init__(f"{where}: {problem}. Fix: {fix}")

    def __reduce__(self):  # whole across processes (datasets.map with num_proc, DataLoader workers)
        return type(self), (self.where, self.problem, self.fix, self.exit_code)


def plural(n: int, noun: str) -> str:
    return f"{n:,} {noun}" + ("" if n == 1 else "s")


def short(value, limit: int = 60) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[:limit - 4] + "..." + text[-1]  # keep the closing quote or bracket


def command(main):
    """Decorates a command's `main(argv=None) -> int`: an InputError becomes one line and its exit status;
    argparse's --help (help printed, then SystemExit(0)) returns 0 like any finished command."""
    @functools.wraps(main)
    def run(*args, **kwargs):
        try:
            return main(*args, **kwargs)
        except InputError as err:
            # One write: print's text and newline are two when unbuffered, and ranks sharing a stderr interleave them
            sys.stderr.write(f"error: {err}\n")
            sys.stderr.flush()
            return err.exit_code
        except SystemExit as exit_:
            if exit_.code in (0, None):
                return 0
            raise
    return run
