"""Shared test fixtures: where the real data is, and the bundled tokenizer."""
import functools
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
DEV_SET = Path(__file__).resolve().parents[2] / "shared" / "data" / "squad" / "dev-v1.1.json.gz"


@functools.lru_cache(maxsize=None)
def dev_set_columns():
    """The official dev set as columns (id, title, context, question, answers), in file order,
    read by the project's own loader. Callers must not modify it."""
    from qa.data import read_squad_file

    return read_squad_file(DEV_SET).to_dict()


@functools.lru_cache(maxsize=None)
def minilm_tokenizer():
    from transformers import AutoTokenizer

    from qa.model import bundled_minilm_dir

    return AutoTokenizer.from_pretrained(bundled_minilm_dir())
