"""The plain loop of the well-known Hugging Face example's post-processing: the oracle that
utils_qa.rank_answers, the vectorised version, must equal (tests/test_postprocess.py) and the baseline
bench/bench_postprocess.py times it against."""
import collections

import numpy as np

from utils_qa import _column, best_valid_span, check_inputs, collect, finish, warn_featureless


def postprocess_qa_predictions_reference(examples, features, all_start_logits, all_end_logits, *,
                                         version_2_with_negative=False, n_best_size=20,
                                         max_answer_length=30, null_score_diff_threshold=0.0,
                                         output_dir=None, prefix=None):
    """The plain loop version of `postprocess_qa_predictions` (same arguments, same results),
    and the specification both follow.

    Per window: the `n_best_size` highest start and end positions among its first
    `len(offset_mapping)` tokens (ties: lower position first); a (start, end) pair is a candidate
    when both are context tokens (offset not None), end >= start and end - start + 1 <=
    max_answer_length; score start_logit + end_logit, text context[offsets[start][0]:
    offsets[end][1]]. A question's candidates from all its windows are ranked by score (ties:
    window order, then start rank, then end rank) and the best `n_best_size` kept.
    SQuAD v2: the null score is the smallest start_logits[0] + end_logits[0] over the question's
    windows; a "" entry with it joins the n-best (after candidates of equal score, kept even below
    the top n_best_size); null_odds = null score - best non-null score, and the prediction is ""
    when null_odds > null_score_diff_threshold. SQuAD v1.1: a question with no valid pair among
    those positions gets the best valid span over all positions of its windows (best_valid_span).
    SQuAD v2 without a valid span, or a question without any window (with a warning), is answered
    "" with the fallback entry {"text": "", score 0}, which also stands as its best non-null score
    in null_odds.
    """
    ids, contexts = _column(examples, "id"), _column(examples, "context")
    feature_example_ids = _column(features, "example_id")
    offsets = _column(features, "offset_mapping")
    all_start_logits, all_end_logits = np.asarray(all_start_logits), np.asarray(all_end_logits)
    check_inputs(ids, feature_example_ids, all_start_logits, all_end_logits, n_best_size)
    features_of = collections.defaultdict(list)
    for f, example_id in enumerate(feature_example_ids):
        features_of[example_id].append(f)
    warn_featureless(ids, [not features_of[i] for i in ids])

    def top(logits):  # positions of the n_best_size highest logits, ties by position
        return np.argsort(-logits, kind="stable")[:n_best_size]

    outputs = []
    for example_id, context in zip(ids, contexts):
        candidates, null = [], None
        for f in features_of[example_id]:
            n = min(len(offsets[f]), all_start_logits.shape[1])
            start_logits, end_logits = all_start_logits[f][:n], all_end_logits[f][:n]
            if null is None or start_logits[0] + end_logits[0] < null[0]:
                null = (float(start_logits[0] + end_logits[0]), float(start_logits[0]),
                        float(end_logits[0]), None)
            for s in top(start_logits):
                for e in top(end_logits):
                    if offsets[f][s] is None or offsets[f][e] is None:
                        continue
                    if e < s or e - s + 1 > max_answer_length:
                        continue
                    candidates.append((float(start_logits[s] + end_logits[e]),
                                       float(start_logits[s]), float(end_logits[e]),
                                       (offsets[f][s][0], offsets[f][e][1])))
        if version_2_with_negative and null is not None:
            candidates.append(null)
        ranked = sorted(candidates, key=lambda c: -c[0])[:n_best_size]  # stable: ties keep order
        if not version_2_with_negative and not ranked and features_of[example_id]:
            rows = features_of[example_id]
            found = best_valid_span([offsets[f] for f in rows], all_start_logits[rows], all_end_logits[rows],
                                    max_answer_length)
            ranked = [found] if found else []
        if version_2_with_negative and null is not None and not any(c[3] is None for c in ranked):
            ranked.append(null)
        outputs.append(finish(context, ranked, null and null[0], version_2_with_negative,
                               null_score_diff_threshold))
    return collect(ids, outputs, version_2_with_negative, output_dir, prefix)
