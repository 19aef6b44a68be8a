"""Tests for utils_qa's metric: hand-computed SQuAD v1.1 / v2.0 scores, the `score` CLI, bad input, and
sanity checks on the real dev set when it is present."""
import collections
import gzip
import json
import re
import string

import pytest

import score_qa
import utils_qa
from qa.data.table import WHAT, table_from_document
from qa.io import read_json
from utils_qa import normalize_answer, scores_from_examples
from tests.helpers import DEV_SET as DEV_V11


def nested(*questions):
    """A one-article, one-paragraph dataset list from (id, [gold texts], is_impossible) tuples."""
    qas = [{"id": qid, "question": "?", "is_impossible": impossible,
            "answers": [{"text": text, "answer_start": 0} for text in golds]}
           for qid, golds, impossible in questions]
    return [{"title": "t", "paragraphs": [{"context": "c", "qas": qas}]}]


def flat(dataset):
    """The same questions as Hugging Face-style flat examples."""
    return [{"id": qa["id"], "answers": {"text": [a["text"] for a in qa["answers"]],
                                         "answer_start": [a["answer_start"] for a in qa["answers"]]}}
            for article in dataset for paragraph in article["paragraphs"] for qa in paragraph["qas"]]


def squad_scores(dataset, predictions, version_2, **kwargs):
    return scores_from_examples(flat(dataset), predictions, version_2, **kwargs)


def squad_v1_scores(dataset, predictions):
    return squad_scores(dataset, predictions, False)


def squad_v2_scores(dataset, predictions, **kwargs):
    return squad_scores(dataset, predictions, True, **kwargs)


# --------------------------------------------------------------------------------------------
# Normalisation
# --------------------------------------------------------------------------------------------

@pytest.mark.parametrize("text, expected", [
    ("The Cat!", "cat"),                             # lowercase, "!" dropped, article dropped
    ("  A  quick-brown   fox. ", "quickbrown fox"),   # "-" removed (no space), whitespace collapsed
    ("theory and an apple", "theory and apple"),     # "the" inside a word stays; "an" goes
    ("Anne's", "annes"),
    ("the-end", "theend"),                           # punctuation goes first, so "the" is no word
    ("Ça, the éa a", "ça éa"),                       # Unicode word boundaries: "éa" keeps its "a"
    ("The", ""),
    ("", ""),
])
def test_normalize_answer(text, expected):
    assert normalize_answer(text) == expected


# --------------------------------------------------------------------------------------------
# v1.1 by hand
# --------------------------------------------------------------------------------------------

V1_DATA = nested(
    ("q1", ["Denver Broncos", "The Denver Broncos"], False),
    ("q2", ["Santa Clara, California"], False),
    ("q3", ["1990", "in 1990"], False),
    ("q4", ["gold"], False),
    ("q5", ["missing"], False),
)
V1_PREDS = {
    "q1": "denver broncos.",   # EM 1, F1 1 (case and punctuation normalised away)
    "q2": "Santa Clara",       # EM 0; 2 shared of pred 2 / gold 3: P=1, R=2/3, F1=2PR/(P+R)=0.8
    "q3": "in 1990 season",    # vs "1990": P=1/3 R=1 F1=0.5; vs "in 1990": P=2/3 R=1 F1=0.8; max 0.8
    "q4": "",                  # empty prediction: EM 0, F1 0
    # q5 has no prediction: 0, but still in the denominator
}


def test_v1_hand_computed():
    result = squad_v1_scores(V1_DATA, V1_PREDS)
    assert list(result) == ["exact_match", "f1"]
    assert result["exact_match"] == pytest.approx(100.0 * 1 / 5)                   # 20.0
    assert result["f1"] == pytest.approx(100.0 * (1 + 0.8 + 0.8 + 0 + 0) / 5)      # 52.0


def test_v1_gold_that_normalises_to_nothing():
    # Gold "The" and prediction "a" both normalise to "": the strings match (EM 1), but v1.1 has no
    # empty-answer rule, so no token overlaps and F1 is 0. v2.0 gives F1 1 for the same pair.
    data = nested(("q", ["The"], False))
    assert squad_v1_scores(data, {"q": "a"}) == {"exact_match": 100.0, "f1": 0.0}
    v2 = squad_v2_scores(data, {"q": "a"})
    assert (v2["exact"], v2["f1"]) == (100.0, 100.0)


def test_v1_question_without_gold_answers_is_an_input_error():
    with pytest.raises(utils_qa.InputError, match="no gold answers"):
        squad_v1_scores(nested(("q", [], True)), {"q": "x"})


# --------------------------------------------------------------------------------------------
# v2.0 by hand
# --------------------------------------------------------------------------------------------

V2_DATA = nested(
    ("a1", ["France", "in France"], False),
    ("a2", ["10th and 11th centuries"], False),
    ("n3", [], True),
    ("n4", [], True),
    ("a5", ["the", "a"], False),   # answerable, but every gold normalises to "": gold becomes [""]
    ("a6", ["Rollo"], False),
)
V2_PREDS = {
    "a1": "France",           # EM 1, F1 1
    "a2": "11th centuries",   # EM 0; 2 shared of pred 2 / gold 4: P=1, R=1/2, F1=2/3
    "n3": "",                 # unanswerable, answered "": EM 1, F1 1
    "n4": "Rollo",            # unanswerable, answered: EM 0, F1 int(False)=0
    "a5": "The",              # normalises to "" like the gold "": EM 1, F1 1 (both sides empty)
    "a6": "",                 # answerable, answered "": EM 0, F1 0
}


def test_v2_hand_computed():
    result = squad_v2_scores(V2_DATA, V2_PREDS)
    assert isinstance(result, collections.OrderedDict)
    assert list(result) == ["exact", "f1", "total", "HasAns_exact", "HasAns_f1", "HasAns_total",
                            "NoAns_exact", "NoAns_f1", "NoAns_total"]
    expected = {
        "exact": 100.0 * (1 + 0 + 1 + 0 + 1 + 0) / 6,          # 50.0
        "f1": 100.0 * (1 + 2 / 3 + 1 + 0 + 1 + 0) / 6,         # 61.11...
        "total": 6,
        # a1, a2, a5, a6: "has answer" follows the raw answer list, even for a5
        "HasAns_exact": 100.0 * (1 + 0 + 1 + 0) / 4,           # 50.0
        "HasAns_f1": 100.0 * (1 + 2 / 3 + 1 + 0) / 4,          # 66.66...
        "HasAns_total": 4,
        "NoAns_exact": 100.0 * (1 + 0) / 2,                    # 50.0
        "NoAns_f1": 100.0 * (1 + 0) / 2,                       # 50.0
        "NoAns_total": 2,
    }
    assert result == pytest.approx(expected)


def test_v2_missing_prediction_is_wrong_and_stays_in_total():
    # Deliberate difference from the official script, which would drop n3 from the totals (or
    # crash): without a prediction n3 loses the EM/F1 of 1 it earned by answering "".
    preds = {k: v for k, v in V2_PREDS.items() if k != "n3"}
    result = squad_v2_scores(V2_DATA, preds)
    assert result["total"] == 6 and result["NoAns_total"] == 2
    assert result["exact"] == pytest.approx(100.0 * 2 / 6)       # a1, a5
    assert result["NoAns_exact"] == pytest.approx(0.0)           # n3 missing, n4 wrong
    assert result["HasAns_exact"] == pytest.approx(50.0)         # unchanged


def test_v2_groups_are_omitted_when_empty():
    only_noans = squad_v2_scores(nested(("n", [], True)), {"n": ""})
    assert list(only_noans) == ["exact", "f1", "total", "NoAns_exact", "NoAns_f1", "NoAns_total"]
    only_hasans = squad_v2_scores(nested(("a", ["x"], False)), {"a": "x"})
    assert list(only_hasans) == ["exact", "f1", "total", "HasAns_exact", "HasAns_f1", "HasAns_total"]


NA_DATA = nested(
    ("qA", ["x"], False),
    ("qB", ["z w"], False),
    ("qC", [], True),
    ("qD", [], True),
)
NA_PREDS = {"qA": "x",     # EM 1, F1 1
            "qB": "z y",   # EM 0, F1 0.5 (1 shared of 2 and 2)
            "qC": "w",     # unanswerable but answered: 0, 0
            "qD": ""}      # unanswerable, answered "": 1, 1
NA_PROBS = {"qA": 0.1, "qB": 0.8, "qC": 0.9, "qD": 0.2}


def test_v2_no_answer_probabilities():
    # Threshold 1.0: no probability exceeds it, so the raw scores count.
    #   exact = (1+0+0+1)/4 = 50, f1 = (1+0.5+0+1)/4 = 62.5
    # Best threshold, walking qA(0.1) qD(0.2) qB(0.8) qC(0.9) from "answer nothing" = 2 no-answers:
    #   exact: 2 -> 3 (qA, thresh 0.1) -> 3 -> 3 -> 2; best 3/4 = 75 at 0.1
    #   f1:    2 -> 3 (qA, 0.1) -> 3 -> 3.5 (qB, 0.8) -> 2.5;  best 3.5/4 = 87.5 at 0.8
    result = squad_v2_scores(NA_DATA, NA_PREDS, na_probs=NA_PROBS)
    assert list(result)[-4:] == ["best_exact", "best_exact_thresh", "best_f1", "best_f1_thresh"]
    assert result == pytest.approx({
        "exact": 50.0, "f1": 62.5, "total": 4,
        "HasAns_exact": 50.0, "HasAns_f1": 75.0, "HasAns_total": 2,
        "NoAns_exact": 50.0, "NoAns_f1": 50.0, "NoAns_total": 2,
        "best_exact": 75.0, "best_exact_thresh": 0.1, "best_f1": 87.5, "best_f1_thresh": 0.8})

    # Threshold 0.5: qB and qC count as answered "" -> qB 0.0, qC 1.0.
    #   exact = f1 = (1+0+1+1)/4 = 75; HasAns (1+0)/2 = 50; NoAns (1+1)/2 = 100
    result = squad_v2_scores(NA_DATA, NA_PREDS, na_probs=NA_PROBS, na_prob_thresh=0.5)
    assert (result["exact"], result["f1"]) == pytest.approx((75.0, 75.0))
    assert (result["HasAns_f1"], result["NoAns_exact"]) == pytest.approx((50.0, 100.0))


def test_v2_best_threshold_with_a_missing_prediction():
    # qE is unanswerable and unpredicted: it never counts as a correct "no answer", so the walk
    # starts from 2 (qC, qD) and divides by all 5 questions: exact 3/5 = 60, f1 3.5/5 = 70.
    data = nested(("qA", ["x"], False), ("qB", ["z w"], False), ("qC", [], True), ("qD", [], True),
                  ("qE", [], True))
    result = squad_v2_scores(data, NA_PREDS, na_probs=NA_PROBS)
    assert result["total"] == 5 and result["NoAns_total"] == 3
    assert result["exact"] == pytest.approx(100.0 * 2 / 5)
    assert (result["best_exact"], result["best_exact_thresh"]) == pytest.approx((60.0, 0.1))
    assert (result["best_f1"], result["best_f1_thresh"]) == pytest.approx((70.0, 0.8))


def test_a_datasets_table_gives_identical_numbers():
    from datasets import Dataset

    for data, preds, v2 in ((V1_DATA, V1_PREDS, False), (V2_DATA, V2_PREDS, True)):
        table = Dataset.from_list(flat(data))
        assert scores_from_examples(table, preds, v2) == squad_scores(data, preds, v2)


# --------------------------------------------------------------------------------------------
# The command line
# --------------------------------------------------------------------------------------------

def write_json(path, obj, compress=False):
    text = json.dumps(obj)
    if compress:
        with gzip.open(path, "wt", encoding="utf-8") as f:
            f.write(text)
    else:
        path.write_text(text, encoding="utf-8")
    return str(path)


def run_cli(capsys, *argv):
    code = score_qa.score(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_cli_help_exits_0(capsys):
    code, out, _ = run_cli(capsys, "--help")
    assert code == 0 and out.startswith("usage: bert-squad-score ") and "dataset_file" in out


def test_score_qa_runs_as_a_script(tmp_path):
    """`python score_qa.py DATASET PREDICTIONS`, the command without its installed name; utils_qa.py is no command."""
    import subprocess
    import sys

    from tests.helpers import REPO

    data = write_json(tmp_path / "dev.json", {"version": "1.1", "data": V1_DATA})
    preds = write_json(tmp_path / "preds.json", V1_PREDS)
    done = subprocess.run([sys.executable, str(REPO / "score_qa.py"), data, preds], capture_output=True, text=True)
    assert done.returncode == 0 and done.stdout == json.dumps(squad_v1_scores(V1_DATA, V1_PREDS)) + "\n", done
    bad = subprocess.run([sys.executable, str(REPO / "score_qa.py"), data], capture_output=True, text=True)
    assert bad.returncode == 2 and bad.stderr.startswith("error: command line: the following arguments are required: "
                                                         "predictions_file. Fix: see 'bert-squad-score --help'"), bad


@pytest.mark.parametrize("compress", [False, True])
def test_cli_v1_prints_the_official_line(tmp_path, capsys, compress):
    suffix = ".json.gz" if compress else ".json"
    data = write_json(tmp_path / ("dev" + suffix), {"version": "1.1", "data": V1_DATA}, compress)
    preds = write_json(tmp_path / "preds.json", V1_PREDS)
    code, out, err = run_cli(capsys, data, preds)
    assert code == 0
    # The official prints json.dumps of {"exact_match", "f1"} on one line.
    assert out == json.dumps(squad_v1_scores(V1_DATA, V1_PREDS)) + "\n"
    assert re.fullmatch(r'\{"exact_match": [0-9.e+-]+, "f1": [0-9.e+-]+\}\n', out)
    assert json.loads(out) == pytest.approx({"exact_match": 20.0, "f1": 52.0})
    # notes on stderr only, in one line: how many questions have a prediction, and the option
    assert err == ("4 of 5 questions have a prediction; the 1 without one (e.g. q5) score 0 and stay in the "
                   "totals; --only_predicted scores the 4 predicted ones only\n")


def test_cli_v1_dataset_with_other_version_warns(tmp_path, capsys):
    data = write_json(tmp_path / "dev.json", {"version": "1.0", "data": V1_DATA})
    preds = write_json(tmp_path / "preds.json", V1_PREDS)
    code, out, err = run_cli(capsys, data, preds)
    assert code == 0 and json.loads(out) == pytest.approx({"exact_match": 20.0, "f1": 52.0})
    assert "Evaluation expects v-1.1, but got dataset with v-1.0" in err


@pytest.mark.parametrize("compress", [False, True])
def test_cli_v2_prints_the_official_block(tmp_path, capsys, compress):
    # No version field: v2.0 is recognised by is_impossible.
    data = write_json(tmp_path / "dev.json", {"data": NA_DATA}, compress)
    preds = write_json(tmp_path / "preds.json", NA_PREDS)
    na = write_json(tmp_path / "na.json", NA_PROBS)
    code, out, err = run_cli(capsys, data, preds, "--na-prob-file", na, "--na-prob-thresh", "0.5")
    assert code == 0 and err == ""
    expected = squad_v2_scores(NA_DATA, NA_PREDS, na_probs=NA_PROBS, na_prob_thresh=0.5)
    assert out == json.dumps(expected, indent=2) + "\n"
    parsed = json.loads(out, object_pairs_hook=collections.OrderedDict)
    assert list(parsed) == list(expected)
    assert parsed["exact"] == pytest.approx(75.0) and parsed["best_f1"] == pytest.approx(87.5)


def test_cli_v2_by_version_field_without_na_probs(tmp_path, capsys):
    data = write_json(tmp_path / "dev.json", {"version": "v2.0", "data": nested(("a", ["x"], False))})
    preds = write_json(tmp_path / "preds.json", {"a": "x"})
    code, out, _ = run_cli(capsys, data, preds)
    assert code == 0
    assert out == json.dumps(collections.OrderedDict(
        [("exact", 100.0), ("f1", 100.0), ("total", 1),
         ("HasAns_exact", 100.0), ("HasAns_f1", 100.0), ("HasAns_total", 1)]), indent=2) + "\n"


def test_cli_predictions_for_another_dataset_are_an_error(tmp_path, capsys):
    """Ids that match none of the dataset's questions (the predictions of another dataset, or keys
    that are not question ids): one line naming how many matched, not an F1 of 0."""
    data = write_json(tmp_path / "dev.json", {"version": "1.1", "data": V1_DATA})
    for name, preds in (("other.json", {"x1": "denver", "x2": "1990"}), ("empty.json", {})):
        code, out, err = run_cli(capsys, data, write_json(tmp_path / name, preds))
        assert code == 2 and out == "", err
        assert err.count("\n") == 1, err
        assert err.startswith(f"error: {data}: none of its 5 questions has a prediction in "), err
        assert "0 of 5 ids matched" in err and ". Fix: score the predictions made for this dataset" in err, err
    code, _, err = run_cli(capsys, data, write_json(tmp_path / "other.json", {"x1": "denver"}))
    assert "(e.g. 'x1' there, 'q1' here)" in err


@pytest.mark.parametrize("version_2", [False, True], ids=["v1.1", "v2.0"])
def test_cli_only_predicted_scores_the_predicted_questions(tmp_path, capsys, version_2):
    """Some questions without a prediction: one line says how many; --only_predicted scores the
    predicted ones alone, as if the dataset held only them."""
    dataset, preds = (NA_DATA, {k: v for k, v in list(NA_PREDS.items())[:2]}) if version_2 else (V1_DATA, V1_PREDS)
    data = write_json(tmp_path / "dev.json", {"version": "v2.0" if version_2 else "1.1", "data": dataset})
    pred_file = write_json(tmp_path / "preds.json", {**preds, "stray": "x"})
    total = len(flat(dataset))
    code, out, err = run_cli(capsys, data, pred_file)
    assert code == 0 and err.count("\n") == 1, err
    assert err.startswith(f"{len(preds)} of {total} questions have a prediction;"), err
    assert "1 prediction id(s) are not questions of the dataset (ignored)" in err
    assert ("official v2.0 script would drop them" in err) == version_2
    code, out_only, err = run_cli(capsys, data, pred_file, "--only_predicted")
    assert code == 0 and err.count("\n") == 1
    assert err.startswith(f"--only_predicted: scoring the {len(preds)} of {total} questions that have a prediction")
    kept = [{**article, "paragraphs": [{**p, "qas": [qa for qa in p["qas"] if qa["id"] in preds]}
                                       for p in article["paragraphs"]]} for article in dataset]
    assert json.loads(out_only) == pytest.approx(dict(squad_scores(kept, preds, version_2)))
    assert json.loads(out_only) != json.loads(out)
    if not version_2:  # q1..q4 predicted: EM 1/4, F1 (1 + 0.8 + 0.8 + 0)/4
        assert json.loads(out_only) == pytest.approx({"exact_match": 25.0, "f1": 65.0})


def bad_inputs(tmp):
    """(name, argv, the file the error must name) for every kind of bad input."""
    good_v1 = write_json(tmp / "good1.json", {"version": "1.1", "data": V1_DATA})
    good_v2 = write_json(tmp / "good2.json", {"version": "v2.0", "data": NA_DATA})
    preds = write_json(tmp / "preds.json", V1_PREDS)
    preds2 = write_json(tmp / "preds2.json", NA_PREDS)

    def text(name, content):
        (tmp / name).write_text(content, encoding="utf-8")
        return str(tmp / name)

    truncated = tmp / "cut.json.gz"
    truncated.write_bytes(gzip.compress(json.dumps({"data": V1_DATA}).encode())[:40])
    cases = [
        ("missing dataset", [str(tmp / "nope.json"), preds], str(tmp / "nope.json")),
        ("missing predictions", [good_v1, str(tmp / "nope.json")], str(tmp / "nope.json")),
        ("dataset is a directory", [str(tmp), preds], str(tmp)),
        ("malformed dataset", [text("bad.json", '{"data": ['), preds], "bad.json"),
        ("malformed predictions", [good_v1, text("badp.json", "{'q1': 'x'}")], "badp.json"),
        ("truncated gzip", [str(truncated), preds], "cut.json.gz"),
        ("not UTF-8", [good_v1, str(tmp / "latin.json")], "latin.json"),
        ("predictions a list", [good_v1, text("list.json", '["x"]')], "list.json"),
        ("prediction not a string", [good_v1, text("num.json", '{"q1": 3}')], "num.json"),
        ("dataset a list", [text("dlist.json", "[]"), preds], "dlist.json"),
        ("no data key", [text("nodata.json", '{"version": "1.1"}'), preds], "nodata.json"),
        ("no paragraphs", [text("nopar.json", '{"data": [{"title": "t"}]}'), preds], "nopar.json"),
        ("no qas", [text("noqas.json", '{"data": [{"paragraphs": [{"context": "c"}]}]}'), preds],
         "noqas.json"),
        ("question without id", [text("noid.json", '{"data": [{"paragraphs": [{"qas": [{"answers": []}]}]}]}'),
                                 preds], "noid.json"),
        ("answer without text", [text("notext.json", '{"data": [{"paragraphs": [{"qas": '
                                      '[{"id": "q1", "answers": [{"answer_start": 0}]}]}]}]}'), preds],
         "notext.json"),
        ("no questions", [text("empty.json", '{"data": []}'), preds], "empty.json"),
        ("v1 question without answers", [text("noans.json", '{"data": [{"paragraphs": [{"qas": '
                                              '[{"id": "q1", "answers": []}]}]}]}'), preds], "noans.json"),
        ("na probs for v1", [good_v1, preds, "--na-prob-file", text("na1.json", "{}")], "na1.json"),
        ("na probs not numbers", [good_v2, preds2, "--na-prob-file",
                                  text("nastr.json", json.dumps({**NA_PROBS, "qA": "high"}))], "nastr.json"),
        ("na probs incomplete", [good_v2, preds2, "--na-prob-file",
                                 text("napart.json", '{"qA": 0.5}')], "napart.json"),
        ("missing na-prob file", [good_v2, preds2, "--na-prob-file", str(tmp / "nona.json")], "nona.json"),
        ("bad threshold", [good_v2, preds2, "--na-prob-thresh", "high"], "command line"),
        ("missing arguments", [good_v2], "command line"),
    ]
    (tmp / "latin.json").write_bytes('{"q1": "caf\xe9"}'.encode("latin-1"))
    return cases


def test_cli_bad_input_exits_2_with_one_line(tmp_path, capsys):
    for name, argv, culprit in bad_inputs(tmp_path):
        code, out, err = run_cli(capsys, *argv)
        assert code == 2, name
        assert out == "", name
        lines = err.splitlines()
        assert len(lines) == 1, (name, err)
        assert lines[0].startswith("error: ") and ". Fix: " in lines[0], (name, err)
        assert culprit in lines[0], (name, err)


# --------------------------------------------------------------------------------------------
# The real dev set (skipped when the shared data is not present)
# --------------------------------------------------------------------------------------------

needs_dev = pytest.mark.skipif(not DEV_V11.exists(), reason=f"SQuAD v1.1 dev set not found at {DEV_V11}")


def read_official_squad(path) -> dict:
    """The official (nested) SQuAD JSON as parsed, after the layout checks every reader applies."""
    obj = read_json(path, WHAT)
    table_from_document(obj, str(path), require_answers=True)
    return obj


def is_squad_v2(squad_json: dict) -> bool:
    """Whether parsed official SQuAD JSON is v2.0: version "v2.0", or some question is_impossible."""
    return squad_json.get("version") == "v2.0" or any(
        qa.get("is_impossible") is True for article in squad_json["data"]
        for paragraph in article["paragraphs"] for qa in paragraph["qas"])


@pytest.fixture(scope="module")
def dev():
    return read_official_squad(DEV_V11)


def dev_questions(dev):
    return [qa for article in dev["data"] for paragraph in article["paragraphs"] for qa in paragraph["qas"]]


@needs_dev
def test_dev_first_gold_scores_100(dev):
    assert not is_squad_v2(dev)
    preds = {qa["id"]: qa["answers"][0]["text"] for qa in dev_questions(dev)}
    assert squad_v1_scores(dev["data"], preds) == {"exact_match": 100.0, "f1": 100.0}


def simple_scores(questions, preds):
    """A plain, separately written EM/F1 (as fractions of 1) to check the module against."""
    table = str.maketrans("", "", string.punctuation)

    def tokens(s):
        return re.sub(r"\b(a|an|the)\b", " ", s.lower().translate(table)).split()

    ems, f1s = [], []
    for qa in questions:
        pred = tokens(preds[qa["id"]])
        golds = [tokens(a["text"]) for a in qa["answers"]]
        ems.append(max(float(pred == gold) for gold in golds))
        best = 0.0
        for gold in golds:
            shared = sum((collections.Counter(pred) & collections.Counter(gold)).values())
            if shared:
                best = max(best, 2 * shared / (len(pred) + len(gold)))
        f1s.append(best)
    return sum(ems) / len(ems), sum(f1s) / len(f1s)


# Predicting each question's first gold answer's first word, as scored by the official
# evaluate-v1.1.py (37.05771050141911, 65.54582990625173), rounded.
EXPECTED_FIRST_WORD_EM = 37.057711
EXPECTED_FIRST_WORD_F1 = 65.54583


@needs_dev
def test_dev_first_word_matches_a_simple_computation(dev, tmp_path, capsys):
    questions = dev_questions(dev)
    preds = {qa["id"]: qa["answers"][0]["text"].split()[0] for qa in questions}
    result = squad_v1_scores(dev["data"], preds)
    em, f1 = simple_scores(questions, preds)
    assert result["exact_match"] == pytest.approx(100 * em, rel=1e-12)
    assert result["f1"] == pytest.approx(100 * f1, rel=1e-12)
    # Pinned, so that a change to either computation shows up.
    assert round(result["exact_match"], 6) == EXPECTED_FIRST_WORD_EM
    assert round(result["f1"], 6) == EXPECTED_FIRST_WORD_F1

    # The CLI reads the .gz dataset directly and prints the same line.
    pred_file = write_json(tmp_path / "preds.json", preds)
    code, out, _ = run_cli(capsys, str(DEV_V11), pred_file)
    assert code == 0 and out == json.dumps(result) + "\n"



@needs_dev
def test_files_in_swapped_order_are_named_as_such_in_one_short_line(tmp_path, capsys):
    """The real dev set and predictions for it, given predictions first: one line under 300 characters that says the
    order is swapped (not thousands of question ids from the predictions file read as a dataset's top level)."""
    from score_qa import score as main

    predictions = tmp_path / "predictions.json"
    dev = read_official_squad(DEV_V11)["data"]
    predictions.write_text(json.dumps({qa["id"]: qa["answers"][0]["text"] for article in dev
                                       for paragraph in article["paragraphs"] for qa in paragraph["qas"]}))
    assert main([str(predictions), str(DEV_V11)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and len(err[0]) < 300, (len(err[0]), err[0][:400])
    assert err[0].startswith(f"error: {predictions}: holds predictions") and "swapped order" in err[0]
    assert err[0].endswith("Fix: give the dataset first: bert-squad-score DATASET_FILE PREDICTIONS_FILE")
    assert main([str(DEV_V11), str(predictions)]) == 0  # that order scores them
    assert json.loads(capsys.readouterr().out) == {"exact_match": 100.0, "f1": 100.0}
