"""A checkpoint is resumed from only when its files are what was saved: the completion marker
records each file's size and hash, a damaged checkpoint (weights cut short, optimizer state
changed, a file missing) is reported in one line and moved aside, and the run resumes from the
newest checkpoint that verifies; when none does, one `error:` line says to pass --resume never."""
import json
import logging
import shutil

import pytest
import torch
from safetensors.torch import save_file

from qa.checkpoints import COMPLETE_MARKER, HASH, check_checkpoint, find_checkpoint, is_verifiable, write_marker
from qa.errors import InputError
from tests.helpers import go_offline
from tests.test_run_qa import TINY

# ---------------------------------------------------------------------------------------------
# The marker and the checks, on files written by the same libraries as a real checkpoint


def _checkpoint(folder):
    folder.mkdir(parents=True)
    save_file({"w": torch.arange(64, dtype=torch.float32).reshape(8, 8), "b": torch.zeros(8)},
              str(folder / "model.safetensors"))
    torch.save({"state": {0: {"exp_avg": torch.ones(100)}}}, folder / "optimizer.pt")
    (folder / "trainer_state.json").write_text(json.dumps({"global_step": 4}))
    (folder / "shards").mkdir()
    (folder / "shards" / "part.bin").write_bytes(b"\1" * 100)  # FSDP keeps shards in subfolders
    return folder


def _flip(path, offset=None):
    data = bytearray(path.read_bytes())
    offset = len(data) // 2 if offset is None else offset
    data[offset] ^= 0xFF
    path.write_bytes(bytes(data))


def test_marker_records_every_file_and_verifies(tmp_path):
    folder = _checkpoint(tmp_path / "checkpoint-4")
    write_marker(folder, 4)
    marker = json.loads((folder / COMPLETE_MARKER).read_text())
    assert marker["global_step"] == 4 and marker["format"] == 2
    assert sorted(marker["files"]) == ["model.safetensors", "optimizer.pt", "shards/part.bin", "trainer_state.json"]
    assert marker["files"]["optimizer.pt"]["size"] == (folder / "optimizer.pt").stat().st_size
    assert all(len(f[HASH]) == 32 for f in marker["files"].values())
    assert check_checkpoint(folder) is None and is_verifiable(folder)


@pytest.mark.parametrize("damage, problem", [
    (lambda f: (f / "model.safetensors").write_bytes((f / "model.safetensors").read_bytes()[:200]),
     "model.safetensors has 200 bytes, "),
    (lambda f: _flip(f / "optimizer.pt"), "optimizer.pt differs from what was saved (content hash)"),
    (lambda f: _flip(f / "shards" / "part.bin", 0), "shards/part.bin differs from what was saved"),
    (lambda f: (f / "trainer_state.json").unlink(), "trainer_state.json is missing"),
], ids=["truncated weights", "changed optimizer state", "changed shard", "missing file"])
def test_damage_is_found(damage, problem, tmp_path):
    folder = _checkpoint(tmp_path / "checkpoint-4")
    write_marker(folder, 4)
    damage(folder)
    assert check_checkpoint(folder).startswith(problem), check_checkpoint(folder)


@pytest.mark.parametrize("damage, problem", [
    (None, None),
    (lambda f: (f / "model.safetensors").write_bytes((f / "model.safetensors").read_bytes()[:300]),
     "model.safetensors has 300 bytes, its header describes "),
    (lambda f: (f / "model.safetensors").write_bytes(b"\x10"), "model.safetensors has 1 bytes"),
    (lambda f: _flip(f / "optimizer.pt", (f / "optimizer.pt").stat().st_size - 1200),
     "optimizer.pt member "),
    (lambda f: (f / "optimizer.pt").write_bytes((f / "optimizer.pt").read_bytes()[:500]),
     "optimizer.pt is not a torch zip file"),
    (lambda f: (f / "trainer_state.json").write_text('{"global_step'), "trainer_state.json cannot be read"),
], ids=["intact", "truncated weights", "weights cut in the header", "optimizer member changed",
        "truncated optimizer", "torn json"])
def test_marker_of_an_earlier_version_is_checked_by_format(damage, problem, tmp_path):
    """Markers written before sizes and hashes were recorded hold only the step."""
    folder = _checkpoint(tmp_path / "checkpoint-4")
    (folder / COMPLETE_MARKER).write_text(json.dumps({"global_step": 4}))
    assert not is_verifiable(folder)
    if damage is not None:
        damage(folder)
    found = check_checkpoint(folder)
    assert (found is None) if problem is None else found.startswith(problem), found


def test_resume_picks_the_newest_that_verifies(tmp_path, caplog):
    for step in (2, 4, 6):
        write_marker(_checkpoint(tmp_path / f"checkpoint-{step}"), step)
    (tmp_path / "checkpoint-8").mkdir()  # torn: no marker
    _flip(tmp_path / "checkpoint-6" / "model.safetensors")
    with caplog.at_level(logging.INFO):
        assert find_checkpoint(tmp_path, "auto") == str(tmp_path / "checkpoint-4")
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING and "damaged" in r.getMessage()]
    assert len(warnings) == 1 and warnings[0].startswith(
        "checkpoint-6 is damaged (model.safetensors differs from what was saved (content hash)): moved to "), warnings
    assert warnings[0].endswith("; resuming from checkpoint-4")
    assert [p.name for p in tmp_path.glob("damaged-*/*")] == ["checkpoint-6"]
    assert [p.name for p in tmp_path.glob("incomplete-*/*")] == ["checkpoint-8"]


def test_explicit_damaged_checkpoint_is_refused(tmp_path):
    folder = _checkpoint(tmp_path / "checkpoint-4")
    write_marker(folder, 4)
    (folder / "optimizer.pt").unlink()
    with pytest.raises(InputError, match=r"checkpoint-4: damaged checkpoint: optimizer.pt is missing\. Fix: pass "
                                         r"--resume auto"):
        find_checkpoint(tmp_path, str(folder))


# ---------------------------------------------------------------------------------------------
# Through run_qa.py with the real Trainer: a tiny BERT saving every 2 steps, 3 checkpoints kept

COMMON = [*TINY, "--do_train", "--save_strategy", "steps", "--save_steps", "2", "--save_total_limit", "3",
          "--report_to", "none"]


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """checkpoint-2, -4 and -6 of a 6-step run."""
    from run_qa import main

    out = tmp_path_factory.mktemp("trained") / "out"
    with pytest.MonkeyPatch.context() as mp:
        go_offline(mp, tmp_path_factory.getbasetemp() / "hf_ckpt")
        assert main([*COMMON, "--max_steps", "6", "--output_dir", str(out)]) == 0
    assert sorted(p.name for p in out.glob("checkpoint-*")) == ["checkpoint-2", "checkpoint-4", "checkpoint-6"]
    return out


@pytest.fixture
def run(trained, tmp_path, monkeypatch):
    """A copy of the trained output folder, and run_qa.main on it."""
    from run_qa import main

    go_offline(monkeypatch, trained.parents[1] / "hf_ckpt")
    out = tmp_path / "out"
    shutil.copytree(trained, out)
    return out, lambda *args: main([*COMMON, "--output_dir", str(out), *args])


def _errors(capsys):
    """The `error:` lines of the run (model loading draws progress bars on stderr too)."""
    err = capsys.readouterr().err
    assert "Traceback" not in err, err
    return [line for line in err.splitlines() if line.startswith("error:")]


def _tree(folder):
    return sorted((p.relative_to(folder).as_posix(), p.stat().st_size) for p in folder.rglob("*") if p.is_file())


@pytest.mark.parametrize("damage, problem", [
    (lambda c: (c / "model.safetensors").write_bytes((c / "model.safetensors").read_bytes()[:100_000]),
     "model.safetensors has 100,000 bytes, "),
    (lambda c: _flip(c / "optimizer.pt"), "optimizer.pt differs from what was saved (content hash)"),
    (lambda c: (c / "rng_state.pth").unlink(), "rng_state.pth is missing"),
], ids=["truncated weights", "damaged optimizer state", "missing file"])
def test_damaged_latest_checkpoint_resumes_from_the_previous(damage, problem, run, caplog):
    out, main = run
    damage(out / "checkpoint-6")
    with caplog.at_level(logging.INFO):
        assert main("--max_steps", "8") == 0
    lines = [r.getMessage() for r in caplog.records if r.name == "qa.checkpoints"]
    damaged = [line for line in lines if " is damaged " in line]
    assert len(damaged) == 1 and "\n" not in damaged[0], lines
    assert damaged[0].startswith(f"checkpoint-6 is damaged ({problem}") and \
        damaged[0].endswith("; resuming from checkpoint-4"), damaged
    assert f"resuming from {out / 'checkpoint-4'}" in lines
    assert [p.name for p in out.glob("damaged-*/*")] == ["checkpoint-6"]
    assert json.loads((out / "trainer_state.json").read_text())["global_step"] == 8
    # the run went on from step 4: it saved step 6 again, whole this time
    assert check_checkpoint(out / "checkpoint-6") is None and check_checkpoint(out / "checkpoint-8") is None


def test_no_checkpoint_verifies(run, capsys):
    out, main = run
    for step in (2, 4, 6):
        _flip(out / f"checkpoint-{step}" / "model.safetensors")
    before = _tree(out)
    assert main("--max_steps", "8") == 2
    err = _errors(capsys)
    assert len(err) == 1 and err[0].startswith(f"error: {out}: none of its 3 complete checkpoint(s) can be resumed "
                                               "(checkpoint-6: model.safetensors differs"), err
    assert "Fix: pass --resume never to start afresh" in err[0]
    assert _tree(out) == before, "nothing moved or written"
    assert main("--max_steps", "2", "--resume", "never") == 0  # the fix works
    assert [p.name for p in sorted(out.glob("previous-*/*"))] == ["checkpoint-2", "checkpoint-4", "checkpoint-6"]


def test_explicit_damaged_checkpoint_stops_the_run(run, capsys):
    out, main = run
    (out / "checkpoint-4" / "scheduler.pt").unlink()
    before = _tree(out)
    assert main("--max_steps", "8", "--resume", str(out / "checkpoint-4")) == 2
    err = _errors(capsys)
    assert err == [f"error: {out / 'checkpoint-4'}: damaged checkpoint: scheduler.pt is missing. Fix: pass --resume "
                   "auto (the newest checkpoint that verifies), another checkpoint-N folder, or --resume never to "
                   "start afresh"]
    assert _tree(out) == before


def test_real_checkpoint_with_an_earlier_marker(trained, tmp_path):
    """The files of a real Trainer checkpoint under a marker that holds only the step."""
    folder = tmp_path / "checkpoint-6"
    shutil.copytree(trained / "checkpoint-6", folder)
    (folder / COMPLETE_MARKER).write_text(json.dumps({"global_step": 6}))
    assert check_checkpoint(folder) is None
    weights = folder / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:-10])
    assert check_checkpoint(folder).startswith("model.safetensors has ")
    shutil.copy(trained / "checkpoint-6" / "model.safetensors", weights)
    _flip(folder / "optimizer.pt")
    assert check_checkpoint(folder).startswith("optimizer.pt member ")
