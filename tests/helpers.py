"""Shared test fixtures: where the real data is, and the bundled tokenizer."""
import functools
from pathlib import Path

from qa.data.sources import squad_dev_path

REPO = Path(__file__).resolve().parents[1]
# The official SQuAD v1.1 dev set: $SQUAD_DEV, or ../shared/data/squad/dev-v1.1.json.gz beside the
# repository (README: "The SQuAD dev set"); tests that need it skip without it.
DEV_SET = squad_dev_path()


@functools.lru_cache(maxsize=None)
def dev_set_columns():
    """The official dev set as columns (id, title, context, question, answers), in file order,
    read by the project's own loader. Callers must not modify it."""
    from qa.data import read_squad

    return read_squad(DEV_SET).dataset.to_dict()


@functools.lru_cache(maxsize=None)
def minilm_tokenizer():
    from transformers import AutoTokenizer

    from qa.model import bundled_minilm_dir

    return AutoTokenizer.from_pretrained(bundled_minilm_dir())
