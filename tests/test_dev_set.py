"""Where the official SQuAD v1.1 dev set is looked for ($SQUAD_DEV, else a shared/ folder beside
the repository); a benchmark that does not find it: tests/test_bench.py."""
import pytest

from bench.dev_set import DEFAULT as SQUAD_DEV_DEFAULT, require_squad_dev, squad_dev_path
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
