"""Load SQuAD-format question answering data from files, the Hugging Face Hub or a generator.

Every split comes back as a `datasets.Dataset` with exactly the columns of the Hub's
`rajpurkar/squad`:

    id (str), title (str), context (str), question (str),
    answers = {"text": list[str], "answer_start": list[int]}

An unanswerable question (SQuAD v2.0) has empty lists. Every split is checked before it is
returned (see `_validate`); bad input raises `qa.errors.InputError`, whose one-line message
names the file and the question and says how to fix it.

Accepted files (each may also be gzip-compressed: recognised by its content, with or without a
`.gz` suffix):

* `.json`: the official SQuAD JSON exactly as published (v1.1 or v2.0):
  `{"version": ..., "data": [{"title", "paragraphs": [{"context", "qas": [{"id", "question",
  "answers": [{"text", "answer_start"}], "is_impossible"?}]}]}]}`;
  or flat records, as a JSON list `[{...}, ...]` or as `{"data": [{...}, ...]}`.
  A `.json` file that holds one object per line is read as JSON Lines.
* `.jsonl` / `.ndjson`: JSON Lines, one flat record per line.
* `.csv`: flat records with a header row.
* `.parquet` / `.pq`: flat records (for example `Dataset.to_parquet` of the Hub dataset).

A flat record has the columns `id`, `title` (optional, default ""), `context`, `question` and
its answers in one of these forms:

* `answers` as a dict `{"text": [...], "answer_start": [...]}` (the Hub's form);
* `answers` as a list of `{"text", "answer_start"}` dicts (the official form);
* `answers` as a JSON string of either form (for CSV, where a cell is text);
* two columns `answer_text` and `answer_start`, each a single value (one answer per row) or a
  list; both empty means "no answer".

Other columns are ignored. A file to predict on (split "test") may carry no answers at all: no
`answers` field in any question, no answers column, or, for SQuAD v1.1 (which has no unanswerable
questions), empty answer lists everywhere. Its dataset then has no `answers` column, so nothing
downstream mistakes "no labels" for "no answer".

Checks, each an InputError: the file exists, is readable, decompresses and decodes as UTF-8;
JSON parses (the message gives line and column); the layout and columns are known (the message
lists the columns found and expected); no empty id, question or context; no repeated id; no
unanswerable question unless `version_2_with_negative`; no empty answer text; and every
`context[answer_start:answer_start + len(text)] == text` exactly, for every answer.
"""
import contextlib
import csv
import gc
import gzip
import io
import json
import numbers
import os
import re
import zlib
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Dict, List, Optional, Sequence

from .errors import InputError

COLUMNS = ("id", "title", "context", "question", "answers")
SPLITS = ("train", "validation", "test")
EXPECTED_COLUMNS = ("id, title (optional), context, question, and answers "
                    "(or answer_text + answer_start)")
SETUP_SCRIPT = "setup_bert.sh"
# The official SQuAD v1.1 dev set, which the tests and benchmarks read: $SQUAD_DEV (the file as
# published, plain or gzip-compressed), else this file in a shared/ folder beside the repository.
SQUAD_DEV_VARIABLE = "SQUAD_DEV"
SQUAD_DEV_DEFAULT = Path(__file__).resolve().parents[2] / "shared" / "data" / "squad" / "dev-v1.1.json.gz"
SQUAD_DEV_URL = "https://rajpurkar.github.io/SQuAD-explorer/dataset/dev-v1.1.json"
GZIP_MAGIC = b"\x1f\x8b"
# Seed offsets of the synthetic evaluation splits, so they never repeat the training questions.
SYNTHETIC_SEED_OFFSET = {"train": 0, "validation": 1_000_003, "test": 2_000_006}


def squad_features():
    """The features of the Hub's `rajpurkar/squad` (answer_start is int32 there)."""
    from datasets import Features, List as ListOf, Value
    return Features({
        "id": Value("string"), "title": Value("string"), "context": Value("string"),
        "question": Value("string"),
        "answers": {"text": ListOf(Value("string")), "answer_start": ListOf(Value("int32"))},
    })


# ----------------------------------------------------------------------------------------------
# Public API


def load_raw_datasets(data_args, splits: Sequence[str] = SPLITS, cache_dir: Optional[str] = None):
    """Return a `datasets.DatasetDict` with the requested splits, validated.

    Each split comes from `data_args.<split>_file` when that is set, otherwise from
    `data_args.dataset_name`: "synthetic" for generated data, else a Hub dataset id (its
    "validation" split serves "validation"). `train_articles` / `validation_articles` then keep a
    slice "START:STOP" of the split's articles (grouped by title, in order of first appearance).
    Synthetic data: train has `synthetic_train_examples` questions from `synthetic_seed`;
    validation and test have `synthetic_eval_examples` each, from seeds derived from it
    (`SYNTHETIC_SEED_OFFSET`), so they never repeat the training questions.
    """
    from datasets import DatasetDict

    hub = None
    out = {}
    for split in splits:
        if split not in SPLITS:
            raise ValueError(f"unknown split {split!r}; expected one of {SPLITS}")
        path = getattr(data_args, f"{split}_file", None)
        if path:
            dataset = read_squad_file(path, data_args.version_2_with_negative,
                                      require_answers=split != "test")
        elif data_args.dataset_name == "synthetic":
            dataset = _load_synthetic(data_args, split)
        elif data_args.dataset_name:
            if hub is None:
                hub = _load_hub(data_args.dataset_name, data_args.dataset_config_name, cache_dir)
            dataset = _hub_split(hub, data_args, split)
        else:
            raise InputError(f"split {split!r}", "no data source is given",
                             f"pass --{split}_file FILE or --dataset_name (e.g. rajpurkar/squad)")
        articles = getattr(data_args, f"{split}_articles", None)
        if articles:
            source = path or f"dataset {data_args.dataset_name!r}"
            dataset = select_articles(dataset, articles, f"--{split}_articles", source)
        out[split] = dataset
    return DatasetDict(out)


def squad_dev_path() -> Path:
    """Where the official SQuAD v1.1 dev set is looked for: $SQUAD_DEV, else SQUAD_DEV_DEFAULT."""
    given = os.environ.get(SQUAD_DEV_VARIABLE)
    return Path(given).expanduser() if given else SQUAD_DEV_DEFAULT


def require_squad_dev(path, option: str = "--dev", synthetic: bool = False) -> Path:
    """`path` when it is a file, else the InputError that says how to get the dev set: nothing
    stands in for it unless asked for (`synthetic`: the caller takes --dataset_name synthetic)."""
    if path is not None and Path(path).is_file():
        return Path(path)
    instead = "; or --dataset_name synthetic to time generated data instead" if synthetic else ""
    raise InputError(f"{option} {path}", "the official SQuAD v1.1 dev set is not there",
                     f"download it once (curl -LO {SQUAD_DEV_URL}, on a machine with internet) and set "
                     f"{SQUAD_DEV_VARIABLE}=/path/to/dev-v1.1.json, or pass its path ({option} PATH){instead}")


def split_source(config: dict, split: str) -> str:
    """Where load_raw_datasets takes `split` from, in words, from a run's resolved configuration
    (the arguments as a dict): the file given for the split, else the synthetic data or the Hub
    dataset, with the article slice when one was kept."""
    path = config.get(f"{split}_file")
    name = config.get("dataset_name")
    if path:
        source = str(path)
    elif name == "synthetic":
        count = config.get("synthetic_train_examples" if split == "train" else "synthetic_eval_examples")
        source = f"synthetic ({count:,} generated questions)" if count else "synthetic"
    elif name:
        config_name = config.get("dataset_config_name")
        source = f"{name}{f' ({config_name})' if config_name else ''}, split {split}"
    else:
        source = "none given"
    articles = config.get(f"{split}_articles")
    return f"{source}, articles {articles}" if articles else source


@dataclass(frozen=True)
class SquadFile:
    """A data file as read: its questions and what the file says about itself."""
    dataset: "object"            # datasets.Dataset; no `answers` column when `labelled` is False
    version: Optional[str]       # the official JSON's "version" field, if any
    version_2: bool              # SQuAD v2.0: declared "v2.0", or some question is_impossible
    labelled: bool


def read_squad_file(path, version_2_with_negative: bool = False, require_answers: bool = True):
    """Read and validate one file in any accepted format; return a `datasets.Dataset`."""
    return load_squad_file(path, version_2_with_negative, require_answers).dataset


def load_squad_file(path, version_2_with_negative: Optional[bool] = None, require_answers: bool = True,
                    check_answer_spans: bool = True) -> SquadFile:
    """Read and validate one file in any accepted format.

    `version_2_with_negative` None: as the file declares itself (what the official scorers do).
    `require_answers` False: the file may be unlabelled (see the module docstring).
    `check_answer_spans` False skips only the check that each answer sits at its answer_start:
    scoring compares answer texts, so a position that is off matters to training, not to the metric.
    """
    path = os.fspath(path)
    with _gc_paused():
        table = _read_table(path, require_answers)
        version_2 = table.declares_v2 if version_2_with_negative is None else version_2_with_negative
        if not require_answers and not version_2 and not any(a["text"] for a in table.answers):
            table.has_answers = False  # v1.1 knows no unanswerable question: empty lists mean no labels
        _validate(table, version_2, check_answer_spans)
        return SquadFile(table.to_dataset(), table.version, version_2, table.has_answers)


def read_json(path):
    """A JSON file (plain or gzip, recognised by its content) parsed, or an InputError naming it."""
    path = os.fspath(path)
    text = _read_file(path, decode=True)
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise _json_error(path, exc) from exc


def load_squad_json(path) -> dict:
    """The official SQuAD JSON at `path` as parsed, after the layout checks every reader applies."""
    obj = read_json(path)
    _table_from_parsed(obj, os.fspath(path), require_answers=True)
    return obj


def is_squad_v2(squad_json: dict) -> bool:
    """Whether parsed official SQuAD JSON is v2.0: version "v2.0", or some question is_impossible."""
    return squad_json.get("version") == "v2.0" or any(
        qa.get("is_impossible") is True for article in squad_json["data"]
        for paragraph in article["paragraphs"] for qa in paragraph["qas"])


def select_articles(dataset, spec: str, option: str = "--train_articles", source: str = "the data"):
    """Keep the articles `spec` ("START:STOP") selects, grouped by title in order of appearance."""
    chosen_slice = parse_slice(spec, option)
    titles = dataset["title"][:]
    order = list(dict.fromkeys(titles))
    chosen = set(order[chosen_slice])
    if not chosen:
        raise InputError(f"{option} {spec!r}", f"selects none of the {len(order)} articles of "
                         f"{source}",
                         f"give a slice within 0:{len(order)}, e.g. '0:{max(1, len(order) // 2)}'")
    return dataset.select([i for i, title in enumerate(titles) if title in chosen])


def parse_slice(spec: str, option: str = "--train_articles") -> slice:
    """Parse "START:STOP" (either side may be empty, negative counts from the end)."""
    match = re.fullmatch(r"\s*([+-]?\d+)?\s*:\s*([+-]?\d+)?\s*", str(spec))
    if not match:
        raise InputError(f"{option} {spec!r}", "is not a slice START:STOP",
                         "give e.g. '0:40' (the first 40 articles), '40:' (all from the 41st) "
                         "or ':-8' (all but the last 8)")
    start, stop = (int(x) if x is not None else None for x in match.groups())
    return slice(start, stop)


@contextlib.contextmanager
def _gc_paused():
    """Building ~10^5 small objects triggers Python's cycle collector over and over; the parsed
    data has no cycles, so pausing it about halves the time to load a file."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


# ----------------------------------------------------------------------------------------------
# The common form every source is turned into before it is checked


@dataclass
class _Table:
    where: str                   # the file, or the Hub dataset and split
    id: List[str] = field(default_factory=list)
    title: List[str] = field(default_factory=list)
    context: List[str] = field(default_factory=list)
    question: List[str] = field(default_factory=list)
    answers: List[dict] = field(default_factory=list)
    has_answers: bool = True     # False: a test file without any answers
    version: Optional[str] = None  # the official JSON's "version" field
    declares_v2: bool = False    # version "v2.0" or a question marked is_impossible
    locate: Callable[[int], str] = lambda i: f"record {i + 1}"

    def name(self, i: int) -> str:
        """`FILE, question 'ID' (record N)`: where row i is, for error messages."""
        qid = self.id[i]
        return f"{self.where}, question {qid!r} ({self.locate(i)})" if qid else \
            f"{self.where}, {self.locate(i)}"

    def to_dataset(self):
        import pyarrow as pa
        from datasets import Dataset, DatasetInfo
        features = squad_features()
        if not self.has_answers:  # unlabelled: no answers column rather than one of empty lists
            del features["answers"]
        arrow = pa.Table.from_pydict({c: getattr(self, c) for c in features},
                                     schema=features.arrow_schema)
        return Dataset(arrow, info=DatasetInfo(features=features))


# ----------------------------------------------------------------------------------------------
# Reading files


def _read_table(path: str, require_answers: bool) -> _Table:
    kind = _file_kind(path)
    text_or_bytes = _read_file(path, decode=kind != "parquet")
    if kind == "json":
        return _table_from_json_text(text_or_bytes, path, require_answers)
    if kind == "jsonl":
        return _table_from_records(_parse_json_lines(text_or_bytes, path), path, require_answers,
                                   lines=True)
    if kind == "csv":
        return _table_from_columns(_parse_csv(text_or_bytes, path), path, require_answers,
                                   locate=lambda i: f"row {i + 1}")
    return _table_from_columns(_parse_parquet(text_or_bytes, path), path, require_answers,
                               locate=lambda i: f"row {i + 1}")


def _file_kind(path: str) -> str:
    name = path.lower()
    name = name[:-3] if name.endswith(".gz") else name  # the content says whether it is compressed
    for suffixes, kind in (((".json",), "json"), ((".jsonl", ".ndjson"), "jsonl"),
                           ((".csv",), "csv"), ((".parquet", ".pq"), "parquet")):
        if name.endswith(suffixes):
            return kind
    raise InputError(path, f"unknown file type {os.path.splitext(name)[1] or '(no suffix)'!r}",
                     "use .json (official SQuAD or flat records), .jsonl, .csv or .parquet, "
                     "optionally gzip-compressed (a .gz suffix may follow)")


def check_data_file(path: str) -> None:
    """The data file exists and is a file (checked with the other settings, before anything runs)."""
    if not os.path.exists(path):
        raise InputError(path, "file not found",
                         f"check the path (a relative path is taken from {os.getcwd()})")
    if os.path.isdir(path):
        raise InputError(path, "is a directory, not a file", "give the path of the data file")


def _read_file(path: str, decode: bool):
    check_data_file(path)
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError as exc:
        raise InputError(path, f"cannot be read ({exc.strerror or exc})",
                         "check the file's permissions") from exc
    if path.lower().endswith(".gz") and data[:2] != GZIP_MAGIC:
        raise InputError(path, "is named .gz but is not gzip-compressed",
                         "drop the .gz suffix, or compress the file with gzip")
    if data[:2] == GZIP_MAGIC:  # by content: a gzipped file keeps working whatever its name
        try:
            data = gzip.decompress(data)
        except (OSError, EOFError, zlib.error) as exc:
            raise InputError(path, f"is not a valid gzip file ({exc})",
                             "re-create it with gzip (it starts like one but is damaged or "
                             "truncated)") from exc
    if not decode:
        return data
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise InputError(path, f"is not UTF-8 text (bad byte at offset {exc.start})",
                         "save the file as UTF-8") from exc


def _json_error(path: str, exc: json.JSONDecodeError, lineno: Optional[int] = None) -> InputError:
    line = lineno if lineno is not None else exc.lineno
    return InputError(f"{path}, line {line} column {exc.colno}", f"malformed JSON: {exc.msg}",
                      "correct the JSON syntax at that point (a file with one JSON object per line "
                      "should be named .jsonl)")


def _table_from_json_text(text: str, path: str, require_answers: bool) -> _Table:
    if not text.strip():
        raise InputError(path, "is empty", "give a file with SQuAD data")
    try:
        obj = json.loads(text)
    except json.JSONDecodeError as exc:
        if exc.msg == "Extra data" and text.lstrip().startswith("{"):
            # One JSON object per line in a file named .json: read it as JSON Lines.
            return _table_from_records(_parse_json_lines(text, path), path, require_answers,
                                       lines=True)
        raise _json_error(path, exc) from exc
    return _table_from_parsed(obj, path, require_answers)


def _table_from_parsed(obj, path: str, require_answers: bool) -> _Table:
    if isinstance(obj, dict) and isinstance(obj.get("data"), list):
        items = obj["data"]
    elif isinstance(obj, list):
        items = obj
    else:
        found = ", ".join(sorted(obj)) if isinstance(obj, dict) else type(obj).__name__
        raise InputError(path, f"unknown layout (top level: {found})",
                         'give the official SQuAD JSON {"version", "data": [{"title", '
                         '"paragraphs": [...]}]}, a list of records or {"data": [records]} with '
                         f"columns {EXPECTED_COLUMNS}")
    if items and isinstance(items[0], dict) and "paragraphs" in items[0]:
        table = _table_from_nested(items, path, require_answers)
        table.version = _text(obj.get("version")) or None if isinstance(obj, dict) else None
        table.declares_v2 |= table.version == "v2.0"
        return table
    return _table_from_records(items, path, require_answers)


def _parse_json_lines(text: str, path: str) -> List[dict]:
    records = []
    for lineno, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as exc:
            raise _json_error(path, exc, lineno) from exc
        if not isinstance(record, dict):
            raise InputError(f"{path}, line {lineno}", f"is a JSON {type(record).__name__}, "
                             "not an object", "write one JSON object (one question) per line")
        record["\0line"] = lineno
        records.append(record)
    return records


def _parse_csv(text: str, path: str) -> Dict[str, list]:
    reader = csv.reader(io.StringIO(text, newline=""), strict=True)
    try:
        header = next(reader, [])
        rows = []
        for row in reader:
            if len(row) != len(header) and any(row):
                raise InputError(f"{path}, line {reader.line_num}", f"has {len(row)} fields but "
                                 f"the header has {len(header)}",
                                 "quote fields that hold commas, quotes or newlines (\"...\")")
            if any(row):
                rows.append(row)
    except csv.Error as exc:
        raise InputError(f"{path}, line {reader.line_num}", f"is not valid CSV ({exc})",
                         "quote fields that hold commas, quotes or newlines and double the quotes "
                         "inside them") from exc
    return {name: [row[j] for row in rows] for j, name in enumerate(header)}


def _parse_parquet(data: bytes, path: str) -> Dict[str, list]:
    import pyarrow as pa
    import pyarrow.parquet as pq
    try:
        return pq.read_table(pa.BufferReader(data)).to_pydict()
    except (pa.ArrowException, OSError) as exc:
        raise InputError(path, f"is not a readable parquet file ({exc})",
                         "re-create it, e.g. with pandas.DataFrame.to_parquet") from exc


# ----------------------------------------------------------------------------------------------
# Turning the parsed file into a _Table


def _table_from_nested(articles: list, path: str, require_answers: bool) -> _Table:
    """The official SQuAD layout: articles > paragraphs > qas > answers."""
    table = _Table(where=path, has_answers=False)
    places = []
    for a, article in enumerate(articles):
        title = _text(article.get("title")) if isinstance(article, dict) else ""
        place = f"article {a + 1} {title!r}"
        for paragraph in _field(article, "paragraphs", list, f"{path}, {place}"):
            context = _text(_field(paragraph, "context", None, f"{path}, {place}"))
            for qa in _field(paragraph, "qas", list, f"{path}, {place}"):
                if not isinstance(qa, dict):
                    raise InputError(f"{path}, {place}", "has a question that is not an object",
                                     "write each question as {\"id\", \"question\", \"answers\"}")
                qid = _text(_field(qa, "id", None, f"{path}, {place}"))
                where = f"{path}, question {qid!r}"
                table.id.append(qid)
                table.title.append(title)
                table.context.append(context)
                table.question.append(_text(_field(qa, "question", None, where)))
                table.answers.append(_nested_answers(qa, where, require_answers))
                table.has_answers |= "answers" in qa
                table.declares_v2 |= qa.get("is_impossible") is True
                places.append(place)
    table.locate = places.__getitem__
    return _non_empty(table)


def _nested_answers(qa: dict, where: str, require_answers: bool) -> dict:
    if "answers" not in qa and not require_answers:
        return {"text": [], "answer_start": []}
    answers = _answers_from_value(_field(qa, "answers", list, where), where)
    if qa.get("is_impossible") and answers["text"]:
        count = _plural(len(answers["text"]), "answer")
        raise InputError(where, f"is marked is_impossible but has {count}",
                         "remove its answers or set is_impossible to false")
    return answers


def _field(obj, key: str, kind, where: str):
    if not isinstance(obj, dict):
        raise InputError(where, f"expected a JSON object, found a {type(obj).__name__}",
                         "follow the official SQuAD layout")
    if key not in obj:
        raise InputError(where, f"has no {key!r} field (fields found: {', '.join(sorted(obj))})",
                         "follow the official SQuAD layout: article {title, paragraphs}, paragraph "
                         "{context, qas}, question {id, question, answers}")
    value = obj[key]
    if kind is not None and not isinstance(value, kind):
        raise InputError(where, f"field {key!r} is a {type(value).__name__}, not a "
                         f"{kind.__name__}", "follow the official SQuAD layout")
    return value


def _table_from_records(records: list, path: str, require_answers: bool, lines=False) -> _Table:
    """Flat records (a JSON list or JSON Lines) into columns, then into a _Table."""
    for i, record in enumerate(records):
        if not isinstance(record, dict):
            raise InputError(f"{path}, record {i + 1}", f"is a {type(record).__name__}, not an "
                             "object", f"write each record as an object with columns "
                             f"{EXPECTED_COLUMNS}")
    keys = list(dict.fromkeys(k for record in records for k in record))
    columns = {k: [record.get(k) for record in records] for k in keys}
    if lines:
        line_numbers = columns.pop("\0line", [])
        locate = lambda i: f"line {line_numbers[i]}"  # noqa: E731
    else:
        locate = lambda i: f"record {i + 1}"  # noqa: E731
    return _table_from_columns(columns, path, require_answers, locate)


def _table_from_columns(columns: Dict[str, list], path: str, require_answers: bool,
                        locate: Callable[[int], str]) -> _Table:
    """Flat columns (from any format) into a _Table; the answers may take any accepted form."""
    if not columns or not len(next(iter(columns.values()))):
        raise InputError(path, "contains no questions", "give a file with SQuAD data")
    has_dict = "answers" in columns
    has_pair = "answer_text" in columns and "answer_start" in columns
    missing = [c for c in ("id", "context", "question") if c not in columns]
    if require_answers and not (has_dict or has_pair):
        missing.append("answers")
    if missing:
        raise InputError(path, f"missing column(s) {', '.join(missing)} (found: "
                         f"{', '.join(columns) or 'none'})",
                         f"give the columns {EXPECTED_COLUMNS}")
    n = len(columns["id"])
    table = _Table(where=path, locate=locate, has_answers=has_dict or has_pair)
    table.id = [_text(v) for v in columns["id"]]
    table.title = [_text(v) for v in columns.get("title", [""] * n)]
    table.context = [_text(v) for v in columns["context"]]
    table.question = [_text(v) for v in columns["question"]]
    if has_dict:
        table.answers = [_answers_from_value(v, table.name(i)) for i, v in
                         enumerate(columns["answers"])]
    elif has_pair:
        table.answers = [_answers_from_pair(t, s, table.name(i)) for i, (t, s) in
                         enumerate(zip(columns["answer_text"], columns["answer_start"]))]
    else:
        table.answers = [{"text": [], "answer_start": []} for _ in range(n)]
    return _non_empty(table)


def _non_empty(table: _Table) -> _Table:
    if not table.id:
        raise InputError(table.where, "contains no questions", "give a file with SQuAD data")
    return table


def _text(value) -> str:
    if type(value) is str:
        return value
    if value is None or (isinstance(value, float) and value != value):  # None or NaN
        return ""
    return str(value)


def _answers_from_value(value, where: str) -> dict:
    """`answers` as a dict of lists, a list of dicts, a JSON string of either, or empty."""
    if value is None or (isinstance(value, str) and not value.strip()):
        return {"text": [], "answer_start": []}
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except json.JSONDecodeError as exc:
            raise InputError(where, f"its answers are not valid JSON ({exc.msg} at column "
                             f"{exc.colno}): {_short(value)}",
                             'write them as {"text": [...], "answer_start": [...]}') from exc
    if isinstance(value, dict) and "text" in value and "answer_start" in value:
        texts, starts = _as_list(value["text"]), _as_list(value["answer_start"])
    elif isinstance(value, list) and all(isinstance(a, dict) and "text" in a and "answer_start" in a
                                         for a in value):
        texts = [a["text"] for a in value]
        starts = [a["answer_start"] for a in value]
    else:
        raise InputError(where, f"its answers have an unknown form: {_short(value)}",
                         'write them as {"text": [...], "answer_start": [...]} or as '
                         '[{"text": ..., "answer_start": ...}]')
    if len(texts) != len(starts):
        raise InputError(where, f"has {_plural(len(texts), 'answer text')} but "
                         f"{_plural(len(starts), 'answer_start value')}",
                         "give one answer_start per answer text")
    return {"text": [_text(t) for t in texts], "answer_start": [_to_int(s, where) for s in starts]}


def _answers_from_pair(text, start, where: str) -> dict:
    """Separate `answer_text` / `answer_start` columns: one value each, or lists."""
    if _is_blank(text) and _is_blank(start):
        return {"text": [], "answer_start": []}
    if _is_blank(start):
        raise InputError(where, f"has answer_text {_short(text)} but no answer_start",
                         "give the answer's character offset in the context as answer_start")
    return _answers_from_value({"text": text, "answer_start": start}, where)


def _is_blank(value) -> bool:
    if isinstance(value, (list, tuple)):
        return len(value) == 0
    return _text(value).strip() == ""


def _as_list(value) -> list:
    if isinstance(value, (list, tuple)):
        return list(value)
    if hasattr(value, "tolist"):  # numpy array
        return list(value.tolist())
    return [value]


def _to_int(value, where: str) -> int:
    if type(value) is int:
        return value
    if isinstance(value, numbers.Integral) and not isinstance(value, bool):
        return int(value)
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, str) and re.fullmatch(r"\s*[+-]?\d+\s*", value):
        return int(value)
    raise InputError(where, f"answer_start {value!r} is not a whole number",
                     "give the answer's character offset in the context (0 = first character)")


def _plural(n: int, noun: str) -> str:
    return f"{n:,} {noun}" + ("" if n == 1 else "s")


def _short(value, limit: int = 60) -> str:
    text = repr(value)
    if len(text) <= limit:
        return text
    return text[:limit - 4] + "..." + text[-1]  # keep the closing quote or bracket


# ----------------------------------------------------------------------------------------------
# Validation


def _validate(table: _Table, version_2_with_negative: bool, check_answer_spans: bool = True) -> None:
    """Check a table; raise InputError for the first problem found (and say how many like it)."""
    _check_not_empty(table, table.id, "id", "give every question a unique id")
    _check_not_empty(table, table.question, "question", "write the question or delete it")
    _check_not_empty(table, table.context, "context", "give the paragraph or delete the question")
    _check_unique_ids(table)
    if table.has_answers and not version_2_with_negative:
        _check_answerable(table)
    _check_answers(table, check_answer_spans)


def _check_not_empty(table: _Table, values: List[str], column: str, fix: str) -> None:
    bad = [i for i, value in enumerate(values) if not value.strip()]
    if bad:
        also = f" ({len(bad)} of {len(values)} questions)" if len(bad) > 1 else ""
        raise InputError(table.name(bad[0]), f"has an empty {column}{also}", fix)


def _check_unique_ids(table: _Table) -> None:
    counts = Counter(table.id)
    if len(counts) < len(table.id):
        qid, times = counts.most_common(1)[0]
        dups = sum(1 for c in counts.values() if c > 1)
        raise InputError(table.where, f"question id {qid!r} occurs {times} times ("
                         f"{_plural(dups, 'id')} repeated in all)",
                         "give every question a unique id (predictions and the "
                         "metric are keyed by id)")


def _check_answerable(table: _Table) -> None:
    bad = [i for i, a in enumerate(table.answers) if not a["text"]]
    if bad:
        raise InputError(table.name(bad[0]), f"has no answer: this is SQuAD v2.0 data ({len(bad)}"
                         f" of {len(table.id)} questions are unanswerable)",
                         "pass --version_2_with_negative to train and evaluate with unanswerable "
                         "questions, or remove them (the scorer takes a file as SQuAD v2.0 when its "
                         "version is \"v2.0\" or a question is marked \"is_impossible\": true)")


def _check_answers(table: _Table, check_spans: bool = True) -> None:
    """Every answer text must be non-empty and (`check_spans`) sit exactly at its answer_start in
    the context."""
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
                         f"{_plural(len(empty), 'empty answer')} in all)",
                         "write the answer as it appears in the context; an unanswerable question "
                         "(SQuAD v2.0) has no answers at all")
    if wrong:
        i, text, start = wrong[0]
        context = table.context[i]
        found = (_short(context[start:start + len(text)]) if 0 <= start < len(context) else
                 f"nothing (the context has {len(context)} characters)")
        first = context.find(text)
        hint = (f"the text occurs at offset {first}" if first >= 0
                else "the text does not occur in the context at all")
        n_answers = sum(len(a["text"]) for a in table.answers)
        raise InputError(table.name(i), f"answer_start {start} does not point at the answer: "
                         f"expected {_short(text)}, found {found} ({len(wrong)} of "
                         f"{_plural(n_answers, 'answer')} wrong)",
                         f"correct answer_start or the answer text ({hint}; whitespace and case "
                         "must match exactly)")


# ----------------------------------------------------------------------------------------------
# Generated and Hub data


def _load_synthetic(data_args, split: str):
    from qa.synthetic import make_synthetic_squad  # imported here: optional at import time
    n = (data_args.synthetic_train_examples if split == "train"
         else data_args.synthetic_eval_examples)
    seed = data_args.synthetic_seed + SYNTHETIC_SEED_OFFSET[split]
    squad = make_synthetic_squad(n, seed, data_args.version_2_with_negative)
    table = _table_from_nested(squad["data"], f"synthetic {split} data (seed {seed})", True)
    _validate(table, data_args.version_2_with_negative)
    return table.to_dataset()


def _load_hub(name: str, config: Optional[str], cache_dir: Optional[str]):
    import datasets
    from datasets.exceptions import DatasetNotFoundError
    try:
        return datasets.load_dataset(name, config, cache_dir=cache_dir)
    except Exception as exc:
        offline = datasets.config.HF_HUB_OFFLINE
        if offline or _is_network_error(exc):
            raise _not_cached_error(name, config, cache_dir, offline) from exc
        if isinstance(exc, DatasetNotFoundError):
            raise InputError(f"Hub dataset {name!r}", "does not exist on the Hub or needs a login",
                             "check --dataset_name (e.g. rajpurkar/squad or rajpurkar/squad_v2), "
                             "or run `hf auth login` for a gated dataset") from exc
        raise


def _not_cached_error(name: str, config: Optional[str], cache_dir: Optional[str],
                      offline: bool) -> InputError:
    """Compute nodes have no internet: the dataset must be fetched on a login node first."""
    import datasets
    cache = cache_dir or datasets.config.HF_DATASETS_CACHE
    why = ("offline mode is on (HF_DATASETS_OFFLINE / HF_HUB_OFFLINE)" if offline
           else "the Hub cannot be reached")
    env = f"DATASET={name}" + (f" DATASET_CONFIG={config}" if config else "")
    not_cache_dir = (f" and without --cache_dir (it fills HF_HOME, not {cache_dir})"
                     if cache_dir else "")
    return InputError(f"Hub dataset {name!r}", f"cannot be loaded: {why} and it is not in the "
                      f"cache {cache}",
                      f"on a login node with internet run `{env} ./{SETUP_SCRIPT}` to pre-fetch it "
                      "into $HF_CACHE_DIR, then run this job with HF_HOME set to that directory "
                      f"(source the env file {SETUP_SCRIPT} writes){not_cache_dir}; or pass "
                      "--train_file / --validation_file")


def _is_network_error(exc: BaseException) -> bool:
    if isinstance(exc, (ConnectionError, TimeoutError)):
        return True
    names = " ".join(cls.__name__ for cls in type(exc).__mro__)
    return any(word in names for word in ("Connect", "Timeout", "Offline"))


def _hub_split(hub, data_args, split: str):
    name = data_args.dataset_name
    where = f"Hub dataset {name!r}, split {split!r}"
    if split not in hub:
        raise InputError(f"Hub dataset {name!r}", f"has no {split!r} split (it has: "
                         f"{', '.join(hub)})", f"pass --{split}_file FILE")
    dataset = hub[split]
    columns = {c: dataset[c][:] for c in COLUMNS if c in dataset.column_names}
    table = _table_from_columns(columns, where, True, locate=lambda i: f"row {i}")
    _validate(table, data_args.version_2_with_negative)
    if list(dataset.column_names) == list(COLUMNS) and dataset.features == squad_features():
        return dataset
    return table.to_dataset()
