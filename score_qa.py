"""The scoring command, bert-squad-score (or `python score_qa.py`): SQuAD predictions scored by utils_qa's metric, with
the checks and notes of a command run by hand (docs/running.md, "Scoring a predictions file"). Beside answer_qa.py,
not in utils_qa.py: a training run never parses it, and utils_qa imports nothing from here."""
import argparse
import json
import sys

from qa.errors import InputError, command
from utils_qa import scores_from_examples  # first: it checks that the environment is active
from qa.data.sources import read_squad
from qa.data.synthetic import VERSION_1 as SYNTHETIC_V1
from qa.io import read_json


class _Parser(argparse.ArgumentParser):
    def error(self, message):
        # argparse would print usage plus a message over two lines; keep the one-line contract.
        raise InputError("command line", message, f"see '{self.prog} --help'")


def _parser():
    parser = _Parser(prog="bert-squad-score", description="Score SQuAD predictions as the official v1.1 / v2.0 "
                                                          "evaluation scripts do (the version is the dataset's).")
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
    examples = squad.dataset
    qids = examples.with_format("arrow")["id"].to_pylist()
    predictions = _read_mapping(args.predictions_file, "predictions file", "answer", "string",
                                "write a JSON object mapping each question id to its answer text")
    note = _coverage_note(qids, predictions, args, squad.version_2)
    if args.only_predicted:
        examples = examples.select([i for i, qid in enumerate(qids) if qid in predictions])
    na_probs = None
    if args.na_prob_file is not None and not squad.version_2:
        raise InputError(args.na_prob_file, "was given, but the dataset is SQuAD v1.1, which has no unanswerable "
                         "questions", "leave out --na-prob-file")
    if args.na_prob_file is not None:
        fix = "write a JSON object mapping each question id to its probability of having no answer"
        na_probs = _read_mapping(args.na_prob_file, "no-answer probability file", "probability", "number", fix)
        # Every answered question is compared with the threshold, so each needs a probability.
        unknown = next((qid for qid in qids if qid in predictions and qid not in na_probs), None)
        if unknown is not None:
            raise InputError(args.na_prob_file, f"has no probability for question {unknown!r}", fix)
    if not squad.version_2 and squad.version not in (None, "1.1", SYNTHETIC_V1):  # the project's own is 1.1
        print(f"Evaluation expects v-1.1, but got dataset with v-{squad.version}", file=sys.stderr)
    if note:  # after every check of the input: an error stays the only line
        print(note, file=sys.stderr)
    scores = scores_from_examples(examples, predictions, squad.version_2, na_probs, args.na_prob_thresh)
    return json.dumps(scores, indent=2 if squad.version_2 else None)


@command
def main(argv=None) -> int:
    """bert-squad-score DATASET_FILE PREDICTIONS_FILE ...: prints the scores; 0, or 2 after a one-line `error: ...` on
    stderr for bad input."""
    print(_score_files(_parser().parse_args(argv)))  # --help: SystemExit(0), which `command` returns as 0
    return 0


score = main  # the installed command's entry point (pyproject.toml)

if __name__ == "__main__":
    sys.exit(main())
