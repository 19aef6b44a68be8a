"""Every numeric and path setting is checked by its rule (qa/arguments.py), right after parsing:
an out-of-range value stops run_qa.py with one `error:` line naming the setting and the fix,
exit 2, no traceback, and nothing written (no output folder, no environment.json, no features
cache, no tiny-BERT build). And `--help` prints the help and exits 0."""
import dataclasses
import json
import logging
import math
import os
import shutil
import subprocess
import sys
import tempfile
import typing
from pathlib import Path

import pytest

from qa.arguments import (RULES, DataArguments, Folder, ModelArguments, Number, RunArguments, check_before_loading,
                          check_settings, steps)
from qa.errors import InputError, command
from tests.helpers import REPO, go_offline, offline_env, run_qa, unprivileged

BASE = ["--model_name_or_path", "bundled:tiny-bert", "--dataset_name", "synthetic", "--do_train", "--do_eval",
        "--max_seq_length", "128", "--doc_stride", "32", "--max_query_length", "32", "--use_cpu", "true"]


def numeric_fields():
    """(name, type) of every int, float or list-of-int field of the run's argument dataclasses
    (bools excluded), read from the installed releases: a field added there or in qa/arguments.py
    without a rule (or one of transformers' own, TRANSFORMERS_CHECKS) fails the tests below."""
    from transformers import TrainingArguments

    found = {}
    for dtype in (ModelArguments, DataArguments, RunArguments, TrainingArguments):
        hints = typing.get_type_hints(dtype)
        for f in dataclasses.fields(dtype):
            if not f.init:
                continue
            kinds = {a for a in typing.get_args(hints[f.name])} or {hints[f.name]}
            kinds |= {a for k in list(kinds) for a in typing.get_args(k)}  # List[int] -> int
            if bool in kinds or str in kinds:
                continue
            if kinds & {int, float}:
                found[f.name] = hints[f.name]
    return found


NUMERIC = numeric_fields()
# Settings whose bad values TrainingArguments itself refuses with a message naming them: a value each refuses
TRANSFORMERS_CHECKS = {"torch_empty_cache_steps": 0}


def outside(rule):
    """A value `rule` refuses."""
    if not isinstance(rule, Number):
        return [0]  # length_buckets
    if math.isfinite(rule.low):
        return rule.low if rule.open == "low" else rule.low - 1
    if math.isfinite(rule.high):
        return rule.high if rule.open == "high" else rule.high + 1
    return math.nan


def test_every_numeric_field_has_a_rule():
    assert len(NUMERIC) > 40, sorted(NUMERIC)  # the walk below must really cover the dataclasses
    assert {"per_device_train_batch_size", "learning_rate", "warmup_steps", "doc_stride", "length_buckets",
            "profile_active", "peak_tflops", "save_total_limit", "ddp_timeout", "seed"} <= set(NUMERIC)
    missing = sorted(set(NUMERIC) - set(RULES) - set(TRANSFORMERS_CHECKS))
    assert not missing, f"numeric settings without a rule in qa/arguments.py: {missing}"
    assert not set(RULES) & set(TRANSFORMERS_CHECKS), "a check transformers makes itself is not restated"


def _flags(name, value):
    return [f"--{name}", *map(str, value)] if isinstance(value, list) else [f"--{name}", str(value)]


def _tree(folder):
    return sorted(p.relative_to(folder).as_posix() for p in folder.rglob("*"))


@pytest.fixture
def offline(tmp_path, monkeypatch):
    go_offline(monkeypatch, tmp_path / "hf", drop=("TENSORBOARD_LOGGING_DIR",))
    return tmp_path


@pytest.mark.parametrize("name", sorted(NUMERIC))
def test_out_of_range_value_stops_before_anything_is_written(name, offline, capsys):
    """Through run_qa.py's entry point (in-process: a fresh interpreter costs ~10 s of imports)."""
    from run_qa import main

    tmp = offline
    bad = TRANSFORMERS_CHECKS[name] if name in TRANSFORMERS_CHECKS else outside(RULES[name])
    before = _tree(tmp)
    out = tmp / "out"
    assert main(BASE + _flags(name, bad) + ["--features_cache_dir", str(tmp / "features"),
                                            "--output_dir", str(out)]) == 2
    err = capsys.readouterr().err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in err, err
    said = "error: command line: invalid arguments: `" + name if name in TRANSFORMERS_CHECKS else f"error: {name}="
    assert lines[0].startswith(said) and ". Fix: " in lines[0], lines[0]
    assert _tree(tmp) == before, "nothing written: no output folder, features cache or model build"


@pytest.mark.parametrize("flags, culprit", [
    (["--per_device_train_batch_size", "0"], "per_device_train_batch_size=0: must be at least 1"),
    (["--learning_rate=-1e-5"], "learning_rate=-1e-05: must be at least 0"),
    (["--num_train_epochs", "0"], "num_train_epochs=0: must be greater than 0"),
    (["--warmup_steps", "1.5"], "warmup_steps=1.5: must be 0, a fraction"),
    (["--adam_beta2", "1"], "adam_beta2=1: must be at least 0 and below 1"),
    (["--max_steps", "0"], "max_steps=0: must be -1 or at least 1"),
    (["--save_steps", "0"], "save_steps=0: must be a fraction"),
    (["--eval_strategy", "steps", "--eval_steps", "2.5"], "eval_steps=2.5"),
    (["--logging_steps", "inf"], "logging_steps=inf"),
    (["--seed", "4294967296"], "seed=4294967296: must be a whole number from 0 to 4294967295"),
    (["--null_score_diff_threshold", "nan"], "null_score_diff_threshold=nan: must be a finite number"),
    (["--max_train_samples", "0"], "max_train_samples=0"),
    (["--profile_active", "0"], "profile_active=0"),
    (["--train_articles", "a:b"], "--train_articles 'a:b'"),
    (["--resume", "no-such-checkpoint"], "resume=no-such-checkpoint"),
    (["--model_name_or_path", "bundled:huge"], "bundled:huge: unknown bundled model"),
    (["--per_device_train_batch_size", "twelve"], "invalid int value: 'twelve'"),
])
def test_named_settings(flags, culprit, offline, capsys):
    from run_qa import main

    out = offline / "out"
    assert main(BASE + flags + ["--output_dir", str(out)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and culprit in err[0] and "Fix:" in err[0], err
    assert not out.exists()


def test_output_dir_that_cannot_be_created(offline, capsys):
    """Under a regular file (a typo'd path, or a file where a folder was meant): refused at start."""
    from run_qa import main

    blocker = offline / "results.txt"
    blocker.write_text("a file, not a folder")
    for out in (blocker, blocker / "run1"):
        assert main(BASE + ["--output_dir", str(out)]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and err[0].startswith(f"error: output_dir={out}: "), err
    assert sorted(p.name for p in offline.iterdir()) == ["results.txt"]


def test_a_folder_the_system_will_not_make_is_one_line_before_anything_loads(offline, capsys):
    """/proc passes access() as root but makes no folder: the run lock's mkdir says it, before the model or data."""
    from run_qa import main

    assert main(BASE + ["--output_dir", "/proc/no-such-process/runs/one"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["error: /proc/no-such-process/runs/one: cannot be created or written (No such file or directory: "
                   "/proc/no-such-process). Fix: give a folder this user can create and write to"], err


def test_a_folder_on_a_read_only_file_system_is_named_so(tmp_path):
    mount = tmp_path / "ro"
    mount.mkdir()
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "ro,size=1m", "tmpfs", str(mount)], capture_output=True)
    if done.returncode:
        pytest.skip(f"mounting a tmpfs is not allowed here (needs root): {done.stderr.decode().strip()}")
    try:
        assert Folder("", "").problem(str(mount / "out")) == f"cannot be created: {mount} is on a read-only file system"
        assert Folder("", "").problem(str(mount)) == "is on a read-only file system"
    finally:
        subprocess.run(["umount", str(mount)], check=True)


def test_the_check_before_loading_records_a_refusal_not_a_pass(tmp_path, monkeypatch):
    """A pass is no outcome: a run killed later would leave "completed" for the job's launcher to read."""
    outcome = tmp_path / "outcome.json"
    monkeypatch.setenv("QA_OUTCOME_FILE", str(outcome))
    early = command(check_before_loading, ends_the_run=False)
    assert early([str(REPO / "configs" / "smoke_tiny.json")]) == 0 and not outcome.exists()
    assert early([str(tmp_path / "none.json")]) == 2
    assert json.loads(outcome.read_text())["outcome"] == "refused"


EARLY = ("import atexit, runpy, sys; atexit.register(lambda: print(sorted({'torch', 'transformers'} & "
         "set(sys.modules)), file=sys.stderr)); sys.argv = sys.argv[1:]; ")


@pytest.mark.parametrize("how", ["run_qa.py", "bert-squad-run"])
@pytest.mark.parametrize("args, said", [
    (["no-such-config.json"], "error: no-such-config.json: config file not found. Fix: check the path (configs/ "
                              "lists the shipped ones)"),
    (["configs/smoke_tiny.json", "--train_file", "no-such.json"], "error: no-such.json: file not found. Fix:"),
    (["configs/smoke_tiny.json", "--output_dir", "/etc/passwd/runs"], "error: output_dir=/etc/passwd/runs: cannot be "
                                                                      "created: /etc/passwd is a file"),
    (["configs/smoke_tiny.json", "--do_predict", "--validation_file", "dev.json.gz"], (
        "error: do_predict: predicts the questions of --test_file, which is not given (the other splits are files). "
        "Fix: pass --test_file FILE, or leave --do_predict out")),
], ids=["config", "data file", "output folder", "test file"])
def test_paths_are_refused_before_torch_and_transformers_load(args, said, how, tmp_path):
    """As a command (python run_qa.py, torchrun, the bert-squad-run entry point): imported, as by a test, it waits."""
    (tmp_path / "dev.json.gz").touch()
    start = ("runpy.run_path(sys.argv[0], run_name='__main__')" if how == "run_qa.py" else
             "sys.path.insert(0, sys.argv[0]); sys.argv[0] = 'bert-squad-run'; "
             "from run_qa import cli; cli()")
    command = [sys.executable, "-c", EARLY + start, str(REPO / "run_qa.py") if how == "run_qa.py" else str(REPO), *args]
    proc = subprocess.run([a.replace("configs/", f"{REPO}/configs/") for a in command], cwd=tmp_path,
                          env=offline_env(tmp_path / "hf"), capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert proc.stderr.splitlines()[0].startswith(said) and proc.stderr.count("error:") == 1, proc.stderr
    assert proc.stderr.splitlines()[-1] == "[]", proc.stderr  # neither library was imported


def test_read_only_output_dir():
    """A folder this user cannot write into, as root too (then checked as nobody); a writable one beside it passes."""
    base = Path(tempfile.mkdtemp())  # not tmp_path: pytest keeps that root's alone (0700), nobody could not reach in
    try:
        base.chmod(0o755)
        locked, free = base / "locked", base / "free"
        locked.mkdir(mode=0o555)
        free.mkdir()
        free.chmod(0o777)
        rule = Folder("", "")
        with unprivileged():
            assert rule.problem(str(locked / "out")) == f"cannot be created: {locked} is not writable by this user"
            assert rule.problem(str(locked)) == "is not writable by this user"
            assert rule.problem(str(free)) is None and rule.problem(str(free / "out")) is None
    finally:
        shutil.rmtree(base)


def test_the_rules_accept_what_transformers_accepts():
    check_settings({"warmup_steps": 0, "save_steps": 0.1, "logging_steps": 1, "eval_steps": None, "max_steps": -1,
                    "adam_beta2": 0.999, "learning_rate": 0.0, "seed": 0, "data_seed": None, "max_grad_norm": 0,
                    "save_total_limit": None, "length_buckets": [128, 384], "max_seq_length": 384,
                    "doc_stride": 128, "max_query_length": 64, "resume": "auto"})
    assert outside(steps("x", "y")) == 0 and math.isnan(outside(Number("x", "y")))
    with pytest.raises(InputError, match=r"^length_buckets=\[64, 256\]: bucket 256 is outside 1..max_seq_length=128"):
        check_settings({"max_seq_length": 128, "length_buckets": [64, 256]})
    with pytest.raises(InputError, match="doc_stride must be smaller than the context room"):
        check_settings({"max_seq_length": 128, "doc_stride": 100, "max_query_length": 32})


def test_through_a_real_process_and_a_config_file(tmp_path):
    """The entry point as users run it: a config with an out-of-range value (and flags after it)."""
    import json

    config = tmp_path / "cfg.json"
    config.write_text(json.dumps({"model_name_or_path": "bundled:tiny-bert", "dataset_name": "synthetic",
                                  "do_train": True, "gradient_accumulation_steps": 0, "use_cpu": True}))
    env = offline_env(tmp_path / "hf")
    proc = run_qa([str(config), "--output_dir", str(tmp_path / "out")], env, timeout=300)
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr and proc.stderr.count("error:") == 1, proc.stderr
    assert proc.stderr.strip().splitlines()[-1] == (
        "error: gradient_accumulation_steps=0: must be at least 1 (batches per optimizer step). Fix: use 1 or more")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["cfg.json"]


@pytest.mark.parametrize("command", [
    [sys.executable, str(REPO / "run_qa.py"), "--help"],
    [sys.executable, str(REPO / "run_qa.py"), "-h"],
    ["bert-squad-run", "--help"],
], ids=["--help", "-h", "bert-squad-run"])
def test_help_exits_0(command, tmp_path):
    if command[0] == "bert-squad-run":
        found = shutil.which("bert-squad-run") or shutil.which("bert-squad-run", path=os.path.dirname(sys.executable))
        if found is None:
            pytest.skip("bert-squad-run is not installed (pip install -e .)")
        command = [found, *command[1:]]
    env = dict(os.environ, PYTHONPATH=str(REPO), HF_HOME=str(tmp_path / "hf"))
    proc = subprocess.run(command, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.startswith("usage:") and "--output_dir" in proc.stdout and "--resume" in proc.stdout
    assert "error" not in proc.stderr
    assert list(tmp_path.iterdir()) == []


def test_help_in_process_returns_0(capsys):
    from run_qa import main

    assert main(["--help"]) == 0
    out = capsys.readouterr().out
    assert "--per_device_train_batch_size" in out
    assert out.startswith("usage: ") and "[CONFIG.json] [--ARGUMENT VALUE ...]" in out.splitlines()[0]


@pytest.mark.parametrize("typo, meant", [
    (["--learning_rat", "1e-4"], "--learning_rate"),
    (["--per_device_train_batchsize", "8"], "--per_device_train_batch_size"),
    (["--num_train_epoch=2"], "--num_train_epochs"),
])
def test_a_misspelt_flag_is_answered_with_the_closest_one(typo, meant, offline, capsys):
    from run_qa import main

    out = offline / "out"
    assert main(BASE + typo + ["--output_dir", str(out)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    flag = typo[0].split("=")[0]
    assert len(err) == 1 and f"Fix: did you mean {meant} (not {flag})?" in err[0], err
    assert len(err[0]) < 300 and not out.exists()


def test_many_unknown_arguments_keep_the_line_short(offline, capsys):
    from run_qa import main

    assert main(BASE + [f"--no_such_setting_{i}" for i in range(40)] + ["--output_dir", str(offline / "out")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "'--no_such_setting_5', '...'" in err[0] and len(err[0]) < 300, err


def _config(folder, **settings):
    import json

    config = folder / "cfg.json"
    config.write_text(json.dumps({"model_name_or_path": "bundled:tiny-bert", "dataset_name": "synthetic",
                                  "do_train": True, "do_eval": True, "use_cpu": True, **settings}))
    return str(config)


@pytest.mark.parametrize("config, flags, said", [
    ({}, ["--learning_rat", "1e-4"], "command line: unknown arguments ['--learning_rat', '1e-4']. Fix: did you mean "
                                     "--learning_rate (not --learning_rat)?"),
    ({}, ["--num_train_epochs", "two"], "command line: invalid arguments: argument --num_train_epochs/"
                                        "--num-train-epochs: invalid float value: 'two'. Fix: use e.g. 2"),
    ({}, ["--output_dir"], "command line: invalid arguments: argument --output_dir/--output-dir: expected one "
                           "argument. Fix: give a folder this user can create and write to"),
    ({"learning_rat": 1e-4}, [], "{config}: unknown arguments ['--learning_rat', '0.0001']. Fix: did you mean"),
    ({"num_train_epochs": "two"}, ["--seed", "3"], "{config}: invalid arguments: argument --num_train_epochs/"
                                                    "--num-train-epochs: invalid float value: 'two'. Fix: use e.g. 2"),
], ids=["misspelt flag", "flag value", "flag without value", "misspelt key", "key value"])
def test_a_mistake_is_blamed_on_where_it_was_made(config, flags, said, offline, capsys):
    """A mistake on the command line was reported as the config file's; the config's own are still its own. Each
    line says what to give instead of only pointing at --help."""
    from run_qa import main

    path = _config(offline, **config)
    out = [] if flags == ["--output_dir"] else ["--output_dir", str(offline / "out")]
    assert main([path, *out, *flags]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: " + said.format(config=path)), err
    assert sorted(p.name for p in offline.iterdir()) == ["cfg.json"]


def test_a_negative_number_is_a_value(offline, capsys):
    """`--learning_rate -3e-5` was read as a flag ("expected one argument"): it is a value, refused by its rule."""
    from qa.arguments import parse_args
    from run_qa import main

    for flags, said in ((["--learning_rate", "-3e-5"], "error: learning_rate=-3e-05: must be at least 0"),
                        (["--seed", "-1"], "error: seed=-1: must be a whole number from 0")):
        assert main(BASE + flags + ["--output_dir", str(offline / "out")]) == 2
        assert capsys.readouterr().err.strip().splitlines()[-1].startswith(said)
    parsed = parse_args(BASE + ["--null_score_diff_threshold", "-1.5e1", "--output_dir", str(offline / "out")])
    assert parsed[1].null_score_diff_threshold == -15.0


def test_a_setting_a_config_gives_is_unset_from_the_command_line_with_none(offline, caplog):
    """configs/smoke.json evaluates during training; `--eval_every none` and `0` were both refused and no page said
    how. `none` unsets it: what only it gives meaning to is left unused with a warning, not refused."""
    from qa.arguments import RULES, parse_args

    path = _config(offline, eval_every=0.25, eval_every_questions=100, target_f1=85, max_train_samples=64)
    with caplog.at_level(logging.WARNING, logger="qa.arguments"):
        _, data_args, run_args, _, _ = parse_args([path, "--eval_every", "none", "--max_train_samples", "None",
                                                   "--output_dir", str(offline / "out")])
    assert (run_args.eval_every, run_args.target_f1, run_args.eval_every_questions) == (None, None, None)
    assert data_args.max_train_samples is None
    assert sorted(r.getMessage() for r in caplog.records) == [
        "--eval_every_questions 100: unused: validation questions of each evaluation during training (--eval_every "
        "is off)", "--target_f1 85: unused: the F1 whose training time to reach is reported (--eval_every is off)"]
    assert "none" in RULES["eval_every"].fix  # what `--eval_every 0` is told
    assert "`--eval_every none`" in (REPO / "docs" / "running.md").read_text()
    with pytest.raises(InputError, match="^target_f1=85: means nothing without --eval_every"):  # never given: refused
        parse_args([_config(offline, target_f1=85), "--output_dir", str(offline / "out")])


def test_fp16_on_the_cpu_is_refused(tmp_path):
    """accelerate runs no fp16 autocast on a CPU: the run would train in fp32 while its log, model card and
    all_results.json said fp16. As a user runs it (--use_cpu: the same refusal on a machine with a GPU)."""
    env = offline_env(tmp_path / "hf")
    proc = run_qa([*BASE, "--fp16", "true", "--max_steps", "2", "--synthetic_eval_examples", "8",
                   "--output_dir", str(tmp_path / "out")], env, timeout=300)
    assert proc.returncode == 2, proc.stderr[-2000:]
    lines = proc.stderr.strip().splitlines()
    assert "Traceback" not in proc.stderr and proc.stderr.count("error:") == 1, proc.stderr
    assert lines[-1].startswith("error: fp16=true: the CPU cannot train in fp16") and len(lines[-1]) < 300
    assert "Fix: pass --bf16 true (the CPU runs bf16) instead, or leave --fp16 out" in lines[-1]
    assert sorted(p.name for p in tmp_path.iterdir()) == []


def test_the_rules_between_settings_are_one_function():
    """check_together: refused when a setting means nothing without another, a note when the run leaves it idle."""
    from qa.arguments import check_together

    run = {"do_train": True, "do_eval": False, "do_predict": False, "eval_strategy": "no"}
    for values, culprit in (({"target_f1": 88.5}, "target_f1=88.5: means nothing without --eval_every"),
                            ({"eval_every_questions": 100}, "eval_every_questions=100: means nothing without"),
                            ({**run, "do_train": False}, "arguments: nothing to do"),
                            ({**run, "eval_every": 0.25}, "eval_every=0.25: evaluates during training")):
        with pytest.raises(InputError, match=f"^{culprit}"):
            check_together(values)
    assert check_together({**run, "eval_every": 0.25, "eval_strategy": "epoch"}) == []  # evaluates: do_eval follows
    assert check_together({**run, "compile_warmup": True, "torch_compile": False, "fsdp_reduce_dtype": "bf16"}) == [
        "--compile_warmup True: the run does not compile: nothing to warm up (--torch_compile is off)",
        "--fsdp_reduce_dtype bf16: the run does not shard with FSDP (--fsdp is off)"]
    assert check_together({**run, "compile_warmup": True, "torch_compile": True, "fsdp_reduce_dtype": "auto"}) == []
