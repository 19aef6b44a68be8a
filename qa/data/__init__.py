"""SQuAD-format question answering data from files, the Hugging Face Hub or a generator.

Every split comes back as a `datasets.Dataset` with exactly the columns of the Hub's
`rajpurkar/squad`:

    id (str), title (str), context (str), question (str),
    answers = {"text": list[str], "answer_start": list[int]}

An unanswerable question (SQuAD v2.0) has empty lists. Every split is checked before it is
returned (qa.data.validate); bad input raises `qa.errors.InputError`, whose one-line message
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

One job per module: `files` (formats, parsing), `normalise` (every source into one table),
`validate` (the checks), `sources` (splits from files, the Hub or `synthetic`; the dev set's
location). Reading bytes, gzip, UTF-8 and JSON is qa.io's, the project's one reader.
"""
from .sources import SquadFile, load_raw_datasets, read_squad, split_source

__all__ = ["SquadFile", "load_raw_datasets", "read_squad", "split_source"]
