"""qa.io's reading side: the one reader of JSON files, and the same one-line errors wherever it is used."""
import gzip
import json

import pytest

from qa.errors import InputError
from qa.io import parse_json_lines, read_json, read_text


def test_gzip_by_content_and_a_byte_order_mark(tmp_path):
    value = {"caf\u00e9": [1, 2.5, None]}
    (tmp_path / "plain.json").write_bytes(b"\xef\xbb\xbf" + json.dumps(value).encode())
    (tmp_path / "packed.json").write_bytes(gzip.compress(json.dumps(value).encode()))
    assert read_json(tmp_path / "plain.json") == read_json(tmp_path / "packed.json") == value


@pytest.mark.parametrize("name, text, words", [
    ("torn.json", '{"a": 1,\n "b": }', ["torn.json, line 2 column 7: malformed JSON: Expecting value", "Fix:"]),
    ("latin1.json", '"caf\xe9"', ["latin1.json: is not UTF-8 text", "save the file as UTF-8"]),
    ("plain.json.gz", "{}", ["plain.json.gz: is named .gz but is not gzip-compressed"]),
])
def test_bad_json_file_is_one_line(tmp_path, name, text, words):
    path = tmp_path / name
    path.write_bytes(text.encode("latin-1"))
    with pytest.raises(InputError) as info:
        read_json(path)
    assert "\n" not in str(info.value) and all(w in str(info.value) for w in words), str(info.value)


def test_missing_or_folder(tmp_path):
    with pytest.raises(InputError, match="nope.json: file not found"):
        read_json(tmp_path / "nope.json")
    (tmp_path / "dir.json").mkdir()
    with pytest.raises(InputError, match=r"dir.json: is a directory, not a file\. Fix: give the path of the config"):
        read_json(tmp_path / "dir.json", "config file")


def test_json_lines(tmp_path):
    def read_json_lines(path):
        return [value for _, value in parse_json_lines(read_text(path), path)]

    path = tmp_path / "parts.jsonl"
    path.write_text('{"job": 1}\n\n[2]\n{"job": \n')
    with pytest.raises(InputError, match=r"parts.jsonl, line 4 column \d+: malformed JSON"):
        read_json_lines(path)
    path.write_text('{"job": 1}\n\n[2]\n')
    assert read_json_lines(path) == [{"job": 1}, [2]]


def test_config_file_errors_are_the_readers(tmp_path):
    """run_qa.py CONFIG: the reader's message for malformed JSON or a folder, the config's own for
    a missing file and for a document that is not an object."""
    from qa.arguments import parse_args

    cases = {"torn.json": ('{"a": 1,\n "b": }', "line 2 column 7: malformed JSON"),
             "list.json": ("[1]", "a config must be a JSON object"),
             "dir.json": (None, "is a directory, not a file. Fix: give the path of the config file"),
             "missing.json": (None, "config file not found")}
    for name, (text, words) in cases.items():
        path = tmp_path / name
        if text is not None:
            path.write_text(text)
        elif name == "dir.json":
            path.mkdir()
        with pytest.raises(InputError) as info:
            parse_args([str(path)])
        assert str(path) in str(info.value) and words in str(info.value), str(info.value)
