"""Where a run's wall clock goes, phase by phase (a job is paid for by its wall clock, not its training loop), no second
counted twice: docs/telemetry.md, "Where the wall clock goes"."""
import contextlib
import time

import psutil

PHASES = ("startup", "data_loading", "model_loading", "features", "compile_warmup", "training",
          "evaluation_during_training", "final_evaluation", "prediction", "saving")


class PhaseClock:
    def __init__(self):
        self.started = psutil.Process().create_time()  # on time.time()'s clock: imports count
        self.seconds = dict.fromkeys(PHASES, 0.0)
        self._open = []  # [phase, start, seconds of the phases timed inside it], innermost last
        self.left_in = None  # the innermost phase an exception (an error, a signal) left

    def since_start(self, phase: str) -> None:
        """`phase` ends now and began with the process (start-up: the interpreter, imports, arguments, the lock)."""
        self.seconds[phase] += time.time() - self.started

    @contextlib.contextmanager
    def phase(self, name: str):
        entry = [name, time.time(), 0.0]
        self._open.append(entry)
        try:
            yield
        except BaseException:
            self.left_in = self.left_in or name
            raise
        finally:
            self._open.pop()
            spent = time.time() - entry[1]
            self.seconds[name] += spent - entry[2]
            if self._open:
                self._open[-1][2] += spent

    def breakdown(self, wall_clock_seconds: float, ranks=None) -> dict:
        """Seconds per phase and the unaccounted rest of `wall_clock_seconds`; with `ranks` (every rank's seconds,
        rank 0 first), the slowest rank's where its phases differ from rank 0's by more than 5% and a second."""
        out = {name: round(s, 3) for name, s in self.seconds.items()}
        out["unaccounted"] = round(wall_clock_seconds - sum(self.seconds.values()), 3)
        slowest = max(range(len(ranks or [])), key=lambda r: sum(ranks[r].values()), default=0)
        if slowest and any(abs(s - self.seconds[p]) > max(0.05 * self.seconds[p], 1.0)
                           for p, s in ranks[slowest].items()):
            out["slowest_rank"] = {"rank": slowest, **{p: round(s, 3) for p, s in ranks[slowest].items()}}
        return out


def breakdown_lines(breakdown: dict, wall_clock_seconds: float) -> list:
    lines = ["", "## Where the wall clock went", "", "| phase | seconds | share |", "|---|---|---|"]
    lines += [f"| {name.replace('_', ' ')} | {breakdown[name]:.1f} | {breakdown[name] / wall_clock_seconds:.0%} |"
              for name in [*(p for p in PHASES if breakdown[p] > 0), "unaccounted"]]
    if "slowest_rank" in breakdown:
        other = breakdown["slowest_rank"]
        lines += ["", f"Rank {other['rank']} took longest: " + ", ".join(
            f"{p.replace('_', ' ')} {other[p]:.1f} s" for p in PHASES if other[p] >= 0.05) + "."]
    return lines
