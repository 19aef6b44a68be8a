"""The run's wall-clock breakdown (qa/results/wall_clock.py): nested phases count once, the rest is reported as
unaccounted, and a rank much slower than rank 0 is named."""
import time

from qa.results.wall_clock import PHASES, PhaseClock, breakdown_lines


def test_a_phase_inside_another_is_taken_out_of_it():
    clock = PhaseClock()
    with clock.phase("training"):
        time.sleep(0.05)
        with clock.phase("evaluation_during_training"):
            time.sleep(0.1)
        with clock.phase("training"):  # the same phase nested: still counted once
            time.sleep(0.02)
    assert 0.065 <= clock.seconds["training"] < 0.12 and 0.1 <= clock.seconds["evaluation_during_training"] < 0.15
    wall = sum(clock.seconds.values()) + 0.5
    out = clock.breakdown(wall)
    assert list(out) == [*PHASES, "unaccounted"] and abs(out["unaccounted"] - 0.5) < 0.01


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
