#!/usr/bin/env python
"""SQuAD pre- and post-processing and the official metric, as plain functions.

The functions live in small modules under qa/ and are gathered here, where users of the
Hugging Face examples look for them. As a command, it scores a predictions file the way the
official evaluation scripts do:

    python utils_qa.py score DATASET_FILE PREDICTIONS_FILE [--na-prob-file F] [--na-prob-thresh T]

DATASET_FILE is an official SQuAD JSON (v1.1 or v2.0, plain or .gz); PREDICTIONS_FILE maps
question id -> answer text. It prints one JSON object, as the official script of that version.
"""
import sys

from qa.data.features import (  # noqa: F401
    answer_token_span, check_tokenizer, prepare_train_features, prepare_validation_features, question_first,
    truncate_questions)
from qa.evaluation.metric import (  # noqa: F401
    normalize_answer, scores_from_examples, squad_scores, squad_v1_scores, squad_v2_scores)
from qa.evaluation.postprocess import postprocess_qa_predictions  # noqa: F401
from qa.arguments import check_window  # noqa: F401


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] in (["-h"], ["--help"]):  # asked for: the help on stdout, and success
        print(__doc__.strip())
        return 0
    if not argv or argv[0] != "score":
        print(__doc__.strip(), file=sys.stderr)
        return 2
    from qa.evaluation.metric import main as score_main

    return score_main(argv[1:])


if __name__ == "__main__":
    sys.exit(main())
