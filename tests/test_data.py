"""Tests of qa/data/: every file format, the real dev set, the Hub path and every bad input."""
import gzip
import json
import os
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

import pandas as pd
import pytest

from qa.arguments import DataArguments
from qa.data.sources import load_raw_datasets, read_squad
from qa.data.sources import parse_slice, select_articles
from qa.errors import InputError
from tests.helpers import DEV_SET, REPO

# Two articles; contexts with a non-ASCII character, a double space and a newline; one question
# with two answers (as in dev files), one with an answer at offset 0.
ARTICLES = [
    ("Caf\u00e9_history", "Caf\u00e9 culture began in  Istanbul in 1554.\nIt spread to Venice.", [
        ("q1", "Where did caf\u00e9 culture begin?", [("Istanbul", 23), ("in  Istanbul", 19)]),
        ("q2", "When did it begin?", [("1554", 35)]),
    ]),
    ("Rivers", "The Nile is long. The Amazon carries the most water.", [
        ("q3", "Which river carries the most water?", [("The Amazon", 18)]),
        ("q4", "What is long?", [("The Nile", 0)]),
    ]),
]


def expected_rows(articles=ARTICLES):
    return [{"id": qid, "title": title, "context": context, "question": question,
             "answers": {"text": [t for t, _ in answers], "answer_start": [s for _, s in answers]}}
            for title, context, qas in articles for qid, question, answers in qas]


def official(articles=ARTICLES, version="1.1"):
    return {"version": version, "data": [
        {"title": title, "paragraphs": [{"context": context, "qas": [
            {"id": qid, "question": question,
             "answers": [{"text": t, "answer_start": s} for t, s in answers]}
            for qid, question, answers in qas]}]}
        for title, context, qas in articles]}


def write(path: Path, text: str) -> Path:
    data = text.encode("utf-8")
    path.write_bytes(gzip.compress(data) if path.name.endswith(".gz") else data)
    return path


def write_json(path: Path, obj) -> Path:
    return write(path, json.dumps(obj))


def write_jsonl(path: Path, records) -> Path:
    return write(path, "".join(json.dumps(r) + "\n" for r in records))


def pair_records(rows):
    """The answer_text / answer_start column form (lists when a question has several)."""
    out = []
    for row in rows:
        texts, starts = row["answers"]["text"], row["answers"]["answer_start"]
        one = len(texts) == 1
        out.append({"id": row["id"], "title": row["title"], "context": row["context"],
                    "question": row["question"], "answer_text": texts[0] if one else texts,
                    "answer_start": starts[0] if one else starts})
    return out


# Each writer puts ARTICLES into tmp_path in one format and returns (path, rows it holds).
def _official_json(d):
    return write_json(d / "train-v1.1.json", official()), expected_rows()


def _official_json_gz(d):
    return write_json(d / "train-v1.1.json.gz", official()), expected_rows()


def _records_list(d):
    return write_json(d / "records.json", expected_rows()), expected_rows()


def _records_data(d):
    rows = expected_rows()
    return write_json(d / "records.json.gz", {"version": "x", "data": rows}), rows


def _records_answer_list(d):  # answers as a list of {"text", "answer_start"} dicts
    rows = [{**r, "answers": [{"text": t, "answer_start": s} for t, s in
                              zip(r["answers"]["text"], r["answers"]["answer_start"])]}
            for r in expected_rows()]
    return write_json(d / "records2.json", rows), expected_rows()


def _jsonl(d):
    return write_jsonl(d / "train.jsonl", expected_rows()), expected_rows()


def _jsonl_gz(d):
    return write_jsonl(d / "train.jsonl.gz", expected_rows()), expected_rows()


def _jsonl_named_json(d):
    return write_jsonl(d / "lines.json", expected_rows()), expected_rows()


def _jsonl_pairs(d):
    return write_jsonl(d / "pairs.jsonl", pair_records(expected_rows())), expected_rows()


def _csv_answers_json(d):
    frame = pd.DataFrame(expected_rows())
    frame["answers"] = frame["answers"].map(json.dumps)
    frame.to_csv(d / "train.csv", index=False)
    return d / "train.csv", expected_rows()


def _csv_pairs_gz(d):  # one answer per row: drop the two-answer question
    rows = [r for r in expected_rows() if len(r["answers"]["text"]) == 1]
    path = d / "train.csv.gz"
    write(path, pd.DataFrame(pair_records(rows)).to_csv(index=False))
    return path, rows


def _csv_no_title(d):
    rows = [{**r, "title": ""} for r in expected_rows()]
    frame = pd.DataFrame(rows).drop(columns="title")
    frame["answers"] = frame["answers"].map(json.dumps)
    frame.to_csv(d / "untitled.csv", index=False)
    return d / "untitled.csv", rows


def _parquet(d):
    pd.DataFrame(expected_rows()).to_parquet(d / "train.parquet")
    return d / "train.parquet", expected_rows()


def _parquet_pairs(d):
    pd.DataFrame(pair_records([r for r in expected_rows() if len(r["answers"]["text"]) == 1])
                 ).to_parquet(d / "pairs.parquet")
    return d / "pairs.parquet", [r for r in expected_rows() if len(r["answers"]["text"]) == 1]


WRITERS = [_official_json, _official_json_gz, _records_list, _records_data, _records_answer_list,
           _jsonl, _jsonl_gz, _jsonl_named_json, _jsonl_pairs, _csv_answers_json, _csv_pairs_gz,
           _csv_no_title, _parquet, _parquet_pairs]


@pytest.mark.parametrize("writer", WRITERS, ids=lambda w: w.__name__.strip("_"))
def test_every_format_loads_the_same_rows(tmp_path, writer):
    path, rows = writer(tmp_path)
    data = load_raw_datasets(DataArguments(train_file=str(path)), splits=("train",))
    train = data["train"]
    assert train.column_names == ["id", "title", "context", "question", "answers"]
    assert train.to_list() == rows
    assert str(train.features["answers"]["answer_start"].feature.dtype) == "int32"


def test_all_three_splits_from_files_and_parquet_round_trip(tmp_path):
    path, rows = _official_json(tmp_path)
    args = DataArguments(train_file=str(path), validation_file=str(path), test_file=str(path))
    data = load_raw_datasets(args)
    assert list(data) == ["train", "validation", "test"]
    data["validation"].to_parquet(str(tmp_path / "hub-like.parquet"))
    again = read_squad(tmp_path / "hub-like.parquet").dataset
    assert again.to_list() == rows == data["test"].to_list()


def test_test_file_may_leave_answers_out(tmp_path):
    rows = [{k: v for k, v in r.items() if k != "answers"} for r in expected_rows()]
    path = write_jsonl(tmp_path / "test.jsonl", rows)
    test = load_raw_datasets(DataArguments(test_file=str(path)), splits=("test",))["test"]
    # No labels is not "no answer": the split carries no answers column at all.
    assert "answers" not in test.column_names and test["id"] == [r["id"] for r in rows]
    with pytest.raises(InputError, match="missing column"):
        load_raw_datasets(DataArguments(train_file=str(path)), splits=("train",))


def test_v2_data_loads_with_the_flag(tmp_path):
    nested = official()
    nested["data"][1]["paragraphs"][0]["qas"].append(
        {"id": "q5", "question": "Who?", "answers": [], "is_impossible": True,
         "plausible_answers": [{"text": "The Nile", "answer_start": 0}]})
    path = write_json(tmp_path / "dev-v2.0.json", nested)
    data = load_raw_datasets(DataArguments(validation_file=str(path), version_2_with_negative=True),
                             splits=("validation",))
    assert data["validation"][-1]["answers"] == {"text": [], "answer_start": []}
    csv_path = tmp_path / "v2.csv"
    pd.DataFrame(pair_records(expected_rows()[2:]) + [
        {"id": "q5", "title": "Rivers", "context": "x", "question": "Who?", "answer_text": "",
         "answer_start": ""}]).to_csv(csv_path, index=False)
    rows = read_squad(csv_path, version_2_with_negative=True).dataset.to_list()
    assert rows[-1]["answers"] == {"text": [], "answer_start": []}


# ------------------------------------------------------------------------------------------------
# Article slices


def test_article_slices(tmp_path):
    path, rows = _official_json(tmp_path)
    for spec, titles in [("0:1", ["Caf\u00e9_history"]), ("1:", ["Rivers"]), (":", None),
                         ("-1:", ["Rivers"]), (" :1 ", ["Caf\u00e9_history"])]:
        args = DataArguments(train_file=str(path), train_articles=spec)
        got = load_raw_datasets(args, splits=("train",))["train"]
        assert got.to_list() == [r for r in rows if titles is None or r["title"] in titles], spec
    assert parse_slice("3:-2") == slice(3, -2)


@pytest.mark.parametrize("spec", ["abc", "5", "1:2:3", "a:b", "1.5:"])
def test_bad_slice_text(tmp_path, spec):
    path, _ = _official_json(tmp_path)
    with pytest.raises(InputError) as info:
        load_raw_datasets(DataArguments(validation_file=str(path), validation_articles=spec),
                          splits=("validation",))
    message = str(info.value)
    assert "--validation_articles" in message and "START:STOP" in message and "Fix:" in message


def test_slice_that_selects_nothing(tmp_path):
    path, _ = _official_json(tmp_path)
    with pytest.raises(InputError, match=r"selects none of the 2 articles of .*v1.1.json.*Fix:"):
        load_raw_datasets(DataArguments(train_file=str(path), train_articles="5:"),
                          splits=("train",))


# ------------------------------------------------------------------------------------------------
# The real SQuAD v1.1 dev set


@pytest.mark.skipif(not DEV_SET.exists(), reason=f"the official dev set is not at {DEV_SET}")
def test_real_dev_set():
    start = time.process_time()  # CPU time: robust to other jobs on the machine
    dev = load_raw_datasets(DataArguments(validation_file=str(DEV_SET)),
                            splits=("validation",))["validation"]
    seconds = time.process_time() - start
    assert seconds < 2.0, f"loading and validating the dev set took {seconds:.2f} s of CPU"
    assert dev.num_rows == 10570
    titles = dev["title"]
    assert len(set(titles)) == 48 and titles[0] == "Super_Bowl_50"
    assert len(set(dev["id"])) == 10570
    assert sum(len(a["text"]) for a in dev["answers"]) == 34726
    # the slice load_raw_datasets applies for --validation_articles (tested above on a small file)
    first, rest = select_articles(dev, ":40"), select_articles(dev, "40:")
    assert len(set(first["title"])) == 40 and len(set(rest["title"])) == 8
    assert not set(first["title"]) & set(rest["title"])
    assert first.num_rows + rest.num_rows == 10570


# ------------------------------------------------------------------------------------------------
# Bad input: every error is one line that names the file and says how to fix it


def _rows_with(**changes):
    rows = expected_rows()
    rows[1].update(changes)
    return rows


def _nested_with(qa_changes):
    nested = official()
    nested["data"][0]["paragraphs"][0]["qas"][1].update(qa_changes)
    return nested


BAD_INPUTS = {
    "missing_file": (lambda d: d / "nope.json", ["nope.json", "not found"]),
    "directory": (lambda d: (d / "adir.json").mkdir() or d / "adir.json", ["adir.json", "directory"]),
    "corrupt_gzip": (lambda d: (d / "bad.json.gz").write_bytes(b"not gzip at all") and
                     d / "bad.json.gz", ["bad.json.gz", "gzip"]),
    "not_utf8": (lambda d: (d / "latin1.json").write_bytes('["caf\xe9"]'.encode("latin-1")) and
                 d / "latin1.json", ["latin1.json", "UTF-8"]),
    "unknown_suffix": (lambda d: write(d / "train.txt", "x"), ["train.txt", "unknown file type"]),
    "empty_file": (lambda d: write(d / "empty.json", "  \n"), ["empty.json", "no questions"]),  # as .jsonl
    "empty_jsonl": (lambda d: write(d / "empty.jsonl.gz", "\n\n"), ["empty.jsonl.gz", "no questions"]),
    "malformed_json": (lambda d: write(d / "broken.json", '{"version": "1.1",\n "data": [\n'
                                       '   {"title": "x",, }]}'),
                       ["broken.json", "line 3 column 18", "malformed JSON"]),
    "malformed_json_gz": (lambda d: write(d / "broken.json.gz", '{"data": [1, 2\n'),
                          ["broken.json.gz", "line 2 column 1", "malformed JSON"]),
    "malformed_jsonl": (lambda d: write(d / "broken.jsonl", json.dumps(expected_rows()[0]) +
                                        '\n{"id": "q2", "question": \n'),
                        ["broken.jsonl", "line 2 column", "malformed JSON"]),
    "jsonl_not_object": (lambda d: write(d / "list.jsonl", "[1, 2]\n"), ["list.jsonl", "line 1"]),
    "unknown_layout": (lambda d: write_json(d / "odd.json", {"articles": [], "name": "x"}),
                       ["odd.json", "unknown layout", "articles, name", "paragraphs"]),
    "missing_columns": (lambda d: write_json(d / "cols.json", [
        {k: v for k, v in r.items() if k != "question"} for r in expected_rows()]),
        ["cols.json", "missing column(s) question", "found: id, title, context, answers",
         "id, title (optional), context, question"]),
    "csv_missing_answers": (lambda d: pd.DataFrame(expected_rows()).drop(columns="answers").to_csv(
        d / "noans.csv", index=False) or d / "noans.csv", ["noans.csv", "missing column(s) answers",
                                                          "answer_text + answer_start"]),
    "nested_missing_field": (lambda d: write_json(
        d / "nested.json", {"data": [{"title": "t", "paragraphs": [{"qas": []}]}]}),
        ["nested.json", "article 1 't'", "no 'context' field"]),
    "nested_question_not_object": (lambda d: write_json(d / "nested.json", {"data": [
        {"title": "t", "paragraphs": [{"context": "c", "qas": [7]}]}]}),
        ["nested.json", "article 1 't'", "expected a JSON object, found a int", "question {id, question, answers}"]),
    "nested_missing_answers": (lambda d: write_json(d / "noanswers.json", {"data": [
        {"title": "t", "paragraphs": [{"context": "c", "qas": [{"id": "x1", "question": "q"}]}]}]}),
        ["noanswers.json", "question 'x1'", "no 'answers' field"]),
    "answer_start_wrong": (lambda d: write_json(d / "offsets.json", _rows_with(
        answers={"text": ["1554"], "answer_start": [34]})),
        ["offsets.json", "question 'q2'", "answer_start 34", "expected '1554'", "found ' 155'",
         "occurs at offset 35"]),
    "answer_start_whitespace": (lambda d: write_json(d / "ws.json", _nested_with(
        {"answers": [{"text": "1554.", "answer_start": 35}, {"text": "1554 ", "answer_start": 35}]})),
        ["ws.json", "question 'q2'", "expected '1554 '", "found '1554.'", "1 of 6 answers wrong"]),
    "answer_text_absent": (lambda d: write_jsonl(d / "absent.jsonl", _rows_with(
        answers={"text": ["Paris"], "answer_start": [3]})),
        ["absent.jsonl", "question 'q2' (line 2)", "expected 'Paris'", "does not occur"]),
    "answer_start_past_end": (lambda d: write_json(d / "far.json", _rows_with(
        answers={"text": ["1554"], "answer_start": [999]})),
        ["far.json", "answer_start 999", "found nothing (the context has 61 characters)"]),
    "answer_start_negative": (lambda d: write_json(d / "neg.json", _rows_with(
        answers={"text": ["1554"], "answer_start": [-1]})),
        ["neg.json", "answer_start -1", "found nothing"]),
    "answer_start_text": (lambda d: write_json(d / "word.json", _rows_with(
        answers={"text": ["1554"], "answer_start": ["ten"]})),
        ["word.json", "'ten'", "not a whole number"]),
    "answer_counts_differ": (lambda d: write_json(d / "counts.json", _rows_with(
        answers={"text": ["1554", "1554"], "answer_start": [37]})),
        ["counts.json", "2 answer texts but 1 answer_start value"]),
    "answers_bad_json_in_csv": (lambda d: pd.DataFrame(_rows_with(answers="{text: 1554}")).assign(
        answers=lambda f: f["answers"].map(lambda a: a if isinstance(a, str) else json.dumps(a))
    ).to_csv(d / "badcell.csv", index=False) or d / "badcell.csv",
        ["badcell.csv", "question 'q2' (row 2)", "not valid JSON"]),
    "answers_unknown_form": (lambda d: write_json(d / "form.json", _rows_with(answers=[1554])),
                             ["form.json", "question 'q2'", "unknown form"]),
    "pair_without_start": (lambda d: pd.DataFrame(pair_records(expected_rows()[1:])).assign(
        answer_start=["", "18", "0"]).to_csv(d / "nostart.csv", index=False) or d / "nostart.csv",
        ["nostart.csv", "question 'q2'", "1 answer text but 0 answer_start values"]),
    "empty_question": (lambda d: write_json(d / "q.json", _rows_with(question="  ")),
                       ["q.json", "question 'q2'", "empty question"]),
    "empty_context": (lambda d: write_json(d / "c.json", {"data": [{"title": "t", "paragraphs": [
        {"context": "", "qas": [{"id": "e1", "question": "q",
                                 "answers": [{"text": "a", "answer_start": 0}]}]}]}]}),
        ["c.json", "question 'e1'", "empty context"]),
    "empty_id": (lambda d: write_jsonl(d / "noid.jsonl", _rows_with(id="")),
                 ["noid.jsonl", "line 2", "empty id"]),
    "duplicate_ids": (lambda d: write_json(d / "dup.json", _rows_with(id="q1") + [
        dict(expected_rows()[3], id="q1")]),
        ["dup.json", "'q1' occurs 3 times", "1 id repeated", "unique id"]),
    "v2_without_flag_nested": (lambda d: write_json(d / "v2.json", _nested_with(
        {"answers": [], "is_impossible": True})),
        ["v2.json", "question 'q2'", "no answer", "SQuAD v2.0", "--version_2_with_negative"]),
    "v2_without_flag_flat": (lambda d: write_jsonl(d / "v2.jsonl", _rows_with(
        answers={"text": [], "answer_start": []})), ["v2.jsonl", "1 of 4", "--version_2_with_negative"]),
    "impossible_with_answers": (lambda d: write_json(d / "imp.json", _nested_with(
        {"is_impossible": True})), ["imp.json", "question 'q2'", "is_impossible"]),
    "empty_answer_text": (lambda d: write_json(d / "blank.json", _nested_with(
        {"answers": [{"text": "", "answer_start": 5}]})),
        ["blank.json", "question 'q2'", "empty answer text"]),
    "no_questions": (lambda d: write_json(d / "none.json", {"version": "1.1", "data": []}),
                     ["none.json", "no questions"]),
    "csv_header_only": (lambda d: write(d / "header.csv", "id,context,question,answers\n"),
                        ["header.csv", "no questions"]),
    "malformed_csv": (lambda d: write(d / "fields.csv", 'id,context,question,answers\na,b,c,d,e,f\n'),
                      ["fields.csv", "line 2", "has 6 fields but the header has 4", "quote"]),
    "unterminated_quote_csv": (lambda d: write(d / "quote.csv", 'id,context\n"q1,"a"b\n'),
                               ["quote.csv", "line 2", "not valid CSV"]),
    "not_parquet": (lambda d: write(d / "fake.parquet", "id,context\n"),
                    ["fake.parquet", "not a readable parquet file"]),
}


@pytest.mark.parametrize("case", list(BAD_INPUTS))
def test_bad_input_raises_input_error(tmp_path, case):
    make, words = BAD_INPUTS[case]
    path = make(tmp_path)
    with pytest.raises(InputError) as info:
        load_raw_datasets(DataArguments(train_file=str(path)), splits=("train",))
    message = str(info.value)
    assert "\n" not in message
    assert str(path) in message and "Fix:" in message
    for word in words:
        assert word in message, f"{word!r} not in {message!r}"


# ------------------------------------------------------------------------------------------------
# The Hub


def test_offline_with_empty_cache_says_run_setup_script(tmp_path):
    cache = tmp_path / "empty-cache"
    cache.mkdir()
    code = ("from qa.arguments import DataArguments; from qa.data.sources import load_raw_datasets\n"
            "from qa.errors import InputError\n"
            "try:\n"
            "    load_raw_datasets(DataArguments(), splits=('train', 'validation'),\n"
            f"                      cache_dir={str(cache)!r})\n"
            "except InputError as e:\n"
            "    print('INPUTERROR', e)\n")
    env = dict(os.environ, HF_DATASETS_OFFLINE="1", HF_HOME=str(tmp_path / "hf-home"),
               PYTHONPATH=str(REPO))
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env,
                            cwd=REPO, timeout=120)
    out = result.stdout
    assert "INPUTERROR" in out, result.stdout + result.stderr
    assert "setup_bert.sh" in out and "rajpurkar/squad" in out and str(cache) in out
    assert "offline" in out and "Fix:" in out and "login node" in out


def _fake_hub(monkeypatch, result):
    """A Hub that answers `result`, as seen online: offline settings of the caller (CI sets
    them) would take the offline path instead."""
    import datasets
    for name in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE", "TRANSFORMERS_OFFLINE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(datasets.config, "HF_HUB_OFFLINE", False)  # read from the environment at import
    calls = []

    def fake_load_dataset(name, config=None, cache_dir=None, **kwargs):
        calls.append((name, config, cache_dir))
        if isinstance(result, BaseException):
            raise result
        return result

    monkeypatch.setattr(datasets, "load_dataset", fake_load_dataset)
    return calls


def test_unreachable_hub_says_run_setup_script(monkeypatch, tmp_path):
    _fake_hub(monkeypatch, ConnectionError("Couldn't reach 'rajpurkar/squad' on the Hub"))
    with pytest.raises(InputError) as info:
        load_raw_datasets(DataArguments(), splits=("train",), cache_dir=str(tmp_path))
    message = str(info.value)
    assert "setup_bert.sh" in message and "cannot be reached" in message and str(tmp_path) in message


def test_unknown_hub_dataset(monkeypatch):
    from datasets.exceptions import DatasetNotFoundError
    _fake_hub(monkeypatch, DatasetNotFoundError("Dataset 'me/nope' doesn't exist on the Hub"))
    with pytest.raises(InputError, match=r"me/nope.*does not exist.*Fix: check --dataset_name"):
        load_raw_datasets(DataArguments(dataset_name="me/nope"), splits=("validation",))


def test_hub_splits_articles_and_files_mix(monkeypatch, tmp_path):
    from datasets import DatasetDict
    hub_path, rows = _official_json(tmp_path)
    hub = DatasetDict({"train": read_squad(hub_path).dataset, "validation": read_squad(hub_path).dataset})
    calls = _fake_hub(monkeypatch, hub)
    file_path = write_jsonl(tmp_path / "mine.jsonl", expected_rows()[2:])
    args = DataArguments(dataset_config_name="plain_text", validation_file=str(file_path),
                         train_articles="1:")
    data = load_raw_datasets(args, splits=("train", "validation"), cache_dir="/some/cache")
    assert calls == [("rajpurkar/squad", "plain_text", "/some/cache")]
    assert data["train"].to_list() == rows[2:] and data["validation"].to_list() == rows[2:]
    with pytest.raises(InputError, match=r"has no 'test' split.*Fix: pass --test_file"):
        load_raw_datasets(args, splits=("test",))


def test_real_load_dataset_from_a_local_repo_folder(tmp_path):
    """No mock: datasets.load_dataset reads a folder laid out like the Hub repo (parquet files)."""
    path, rows = _official_json(tmp_path)
    repo = tmp_path / "squad-repo" / "plain_text"
    repo.mkdir(parents=True)
    read_squad(path).dataset.to_parquet(str(repo / "train-00000-of-00001.parquet"))
    read_squad(path).dataset.select(range(2, 4)).to_parquet(str(repo / "validation-00000-of-00001.parquet"))
    args = DataArguments(dataset_name=str(tmp_path / "squad-repo"), validation_articles="-1:")
    data = load_raw_datasets(args, splits=("train", "validation"), cache_dir=str(tmp_path / "cache"))
    assert data["train"].to_list() == rows and data["validation"].to_list() == rows[2:]
    assert data["train"].features == read_squad(path).dataset.features


def test_hub_v2_data_needs_the_flag(monkeypatch, tmp_path):
    from datasets import DatasetDict
    rows = expected_rows()
    rows[0]["answers"] = {"text": [], "answer_start": []}
    path = write_jsonl(tmp_path / "v2.jsonl", rows)
    _fake_hub(monkeypatch, DatasetDict({"validation": read_squad(path, True).dataset}))
    args = DataArguments(dataset_name="rajpurkar/squad_v2")
    with pytest.raises(InputError, match=r"squad_v2.*'q1'.*Fix: pass --version_2_with_negative"):
        load_raw_datasets(args, splits=("validation",))
    ok = load_raw_datasets(replace(args, version_2_with_negative=True), splits=("validation",))
    assert ok["validation"].to_list() == rows


def test_no_source_at_all():
    with pytest.raises(InputError, match="Fix: pass --train_file"):
        load_raw_datasets(DataArguments(dataset_name=None), splits=("train",))


# ------------------------------------------------------------------------------------------------
# Synthetic data


@pytest.mark.parametrize("v2", [False, True])
def test_synthetic(v2):
    args = DataArguments(dataset_name="synthetic", synthetic_train_examples=30,
                         synthetic_eval_examples=12, synthetic_seed=3, version_2_with_negative=v2,
                         validation_articles=":")
    data = load_raw_datasets(args)
    assert [data[s].num_rows for s in ("train", "validation", "test")] == [30, 12, 12]
    assert data["train"].column_names == ["id", "title", "context", "question", "answers"]
    assert data["train"]["context"] != data["validation"]["context"][:30]
    again = load_raw_datasets(args, splits=("train",))
    assert again["train"].to_list() == data["train"].to_list()


# ------------------------------------------------------------------------------------------------
# One reader for training, evaluation and scoring


def test_gzip_is_recognised_by_content_whatever_the_name(tmp_path, capsys):
    """A gzipped official file named .json trains and scores alike (the loader once went by the
    suffix and the scorer by the content)."""
    import score_qa

    path = tmp_path / "dev.json"
    path.write_bytes(gzip.compress(json.dumps(official()).encode()))
    data = load_raw_datasets(DataArguments(train_file=str(path)), splits=("train",))["train"]
    assert data["id"] == [r["id"] for r in expected_rows()]
    preds = write_json(tmp_path / "preds.json", {r["id"]: r["answers"]["text"][0] for r in expected_rows()})
    assert score_qa.score([str(path), str(preds)]) == 0
    assert json.loads(capsys.readouterr().out) == {"exact_match": 100.0, "f1": 100.0}


BAD_FOR_BOTH = {
    "not an object or list": ('"hello"', "unknown layout"),
    "no paragraphs or columns": ('{"data": [{"title": "t"}]}', "missing column"),
    "question without id": ('{"data": [{"title": "t", "paragraphs": [{"context": "c", "qas": '
                            '[{"question": "q", "answers": []}]}]}]}', "has no 'id' field"),
    "answers of an unknown form": ('{"data": [{"title": "t", "paragraphs": [{"context": "c", "qas": '
                                   '[{"id": "a", "question": "q", "answers": [{"start": 0}]}]}]}]}',
                                   "unknown form"),
    "repeated id": ('{"data": [{"title": "t", "paragraphs": [{"context": "c", "qas": ['
                    '{"id": "a", "question": "q", "answers": [{"text": "c", "answer_start": 0}]}, '
                    '{"id": "a", "question": "q", "answers": [{"text": "c", "answer_start": 0}]}]}]}]}',
                    "occurs 2 times"),
}


@pytest.mark.parametrize("case", sorted(BAD_FOR_BOTH))
def test_loader_and_scorer_reject_a_file_with_the_same_message(case, tmp_path, capsys):
    import score_qa

    text, words = BAD_FOR_BOTH[case]
    path = tmp_path / "bad.json"
    path.write_text(text)
    with pytest.raises(InputError) as info:
        load_raw_datasets(DataArguments(validation_file=str(path)), splits=("validation",))
    preds = write_json(tmp_path / "preds.json", {"a": "c"})
    assert score_qa.score([str(path), str(preds)]) == 2
    assert capsys.readouterr().err.strip() == f"error: {info.value}"
    assert words in str(info.value) and str(path) in str(info.value)


def test_file_named_gz_that_is_not_compressed(tmp_path):
    path = tmp_path / "dev.json.gz"
    path.write_text(json.dumps(official()))
    with pytest.raises(InputError, match=r"dev.json.gz: is named .gz but is not gzip-compressed\. Fix: drop"):
        read_squad(path).dataset


@pytest.mark.parametrize("empty", [True, False])
def test_unlabelled_test_split(tmp_path, empty):
    """A SQuAD v1.1 file to predict on, without answers or with empty answer lists everywhere,
    loads without an answers column; as v2.0 data empty lists mean "unanswerable" and stay."""
    data = official()
    for article in data["data"]:
        for paragraph in article["paragraphs"]:
            for qa in paragraph["qas"]:
                if empty:
                    qa["answers"] = []
                else:
                    del qa["answers"]
    path = write_json(tmp_path / "test.json", data)
    test = load_raw_datasets(DataArguments(test_file=str(path)), splits=("test",))["test"]
    assert "answers" not in test.column_names and len(test) == len(expected_rows())
    v2 = load_raw_datasets(DataArguments(test_file=str(path), version_2_with_negative=True), splits=("test",))
    assert ("answers" in v2["test"].column_names) == empty
    with pytest.raises(InputError, match="version_2_with_negative" if empty else "has no 'answers' field"):
        load_raw_datasets(DataArguments(validation_file=str(path)), splits=("validation",))


def test_split_source_names_where_each_split_comes_from():
    """What results.md says each split read: the file given for it, else the generated data or
    the Hub dataset, with the kept articles."""
    from qa.data.sources import split_source

    config = {"dataset_name": "rajpurkar/squad", "test_file": "questions.json", "train_articles": "0:36",
              "synthetic_train_examples": 1000}
    assert split_source(config, "test") == "questions.json"
    assert split_source(config, "train") == "rajpurkar/squad, split train, articles 0:36"
    assert split_source({**config, "dataset_name": "synthetic"}, "train") == \
        "synthetic (1,000 generated questions), articles 0:36"
    assert split_source({"dataset_name": None}, "validation") == "none given"
