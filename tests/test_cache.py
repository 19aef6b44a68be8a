"""The tokenized-features cache: keyed by everything that matters, reused, never torn, verified."""
import json
import logging
import os
import re
import socket
import subprocess
import sys
import threading
import time

import pytest

from qa.data import cache
from qa.data.cache import cached_features, features_key
from utils_qa import prepare_train_features, prepare_validation_features
from tests.helpers import FEATURE_PARAMS, TINY, go_offline, minilm_tokenizer, results, synthetic_examples


def test_key_depends_on_data_parameters_function_and_tokenizer():
    tok = minilm_tokenizer()
    ex = synthetic_examples()
    key = features_key(ex, tok, prepare_train_features, FEATURE_PARAMS)
    assert key == features_key(synthetic_examples(), tok, prepare_train_features, FEATURE_PARAMS), \
        "same content, same key"
    assert key != features_key(synthetic_examples(seed=1), tok, prepare_train_features, FEATURE_PARAMS)
    assert key != features_key(ex.select(range(30)), tok, prepare_train_features, FEATURE_PARAMS)
    assert key != features_key(ex, tok, prepare_validation_features, FEATURE_PARAMS)
    assert key != features_key(ex, tok, prepare_train_features, {**FEATURE_PARAMS, "doc_stride": 16})
    tok2 = minilm_tokenizer().__class__.from_pretrained(minilm_tokenizer().name_or_path, do_lower_case=False)
    assert key != features_key(ex, tok2, prepare_train_features, FEATURE_PARAMS)


def test_second_call_is_a_hit_with_identical_features(tmp_path):
    tok = minilm_tokenizer()
    ex = synthetic_examples()
    first, hit1 = cached_features(ex, tok, prepare_train_features, FEATURE_PARAMS, cache_dir=tmp_path)
    second, hit2 = cached_features(ex, tok, prepare_train_features, FEATURE_PARAMS, cache_dir=tmp_path)
    assert (hit1, hit2) == (False, True)
    assert first.to_dict() == second.to_dict()
    assert not [p for p in tmp_path.iterdir() if ".tmp-" in p.name], "no staging folder left behind"
    again, hit3 = cached_features(ex, tok, prepare_train_features, FEATURE_PARAMS, cache_dir=tmp_path, overwrite=True)
    assert hit3 is False and again.to_dict() == first.to_dict()


def test_worker_processes_give_the_same_features(tmp_path):
    tok = minilm_tokenizer()
    ex = synthetic_examples(120)
    one, _ = cached_features(ex, tok, prepare_validation_features, FEATURE_PARAMS, cache_dir=tmp_path / "a")
    two, _ = cached_features(ex, tok, prepare_validation_features, FEATURE_PARAMS, cache_dir=tmp_path / "b", num_proc=2)
    assert one.to_dict() == two.to_dict()


def test_key_depends_on_the_tokenizer_settings_that_change_the_features():
    """The padding side picks the question/context order, the truncation side where windows
    start, the input names whether token_type_ids are made: none of them is in the backend
    tokenizer's definition."""
    from transformers import AutoTokenizer

    from qa.model import bundled_minilm_dir

    ex = synthetic_examples()
    key = features_key(ex, minilm_tokenizer(), prepare_train_features, FEATURE_PARAMS)
    assert key == features_key(ex, AutoTokenizer.from_pretrained(bundled_minilm_dir()), prepare_train_features,
                               FEATURE_PARAMS)
    for setting in (dict(padding_side="left"), dict(truncation_side="left"),
                    dict(model_input_names=["input_ids", "attention_mask"])):
        other = AutoTokenizer.from_pretrained(bundled_minilm_dir(), **setting)
        assert key != features_key(ex, other, prepare_train_features, FEATURE_PARAMS), setting
    left = AutoTokenizer.from_pretrained(bundled_minilm_dir(), padding_side="left")
    right = minilm_tokenizer()
    assert prepare_train_features(ex[:3], left, **FEATURE_PARAMS) != \
        prepare_train_features(ex[:3], right, **FEATURE_PARAMS)


# ---------------------------------------------------------------------------------------------
# A damaged entry is rebuilt; replacing one leaves readers a whole entry; staging folders of the dead go


def _damaged_then_rebuilt(tmp_path, caplog, damage):
    """Saves an entry, damages its one Arrow file with `damage`, asks again: (the one warning, first
    features, the features of the call after the damage, whether that was a hit)."""
    tok, ex = minilm_tokenizer(), synthetic_examples()
    first, _ = cached_features(ex, tok, prepare_train_features, FEATURE_PARAMS, cache_dir=tmp_path)
    expected = first.to_dict()
    del first  # its memory map of the file about to be damaged
    [arrow] = tmp_path.rglob("data-*.arrow")
    damage(arrow)
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="qa.data.cache"):
        again, hit = cached_features(ex, tok, prepare_train_features, FEATURE_PARAMS, cache_dir=tmp_path)
    warnings = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(warnings) == 1, warnings
    assert again.to_dict() == expected and hit is False
    _, hit = cached_features(ex, tok, prepare_train_features, FEATURE_PARAMS, cache_dir=tmp_path)
    assert hit is True, "the rebuilt entry verifies"
    return warnings[0]


def test_a_file_cut_short_is_rebuilt(tmp_path, caplog):
    def cut(path):
        os.truncate(path, path.stat().st_size // 2)

    warning = _damaged_then_rebuilt(tmp_path, caplog, cut)
    assert re.search(r"prepare_train_features-[0-9a-f]{24}.* is damaged \(.*data-00000-of-00001\.arrow has "
                     r"[\d,]+ bytes, [\d,]+ when saved\): rebuilding it", warning), warning


def test_a_file_changed_in_place_is_rebuilt(tmp_path, caplog):
    def flip(path):
        with open(path, "r+b") as f:  # same size: only the content hash can tell
            f.seek(path.stat().st_size // 2)
            chunk = f.read(16)
            f.seek(-len(chunk), os.SEEK_CUR)
            f.write(bytes(b ^ 0xFF for b in chunk))

    warning = _damaged_then_rebuilt(tmp_path, caplog, flip)
    assert "data-00000-of-00001.arrow differs from what was saved (content hash)" in warning, warning


def test_replacing_an_entry_leaves_readers_a_whole_one(tmp_path, caplog):
    """While one thread rebuilds the entry again and again (--overwrite_cache), every read in another
    finds an entry that verifies; the version it replaced stays for jobs still reading it."""
    tok, ex = minilm_tokenizer(), synthetic_examples()
    expected = cached_features(ex, tok, prepare_train_features, FEATURE_PARAMS, cache_dir=tmp_path)[0].to_dict()

    def rewrite():
        for _ in range(3):
            cached_features(ex, tok, prepare_train_features, FEATURE_PARAMS, cache_dir=tmp_path, overwrite=True)

    writer = threading.Thread(target=rewrite)
    reads = []
    with caplog.at_level(logging.INFO, logger="qa.data.cache"):
        writer.start()
        while writer.is_alive() or not reads:
            feats, hit = cached_features(ex, tok, prepare_train_features, FEATURE_PARAMS, cache_dir=tmp_path)
            reads.append(hit and feats.to_dict() == expected)
        writer.join()
    assert all(reads), f"{reads.count(False)} of {len(reads)} reads found no whole entry"
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(list(tmp_path.glob("*.v-*"))) == 4, "the replaced versions are kept for a while"
    [pointer] = tmp_path.glob("*.json")

    # Replaced longer ago than any job runs: collected; the current version, however old, stays.
    long_ago = time.time() - cache.KEEP_REPLACED_S - 60
    for folder in tmp_path.glob("*.v-*"):
        os.utime(folder, (long_ago, long_ago))
    cached_features(ex, tok, prepare_train_features, FEATURE_PARAMS, cache_dir=tmp_path)
    assert [p.name for p in tmp_path.glob("*.v-*")] == [json.loads(pointer.read_text())["folder"]]


def test_staging_folders_of_dead_writers_are_removed(tmp_path):
    """On this node a writer's process tells whether it lives; another node's staging folder goes
    only once it has been left for a day."""
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    host, name = socket.gethostname(), "prepare_train_features-" + "0" * 24
    staging = {"dead writer here": f"{name}.tmp-{host}-{dead.pid}",
               "live writer here": f"{name}.tmp-{host}-{os.getpid()}",
               "another node, recent": f"{name}.tmp-other-node-{dead.pid}",
               "another node, left": f"{name}.tmp-other-node-{dead.pid + 1}",
               "earlier release, left": f"{name}.tmp-{dead.pid}"}
    for folder in staging.values():
        (tmp_path / folder).mkdir()
        (tmp_path / folder / "data-00000-of-00001.arrow").write_bytes(b"half")
    two_days_ago = time.time() - 2 * 86400
    for label in ("another node, left", "earlier release, left"):
        os.utime(tmp_path / staging[label], (two_days_ago, two_days_ago))
    cached_features(synthetic_examples(), minilm_tokenizer(), prepare_train_features, FEATURE_PARAMS,
                    cache_dir=tmp_path)
    left = {label for label, folder in staging.items() if (tmp_path / folder).exists()}
    assert left == {"live writer here", "another node, recent"}


@pytest.mark.slow
def test_a_run_over_a_damaged_entry_finishes_with_one_line(tmp_path, monkeypatch, caplog):
    """run_qa.py whose evaluation features were cut short since the last run: one line says so, the
    run rebuilds them and evaluates as before (run_qa.main in this process: the boundary is not what is tested)."""
    from run_qa import main

    go_offline(monkeypatch, tmp_path / "hf_home", drop=("TENSORBOARD_LOGGING_DIR",))
    args = [*TINY, "--do_train", "false", "--do_eval", "--features_cache_dir", str(tmp_path / "features")]
    assert main([*args, "--output_dir", str(tmp_path / "first")]) == 0
    [arrow] = (tmp_path / "features").rglob("data-*.arrow")
    os.truncate(arrow, arrow.stat().st_size // 2)
    caplog.clear()
    assert main([*args, "--output_dir", str(tmp_path / "second")]) == 0
    said = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    damaged = [line for line in said if "is damaged" in line]
    assert len(damaged) == 1 and "data-00000-of-00001.arrow has" in damaged[0], said
    assert not [r for r in caplog.records if r.exc_info], said
    assert results(tmp_path / "second")["eval_f1"] == results(tmp_path / "first")["eval_f1"]


def test_the_code_key_follows_what_makes_features_and_nothing_beside_it(tmp_path):
    """An edit of a function the feature function calls changes its key; an edit of a neighbour (the
    post-processing beside the windows in utils_qa.py) does not."""
    import importlib.util

    def digest(callee, neighbour):
        path = tmp_path / f"v{len(list(tmp_path.iterdir()))}.py"
        path.write_text(f"LIMIT = 3\n\ndef make(x):\n    return [helper(v) for v in x][:LIMIT]\n\n"
                        f"def helper(v):\n    return {callee}\n\ndef neighbour(v):\n    return {neighbour}\n")
        spec = importlib.util.spec_from_file_location("qa.digest_probe", path)  # a project module's name
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        return cache.code_digest(module.make)

    base = digest("v + 1", "v")
    assert digest("v + 1", "v * 2") == base
    assert digest("v + 2", "v") != base
