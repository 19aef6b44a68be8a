"""Post-processing: logits over features -> answer texts, n-best lists and null odds.

Hand-made windows with known answers run through both implementations (which must agree);
then the vectorised version is checked against the reference on real dev-set features.
"""
import json
import logging
import re

import numpy as np
import pytest

from utils_qa import rank_answers
from tests.helpers import DEV_SET
from bench.postprocess_reference import postprocess_qa_predictions_reference

CONTEXT = "zero one two three four five six seven eight nine"
SPANS = [m.span() for m in re.finditer(r"\S+", CONTEXT)]
LOW = -10.0


def window(first, last, pad=3):
    """Offsets of a feature `[CLS] q q [SEP] words first..last [SEP] pad...`."""
    return [None] * 4 + [list(span) for span in SPANS[first:last + 1]] + [None] * (1 + pad)


def tok(word, first=0):
    """Token position of context word `word` in a window starting at word `first`."""
    return 4 + word - first


def run(windows, starts, ends, seq_len=None, example_ids=None, examples=None, **kwargs):
    """Both implementations on hand-made windows; they must agree. starts/ends: one
    {token: logit} dict per window, every other logit LOW."""
    seq_len = seq_len or max(len(w) for w in windows)
    start = np.full((len(windows), seq_len), LOW, dtype=np.float32)
    end = np.full((len(windows), seq_len), LOW, dtype=np.float32)
    for f, (s, e) in enumerate(zip(starts, ends)):
        for i, v in s.items():
            start[f, i] = v
        for i, v in e.items():
            end[f, i] = v
    examples = examples or {"id": ["q"], "context": [CONTEXT]}
    features = {"example_id": example_ids or ["q"] * len(windows), "offset_mapping": windows}
    got = rank_answers(examples, features, start, end, **kwargs)
    assert got == postprocess_qa_predictions_reference(examples, features, start, end, **kwargs)
    json.dumps(got)  # JSON-serialisable, floats included
    return got


def test_the_best_span_wins_and_the_nbest_is_a_ranked_distribution():
    preds, nbest, odds = run([window(0, 9)], [{tok(2): 5, tok(6): 3}], [{tok(3): 4, tok(6): 3.5}])
    assert preds == {"q": "two three"} and odds is None
    entries = nbest["q"]
    assert len(entries) == 20
    assert entries[0] == {"text": "two three", "answer_start": 9, "answer_end": 18,
                          "probability": entries[0]["probability"], "start_logit": 5.0, "end_logit": 4.0}
    assert all(CONTEXT[e["answer_start"]:e["answer_end"]] == e["text"] for e in entries)
    assert [e["text"] for e in entries[1:3]] == ["two three four five six", "six"]  # 8.5, 6.5
    scores = [e["start_logit"] + e["end_logit"] for e in entries]
    assert scores == sorted(scores, reverse=True)
    assert sum(e["probability"] for e in entries) == pytest.approx(1.0)
    assert all(type(e["probability"]) is float and type(e["start_logit"]) is float for e in entries)


@pytest.mark.parametrize("v2", [False, True])
def test_tokens_outside_the_context_are_never_chosen(v2):
    w = window(0, 9, pad=3)
    question, sep, padding = 1, tok(10), len(w) - 1
    starts = [{0: 20, question: 15, sep: 30, padding: 30, tok(5): 1}]
    ends = [{0: -20, question: 15, sep: 30, padding: 30, tok(5): 1}]
    preds, nbest, _ = run([w], starts, ends, version_2_with_negative=v2)
    assert preds == {"q": "five"}
    assert all(e["text"] in CONTEXT for e in nbest["q"])
    assert [e["text"] for e in nbest["q"]].count("") == (1 if v2 else 0)


def test_reversed_spans_are_never_chosen():
    # (start seven, end two) would score 20; the best forward pair is (one, two) at 15.
    preds, nbest, _ = run([window(0, 9)], [{tok(7): 10, tok(1): 5}], [{tok(2): 10, tok(8): 4}])
    assert preds == {"q": "one two"}
    assert nbest["q"][1]["text"] == "seven eight"


@pytest.mark.parametrize("max_len, answer", [(5, "four five"), (9, "zero one two three four five"), (10, CONTEXT)])
def test_spans_longer_than_max_answer_length_are_never_chosen(max_len, answer):
    preds, nbest, _ = run([window(0, 9)], [{tok(0): 10, tok(4): 3}], [{tok(9): 10, tok(5): 3}],
                          max_answer_length=max_len)
    assert preds == {"q": answer}
    assert all(len(e["text"].split()) <= max_len for e in nbest["q"])


def test_the_answer_can_come_from_either_of_two_windows():
    # Window A holds words 0-5, window B words 4-9 (overlapping); offsets index the whole context.
    a, b = window(0, 5), window(4, 9)
    preds, nbest, _ = run([a, b], [{tok(1): 4}, {tok(8, first=4): 5}],
                          [{tok(1): 4}, {tok(8, first=4): 5}])
    assert preds == {"q": "eight"}
    assert [e["text"] for e in nbest["q"][:2]] == ["eight", "one"]
    preds, _, _ = run([a, b], [{tok(1): 6}, {tok(8, first=4): 5}], [{tok(1): 6}, {tok(8, first=4): 5}])
    assert preds == {"q": "one"}


def test_nbest_size_keeps_the_best_candidates_over_all_windows():
    starts = [{tok(1): 4, tok(2): 3}, {tok(8, first=4): 5, tok(9, first=4): 2}]
    preds, nbest, _ = run([window(0, 5), window(4, 9)], starts, starts, n_best_size=2)
    assert preds == {"q": "eight"}
    assert [e["text"] for e in nbest["q"]] == ["eight", "one"]


@pytest.mark.parametrize("threshold, answer", [(0.0, "two"), (-1.9, "two"), (-2.1, "")])
def test_v2_null_answer_depends_on_the_threshold(threshold, answer):
    # null score 3 + 3 = 6, best span 4 + 4 = 8: null_odds = -2.
    preds, nbest, odds = run([window(0, 9)], [{0: 3, tok(2): 4}], [{0: 3, tok(2): 4}],
                             version_2_with_negative=True, null_score_diff_threshold=threshold)
    assert preds == {"q": answer} and odds == {"q": -2.0}
    null = [e for e in nbest["q"] if e["text"] == ""]
    assert len(null) == 1 and null[0]["start_logit"] == 3.0 and nbest["q"][1] is null[0]


def test_v2_null_wins_when_it_outscores_every_span_and_uses_the_smallest_window_score():
    preds, nbest, odds = run([window(0, 5), window(4, 9)], [{0: 9, tok(1): 2}, {0: 6}],
                             [{0: 9, tok(1): 2}, {0: 5}], version_2_with_negative=True)
    assert preds == {"q": ""} and odds == {"q": 11.0 - 4.0}  # min(18, 11) - (2 + 2)
    assert nbest["q"][0] == {"text": "", "answer_start": None, "answer_end": None,
                             "probability": nbest["q"][0]["probability"], "start_logit": 6.0, "end_logit": 5.0}


@pytest.mark.parametrize("null, size", [(-50.0, 6), (1.78, 5), (1.9, 5)])
def test_v2_null_entry_is_kept_even_below_the_top_n(null, size):
    # Span scores: 3.8, 3.7, 3.6, 3.6, 3.5, 3.5, ...; null = 2 * null.
    logits = {0: null, **{tok(w): 1 + w / 10 for w in range(10)}}
    _, nbest, _ = run([window(0, 9)], [logits], [logits], version_2_with_negative=True, n_best_size=5)
    texts = [e["text"] for e in nbest["q"]]
    assert len(texts) == size and texts.count("") == 1
    assert texts.index("") == (1 if null == 1.9 else size - 1)  # after spans of equal score


@pytest.mark.parametrize("v2", [False, True])
def test_no_valid_span_among_the_nbest(v2):
    """With n_best_size=2 the best starts and ends are all [CLS] or question tokens (an undertrained
    model). v1.1 has an answer to every question: the best valid span over all positions; v2 keeps
    its null answer."""
    windows, kwargs = [window(0, 3), window(2, 9)], dict(n_best_size=2, version_2_with_negative=v2,
                                                         null_score_diff_threshold=100.0)
    starts, ends = [{0: 9, 1: 8}, {0: 9, 1: 8, tok(4, 2): 1}], [{0: 9, 2: 8}, {0: 9, 2: 8, tok(5, 2): 2}]
    preds, nbest, odds = run(windows, starts, ends, **kwargs)
    datasets = pytest.importorskip("datasets")
    start = np.full((2, 16), LOW, dtype=np.float32)
    end = start.copy()
    for f in range(2):
        start[f, list(starts[f])], end[f, list(ends[f])] = list(starts[f].values()), list(ends[f].values())
    table = datasets.Dataset.from_dict
    tables = rank_answers(table({"id": ["q"], "context": [CONTEXT]}),
                                        table({"example_id": ["q", "q"], "offset_mapping": windows}), start, end,
                                        **kwargs)
    assert tables == (preds, nbest, odds)
    if v2:
        assert preds == {"q": ""} and odds == {"q": 18.0} and [e["text"] for e in nbest["q"]] == ["", ""]
    else:
        assert preds == {"q": "four five"} and odds is None
        assert nbest["q"] == [{"text": "four five", "answer_start": 19, "answer_end": 28, "probability": 1.0,
                               "start_logit": 1.0, "end_logit": 2.0}]


def test_an_example_without_features_gets_an_empty_answer_and_a_warning(caplog):
    examples = {"id": ["q", "lost"], "context": [CONTEXT, CONTEXT]}
    with caplog.at_level(logging.WARNING, logger="utils_qa"):
        preds, _, _ = run([window(0, 9)], [{tok(3): 1}], [{tok(3): 1}], examples=examples)
    assert preds == {"q": "three", "lost": ""}
    assert "1 example(s) have no features" in caplog.text and "'lost'" in caplog.text


def test_logit_positions_past_the_offsets_are_ignored():
    # Dynamic padding: the logits are wider than this feature's offsets, and it is shorter
    # than n_best_size.
    w = window(0, 9, pad=0)
    preds, nbest, _ = run([w], [{tok(4): 2, 30: 99}], [{tok(4): 2, 31: 99}], seq_len=40)
    assert preds == {"q": "four"} and all(e["start_logit"] < 99 for e in nbest["q"])


def test_inconsistent_inputs_are_rejected():
    features = {"example_id": ["nobody"], "offset_mapping": [window(0, 9)]}
    logits = np.zeros((1, 20), dtype=np.float32)
    examples = {"id": ["q"], "context": [CONTEXT]}
    for fn in (rank_answers, postprocess_qa_predictions_reference):
        with pytest.raises(ValueError, match="belong to no example"):
            fn(examples, features, logits, logits)
        with pytest.raises(ValueError, match="shape"):
            fn(examples, {**features, "example_id": ["q"]}, logits, logits[:, :10])
        with pytest.raises(ValueError, match="n_best_size"):
            fn(examples, {**features, "example_id": ["q"]}, logits, logits, n_best_size=0)


@pytest.mark.parametrize("v2, prefix", [(False, None), (True, None), (True, "eval")])
def test_files_are_written_with_the_right_names(tmp_path, v2, prefix):
    got = run([window(0, 9)], [{0: 3, tok(2): 4}], [{0: 3, tok(2): 4}], version_2_with_negative=v2,
              output_dir=str(tmp_path), prefix=prefix)
    names = ["predictions.json", "nbest_predictions.json"] + (["null_odds.json"] if v2 else [])
    names = [n if prefix is None else f"{prefix}_{n}" for n in names]
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(names)  # no temporary left over
    for name, value in zip(names, got):
        assert json.loads((tmp_path / name).read_text()) == value


def test_datasets_tables_give_the_same_results():
    datasets = pytest.importorskip("datasets")
    windows = [window(0, 5), window(4, 9), window(0, 9)]
    rng = np.random.default_rng(3)
    start, end = rng.normal(size=(2, 3, 16)).astype(np.float32)
    examples = {"id": ["a", "b"], "context": [CONTEXT, CONTEXT]}
    features = {"example_id": ["a", "a", "b"], "offset_mapping": windows}
    want = postprocess_qa_predictions_reference(examples, features, start, end,
                                                version_2_with_negative=True)
    ds_examples = datasets.Dataset.from_dict(examples)
    ds_features = datasets.Dataset.from_dict(features)
    for fn in (rank_answers, postprocess_qa_predictions_reference):
        assert fn(ds_examples, ds_features, start, end, version_2_with_negative=True) == want
    # A reordered table (an indices mapping over the Arrow data) is read in its own order.
    order = [2, 0, 1]
    shuffled = ds_features.select(order)
    assert rank_answers(ds_examples, shuffled, start[order], end[order],
                                      version_2_with_negative=True)[0] == want[0]


# ---------------------------------------------------------------------------------------------
# Vectorised == reference on real dev-set features.

@pytest.fixture(scope="module")
def dev_examples():
    if not DEV_SET.exists():
        pytest.skip(f"SQuAD v1.1 dev set not found at {DEV_SET}")
    from tests.helpers import dev_set_columns

    dev = dev_set_columns()
    # Every 40th question plus the 60 with the longest contexts (which need several windows).
    n = len(dev["id"])
    longest = sorted(range(n), key=lambda i: -len(dev["context"][i]))[:60]
    keep = sorted(set(range(0, n, 40)) | set(longest))
    return {key: [dev[key][i] for i in keep] for key in ("id", "question", "context")}


@pytest.fixture(scope="module")
def dev_features(dev_examples):
    from utils_qa import prepare_validation_features
    from tests.helpers import minilm_tokenizer

    tokenizer = minilm_tokenizer()
    return {
        "384 padded": prepare_validation_features(dev_examples, tokenizer, 384, 128, 64, True),
        "128 dynamic": prepare_validation_features(dev_examples, tokenizer, 128, 32, 64, False),
    }


LOGITS = {
    "normal": lambda rng, shape: rng.normal(0, 3, shape).astype(np.float32),
    "ties": lambda rng, shape: rng.integers(-2, 3, shape).astype(np.float32),
    "float64": lambda rng, shape: rng.normal(0, 3, shape),
}


@pytest.mark.parametrize("v2", [False, True], ids=["v1", "v2"])
@pytest.mark.parametrize("window_kind", ["384 padded", "128 dynamic"])
@pytest.mark.parametrize("logits, kwargs", [
    ("normal", {}),
    ("ties", {}),
    ("float64", {"n_best_size": 5, "max_answer_length": 3, "null_score_diff_threshold": 1.5}),
    ("normal", {"n_best_size": 1}),
])
def test_vectorised_equals_reference_on_dev_features(dev_examples, dev_features, v2, window_kind,
                                                      logits, kwargs):
    features = dev_features[window_kind]
    n, seq_len = len(features["example_id"]), max(len(o) for o in features["offset_mapping"])
    assert len(set(features["example_id"])) == len(dev_examples["id"]) < n  # some have 2+ windows
    rng = np.random.default_rng(0)
    start, end = LOGITS[logits](rng, (n, seq_len)), LOGITS[logits](rng, (n, seq_len))
    args = (dev_examples, features, start, end)
    got = rank_answers(*args, version_2_with_negative=v2, **kwargs)
    assert got == postprocess_qa_predictions_reference(*args, version_2_with_negative=v2, **kwargs)
    assert any(p != "" for p in got[0].values())
