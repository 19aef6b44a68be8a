"""What a run prints (qa/console.py, qa/model.py's loading message): a log file without escape
codes or progress-bar redraws, log entries as numbers, and one line that says what a loading means
(the QA head a base BERT lacks, weights missing beyond it) instead of transformers' table."""
import json
import logging
import re
import subprocess
import sys

import pytest

from tests.helpers import REPO, base_bert, error_lines, offline_env


# ---------------------------------------------------------------------------------------------
# Plain functions


def test_log_entries_print_numbers():
    from qa.console import format_log

    line = format_log({"loss": 4.631234, "learning_rate": 2.5e-05, "epoch": 0.8333333, "total_flos": 1.5e12,
                       "perf/real_tokens_per_s": 26563.7, "eval_examples": 16, "note": "x"}, step=10)
    assert line == ('{"step": 10, "loss": 4.631, "learning_rate": 2.5e-05, "epoch": 0.8333, '
                    '"perf/real_tokens_per_s": 26560.0, "eval_examples": 16, "note": "x"}')
    assert format_log({"loss": float("nan")}) == '{"loss": NaN}'  # as json writes it, not a string


@pytest.mark.parametrize("terminal", [False, True])
def test_progress_bars_and_pinning_follow_the_output(terminal, monkeypatch):
    import datasets
    from transformers import TrainingArguments
    from transformers.utils import logging as transformers_logging

    from qa.console import configure_output

    monkeypatch.setattr(datasets, "disable_progress_bars", lambda: calls.append("datasets off"))
    monkeypatch.setattr(transformers_logging, "disable_progress_bar", lambda: calls.append("weights off"))
    calls = []
    args = TrainingArguments(output_dir="x", disable_tqdm=False, dataloader_pin_memory=True)
    configure_output(args, explicit=set(), terminal=terminal)
    assert args.disable_tqdm is (not terminal)
    assert calls == (["weights off"] if terminal else ["datasets off", "weights off"])
    assert args.dataloader_pin_memory is False  # no accelerator on this machine
    # what the user gave is kept
    calls.clear()
    args = TrainingArguments(output_dir="x", disable_tqdm=False)
    configure_output(args, explicit={"disable_tqdm"}, terminal=False)
    assert args.disable_tqdm is False and calls == ["weights off"]


HEAD = ["qa_outputs"]


def test_loading_message_for_a_base_bert():
    from qa.model import loading_message

    level, message = loading_message(["qa_outputs.weight", "qa_outputs.bias"],
                                     ["pooler.dense.weight", "pooler.dense.bias"], HEAD, 770, training=True)
    assert level == logging.INFO
    assert message.startswith("the QA head (qa_outputs, 770 parameters) is new: it starts from random values and this "
                              "run trains it") and "pooler.dense (2 tensors)" in message
    # a fine-tuned QA model: nothing to say
    assert loading_message([], [], HEAD, 770, training=False) is None


def test_loading_message_when_something_unexpected_is_missing():
    from qa.model import loading_message

    encoder = ["bert.encoder.layer.1.output.dense.weight", "bert.encoder.layer.1.output.dense.bias"]
    level, message = loading_message(encoder + ["qa_outputs.weight"], [], HEAD, 770, training=True)
    assert level == logging.WARNING
    assert "lacks 2 weights of the model beyond its QA head (bert.encoder.layer.1.output.dense)" in message
    # the head missing from a run that does not train: random answers
    level, message = loading_message(["qa_outputs.weight"], [], HEAD, 770, training=False)
    assert level == logging.WARNING and "answers come from random weights" in message


class _Records(logging.Handler):
    def __init__(self):
        super().__init__()
        self.records = []

    def emit(self, record):
        self.records.append(record)


@pytest.mark.parametrize("case", ["base bert, training", "encoder layer missing", "base bert, no training"])
def test_loading_says_what_it_means_in_one_line(case, tmp_path):
    """The real loading, in-process: transformers' table never reaches its handlers; one line of ours
    says what the loading means, a warning when the run would not expect what is missing."""
    from transformers import BertConfig, BertModel

    from qa.arguments import ModelArguments
    from qa.model import load_model_and_tokenizer

    folder = base_bert(tmp_path / "base")
    if case == "encoder layer missing":  # a one-layer checkpoint whose config says two layers
        config = BertConfig.from_pretrained(folder)
        config.num_hidden_layers = 1
        model = BertModel(config)
        model.config.num_hidden_layers = 2
        model.save_pretrained(folder)
    seen, ours = _Records(), _Records()
    logging.getLogger("transformers").addHandler(seen)
    logging.getLogger("qa.model").addHandler(ours)
    logging.getLogger("qa.model").setLevel(logging.INFO)
    try:
        load_model_and_tokenizer(ModelArguments(str(folder)), work_dir=tmp_path,
                                 training=case != "base bert, no training")
    finally:
        logging.getLogger("transformers").removeHandler(seen)
        logging.getLogger("qa.model").removeHandler(ours)
    assert not [r for r in seen.records if "LOAD REPORT" in r.getMessage()]
    said = ours.records
    assert len(said) == 1
    if case == "base bert, training":
        assert said[0].levelno == logging.INFO and "the QA head (qa_outputs" in said[0].getMessage()
    else:
        assert said[0].levelno == logging.WARNING
    if case == "encoder layer missing":
        assert "bert.encoder.layer.1" in said[0].getMessage()


def test_weights_that_do_not_fit_the_config_are_an_input_error(tmp_path):
    """A checkpoint whose weights do not fit its config: one line naming a weight and both shapes,
    not transformers' table and its traceback."""
    from transformers import BertConfig

    from qa.arguments import ModelArguments
    from qa.errors import InputError
    from qa.model import load_model_and_tokenizer

    folder = base_bert(tmp_path / "base")
    config = BertConfig.from_pretrained(folder)
    config.type_vocab_size = 3  # the saved token-type embeddings have 2 rows
    config.save_pretrained(folder)
    seen = _Records()
    logging.getLogger("transformers").addHandler(seen)
    try:
        with pytest.raises(InputError, match=r"1 weight\(s\) do not fit the model's configuration, e\.g\. "
                                             r"bert\.embeddings\.token_type_embeddings\.weight: \(2, 64\) in the "
                                             r"checkpoint, \(3, 64\) in the model"):
            load_model_and_tokenizer(ModelArguments(str(folder)), work_dir=tmp_path)
    finally:
        logging.getLogger("transformers").removeHandler(seen)
    assert not [r for r in seen.records if "LOAD REPORT" in r.getMessage()]


# ---------------------------------------------------------------------------------------------
# A real run, its output in a file as a SLURM job's


@pytest.fixture(scope="module")
def run_log(tmp_path_factory):
    """run_qa.py fine-tuning a tiny base BERT, stdout and stderr into one file (not a terminal),
    without use_cpu (a GPU config on a machine without one) and with checkpoints."""
    tmp = tmp_path_factory.mktemp("console")
    base = base_bert(tmp / "base")
    env = offline_env(tmp / "hf", CUDA_VISIBLE_DEVICES="")
    out, log = tmp / "out", tmp / "job.out"
    with open(log, "w") as f:
        proc = subprocess.run([sys.executable, str(REPO / "run_qa.py"), str(REPO / "configs" / "smoke_tiny.json"),
                               "--model_name_or_path", str(base), "--use_cpu", "false", "--output_dir", str(out),
                               "--synthetic_train_examples", "120", "--synthetic_eval_examples", "40",
                               "--do_predict", "true"],
                              cwd=REPO, env=env, stdout=f, stderr=subprocess.STDOUT, timeout=600)
    text = log.read_text()
    assert proc.returncode == 0, text[-3000:]
    return text, out


def test_log_file_has_no_terminal_codes_or_bars(run_log):
    text, _ = run_log
    assert "\r" not in text and "\x1b[" not in text
    for bar in ("it/s]", "examples/s]", "Writing model shards", "Loading weights", "Saving the dataset"):
        assert bar not in text, bar
    assert "pin_memory" not in text  # no accelerator: nothing pinned, nothing to warn about


def test_log_says_the_qa_head_is_new_in_one_line(run_log):
    text, _ = run_log
    assert "LOAD REPORT" not in text and "UNEXPECTED" not in text and "MISSING" not in text
    lines = [line for line in text.splitlines() if "the QA head (qa_outputs" in line]
    assert len(lines) == 1 and "this run trains it" in lines[0] and "pooler.dense" in lines[0], lines


def test_a_refused_rerun_says_only_why(run_log, monkeypatch, caplog, capsys):
    """The same command again on its finished folder is refused; the loading's line ("the QA head ... is new: ...
    this run trains it") no longer comes first, for a run that trains nothing. In-process, on run_log's folder."""
    from run_qa import main
    from tests.helpers import go_offline

    _, out = run_log
    go_offline(monkeypatch, out.parent / "hf", drop=("TENSORBOARD_LOGGING_DIR",))
    with caplog.at_level(logging.INFO):
        assert main([str(REPO / "configs" / "smoke_tiny.json"), "--model_name_or_path", str(out.parent / "base"),
                     "--use_cpu", "false", "--output_dir", str(out), "--synthetic_train_examples", "120",
                     "--synthetic_eval_examples", "40", "--do_predict", "true"]) == 2
    errors = error_lines(capsys.readouterr().err)
    assert len(errors) == 1 and "holds a finished run" in errors[0], errors
    assert [r.getMessage() for r in caplog.records if r.name in ("qa.model", "run_qa")] == []  # no line before it


def test_log_entries_are_numbers(run_log):
    text, out = run_log
    entries = [json.loads(line) for line in text.splitlines() if line.startswith('{"step": ')]
    losses = [e for e in entries if "loss" in e]
    assert len(losses) >= 3 and all(isinstance(e["loss"], float) and isinstance(e["step"], int) for e in losses)
    assert all(isinstance(e["perf/samples_per_s"], float) for e in losses)
    assert any(isinstance(e.get("eval_f1"), float) for e in entries)  # evaluation after training too
    assert not re.search(r"'\w+': '[-0-9.e+]+'", text)  # no number printed as a quoted string
    # the same entries as trainer_state.json's log history, rounded to 4 significant digits
    history = [h for h in json.loads((out / "trainer_state.json").read_text())["log_history"] if "loss" in h]
    assert [e["loss"] for e in losses] == [float(f"{h['loss']:.4g}") for h in history]


def test_padding_figures_of_a_dynamically_padded_run(run_log):
    """smoke_tiny pads each batch (pad_to_max_length false): the features hold no padding,
    the batches the model computed on do."""
    _, out = run_log
    results = json.loads((out / "all_results.json").read_text())
    assert results["train_features_padding_fraction"] == 0
    assert 0 < results["train_batches_padding_fraction"] < 1
