"""SQuAD-format question answering data from files, the Hugging Face Hub or a generator, every
split as a `datasets.Dataset` with the columns of the Hub's `rajpurkar/squad`, checked before it
is returned (bad input: a one-line qa.errors.InputError naming the file and the question).

One job per module: `files` (formats, parsing), `normalise` (every source into one table),
`validate` (the checks), `sources` (splits from files, the Hub or `synthetic`; the dev set's
location). Bytes, gzip, UTF-8 and JSON are read by qa.io, the project's one reader. The accepted
formats and checks: docs/data.md.
"""
from qa.data.sources import SquadFile, load_raw_datasets, read_squad, split_source

__all__ = ["SquadFile", "load_raw_datasets", "read_squad", "split_source"]
