"""Data files: the format from the name (`.json`, `.jsonl`/`.ndjson`, `.csv`, `.parquet`/`.pq`, each
optionally followed by `.gz`), the content parsed into a Table (qa.data.table)."""
import csv
import io
import json
import os

from qa.errors import InputError
from qa.data.table import Table, table_from_columns, table_from_document, table_from_records
from qa.io import json_error, parse_json_lines, read_bytes, read_text, require_file

WHAT = "data file"  # what qa.io's messages call it


def read_table(path: str, require_answers: bool) -> Table:
    """The data file at `path` as a Table; InputError when it cannot be parsed."""
    kind = file_kind(path)
    if kind == "parquet":
        return table_from_columns(_parse_parquet(read_bytes(path, WHAT), path), path, require_answers, _row)
    text = read_text(path, WHAT)
    if kind == "csv":
        return table_from_columns(_parse_csv(text, path), path, require_answers, _row)
    if kind == "json":
        if not text.strip():
            raise InputError(path, "is empty", "give a file with SQuAD data")
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


def check_data_file(path: str) -> None:
    """Checked with the other settings, before anything runs."""
    require_file(path, WHAT)


def file_kind(path: str) -> str:
    name = path.lower().removesuffix(".gz")  # the content says whether it is compressed
    for suffixes, kind in (((".json",), "json"), ((".jsonl", ".ndjson"), "jsonl"),
                           ((".csv",), "csv"), ((".parquet", ".pq"), "parquet")):
        if name.endswith(suffixes):
            return kind
    raise InputError(path, f"unknown file type {os.path.splitext(name)[1] or '(no suffix)'!r}",
                     "use .json (official SQuAD or flat records), .jsonl, .csv or .parquet, "
                     "optionally gzip-compressed (a .gz suffix may follow)")


def _row(i: int) -> str:
    return f"row {i + 1}"


def _parse_csv(text: str, path: str) -> dict:
    reader = csv.reader(io.StringIO(text, newline=""), strict=True)
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


def _parse_parquet(data: bytes, path: str) -> dict:
    import pyarrow as pa
    import pyarrow.parquet as pq
    try:
        return pq.read_table(pa.BufferReader(data)).to_pydict()
    except (pa.ArrowException, OSError) as exc:
        raise InputError(path, f"is not a readable parquet file ({exc})",
                         "re-create it, e.g. with pandas.DataFrame.to_parquet") from exc
