"""The one table every source becomes before it is checked: the columns of the Hub's `rajpurkar/squad`,
each question's answers as {"text": [...], "answer_start": [...]} whatever form or file format they came in
(docs/data.md), and where each row came from, so that `validate` names the question at fault."""
import csv
import io
import json
import os
import re
from collections import Counter
from dataclasses import dataclass, field
from typing import Callable, List, Optional

from qa.errors import InputError, plural, short
from qa.io import json_error, parse_json_lines, read_bytes, read_text

EXPECTED_COLUMNS = "id, title (optional), context, question, and answers (or answer_text + answer_start)"
WHAT = "data file"  # what qa.io's messages call it
SQUAD_LAYOUT = ("follow the official SQuAD layout: article {title, paragraphs}, paragraph {context, qas}, question "
                "{id, question, answers}")


def squad_features():
    """The features of the Hub's `rajpurkar/squad` (answer_start is int32 there)."""
    from datasets import Features, List as ListOf, Value
    return Features({**{c: Value("string") for c in ("id", "title", "context", "question")},
                     "answers": {"text": ListOf(Value("string")), "answer_start": ListOf(Value("int32"))}})


@dataclass
class Table:
    where: str                     # the file, or the Hub dataset and split
    id: List[str] = field(default_factory=list)
    title: List[str] = field(default_factory=list)
    context: List[str] = field(default_factory=list)
    question: List[str] = field(default_factory=list)
    answers: List[dict] = field(default_factory=list)
    has_answers: bool = True       # False: a test file without any answers
    version: Optional[str] = None  # the official JSON's "version" field
    declares_v2: bool = False      # version "v2.0" or a question marked is_impossible
    locate: Callable[[int], str] = lambda i: f"record {i + 1}"

    def name(self, i: int) -> str:
        """`FILE, question 'ID' (record N)`: where row i is, for error messages."""
        qid = self.id[i]
        return f"{self.where}, question {qid!r} ({self.locate(i)})" if qid else f"{self.where}, {self.locate(i)}"

    def to_dataset(self):
        import pyarrow as pa
        from datasets import Dataset, DatasetInfo
        features = squad_features()
        if not self.has_answers:  # unlabelled: no answers column rather than one of empty lists
            del features["answers"]
        arrow = pa.Table.from_pydict({c: getattr(self, c) for c in features}, schema=features.arrow_schema)
        return Dataset(arrow, info=DatasetInfo(features=features))


def table_from_document(obj, path: str, require_answers: bool) -> Table:
    """A JSON document: official SQuAD (nested), a list of records or {"data": [records]}."""
    if isinstance(obj, dict) and isinstance(obj.get("data"), list):
        items = obj["data"]
    elif isinstance(obj, list):
        items = obj
    else:
        keys = sorted(obj) if isinstance(obj, dict) else [type(obj).__name__]
        # the keys that fit in 40 characters (at least one): the line stays short whatever the file holds
        shown = [key for i, key in enumerate(keys[:5]) if len(", ".join(keys[:i + 1])) <= 40] or keys[:1]
        found = ", ".join(shown) + (f" and {len(keys) - len(shown)} more keys" if len(keys) > len(shown) else "")
        raise InputError(path, f"unknown layout (top level: {found})",
                         'give SQuAD JSON {"data": [{"title", "paragraphs"}]}, or records (a list, or {"data": '
                         f'[...]}}) with columns {EXPECTED_COLUMNS}')
    if not (items and isinstance(items[0], dict) and "paragraphs" in items[0]):
        return table_from_records(items, path, require_answers)
    table = table_from_nested(items, path, require_answers)
    table.version = _text(obj.get("version")) or None if isinstance(obj, dict) else None
    table.declares_v2 |= table.version == "v2.0"
    return table


def table_from_nested(articles: list, path: str, require_answers: bool) -> Table:
    records, places = [], []  # a flat record per question, read as flat records are; the article it is in
    for a, article in enumerate(articles):
        title = _text(article.get("title")) if isinstance(article, dict) else ""
        place = f"article {a + 1} {title!r}"
        at = f"{path}, {place}"
        for paragraph in _field(article, "paragraphs", list, at):
            context = _field(paragraph, "context", None, at)
            for qa in _field(paragraph, "qas", list, at):
                where = f"{path}, question {_text(_field(qa, 'id', None, at))!r}"
                _field(qa, "question", None, where)
                answers = _field(qa, "answers", list, where) if "answers" in qa or require_answers else []
                if qa.get("is_impossible") and answers:
                    raise InputError(where, f"is marked is_impossible but has {plural(len(answers), 'answer')}",
                                     "remove its answers or set is_impossible to false")
                records.append({**qa, "title": title, "context": context})
                places.append(place)
    table = table_from_records(records, path, require_answers, places.__getitem__)
    table.declares_v2 = any(record.get("is_impossible") is True for record in records)
    return table


def _field(obj, key: str, kind, where: str):
    if not isinstance(obj, dict):
        raise InputError(where, f"expected a JSON object, found a {type(obj).__name__}", SQUAD_LAYOUT)
    if key not in obj:
        raise InputError(where, f"has no {key!r} field (fields found: {', '.join(sorted(obj))})", SQUAD_LAYOUT)
    if kind is not None and not isinstance(obj[key], kind):
        raise InputError(where, f"field {key!r} is a {type(obj[key]).__name__}, not a {kind.__name__}", SQUAD_LAYOUT)
    return obj[key]


def table_from_records(records: list, path: str, require_answers: bool, locate=Table.locate) -> Table:
    for i, record in enumerate(records):
        if not isinstance(record, dict):
            raise InputError(f"{path}, {locate(i)}", f"is a JSON {type(record).__name__}, not an object",
                             f"write each record (one question) as an object with columns {EXPECTED_COLUMNS}")
    keys = dict.fromkeys(k for record in records for k in record)
    return table_from_columns({k: [record.get(k) for record in records] for k in keys}, path, require_answers, locate)


def table_from_columns(columns: dict, path: str, require_answers: bool, locate: Callable[[int], str]) -> Table:
    if not columns or not len(next(iter(columns.values()))):
        raise InputError(path, "contains no questions", "give a file with SQuAD data")
    has_dict = "answers" in columns
    has_pair = "answer_text" in columns and "answer_start" in columns
    missing = [c for c in ("id", "context", "question") if c not in columns]
    if require_answers and not (has_dict or has_pair):
        missing.append("answers")
    if missing:
        raise InputError(path, f"missing column(s) {', '.join(missing)} (found: {', '.join(columns)})",
                         f"give the columns {EXPECTED_COLUMNS}")
    n = len(columns["id"])
    table = Table(where=path, locate=locate, has_answers=has_dict or has_pair)
    for name in ("id", "title", "context", "question"):  # only title may be missing
        setattr(table, name, [_text(v) for v in columns.get(name, [""] * n)])
    if has_dict:
        table.answers = [_answers_from_value(v, table.name(i)) for i, v in enumerate(columns["answers"])]
    elif has_pair:
        table.answers = [_answers_from_value({"text": t, "answer_start": s}, table.name(i)) for i, (t, s) in
                         enumerate(zip(columns["answer_text"], columns["answer_start"]))]
    else:
        table.answers = [{"text": [], "answer_start": []} for _ in range(n)]
    return table


def _text(value) -> str:
    if type(value) is str:
        return value
    return "" if value is None or (isinstance(value, float) and value != value) else str(value)  # None or NaN: ""


def _answers_from_value(value, where: str) -> dict:
    """`answers` as a dict of lists, a list of dicts, a JSON string of either, or empty."""
    if value is None or (isinstance(value, str) and not value.strip()):
        return {"text": [], "answer_start": []}
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except json.JSONDecodeError as exc:
            raise InputError(where, f"its answers are not valid JSON ({exc.msg} at column {exc.colno}): "
                             f"{short(value)}", 'write them as {"text": [...], "answer_start": [...]}') from exc
    if isinstance(value, dict) and "text" in value and "answer_start" in value:  # a blank single value: none
        texts, starts = (v if isinstance(v, list) else [v] if _text(v).strip() else []
                         for v in (value["text"], value["answer_start"]))
    elif isinstance(value, list) and all(isinstance(a, dict) and "text" in a and "answer_start" in a
                                         for a in value):
        texts, starts = [a["text"] for a in value], [a["answer_start"] for a in value]
    else:
        raise InputError(where, f"its answers have an unknown form: {short(value)}",
                         'write them as {"text": [...], "answer_start": [...]} or as '
                         '[{"text": ..., "answer_start": ...}]')
    if len(texts) != len(starts):
        raise InputError(where, f"has {plural(len(texts), 'answer text')} but "
                         f"{plural(len(starts), 'answer_start value')}",
                         "give one answer_start (the answer's character offset in the context) per answer text")
    return {"text": [_text(t) for t in texts], "answer_start": [_to_int(s, where) for s in starts]}


def _to_int(value, where: str) -> int:
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    if isinstance(value, float) and value.is_integer() or isinstance(value, str) and re.fullmatch(
            r"\s*[+-]?\d+\s*", value):
        return int(value)
    raise InputError(where, f"answer_start {value!r} is not a whole number",
                     "give the answer's character offset in the context (0 = first character)")


def read_table(path: str, require_answers: bool) -> Table:
    if (kind := file_kind(path)) in ("parquet", "csv"):
        columns = (_parse_parquet if kind == "parquet" else _parse_csv)(path)
        return table_from_columns(columns, path, require_answers, lambda i: f"row {i + 1}")
    text = read_text(path, WHAT)
    if kind == "json" and text.strip():  # an empty file: no questions, said as of an empty .jsonl
        try:
            document = json.loads(text)
        except json.JSONDecodeError as exc:
            if exc.msg != "Extra data" or not text.lstrip().startswith("{"):
                raise json_error(path, exc, hint="a file with one JSON object per line should be named .jsonl") from exc
        else:
            return table_from_document(document, path, require_answers)
    numbered = list(parse_json_lines(text, path))  # JSON Lines, also in a file named .json
    return table_from_records([record for _, record in numbered], path, require_answers,
                              locate=lambda i: f"line {numbered[i][0]}")


def file_kind(path: str) -> str:
    name = path.lower().removesuffix(".gz")  # the content says whether it is compressed
    for suffixes, kind in (((".json",), "json"), ((".jsonl", ".ndjson"), "jsonl"),
                           ((".csv",), "csv"), ((".parquet", ".pq"), "parquet")):
        if name.endswith(suffixes):
            return kind
    raise InputError(path, f"unknown file type {os.path.splitext(name)[1] or '(no suffix)'!r}",
                     "use .json (official SQuAD or flat records), .jsonl, .csv or .parquet, "
                     "optionally gzip-compressed (a .gz suffix may follow)")


def _parse_csv(path: str) -> dict:
    reader = csv.reader(io.StringIO(read_text(path, WHAT), newline=""), strict=True)
    try:
        header = next(reader, [])
        rows = []
        for row in filter(any, reader):
            if len(row) != len(header):
                raise InputError(f"{path}, line {reader.line_num}", f"has {len(row)} fields but the header has "
                                 f"{len(header)}", "quote fields that hold commas, quotes or newlines (\"...\")")
            rows.append(row)
    except csv.Error as exc:
        raise InputError(f"{path}, line {reader.line_num}", f"is not valid CSV ({exc})",
                         "quote fields that hold commas, quotes or newlines and double the quotes "
                         "inside them") from exc
    return {name: [row[j] for row in rows] for j, name in enumerate(header)}


def _parse_parquet(path: str) -> dict:
    import pyarrow as pa
    import pyarrow.parquet as pq
    data = read_bytes(path, WHAT)
    try:
        return pq.read_table(pa.BufferReader(data)).to_pydict()
    except (pa.ArrowException, OSError) as exc:
        raise InputError(path, f"is not a readable parquet file ({exc})",
                         "re-create it, e.g. with pandas.DataFrame.to_parquet") from exc


def validate(table: Table, version_2_with_negative: bool, check_answer_spans: bool = True) -> None:
    for column, fix in (("id", "give every question a unique id"), ("question", "write the question or delete it"),
                        ("context", "give the paragraph or delete the question")):
        values = getattr(table, column)
        if bad := [i for i, value in enumerate(values) if not value.strip()]:
            also = f" ({len(bad)} of {len(values)} questions)" if len(bad) > 1 else ""
            raise InputError(table.name(bad[0]), f"has an empty {column}{also}", fix)
    if len(counts := Counter(table.id)) < len(table.id):
        qid, times = counts.most_common(1)[0]
        repeated = plural(sum(1 for c in counts.values() if c > 1), "id")
        raise InputError(table.where, f"question id {qid!r} occurs {times} times ({repeated} repeated in all)",
                         "give every question a unique id (predictions and the metric are keyed by id)")
    unanswerable = [i for i, a in enumerate(table.answers) if not a["text"]]
    if table.has_answers and not version_2_with_negative and unanswerable:
        raise InputError(table.name(unanswerable[0]), f"has no answer: this is SQuAD v2.0 data ("
                         f"{len(unanswerable)} of {len(table.id)} questions are unanswerable)",
                         "pass --version_2_with_negative, or remove them (bert-squad-score reads v2.0 from "
                         "\"version\": \"v2.0\" or an \"is_impossible\" question)")
    _check_answers(table, check_answer_spans)


def _check_answers(table: Table, check_spans: bool) -> None:
    empty, wrong = [], []
    for i, (context, answers) in enumerate(zip(table.context, table.answers)):
        for text, start in zip(answers["text"], answers["answer_start"]):
            if not text:
                empty.append((i, start))
            elif check_spans and (start < 0 or context[start:start + len(text)] != text):
                wrong.append((i, text, start))
    if empty:
        i, start = empty[0]
        raise InputError(table.name(i), f"has an empty answer text (answer_start {start}; "
                         f"{plural(len(empty), 'empty answer')} in all)",
                         "write the answer as it appears in the context; an unanswerable question "
                         "(SQuAD v2.0) has no answers at all")
    if wrong:
        i, text, start = wrong[0]
        context = table.context[i]
        found = (short(context[start:start + len(text)]) if 0 <= start < len(context) else
                 f"nothing (the context has {len(context)} characters)")
        first = context.find(text)
        hint = f"the text occurs at offset {first}" if first >= 0 else "the text does not occur in the context at all"
        n_answers = sum(len(a["text"]) for a in table.answers)
        raise InputError(table.name(i), f"answer_start {start} does not point at the answer: expected "
                         f"{short(text)}, found {found} ({len(wrong)} of {plural(n_answers, 'answer')} wrong)",
                         f"correct answer_start or the answer text ({hint}; whitespace and case must match exactly)")
