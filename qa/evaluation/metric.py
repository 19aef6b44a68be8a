"""SQuAD v1.1 and v2.0 scores, computed exactly as the official evaluation scripts compute them
(the same normalisation, token-overlap F1, maximum over gold answers and float summation), so
the numbers compare with published ones to the last digit.

One deliberate difference: a question without a prediction scores 0 and counts in every
denominator, in both versions (the official v2.0 script leaves it out, or crashes). `main` is the
`score` command (README, "Scoring a predictions file")."""
import argparse
import collections
import json
import re
import string
import sys

from qa.data.sources import read_squad
from qa.data.synthetic import VERSION_1 as SYNTHETIC_V1
from qa.errors import InputError, command
from qa.io import read_json

# ---------------------------------------------------------------------------------------------
# Answer normalisation and per-answer scores
# ---------------------------------------------------------------------------------------------

_PUNCTUATION = frozenset(string.punctuation)
# \b is Unicode-aware for str patterns, as in the official scripts, so "éa" keeps its "a".
_ARTICLES = re.compile(r"\b(a|an|the)\b")


def normalize_answer(s: str) -> str:
    """Lowercase, drop ASCII punctuation, drop the articles a/an/the, collapse whitespace.

    The steps run in the official order: punctuation goes before articles, so "the-end" becomes
    "theend" and keeps its "the".
    """
    text = s.lower()
    text = "".join(ch for ch in text if ch not in _PUNCTUATION)
    text = _ARTICLES.sub(" ", text)
    return " ".join(text.split())


def _overlap_f1(pred_tokens, gold_tokens):
    """Token F1 of two non-empty bags of tokens; int 0 when they share nothing, like the official."""
    num_same = sum((collections.Counter(pred_tokens) & collections.Counter(gold_tokens)).values())
    if num_same == 0:
        return 0
    # Written as the official scripts write it; the algebraically equal 2*n/(p+g) can differ in
    # the last bit.
    precision = 1.0 * num_same / len(pred_tokens)
    recall = 1.0 * num_same / len(gold_tokens)
    return (2 * precision * recall) / (precision + recall)


def _v1_f1(prediction, gold):
    # v1.1 has no empty-answer rule: an empty side has no overlap and so scores 0.
    return _overlap_f1(normalize_answer(prediction).split(), normalize_answer(gold).split())


def _v2_f1(prediction, gold):
    pred_tokens = normalize_answer(prediction).split()
    gold_tokens = normalize_answer(gold).split()
    if not pred_tokens or not gold_tokens:
        # "No answer" on either side: full marks only when both say so.
        return int(pred_tokens == gold_tokens)
    return _overlap_f1(pred_tokens, gold_tokens)


def _v1_question_scores(prediction, golds):
    """(exact, f1) of one question under v1.1; exact is a bool, as the official sums bools."""
    normalized = normalize_answer(prediction)
    exact = max(normalized == normalize_answer(gold) for gold in golds)
    f1 = max(_v1_f1(prediction, gold) for gold in golds)
    return exact, f1


def _v2_question_scores(prediction, golds):
    """(exact, f1) of one question under v2.0, golds already passed through `_v2_golds`."""
    normalized = normalize_answer(prediction)
    exact = max(int(normalize_answer(gold) == normalized) for gold in golds)
    f1 = max(_v2_f1(prediction, gold) for gold in golds)
    return exact, f1


def _v2_golds(answer_texts):
    # Golds that normalise to nothing ("the", "!") cannot be matched by any real answer, so v2.0
    # drops them; a question left without golds expects the empty answer.
    return [text for text in answer_texts if normalize_answer(text)] or [""]


# ---------------------------------------------------------------------------------------------
# Dataset-level scores
#
# Every score is computed from (question id, gold answer texts) pairs in dataset order: the
# official JSON gives them through `_questions`, flat examples (the Hub's layout, the datasets the
# Trainer evaluates) through `_flat_questions`, and both feed the same functions.
# ---------------------------------------------------------------------------------------------

def _questions(dataset):
    """(id, gold answer texts) of every question of the official JSON's "data" list, in order."""
    for article in dataset:
        for paragraph in article["paragraphs"]:
            for qa in paragraph["qas"]:
                yield qa["id"], [answer["text"] for answer in qa["answers"]]


def _flat_questions(examples):
    """(id, gold answer texts) of flat examples: a datasets.Dataset, or dicts with "id" and
    "answers" = {"text": [...], ...}; for SQuAD v2.0 an empty text list means unanswerable."""
    if hasattr(examples, "with_format"):  # a datasets.Dataset: read whole columns, not row by row
        table = examples.with_format("arrow")
        ids = table["id"].to_pylist()
        texts = [a["text"] for a in table["answers"].to_pylist()]
        return list(zip(ids, texts))
    return [(example["id"], list(example["answers"]["text"])) for example in examples]


def _v1_scores(questions, predictions) -> dict:
    exact_total = f1_total = count = 0
    for qid, golds in questions:
        count += 1
        if qid not in predictions:
            continue
        if not golds:
            raise InputError(
                f"question {qid!r}", "has no gold answers, which SQuAD v1.1 scoring cannot score",
                "score it with the SQuAD v2.0 rules (version_2_with_negative), or drop the question")
        exact, f1 = _v1_question_scores(predictions[qid], golds)
        exact_total += exact
        f1_total += f1
    if count == 0:
        raise InputError("dataset", "contains no questions", "score a dataset that has questions")
    return {"exact_match": 100.0 * exact_total / count, "f1": 100.0 * f1_total / count}


def squad_v1_scores(dataset, predictions) -> dict:
    """{"exact_match", "f1"} in percent, as `evaluate-v1.1.py` computes them.

    `dataset` is the list under the official JSON's "data" key; `predictions` maps question id to
    answer text. A question without a prediction scores 0 (as in the official script).
    """
    return _v1_scores(_questions(dataset), predictions)


def _percentages(exact_scores, f1_scores, qids):
    # The builtin sum over values in dataset order, exactly as the official v2.0 script adds them.
    total = len(qids)
    return [
        ("exact", 100.0 * sum(exact_scores[qid] for qid in qids) / total),
        ("f1", 100.0 * sum(f1_scores[qid] for qid in qids) / total),
        ("total", total),
    ]


def _best_threshold(predictions, raw_scores, na_probs, has_answer):
    """(best score in percent, threshold) over all no-answer thresholds, as the official finds it.

    Start from "answer nothing" (every answerable question wrong, every unanswerable one right),
    then, in order of rising no-answer probability, switch each question to its own prediction.
    """
    # A question without a prediction is wrong at every threshold: it never counts as a correct
    # "no answer" and is never switched. (The official, whose scores lack such questions, would
    # count the unanswerable ones as right at the start.)
    score = sum(1 for qid, has in has_answer.items() if not has and qid in predictions)
    best_score, best_thresh = score, 0.0
    for qid in sorted(na_probs, key=lambda k: na_probs[k]):
        if qid not in raw_scores or qid not in predictions:
            continue
        if has_answer[qid]:
            score += raw_scores[qid]
        elif predictions[qid]:  # an unanswerable question answered: loses its point
            score -= 1
        if score > best_score:
            best_score, best_thresh = score, na_probs[qid]
    return 100.0 * best_score / len(raw_scores), best_thresh


def _v2_scores(questions, predictions, na_probs=None, na_prob_thresh=1.0) -> collections.OrderedDict:
    has_answer = {}  # dicts keyed by id, as the official's: a repeated id keeps one entry
    exact_raw, f1_raw = {}, {}
    for qid, golds in questions:
        has_answer[qid] = bool(golds)
        if qid in predictions:
            exact_raw[qid], f1_raw[qid] = _v2_question_scores(predictions[qid], _v2_golds(golds))
        else:
            exact_raw[qid] = f1_raw[qid] = 0  # see squad_v2_scores: wrong, but still counted
    if not exact_raw:
        raise InputError("dataset", "contains no questions", "score a dataset that has questions")

    probs = na_probs if na_probs is not None else {qid: 0.0 for qid in predictions}
    unknown = next((qid for qid in exact_raw if qid in predictions and qid not in probs), None)
    if unknown is not None:
        raise InputError("na_probs", f"has no probability for question {unknown!r}",
                         "give a no-answer probability for every predicted question")
    exact, f1 = {}, {}
    for qid in exact_raw:
        if qid in predictions and probs[qid] > na_prob_thresh:
            # Predicted "no answer": right exactly when the question has none.
            exact[qid] = f1[qid] = float(not has_answer[qid])
        else:
            exact[qid], f1[qid] = exact_raw[qid], f1_raw[qid]

    result = collections.OrderedDict(_percentages(exact, f1, list(exact)))
    for prefix, wanted in (("HasAns", True), ("NoAns", False)):
        qids = [qid for qid, has in has_answer.items() if has is wanted]
        if qids:
            result.update((f"{prefix}_{key}", value) for key, value in _percentages(exact, f1, qids))
    if na_probs is not None:
        result["best_exact"], result["best_exact_thresh"] = _best_threshold(
            predictions, exact_raw, na_probs, has_answer)
        result["best_f1"], result["best_f1_thresh"] = _best_threshold(
            predictions, f1_raw, na_probs, has_answer)
    return result


def squad_v2_scores(dataset, predictions, na_probs=None, na_prob_thresh=1.0) -> collections.OrderedDict:
    """The official `evaluate-v2.0.py` result, as an OrderedDict in its key order.

    exact, f1, total; then HasAns_exact/f1/total when some question has gold answers and
    NoAns_exact/f1/total when some has none; then, when `na_probs` (question id -> probability
    that it has no answer) is given, best_exact, best_exact_thresh, best_f1, best_f1_thresh.
    A question whose no-answer probability exceeds `na_prob_thresh` is scored as answered "".

    Deliberate difference from the official script: a question missing from `predictions` scores
    0 and stays in every total (the official drops it from `total`, or crashes).
    """
    return _v2_scores(_questions(dataset), predictions, na_probs, na_prob_thresh)


def _scores(questions, predictions, version_2_with_negative, na_probs, na_prob_thresh):
    if version_2_with_negative:
        return _v2_scores(questions, predictions, na_probs=na_probs, na_prob_thresh=na_prob_thresh)
    if na_probs is not None:
        raise ValueError("no-answer probabilities apply only to SQuAD v2.0 scoring")
    return _v1_scores(questions, predictions)


def squad_scores(dataset, predictions, version_2_with_negative: bool, na_probs=None, na_prob_thresh=1.0):
    """`squad_v2_scores` when `version_2_with_negative`, else `squad_v1_scores`."""
    return _scores(_questions(dataset), predictions, version_2_with_negative, na_probs, na_prob_thresh)


def scores_from_examples(examples, predictions, version_2_with_negative: bool,
                         na_probs=None, na_prob_thresh=1.0):
    """The same scores from flat examples (see `_flat_questions`), scored directly: the numbers
    equal the official JSON's for the same questions in the same order."""
    return _scores(_flat_questions(examples), predictions, version_2_with_negative, na_probs, na_prob_thresh)


# ---------------------------------------------------------------------------------------------
# Command line
# ---------------------------------------------------------------------------------------------

class _Parser(argparse.ArgumentParser):
    def error(self, message):
        # argparse would print usage plus a message over two lines; keep the one-line contract.
        raise InputError("command line", message, f"see '{self.prog} --help'")


def _parser():
    parser = _Parser(
        prog="utils_qa.py score",
        description="Score SQuAD predictions exactly as the official v1.1 / v2.0 evaluation "
                    "scripts do (the version is detected from the dataset).")
    parser.add_argument("dataset_file", help="official SQuAD dataset JSON (plain or .gz)")
    parser.add_argument("predictions_file", help="JSON object: question id -> answer text")
    parser.add_argument("--na-prob-file", "-n", default=None,
                        help="v2.0 only: JSON object, question id -> probability of no answer")
    parser.add_argument("--na-prob-thresh", "-t", type=float, default=1.0,
                        help='v2.0: predict "" when the no-answer probability exceeds this (default 1.0)')
    parser.add_argument("--only_predicted", "--only-predicted", action="store_true",
                        help="score only the questions that have a prediction (by default a question without "
                             "one scores 0 and counts in every total)")
    return parser


def _load_predictions(path):
    predictions = read_json(path, "predictions file")
    fix = "write a JSON object mapping each question id to its answer text"
    if not isinstance(predictions, dict):
        raise InputError(str(path), f"holds a JSON {_json_type(predictions)}, not an object", fix)
    for qid, answer in predictions.items():
        if not isinstance(answer, str):
            raise InputError(str(path), f"the answer for question {qid!r} is a JSON "
                                        f"{_json_type(answer)}, not a string", fix)
    return predictions


def _load_na_probs(path, qids, predictions):
    na_probs = read_json(path, "no-answer probability file")
    fix = "write a JSON object mapping each question id to its probability of having no answer"
    if not isinstance(na_probs, dict):
        raise InputError(str(path), f"holds a JSON {_json_type(na_probs)}, not an object", fix)
    for qid, prob in na_probs.items():
        if isinstance(prob, bool) or not isinstance(prob, (int, float)):
            raise InputError(str(path), f"the probability for question {qid!r} is a JSON "
                                        f"{_json_type(prob)}, not a number", fix)
    # Every answered question is compared with the threshold, so each needs a probability.
    for qid in qids:
        if qid in predictions and qid not in na_probs:
            raise InputError(str(path), f"has no probability for question {qid!r}", fix)
    return na_probs


def _json_type(value):
    """How JSON calls the type of a parsed value, for error messages."""
    names = {dict: "object", list: "array", str: "string", bool: "boolean", int: "number",
             float: "number", type(None): "null"}
    return names.get(type(value), type(value).__name__)


def _coverage_note(qids, predictions, args, version_2):
    """Stop when no prediction belongs to the dataset (an F1 of 0 would be printed as if real);
    when only some questions have a prediction, the one line that says how many (else None)."""
    missing = [qid for qid in qids if qid not in predictions]
    answered = len(qids) - len(missing)
    present = set(qids)
    extra = sum(1 for qid in predictions if qid not in present)
    if answered == 0:
        example = f" (e.g. {next(iter(predictions))!r} there, {qids[0]!r} here)" if predictions else ""
        raise InputError(str(args.dataset_file), f"none of its {len(qids)} questions has a prediction in "
                         f"{args.predictions_file}: 0 of {len(qids)} ids matched{example}",
                         "score the predictions made for this dataset (they are keyed by its question ids)")
    notes = []
    if missing and args.only_predicted:
        notes.append(f"--only_predicted: scoring the {answered} of {len(qids)} questions that have a prediction")
    elif missing:
        notes.append(f"{answered} of {len(qids)} questions have a prediction; the {len(missing)} without one (e.g. "
                     f"{missing[0]}) score 0 and stay in the totals"
                     + (" (the official v2.0 script would drop them or crash)" if version_2 else "")
                     + f"; --only_predicted scores the {answered} predicted ones only")
    if extra:
        notes.append(f"{extra} prediction id(s) are not questions of the dataset (ignored)")
    return "; ".join(notes) or None


def _score_files(args):
    # The project's one reader: the same layout checks and messages as training and evaluation
    # (answer positions are not checked: the metric compares texts).
    squad = read_squad(args.dataset_file, check_answer_spans=False)
    questions = _flat_questions(squad.dataset)
    predictions = _load_predictions(args.predictions_file)
    note = _coverage_note([qid for qid, _ in questions], predictions, args, squad.version_2)
    if args.only_predicted:
        questions = [(qid, golds) for qid, golds in questions if qid in predictions]
    qids = [qid for qid, _ in questions]
    if squad.version_2:
        na_probs = (_load_na_probs(args.na_prob_file, qids, predictions)
                    if args.na_prob_file is not None else None)
    else:
        if args.na_prob_file is not None:
            raise InputError(args.na_prob_file, "was given, but the dataset is SQuAD v1.1, which has "
                             "no unanswerable questions", "leave out --na-prob-file")
        if squad.version is not None and squad.version not in ("1.1", SYNTHETIC_V1):  # the project's own is 1.1
            print(f"Evaluation expects v-1.1, but got dataset with v-{squad.version}", file=sys.stderr)
        na_probs = None
    if note:  # after every check of the input: an error stays the only line
        print(note, file=sys.stderr)
    result = _scores(questions, predictions, squad.version_2, na_probs, args.na_prob_thresh)
    return json.dumps(result, indent=2) if squad.version_2 else json.dumps(result)


@command
def main(argv=None) -> int:
    """`score DATASET_FILE PREDICTIONS_FILE [--na-prob-file F] [--na-prob-thresh T] [--only_predicted]`.

    Prints what the official script of the dataset's version prints; returns 0, or 2 after a
    one-line `error: ...` on stderr for bad input.
    """
    args = _parser().parse_args(argv)  # --help: SystemExit(0), which `command` returns as 0
    print(_score_files(args))
    return 0


if __name__ == "__main__":
    sys.exit(main())
