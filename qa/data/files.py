"""Data files: which format a file is in, and its content parsed into raw rows.

The format comes from the name (`.json`, `.jsonl`/`.ndjson`, `.csv`, `.parquet`/`.pq`, each
optionally followed by `.gz`); bytes, gzip and UTF-8 are qa.io's. What the rows mean is
qa.data.normalise's business.
"""
import csv
import io
import json
import os
from dataclasses import dataclass
from typing import Dict, List

from qa.errors import InputError
from qa.io import json_error, parse_json_lines, read_bytes, read_text, require_file

# What require_file / read_bytes call a data file in their messages.
WHAT = "data file"
# Where a JSON Lines record keeps its line number (no column can be named so).
LINE_KEY = "\0line"


@dataclass(frozen=True)
class RawFile:
    """A data file parsed, before normalisation. `shape` says what `content` is:
    "document": a JSON document, as parsed;
    "records": JSON Lines, one dict per line, each with its line number under LINE_KEY;
    "columns": CSV or parquet, column name -> values (row i is row i + 1 of the file)."""
    path: str
    shape: str
    content: object


def read_raw_file(path: str) -> RawFile:
    """The file at `path` parsed according to its format; InputError when it cannot be."""
    kind = file_kind(path)
    if kind == "parquet":
        return RawFile(path, "columns", _parse_parquet(read_bytes(path, WHAT), path))
    text = read_text(path, WHAT)
    if kind == "json":
        return _parse_json_text(text, path)
    if kind == "jsonl":
        return RawFile(path, "records", _parse_json_lines(text, path))
    return RawFile(path, "columns", _parse_csv(text, path))


def check_data_file(path: str) -> None:
    """The data file exists and is a file (checked with the other settings, before anything runs)."""
    require_file(path, WHAT)


def file_kind(path: str) -> str:
    name = path.lower()
    name = name[:-3] if name.endswith(".gz") else name  # the content says whether it is compressed
    for suffixes, kind in (((".json",), "json"), ((".jsonl", ".ndjson"), "jsonl"),
                           ((".csv",), "csv"), ((".parquet", ".pq"), "parquet")):
        if name.endswith(suffixes):
            return kind
    raise InputError(path, f"unknown file type {os.path.splitext(name)[1] or '(no suffix)'!r}",
                     "use .json (official SQuAD or flat records), .jsonl, .csv or .parquet, "
                     "optionally gzip-compressed (a .gz suffix may follow)")


def _parse_json_text(text: str, path: str) -> RawFile:
    if not text.strip():
        raise InputError(path, "is empty", "give a file with SQuAD data")
    try:
        return RawFile(path, "document", json.loads(text))
    except json.JSONDecodeError as exc:
        if exc.msg == "Extra data" and text.lstrip().startswith("{"):
            # One JSON object per line in a file named .json: read it as JSON Lines.
            return RawFile(path, "records", _parse_json_lines(text, path))
        raise json_error(path, exc, hint="a file with one JSON object per line should be named .jsonl") from exc


def _parse_json_lines(text: str, path: str) -> List[dict]:
    records = []
    for lineno, record in parse_json_lines(text, path):
        if not isinstance(record, dict):
            raise InputError(f"{path}, line {lineno}", f"is a JSON {type(record).__name__}, "
                             "not an object", "write one JSON object (one question) per line")
        record[LINE_KEY] = lineno
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
