"""Where the official SQuAD v1.1 dev set is looked for ($SQUAD_DEV, else a shared/ folder beside
the repository), and the one-line error of a benchmark that does not find it."""
import os
import subprocess
import sys

import pytest

from qa.data import SQUAD_DEV_DEFAULT, SQUAD_DEV_URL, require_squad_dev, squad_dev_path
from qa.errors import InputError
from tests.helpers import REPO


def test_squad_dev_variable_wins(monkeypatch, tmp_path):
    monkeypatch.setenv("SQUAD_DEV", str(tmp_path / "dev-v1.1.json"))
    assert squad_dev_path() == tmp_path / "dev-v1.1.json"
    monkeypatch.delenv("SQUAD_DEV")
    assert squad_dev_path() == SQUAD_DEV_DEFAULT == REPO.parent / "shared" / "data" / "squad" / "dev-v1.1.json.gz"
    (tmp_path / "dev.json").write_text("{}")
    assert require_squad_dev(tmp_path / "dev.json") == tmp_path / "dev.json"
    with pytest.raises(InputError, match="SQUAD_DEV="):
        require_squad_dev(tmp_path / "missing.json")


@pytest.mark.parametrize("script", ["bench_postprocess.py", "bench_features.py", "parity.py"])
def test_benchmark_without_the_dev_set_says_how_to_get_it(script, tmp_path):
    missing = tmp_path / "nowhere" / "dev-v1.1.json"
    env = dict(os.environ, SQUAD_DEV=str(missing), PYTHONPATH=str(REPO))
    proc = subprocess.run([sys.executable, str(REPO / "bench" / script)], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2, proc.stderr[-2000:]
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr  # no traceback
    assert lines[0].startswith(f"error: {missing}: the official SQuAD v1.1 dev set is not there. Fix: ")
    assert SQUAD_DEV_URL in lines[0] and "SQUAD_DEV=" in lines[0]
