"""answer_qa.py (bert-squad-answer) and its Python API: the answers `run_qa.py --do_predict` writes,
contexts longer than one window and batches of questions included, and a one-line error for a folder
that is not a trained QA model. The model is a tiny BERT with a random QA head, built here: the
answers are arbitrary spans, which is what an agreement test wants (every window and every
candidate counts). The same against the README's main job's trained model: tests/test_run_qa.py."""
import json
import shutil
import subprocess
import sys

import pytest

from tests.helpers import REPO, base_bert, go_offline, rendering_problems, same_as_predict, tiny_bert

LONG = ("Talon Mar founded the Vorbel Guild in 1820 in the city of Rosford, and the guild grew for a hundred "
        "years. In 1851 Ada Quill moved to Rosford to become a clockmaker, and she kept nine goats on a farm "
        "near the river. The guild hall was painted crimson in 1902 by Otto Venn, who had travelled from "
        "Delhaven to Rosford in twelve days. Ada Quill wrote The Silent Harbour in 1874; it sold in every "
        "city of the coast, from Delhaven to Marport, and was read aloud in the guild hall each winter.")
QUESTIONS = [("Who founded the Vorbel Guild?", LONG), ("When did Ada Quill move to Rosford?", LONG),
             ("How many goats did Ada Quill keep?", LONG), ("Who painted the guild hall?", LONG),
             ("What did Ada Quill write?", LONG), ("Where is the Nile?", "The Nile flows north through Egypt."),
             ("Which city did Otto Venn leave?", LONG[150:])]
WINDOW = ["--max_seq_length", "64", "--doc_stride", "16", "--max_query_length", "24"]
TOP_K = 3
# SQuAD v2.0 with a threshold between the tiny model's null odds (-0.8 to -0.5 for these questions):
# some questions get no answer, the others a span.
V2_ARGS = ["--version_2_with_negative", "--null_score_diff_threshold", "-0.7"]


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory):
    return tiny_bert(tmp_path_factory.mktemp("models") / "tiny")


@pytest.fixture(params=[(False, False), (True, True)], ids=["dynamic padding, v1.1", "padded, v2.0"])
def predicted(request, tiny_dir, tmp_path, monkeypatch):
    """The tiny model as a run leaves it (its settings in environment.json), and --do_predict's
    answers to QUESTIONS with 64-token windows, in batches of 3 windows."""
    from run_qa import main

    pad, version_2 = request.param
    go_offline(monkeypatch, tmp_path / "hf", drop=("TENSORBOARD_LOGGING_DIR",))
    model = tmp_path / "model"
    shutil.copytree(tiny_dir, model)
    test_file = tmp_path / "questions.jsonl"
    test_file.write_text("".join(json.dumps({"id": f"k{i}", "question": q, "context": c}) + "\n"
                                 for i, (q, c) in enumerate(QUESTIONS)))
    out = tmp_path / "predicted"
    assert main(["--model_name_or_path", str(model), "--do_predict", "--test_file", str(test_file), *WINDOW,
                 "--pad_to_max_length", str(pad).lower(), "--per_device_eval_batch_size", "3", "--use_cpu", "true",
                 "--report_to", "none", "--output_dir", str(out)] + V2_ARGS * version_2) == 0
    shutil.copy(out / "environment.json", model / "environment.json")
    return model, test_file, out, version_2


def test_answers_are_those_of_do_predict_with_long_contexts_in_batches(predicted):
    from answer_qa import Answerer
    from utils_qa import prepare_validation_features

    model, test_file, out, version_2 = predicted
    answerer = Answerer(model)
    windows = prepare_validation_features({"id": ["x"], "question": [QUESTIONS[0][0]], "context": [LONG]},
                                          answerer.tokenizer, 64, 16, 24, with_labels=False)
    assert len(windows["input_ids"]) >= 3  # the long context spans several windows
    assert answerer.data_args.version_2_with_negative is version_2 and answerer.batch_size == 3
    contexts = {f"k{i}": c for i, (_, c) in enumerate(QUESTIONS)}
    answers = answerer.answer_file(test_file, top_k=TOP_K)
    same_as_predict(answers, out, contexts, top_k=TOP_K)
    if version_2:  # both kinds of answer, the null one as "" at no offsets
        assert {a["start"] is None for a in answers} == {True, False}
        assert all(a["answer"] == "" and a["end"] is None for a in answers if a["start"] is None)
    # the same questions given as strings: the same answers, under their own ids
    given = answerer.answer_many([q for q, _ in QUESTIONS], [c for _, c in QUESTIONS], top_k=TOP_K)
    from_file = answerer.answer_file(test_file, top_k=TOP_K)
    assert [{**a, "id": None} for a in given] == [{**a, "id": None} for a in from_file]
    one = answerer(QUESTIONS[5][0], QUESTIONS[5][1])
    assert set(one) == {"id", "question", "answer", "start", "end", "score"} and 0 < one["score"] <= 1


def test_the_command_prints_one_json_line_per_question(predicted):
    model, test_file, out, _ = predicted
    proc = subprocess.run([sys.executable, "-m", "answer_qa", str(model), "--file", str(test_file), "--top_k",
                           str(TOP_K)], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stderr == ""
    answers = [json.loads(line) for line in proc.stdout.splitlines()]
    same_as_predict(answers, out, {f"k{i}": c for i, (_, c) in enumerate(QUESTIONS)}, top_k=TOP_K)


def _one_line_error(capsys, argv):
    from answer_qa import main

    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: "), err
    return err[0]


def test_a_folder_that_is_not_a_trained_model_is_a_one_line_error(tmp_path, tiny_dir, capsys, monkeypatch):
    go_offline(monkeypatch, tmp_path / "hf")
    ask = ["--question", "Who?", "--context", "Ada did."]
    assert "model folder does not exist" in _one_line_error(capsys, [str(tmp_path / "missing"), *ask])
    base = base_bert(tmp_path / "base")
    assert "has no trained question-answering head (qa_outputs)" in _one_line_error(capsys, [str(base), *ask])
    run = tmp_path / "run"  # a run that has saved checkpoints but not finished
    shutil.copytree(tiny_dir, run / "checkpoint-4")
    (run / "checkpoint-4" / "checkpoint_complete.json").write_text("{}")
    assert f"is a training checkpoint (what a run resumes from), not a run's final model. Fix: give the run's " \
           f"output_dir, {run}" in _one_line_error(capsys, [str(run / "checkpoint-4"), *ask])
    assert "holds no model (no config.json); it has checkpoints up to checkpoint-4" in _one_line_error(
        capsys, [str(run), *ask])
    assert "is a file, not a model folder" in _one_line_error(capsys, [str(tiny_dir / "config.json"), *ask])
    assert "--question and --context go together" in _one_line_error(capsys, [str(tiny_dir), "--question", "Who?"])
    assert "top_k=0: must be at least 1" in _one_line_error(capsys, [str(tiny_dir), *ask, "--top_k", "0"])


def test_the_model_card_says_what_the_model_is_how_good_and_how_to_ask_it(tmp_path):
    from qa.results.model_card import CARD, write_model_card

    env = {"config": {"model_name_or_path": "bundled:minilm", "dataset_name": "synthetic", "do_train": True,
                      "do_eval": True, "synthetic_train_examples": 1000, "synthetic_eval_examples": 300,
                      "per_device_train_batch_size": 16, "gradient_accumulation_steps": 1, "num_train_epochs": 2,
                      "max_steps": -1, "learning_rate": 3e-4, "warmup_steps": 0.1, "weight_decay": 0.0,
                      "max_seq_length": 128, "doc_stride": 32, "max_query_length": 32, "seed": 42},
           "distributed": {}, "started_utc": "2026-11-23T10:00:00+00:00", "host": "node1", "git_commit": "abc"}
    results = {"eval_f1": 94.71, "eval_exact_match": 93.33, "eval_examples": 300, "train_runtime": 131.2,
               "train_seconds_excluding_evaluation": 120.4, "eval_during_training_count": 8}
    write_model_card(tmp_path / "smoke", results, env, "CPU (2 cores)")
    card = (tmp_path / "smoke" / CARD).read_text()
    front, body = card.split("---\n")[1:3]
    assert "pipeline_tag: question-answering" in front and "base_model: sentence-transformers/all-MiniLM-L6-v2" in front
    assert "datasets:" not in front  # generated data is no Hub dataset
    for row in ("| base model | bundled:minilm |", "| training data | synthetic (1,000 generated questions) |",
                "| evaluation | F1 94.71 / EM 93.33 on 300 questions |", "| device | CPU (2 cores) |",
                "| training time | 131.2 s, of which 120.4 s training and the rest 8 evaluations during training |",
                "| recipe | 2 epochs, global batch 16 (per device 16 x 1 process(es) x accumulation 1), learning rate "
                "0.0003, warm-up 0.1, weight decay 0, fp32 matmuls; windows of 128 tokens, stride 32, questions cut "
                "at 32 tokens; seed 42 |"):
        assert row in body, row
    assert f"bert-squad-answer {tmp_path / 'smoke'} --question" in body and "from answer_qa import Answerer" in body
    assert rendering_problems(card) == []


def test_help_exits_0(capsys):
    from answer_qa import main

    assert main(["--help"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("usage: bert-squad-answer") and "--top_k" in out and "output_dir of a finished" in out
