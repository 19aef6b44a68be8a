"""tools/plot_tb.py: PNG plots and summary.md from a run's TensorBoard events; a clean one-line
error (exit 2) when there are none. In-process (a fresh interpreter costs seconds of imports)."""
import importlib.util

import pytest

from tests.helpers import REPO
from tests.test_telemetry import PLAIN, tiny_run


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


def test_plots_written(plotted):
    _, out = plotted
    for name in ("loss.png", "grad_norm.png", "learning_rate.png", "throughput.png", "performance.png",
                 "eval_f1.png"):
        data = (out / name).read_bytes()
        assert data.startswith(b"\x89PNG") and len(data) > 5000, name


def test_summary(plotted):
    _, out = plotted
    text = (out / "summary.md").read_text()
    assert "| scalar | points | steps | final | min | max | mean |" in text
    rows = {line.split("|")[1].strip(): line for line in text.splitlines() if line.startswith("| ")}
    for tag in ("train/loss", "train/grad_norm", "train/learning_rate", "train/perf/samples_per_s",
                "train/perf/real_tokens_per_s", "eval/f1"):
        assert tag in rows, tag
    cells = [c.strip() for c in rows["train/loss"].split("|")[2:-1]]
    points, steps = int(cells[0]), cells[1]
    assert points >= 5 and steps.startswith("2–")
    final, low, high, mean = (float(c) for c in cells[2:])
    assert low <= final <= high and low <= mean <= high
    assert "loss.png" in text


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
