#!/usr/bin/env python
"""Where the official SQuAD v1.1 dev set is, for the benchmarks and the tests: $SQUAD_DEV (as
published, plain or gzip-compressed), else shared/data/squad/dev-v1.1.json.gz beside the repository.

    python bench/dev_set.py        # prints its path, or says in one line how to get it (exit 2)
"""
import os
from pathlib import Path

from qa.errors import InputError, command

VARIABLE = "SQUAD_DEV"
DEFAULT = Path(__file__).resolve().parents[2] / "shared" / "data" / "squad" / "dev-v1.1.json.gz"
URL = "https://rajpurkar.github.io/SQuAD-explorer/dataset/dev-v1.1.json"


def squad_dev_path() -> Path:
    given = os.environ.get(VARIABLE)
    return Path(given).expanduser() if given else DEFAULT


def require_squad_dev(path, option: str = "--dev", synthetic: bool = False) -> Path:
    """`path` when it is a file, else the InputError that says how to get the dev set (`synthetic`:
    the caller takes --dataset_name synthetic instead)."""
    if path is not None and Path(path).is_file():
        return Path(path)
    instead = f", or pass its path ({option} PATH)" if option.startswith("--") else ""
    instead += "; or --dataset_name synthetic to time generated data instead" if synthetic else ""
    raise InputError(f"{option} {path}", "the official SQuAD v1.1 dev set is not there",
                     f"download it once (curl -LO {URL}, on a machine with internet) and set "
                     f"{VARIABLE}=/path/to/dev-v1.1.json{instead}")


@command
def main() -> int:
    print(require_squad_dev(squad_dev_path(), option=VARIABLE))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
