"""The run's wall-clock breakdown (qa/results/wall_clock.py): nested phases count once, the rest is reported as
unaccounted, and a rank much slower than rank 0 is named."""
import types

import pytest

from qa.results import wall_clock
from qa.results.wall_clock import PHASES, PhaseClock, breakdown_lines


def test_a_phase_inside_another_is_taken_out_of_it(monkeypatch):
    now = [1000.0]  # a clock the test moves: exact seconds, whatever the machine's speed or load
    monkeypatch.setattr(wall_clock, "time", types.SimpleNamespace(time=lambda: now[0]))

    def spend(seconds):
        now[0] += seconds

    clock = PhaseClock()
    with clock.phase("training"):
        spend(0.05)
        with clock.phase("evaluation_during_training"):
            spend(0.1)
        with clock.phase("training"):  # the same phase nested: still counted once
            spend(0.02)
        spend(0.03)
    assert clock.seconds["training"] == pytest.approx(0.1) and clock.seconds["evaluation_during_training"] == \
        pytest.approx(0.1), clock.seconds
    assert sum(clock.seconds.values()) == pytest.approx(0.2)  # every second of the 0.2 spent, once
    out = clock.breakdown(0.7)
    assert list(out) == [*PHASES, "unaccounted"] and out["unaccounted"] == pytest.approx(0.5)


def test_the_slowest_rank_is_reported_only_where_it_differs():
    clock = PhaseClock()
    clock.seconds.update(startup=10.0, training=100.0)
    alike = {**clock.seconds, "training": 100.4}
    assert "slowest_rank" not in clock.breakdown(120, [dict(clock.seconds), alike])
    slow = {**clock.seconds, "features": 30.0}
    out = clock.breakdown(120, [dict(clock.seconds), alike, slow])
    assert out["slowest_rank"]["rank"] == 2 and out["slowest_rank"]["features"] == 30.0
    lines = breakdown_lines(out, 120)
    assert "| training | 100.0 | 83% |" in lines and lines[-1].startswith("Rank 2 took longest: startup 10.0 s")
