"""SQuAD v1.1 and v2.0 scores, computed exactly as the official evaluation scripts compute them (the same
normalisation, token-overlap F1, maximum over gold answers and float summation), so the numbers compare
with published ones to the last digit. One deliberate difference: a question without a prediction scores 0
and counts in every denominator, in both versions (the official v2.0 script leaves it out, or crashes).

As a command (installed as bert-squad-score too) it scores a predictions file as the official scripts do:

    python -m qa.evaluation.metric DATASET_FILE PREDICTIONS_FILE [--na-prob-file F] [--na-prob-thresh T]

DATASET_FILE: official SQuAD JSON (v1.1 or v2.0, plain or .gz) or another layout the project reads;
PREDICTIONS_FILE maps question id -> answer text. It prints what the official script of that version prints."""
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

_PUNCTUATION = frozenset(string.punctuation)
# \b is Unicode-aware for str patterns, as in the official scripts, so "éa" keeps its "a".
_ARTICLES = re.compile(r"\b(a|an|the)\b")


def normalize_answer(s: str) -> str:
    """Lowercase, drop ASCII punctuation, then the articles a/an/the, collapse whitespace: in the official
    order, so "the-end" becomes "theend" and keeps its "the"."""
    text = "".join(ch for ch in s.lower() if ch not in _PUNCTUATION)
    return " ".join(_ARTICLES.sub(" ", text).split())


def _f1(prediction: str, gold: str, version_2: bool):
    pred_tokens, gold_tokens = normalize_answer(prediction).split(), normalize_answer(gold).split()
    if version_2 and not (pred_tokens and gold_tokens):
        return int(pred_tokens == gold_tokens)  # "no answer" on either side: right only when both say so
    num_same = sum((collections.Counter(pred_tokens) & collections.Counter(gold_tokens)).values())
    if num_same == 0:
        return 0
    # As the official scripts write it: the algebraically equal 2*n/(p+g) can differ in the last bit.
    precision = 1.0 * num_same / len(pred_tokens)
    recall = 1.0 * num_same / len(gold_tokens)
    return (2 * precision * recall) / (precision + recall)


def _question_scores(prediction: str, golds: list, version_2: bool):
    """(exact, f1) of one question. v2.0 drops golds that normalise to nothing ("the", "!"), which no real
    answer can match; a question left without golds expects the empty answer."""
    if version_2:
        golds = [gold for gold in golds if normalize_answer(gold)] or [""]
    normalized = normalize_answer(prediction)
    exact = int(max(normalize_answer(gold) == normalized for gold in golds))
    return exact, max(_f1(prediction, gold, version_2) for gold in golds)


def _questions(examples) -> list:
    """(id, gold answer texts) of flat examples: a datasets.Dataset, or dicts with "id" and "answers" =
    {"text": [...], ...}; for SQuAD v2.0 an empty text list means unanswerable."""
    if hasattr(examples, "with_format"):  # a datasets.Dataset: whole columns, not row by row
        table = examples.with_format("arrow")
        return list(zip(table["id"].to_pylist(), [a["text"] for a in table["answers"].to_pylist()]))
    return [(example["id"], list(example["answers"]["text"])) for example in examples]


def _v1_scores(questions, predictions) -> dict:
    if not questions:
        raise InputError("dataset", "contains no questions", "score a dataset that has questions")
    exact_total = f1_total = 0
    for qid, golds in questions:
        if qid not in predictions:
            continue
        if not golds:
            raise InputError(f"question {qid!r}", "has no gold answers, which SQuAD v1.1 scoring cannot score",
                             "score it with the SQuAD v2.0 rules (version_2_with_negative), or drop the question")
        exact, f1 = _question_scores(predictions[qid], golds, version_2=False)
        exact_total += exact
        f1_total += f1
    return {"exact_match": 100.0 * exact_total / len(questions), "f1": 100.0 * f1_total / len(questions)}


def _percentages(exact_scores, f1_scores, qids):
    # The builtin sum over values in dataset order, exactly as the official v2.0 script adds them.
    return [("exact", 100.0 * sum(exact_scores[qid] for qid in qids) / len(qids)),
            ("f1", 100.0 * sum(f1_scores[qid] for qid in qids) / len(qids)), ("total", len(qids))]


def _best_threshold(predictions, raw_scores, na_probs, has_answer):
    """(best score in percent, threshold) over all no-answer thresholds, as the official finds it: from
    "answer nothing", switch each question to its prediction in order of rising no-answer probability."""
    # A question without a prediction is wrong at every threshold: never a correct "no answer", never switched.
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
    """The official evaluate-v2.0.py result in its key order: exact, f1, total, then HasAns_* and NoAns_*
    when such questions exist, then best_exact(_thresh) and best_f1(_thresh) when `na_probs` (question id
    -> probability of no answer) is given. Above `na_prob_thresh` a question counts as answered ""."""
    has_answer, exact_raw, f1_raw = {}, {}, {}  # keyed by id, as the official's: a repeated id keeps one entry
    for qid, golds in questions:
        has_answer[qid] = bool(golds)
        exact_raw[qid], f1_raw[qid] = (_question_scores(predictions[qid], golds, version_2=True)
                                       if qid in predictions else (0, 0))
    if not exact_raw:
        raise InputError("dataset", "contains no questions", "score a dataset that has questions")
    exact, f1 = dict(exact_raw), dict(f1_raw)
    for qid in exact_raw:
        if qid in predictions and (na_probs or {}).get(qid, 0.0) > na_prob_thresh:
            exact[qid] = f1[qid] = float(not has_answer[qid])  # predicted "no answer"

    result = collections.OrderedDict(_percentages(exact, f1, list(exact)))
    for prefix, wanted in (("HasAns", True), ("NoAns", False)):
        qids = [qid for qid, has in has_answer.items() if has is wanted]
        if qids:
            result.update((f"{prefix}_{key}", value) for key, value in _percentages(exact, f1, qids))
    if na_probs is not None:
        result["best_exact"], result["best_exact_thresh"] = _best_threshold(predictions, exact_raw, na_probs,
                                                                            has_answer)
        result["best_f1"], result["best_f1_thresh"] = _best_threshold(predictions, f1_raw, na_probs, has_answer)
    return result


def scores_from_examples(examples, predictions, version_2_with_negative: bool, na_probs=None, na_prob_thresh=1.0):
    """{"exact_match", "f1"} in percent as evaluate-v1.1.py computes them, or evaluate-v2.0.py's result
    (_v2_scores) when `version_2_with_negative`, from flat examples (see _questions) and `predictions`
    (question id -> answer text)."""
    questions = _questions(examples)
    if version_2_with_negative:
        return _v2_scores(questions, predictions, na_probs, na_prob_thresh)
    return _v1_scores(questions, predictions)


class _Parser(argparse.ArgumentParser):
    def error(self, message):
        # argparse would print usage plus a message over two lines; keep the one-line contract.
        raise InputError("command line", message, f"see '{self.prog} --help'")


def _parser():
    parser = _Parser(prog="python -m qa.evaluation.metric", description="Score SQuAD predictions as the official "
                     "v1.1 / v2.0 evaluation scripts do (the version is the dataset's).")
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


def _json_type(value) -> str:
    names = {dict: "object", list: "array", str: "string", bool: "boolean", int: "number", float: "number"}
    return names.get(type(value), "null")


def _read_mapping(path, what: str, value_name: str, kind: str, fix: str) -> dict:
    """The JSON object in `path`, question id -> a JSON `kind` ("string" or "number") for each."""
    mapping = read_json(path, what)
    if not isinstance(mapping, dict):
        raise InputError(str(path), f"holds a JSON {_json_type(mapping)}, not an object", fix)
    for qid, value in mapping.items():
        if _json_type(value) != kind:
            raise InputError(str(path), f"the {value_name} for question {qid!r} is a JSON {_json_type(value)}, "
                                        f"not a {kind}", fix)
    return mapping


def _coverage_note(qids, predictions, args, version_2):
    """Stop when no prediction belongs to the dataset (an F1 of 0 would be printed as if real); when only
    some questions have one, the line that says how many (else None)."""
    missing = [qid for qid in qids if qid not in predictions]
    answered = len(qids) - len(missing)
    extra = len(set(predictions) - set(qids))
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


def _looks_like_predictions(path) -> bool:
    """A JSON object of strings only, as a predictions file is (a dataset has lists and objects)."""
    try:
        found = read_json(path, "dataset file")
    except InputError:
        return False
    return isinstance(found, dict) and bool(found) and all(isinstance(v, str) for v in found.values())


def _score_files(args) -> str:
    # The project's one reader, with its layout checks and messages (answer positions are not checked:
    # the metric compares texts).
    try:
        squad = read_squad(args.dataset_file, check_answer_spans=False)
    except InputError:
        if _looks_like_predictions(args.dataset_file):
            raise InputError(str(args.dataset_file), "holds predictions (question id -> answer text), not a dataset: "
                             "the two files are likely given in swapped order", "give the dataset first: "
                             "bert-squad-score DATASET_FILE PREDICTIONS_FILE") from None
        raise
    questions = _questions(squad.dataset)
    predictions = _read_mapping(args.predictions_file, "predictions file", "answer", "string",
                                "write a JSON object mapping each question id to its answer text")
    note = _coverage_note([qid for qid, _ in questions], predictions, args, squad.version_2)
    if args.only_predicted:
        questions = [(qid, golds) for qid, golds in questions if qid in predictions]
    na_probs = None
    if args.na_prob_file is not None and not squad.version_2:
        raise InputError(args.na_prob_file, "was given, but the dataset is SQuAD v1.1, which has no unanswerable "
                         "questions", "leave out --na-prob-file")
    if args.na_prob_file is not None:
        fix = "write a JSON object mapping each question id to its probability of having no answer"
        na_probs = _read_mapping(args.na_prob_file, "no-answer probability file", "probability", "number", fix)
        # Every answered question is compared with the threshold, so each needs a probability.
        unknown = next((qid for qid, _ in questions if qid in predictions and qid not in na_probs), None)
        if unknown is not None:
            raise InputError(args.na_prob_file, f"has no probability for question {unknown!r}", fix)
    if not squad.version_2 and squad.version not in (None, "1.1", SYNTHETIC_V1):  # the project's own is 1.1
        print(f"Evaluation expects v-1.1, but got dataset with v-{squad.version}", file=sys.stderr)
    if note:  # after every check of the input: an error stays the only line
        print(note, file=sys.stderr)
    if squad.version_2:
        return json.dumps(_v2_scores(questions, predictions, na_probs, args.na_prob_thresh), indent=2)
    return json.dumps(_v1_scores(questions, predictions))


@command
def main(argv=None) -> int:
    """Prints the scores; 0, or 2 after a one-line `error: ...` on stderr for bad input."""
    print(_score_files(_parser().parse_args(argv)))  # --help: SystemExit(0), which `command` returns as 0
    return 0


if __name__ == "__main__":
    sys.exit(main())
