"""tools/plot_tb.py: PNG plots and summary.md from a run's TensorBoard events; a clean one-line
error (exit 2) when there are none. In-process (a fresh interpreter costs seconds of imports)."""
import importlib.util
import json
import logging

import pytest

from tests.helpers import PLAIN, REPO, losses, results, tiny_run
from tests.test_disk_full import FILLER, disk, leave  # noqa: F401 (disk: the fixture of a tmpfs of its own)


def _plot_tb():
    spec = importlib.util.spec_from_file_location("plot_tb", REPO / "tools" / "plot_tb.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def plotted(tmp_path_factory):
    run = tiny_run(tmp_path_factory, *PLAIN)
    out = tmp_path_factory.mktemp("plots")
    assert _plot_tb().main([str(run), "--out", str(out)]) == 0
    return run, out


@pytest.mark.slow
def test_plots_written(plotted):
    _, out = plotted
    for name in ("loss.png", "grad_norm.png", "learning_rate.png", "throughput.png", "performance.png"):
        data = (out / name).read_bytes()
        assert data.startswith(b"\x89PNG") and len(data) > 5000, name
    # evaluated once, at the end: two lone dots are no plot; summary.md has the values
    assert not (out / "eval_f1.png").exists()


def _shown(value):
    """`value` as summary.md shows it: rounded to 4 significant digits, off by at most 0.05% of it."""
    return pytest.approx(value, rel=6e-4)


@pytest.mark.slow
def test_summary(plotted):
    run, out = plotted
    text = (out / "summary.md").read_text()
    assert "| scalar | points | steps | final | min | max | mean |" in text
    over_time, once = text.split("Logged once:")
    rows = {line.split("|")[1].strip(): line for line in over_time.splitlines() if line.startswith("| ")}
    for tag in ("train/loss", "train/grad_norm", "train/learning_rate", "train/perf/samples_per_s",
                "train/perf/real_tokens_per_s"):
        assert tag in rows, tag
    cells = [c.strip() for c in rows["train/loss"].split("|")[2:-1]]
    points, steps = int(cells[0]), cells[1]
    assert points >= 5 and steps.startswith("2–")
    # This short run at its small learning rate neither lowers its loss nor beats an untrained F1 (4.865 to 4.857,
    # F1 3.3): what the summary must get right is the run's own figures, to the 4 digits it shows
    logged = losses(run)
    assert [float(c) for c in cells[2:]] == [_shown(v) for v in (logged[-1], min(logged), max(logged),
                                                                 sum(logged) / len(logged))], (cells, logged)
    single = {line.split("|")[1].strip(): line for line in once.splitlines() if line.startswith("| ")}
    step, f1 = (c.strip() for c in single["eval/f1"].split("|")[2:4])
    assert int(step) >= int(steps.split("–")[1])  # evaluated after the last logged training step
    assert float(f1) == _shown(results(run)["eval_f1"]) and "eval/f1" not in rows
    assert "loss.png" in text and "eval_f1.png" not in text


@pytest.mark.slow
def test_default_out_dir(plotted, tmp_path):
    run, _ = plotted
    import shutil

    copy = tmp_path / "run"
    shutil.copytree(run / "runs", copy / "runs")
    assert _plot_tb().main([str(copy)]) == 0
    assert (copy / "tb_plots" / "summary.md").is_file()


@pytest.mark.parametrize("make", ["empty", "missing", "no runs events"])
def test_no_events_fails_cleanly(make, tmp_path, capsys):
    folder = tmp_path / "run"
    if make != "missing":
        folder.mkdir()
    if make == "no runs events":
        (folder / "runs").mkdir()
        (folder / "runs" / "notes.txt").write_text("nothing here")
    assert _plot_tb().main([str(folder)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error:") and str(folder) in err[0], err
    assert not (folder / "tb_plots").exists()


# ---------------------------------------------------------------------------------------------
# The figures, on hand-made scalars


def _figures(scalars):
    import matplotlib.pyplot as plt

    figures = _plot_tb().figures(scalars)
    yield figures
    for fig in figures.values():
        plt.close(fig)


def _axes(fig):
    return [ax for ax in fig.axes if ax.axison]


SCALARS = {
    "train/loss": [(10, 4.8), (20, 4.1), (30, 3.2)],
    "eval/loss": [(30, 3.4)],
    "train/perf/peak_rss_gib": [(10, 1.55), (20, 1.57), (30, 1.58)],
    "train/perf/padding_fraction": [(10, 0.52), (20, 0.55), (30, 0.53)],
    "train/perf/step_time_s": [(10, 0.41), (20, 0.40), (30, 0.40)],
    "train/grad_norm": [(10, 3.0001), (20, 3.0002), (30, 3.0003)],
    "eval/f1": [(30, 61.5)],
    "eval/exact_match": [(30, 50.0)],
}


def test_one_title_per_figure_and_axes_with_units():
    for figures in _figures(SCALARS):
        assert set(figures) == {"loss.png", "grad_norm.png", "performance.png"}
        for name, fig in figures.items():
            assert fig._suptitle is not None and fig._suptitle.get_text(), name
            for ax in _axes(fig):
                assert ax.get_title() == "", (name, ax.get_title())  # the figure's title is the only one
                assert ax.get_xlabel() == "optimizer step" and ax.get_ylabel(), name
        labels = {ax.get_ylabel() for ax in _axes(figures["performance.png"])}
        assert labels == {"peak host memory, RSS (GiB)", "padding (% of batch tokens)", "optimizer step time (s)"}


def test_a_value_logged_once_is_a_labelled_point_or_left_to_the_summary():
    for figures in _figures(SCALARS):
        (ax,) = _axes(figures["loss.png"])
        legend = [t.get_text() for t in ax.get_legend().get_texts()]
        assert legend == ["training", "evaluation: 3.4 at step 30"]
        assert "eval_f1.png" not in figures  # F1 and exact match logged once each: nothing to plot
    for figures in _figures({**SCALARS, "eval/f1": [(15, 40.0), (30, 61.5)]}):
        (ax,) = _axes(figures["eval_f1.png"])
        legend = [t.get_text() for t in ax.get_legend().get_texts()]
        assert legend == ["F1", "exact match: 50% at step 30"]
        assert ax.get_ylim() == (0.0, 100.0)


def test_small_changes_look_small():
    """Peak memory 1.55-1.58 GiB, step time 0.40-0.41 s: drawn from zero; a gradient norm that
    moves in its fifth digit: over at least 20% of its size, not from edge to edge."""
    for figures in _figures(SCALARS):
        panels = {ax.get_ylabel(): ax for ax in _axes(figures["performance.png"])}
        low, high = panels["peak host memory, RSS (GiB)"].get_ylim()
        assert low == 0 and 1.58 <= high <= 1.8
        assert panels["optimizer step time (s)"].get_ylim()[0] == 0
        low, high = panels["padding (% of batch tokens)"].get_ylim()
        assert low == 0 and 0.55 <= high <= 1
        (ax,) = _axes(figures["grad_norm.png"])
        assert ax.get_ylim()[0] == 0
    y_limits = _plot_tb().y_limits
    low, high = y_limits([3.0001, 3.0003], "plain")
    assert high - low == pytest.approx(0.2 * 3.0003) and low < 3.0001 and high > 3.0003
    assert y_limits([4.8, 3.2], "plain") is None  # a real change: matplotlib's own limits
    assert y_limits([-0.5, 2.0], "zero") is None  # negative values: not a quantity from zero


def test_f1_against_training_time_with_the_target():
    """The evaluations during training (qa/evaluation/time_to_accuracy.py logs them with the training
    seconds as the step) over training seconds, with the target F1 and where it was reached."""
    scalars = {**SCALARS, "eval_by_train_seconds/f1": [(5, 40.0), (10, 70.0), (15, 89.0)],
               "eval_by_train_seconds/exact_match": [(5, 30.0), (10, 60.0), (15, 80.0)]}
    import matplotlib.pyplot as plt

    for target, expected in (({"target_f1": 80.0, "train_seconds_to_target_f1": 12.4}, "reached at 12.4 s"),
                             ({"target_f1": 95.0, "train_seconds_to_target_f1": None}, "not reached")):
        figures = _plot_tb().figures(scalars, target)
        (ax,) = _axes(figures["f1_vs_time.png"])
        assert ax.get_xlabel() == "training seconds (evaluations excluded)"
        legend = [t.get_text() for t in ax.get_legend().get_texts()]
        assert legend == ["F1", "exact match", f"target F1 {target['target_f1']:g}: {expected}"], legend
        assert any(list(line.get_ydata()) == [target["target_f1"]] * 2 for line in ax.lines)  # the target line
        for fig in figures.values():
            plt.close(fig)
    for figures in _figures(SCALARS):
        assert "f1_vs_time.png" not in figures  # no evaluations during training, no plot


def test_the_final_evaluation_on_all_questions_is_drawn_apart_from_those_during_training():
    """--eval_every evaluates the first 100 questions during training, then all 300 once more at
    the last step under the same tags: that last value is a point of its own, with its question
    count, not one more point of the curve (where its change of question set read as a drop)."""
    scalars = {**SCALARS, "eval/f1": [(10, 60.0), (20, 97.0), (30, 94.7)],
               "eval/exact_match": [(10, 50.0), (20, 96.0), (30, 93.3)], "eval/loss": [(10, 2.0), (20, 0.4), (30, 0.5)]}
    results = {"eval_during_training_count": 3, "eval_f1": 94.7, "eval_exact_match": 93.3, "eval_loss": 0.5,
               "eval_examples": 300}
    import matplotlib.pyplot as plt

    figures = _plot_tb().figures(scalars, results, {"eval_every_questions": 100})
    (ax,) = _axes(figures["eval_f1.png"])
    assert [t.get_text() for t in ax.get_legend().get_texts()] == [
        "F1 during training (first 100 questions)", "F1, final evaluation (all 300 questions): 94.7% at step 30",
        "exact match during training (first 100 questions)",
        "exact match, final evaluation (all 300 questions): 93.3% at step 30"]
    curves = [line for line in ax.lines if len(line.get_xdata()) > 1]
    assert [list(line.get_xdata()) for line in curves] == [[10, 20], [10, 20]]  # the curves end before it
    (ax,) = _axes(figures["loss.png"])
    assert [t.get_text() for t in ax.get_legend().get_texts()][-2:] == [
        "evaluation during training (first 100 questions)", "final evaluation (all 300 questions): 0.5 at step 30"]
    for fig in figures.values():
        plt.close(fig)
    # A run that did not evaluate during training: its one evaluation is the curve's only point, as before.
    for figures in _figures(SCALARS):
        (ax,) = _axes(figures["loss.png"])
        assert [t.get_text() for t in ax.get_legend().get_texts()] == ["training", "evaluation: 3.4 at step 30"]


def test_the_legend_clears_the_axis_label_and_both_final_scores_show():
    """eval_f1.png as a newcomer saw it: the legend under the panel covered its x-axis label, and the final exact
    match (93.3), drawn over the final F1 (94.7) at the same size, hid it. Read from the saved figures' artists."""
    import io

    import matplotlib.pyplot as plt

    scalars = {**SCALARS, "eval/f1": [(10, 60.0), (20, 97.0), (30, 94.7)], "eval/exact_match": [(10, 50.0), (20, 96.0),
                                                                                               (30, 93.3)],
               "eval/loss": [(10, 2.0), (20, 0.4), (30, 0.5)], "eval_by_train_seconds/f1": [(5, 40.0), (10, 70.0)]}
    results = {"eval_during_training_count": 2, "eval_f1": 94.7, "eval_exact_match": 93.3, "eval_loss": 0.5,
               "eval_examples": 300, "target_f1": 60.0, "train_seconds_to_target_f1": 7.5}
    figures = _plot_tb().figures(scalars, results, {"eval_every_questions": 100})
    legends = 0
    for name, fig in figures.items():
        fig.savefig(io.BytesIO(), dpi=100, bbox_inches="tight")
        renderer = fig.canvas.get_renderer()
        for ax in _axes(fig):
            if ax.get_legend() is not None:
                legends += 1
                legend, label = ax.get_legend().get_window_extent(renderer), ax.xaxis.label.get_window_extent(renderer)
                assert legend.y1 < label.y0, (name, legend, label)  # the legend's top below the label's bottom
    assert legends == 3  # loss, eval_f1 and f1_vs_time
    (ax,) = _axes(figures["eval_f1.png"])
    finals = [line for line in ax.lines if "final evaluation" in line.get_label()]
    below, above = sorted(finals, key=lambda line: (line.get_zorder(), ax.lines.index(line)))
    assert below.get_label().startswith("F1") and list(below.get_xdata()) == list(above.get_xdata())
    # the one drawn first shows around the one drawn over it: a ring wider than the edge lines
    assert below.get_markersize() - above.get_markersize() > 2 * below.get_markeredgewidth(), finals
    for fig in figures.values():
        plt.close(fig)


@pytest.mark.slow
def test_a_real_run_with_evaluations_during_training_shows_its_final_evaluation_apart(tmp_path_factory, tmp_path):
    """The same on a run's own events: the final evaluation is the last value at the last step, where the last
    evaluation during training stays a point of the curve."""
    import json

    import matplotlib.pyplot as plt

    run = tiny_run(tmp_path_factory, "eval_every", "--eval_every", "0.25", "--eval_every_questions", "20")
    plot_tb = _plot_tb()
    results = json.loads((run / "all_results.json").read_text())
    config = json.loads((run / "environment.json").read_text())["config"]
    figures = plot_tb.figures(plot_tb.load_scalars(run), results, config)
    (ax,) = _axes(figures["eval_f1.png"])
    legend = [t.get_text() for t in ax.get_legend().get_texts()]
    final_step = json.loads((run / "trainer_state.json").read_text())["global_step"]
    assert legend[0] == "F1 during training (first 20 questions)"
    assert legend[1] == f"F1, final evaluation (all 50 questions): {plot_tb._fmt(results['eval_f1'])}% at step {final_step}"
    # Every evaluation during training, the last at the last step too, which the final evaluation shares
    (curve,) = [line for line in ax.lines if line.get_label() == legend[0]]
    assert len(curve.get_xdata()) == results["eval_during_training_count"] and max(curve.get_xdata()) == final_step
    for fig in figures.values():
        plt.close(fig)
    assert plot_tb.main([str(run), "--out", str(tmp_path)]) == 0 and (tmp_path / "eval_f1.png").is_file()


# ---------------------------------------------------------------------------------------------
# The run's own plots (qa.results.records.write_plots): drawn at its end from its records, no TensorBoard needed

EVAL_EVERY = ("eval_every", "--eval_every", "0.25", "--eval_every_questions", "20")  # the run of the test above


def _png(path):
    data = path.read_bytes()
    return data.startswith(b"\x89PNG") and len(data) > 5000


@pytest.mark.slow
@pytest.mark.parametrize("run_args", [EVAL_EVERY, PLAIN], ids=["evaluated during training", "evaluated at the end"])
def test_a_run_draws_its_loss_and_f1_and_names_them(run_args, tmp_path_factory):
    """The training loss by optimizer step, each logged loss; the F1 by training second: the evaluations during training
    as a curve and the final evaluation as a point of its own, or that point alone. The records name the plots, and
    the model card of a model trained on generated questions says it will not answer real ones."""
    from qa.results.records import plot_data

    run = tiny_run(tmp_path_factory, *run_args)
    found = results(run)
    assert found["plots"] == ["plots/loss.png", "plots/f1.png"]
    assert all(_png(run / name) for name in found["plots"])
    assert "| plots | plots/loss.png, plots/f1.png |" in (run / "results.md").read_text()
    assert "it will not answer real questions well" in (run / "README.md").read_text()
    config = json.loads((run / "environment.json").read_text())["config"]
    data = plot_data(run, found, config["eval_every_questions"])
    ((loss, label),) = data["loss.png"][3]
    last = json.loads((run / "trainer_state.json").read_text())["global_step"]
    assert label == "training" and loss == list(zip(range(2, last + 1, 2), losses(run)))  # --logging_steps 2
    during, final = data["f1.png"][3]
    assert final == ([(found.get("train_seconds_excluding_evaluation") or found["train_runtime"], found["eval_f1"])],
                     "final evaluation")
    record = json.loads((run / "time_to_accuracy.json").read_text()) if run_args == EVAL_EVERY else {"evaluations": []}
    assert during == ([(e["train_seconds"], e["f1"]) for e in record["evaluations"]],
                      "during training (first 20 questions)" if run_args == EVAL_EVERY else "during training")
    assert len(during[0]) == found.get("eval_during_training_count", 0)
    # plot_tb's f1_vs_time.png reads the same evaluations, with the TensorBoard events
    assert _plot_tb().load_scalars(run).get("eval_by_train_seconds/f1", []) == during[0]


def _records(out):
    """A trained run's records as write_plots reads them, made by hand: its results."""
    out.mkdir()
    (out / "trainer_state.json").write_text(json.dumps({"log_history": [{"step": 2, "loss": 4.8}, {"step": 4, "loss": 4.1},
                                                                        {"step": 4, "train_runtime": 2.0}]}))
    return {"train_runtime": 2.0, "eval_f1": 3.0}


def _warnings(caplog):
    return [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]


def test_plots_on_a_full_disk_are_one_warning_and_the_run_goes_on(disk, caplog):
    from qa.results.records import write_plots

    out = disk / "out"
    found = _records(out)
    leave(disk)
    with caplog.at_level(logging.WARNING):
        assert write_plots(out, found) == []
    assert _warnings(caplog) == [f"{out / 'plots'}: no space left on its file system (ENOSPC) while writing the run's "
                                 "plots: no more of them in this run, which goes on (free space there for the next "
                                 "run's)"]
    assert not [p.name for p in out.rglob("*") if p.is_file() and p.name != "trainer_state.json"]  # nothing partial
    (disk / FILLER).unlink()
    assert write_plots(out, found) == ["plots/loss.png", "plots/f1.png"]  # with room, both

