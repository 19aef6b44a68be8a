"""Start/end logits over tokenized features (windows) into answer texts, SQuAD v1.1 and v2.0: the plain loop
of the well-known Hugging Face example (tests/postprocess_reference.py, whose docstring is the specification,
ties and fallbacks included), vectorised with numpy: the 10,784 dev features in under a second."""
import logging
import math
import os
from dataclasses import asdict, dataclass, fields

import numpy as np
import pyarrow as pa

from qa.io import atomic_write_json

logger = logging.getLogger(__name__)

_FALLBACK = (0.0, 0.0, 0.0, (0, 0))  # (score, start_logit, end_logit, char span): the empty answer


def _column(table, name) -> list:
    """A whole column as a list: a datasets table's read at once, never row by row."""
    if hasattr(table, "with_format"):
        return table.with_format("arrow")[name].to_pylist()
    return list(table[name])


def _offsets(features) -> pa.ListArray:
    """The offset_mapping column as one Arrow array: per feature a list of [start, end] pairs or nulls."""
    if hasattr(features, "with_format"):
        return features.with_format("arrow")["offset_mapping"].combine_chunks()
    return pa.array(features["offset_mapping"], type=pa.list_(pa.list_(pa.int64())))


def check_inputs(ids, feature_example_ids, start_logits, end_logits, n_best_size) -> None:
    if n_best_size < 1:
        raise ValueError(f"n_best_size must be at least 1, got {n_best_size}")
    n = len(feature_example_ids)
    if start_logits.shape != end_logits.shape or start_logits.ndim != 2 or len(start_logits) != n:
        raise ValueError(f"expected start and end logits of shape (n_features={n}, seq_len); got "
                         f"{start_logits.shape} and {end_logits.shape}")
    unknown = set(feature_example_ids) - set(ids)
    if unknown:
        raise ValueError(f"{len(unknown)} feature(s) belong to no example, e.g. example_id {next(iter(unknown))!r}")


def warn_featureless(ids, featureless) -> None:
    missing = [i for i, none in zip(ids, featureless) if none]
    if missing:
        logger.warning("%d example(s) have no features, so an empty prediction (e.g. %r): were "
                       "some windows dropped?", len(missing), missing[0])


def best_valid_span(offset_rows, start_rows, end_rows, max_answer_length):
    """v1.1 always has an answer: when none of the n_best pairs is valid (an undertrained model), the best
    valid span over every position of a question's windows, as a ranked entry; None when no window has a
    context token. Ties: the first window, the shorter span, the earlier start."""
    best = None
    for offsets, start, end in zip(offset_rows, start_rows, end_rows):
        n = min(len(offsets), len(start))
        context = np.array([o is not None for o in offsets[:n]], dtype=bool)
        start, end = np.where(context, start[:n], -np.inf), np.where(context, end[:n], -np.inf)
        for width in range(min(max_answer_length, n)):
            scores = start[:n - width] + end[width:]
            s = int(np.argmax(scores))
            if np.isfinite(scores[s]) and (best is None or scores[s] > best[0]):
                best = (float(scores[s]), float(start[s]), float(end[s + width]),
                        (offsets[s][0], offsets[s + width][1]))
    return best


def finish(context, ranked, null_score, version_2_with_negative, threshold):
    """(prediction, n-best entries, null_odds) of one question from its n-best `ranked`: (score,
    start_logit, end_logit, (char_start, char_end) or None for the null answer) tuples, best first."""
    best = next((c for c in ranked if c[3] is not None), None)
    if best is None:
        best = _FALLBACK
        ranked = sorted(ranked + [best], key=lambda c: -c[0])
    top = max(c[0] for c in ranked)
    exps = [math.exp(c[0] - top) for c in ranked]
    total = sum(exps)
    # Where in the context (characters, end excluded): a text can occur more than once.
    nbest = [{"text": "" if span is None else context[span[0]:span[1]],
              "answer_start": None if span is None else span[0], "answer_end": None if span is None else span[1],
              "probability": x / total, "start_logit": s, "end_logit": e}
             for (_, s, e, span), x in zip(ranked, exps)]
    best_text = context[best[3][0]:best[3][1]]
    if not version_2_with_negative:
        return best_text, nbest, None
    odds = (0.0 if null_score is None else null_score) - best[0]
    return ("" if odds > threshold else best_text), nbest, odds


def collect(ids, outputs, version_2_with_negative, output_dir, prefix):
    """(predictions, nbest, null_odds) keyed by example id, written to output_dir when given."""
    predictions = {i: out[0] for i, out in zip(ids, outputs)}
    nbest = {i: out[1] for i, out in zip(ids, outputs)}
    null_odds = {i: out[2] for i, out in zip(ids, outputs)} if version_2_with_negative else None
    if output_dir is not None:
        values = (predictions, nbest, null_odds) if version_2_with_negative else (predictions, nbest)
        for name, value in zip(("predictions.json", "nbest_predictions.json", "null_odds.json"), values):
            atomic_write_json(os.path.join(output_dir, name if prefix is None else f"{prefix}_{name}"), value, indent=4)
    return predictions, nbest, null_odds


def _offset_gather(column):
    """(lengths, gather) for the offsets: gather(idx, side) gives, for token idx[f, r] of each feature f,
    its start (side 0) or end (side 1) character and whether it is a context token, both shaped like idx.
    Positions past a feature's end are not context. No Python object per token."""
    lengths = column.value_lengths().fill_null(0).to_numpy()
    tokens = column.flatten()  # one entry per token: a [start, end] list, or null
    sizes = tokens.value_lengths().fill_null(0).to_numpy()
    values = np.append(tokens.flatten().to_numpy(), [-1, -1])
    first = np.minimum(np.cumsum(sizes) - sizes, len(values) - 2)
    chars = [np.append(values[first], -1), np.append(values[first + 1], -1)]
    is_context = np.append(tokens.is_valid().to_numpy(zero_copy_only=False), False)
    row_start = np.cumsum(lengths) - lengths

    def gather(idx, side):
        token = np.where(idx < lengths[:, None], row_start[:, None] + idx, len(is_context) - 1)
        return chars[side][token], is_context[token]
    return lengths, gather


def _top_positions(logits, lengths, k):
    """Per row, the positions of the k highest logits among the first lengths[f], best first, ties by
    position: np.argsort(-row[:length], kind="stable")[:k] for every row at once."""
    n, seq_len = logits.shape
    if (lengths < seq_len).any():
        logits = np.where(np.arange(seq_len) >= lengths[:, None], -np.inf, logits)
    if k >= seq_len:
        return np.argsort(-logits, axis=1, kind="stable")
    kth = -np.partition(-logits, k - 1, axis=1)[:, k - 1]
    chosen = logits >= kth[:, None]  # k per row, unless values tie with the kth: sort those rows
    ties = np.flatnonzero(chosen.sum(axis=1) != k)
    if len(ties):
        chosen[ties] = False
        best = np.argsort(-logits[ties], axis=1, kind="stable")[:, :k]
        chosen[ties[:, None], best] = True
    positions = np.nonzero(chosen)[1].reshape(n, k)  # in position order
    order = np.argsort(-np.take_along_axis(logits, positions, axis=1), axis=1, kind="stable")
    return np.take_along_axis(positions, order, axis=1)


def _group_starts(sorted_keys):
    """Positions where a new group begins in a sorted array."""
    return np.flatnonzero(np.r_[True, sorted_keys[1:] != sorted_keys[:-1]]) if len(sorted_keys) else sorted_keys


def postprocess_qa_predictions(examples, features, all_start_logits, all_end_logits, *,
                               version_2_with_negative=False, n_best_size=20, max_answer_length=30,
                               null_score_diff_threshold=0.0, output_dir=None, prefix=None):
    """(predictions, nbest, null_odds) keyed by example id; null_odds is None for SQuAD v1.1. examples,
    features: datasets.Dataset or dict of lists with `id` and `context`, `example_id` and `offset_mapping`
    (None for non-context tokens); logits (n_features, seq_len). With `output_dir`, writes
    [prefix_]predictions.json, [prefix_]nbest_predictions.json and, for v2, [prefix_]null_odds.json there."""
    ids, contexts = _column(examples, "id"), _column(examples, "context")
    feature_example_ids = _column(features, "example_id")
    start, end = np.asarray(all_start_logits), np.asarray(all_end_logits)
    check_inputs(ids, feature_example_ids, start, end, n_best_size)
    position = {example_id: x for x, example_id in enumerate(ids)}
    example_of = np.array([position[i] for i in feature_example_ids], dtype=np.int64)
    n_features, seq_len = start.shape
    offsets = _offsets(features)
    lengths, gather = _offset_gather(offsets)
    lengths = np.minimum(lengths, seq_len)
    warn_featureless(ids, np.bincount(example_of, minlength=len(ids)) == 0)

    # The n_best_size best start and end positions of every feature and their offsets.
    k = n_best_size
    starts, ends = _top_positions(start, lengths, k), _top_positions(end, lengths, k)
    start_char, start_ok = gather(starts, 0)
    end_char, end_ok = gather(ends, 1)
    rows = np.arange(n_features)[:, None]
    start_logit, end_logit = start[rows, starts], end[rows, ends]

    # All k x k pairs of every feature at once; the valid ones come out in (f, s, e) order.
    width = ends[:, None, :] - starts[:, :, None]
    valid = start_ok[:, :, None] & end_ok[:, None, :] & (width >= 0) & (width < max_answer_length)
    f, s, e = np.nonzero(valid)
    score = start_logit[f, s] + end_logit[f, e]

    # Rank per example by score (lexsort is stable: ties keep the (f, s, e) order); keep k.
    order = np.lexsort((-score, example_of[f]))
    group_starts = _group_starts(example_of[f[order]])
    sizes = np.diff(np.r_[group_starts, len(order)])
    kept = order[np.arange(len(order)) - np.repeat(group_starts, sizes) < k]
    f, s, e, score = f[kept], s[kept], e[kept], score[kept]
    example = example_of[f]
    bounds = np.r_[0, np.cumsum(np.bincount(example, minlength=len(ids)))].tolist()
    candidates = list(zip(score.tolist(), start_logit[f, s].tolist(), end_logit[f, e].tolist(),
                          zip(start_char[f, s].tolist(), end_char[f, e].tolist())))

    # SQuAD v2: each example's null entry comes from its feature with the smallest null score
    # (the first one on ties) and goes after the candidates that score at least as much.
    nulls, null_at = [None] * len(ids), None
    if version_2_with_negative and n_features:
        null_score = start[:, 0] + end[:, 0]
        by_null = np.lexsort((np.arange(n_features), null_score, example_of))
        g = by_null[_group_starts(example_of[by_null])]
        for x, entry in zip(example_of[g].tolist(), zip(null_score[g].tolist(), start[g, 0].tolist(),
                                                        end[g, 0].tolist())):
            nulls[x] = entry + (None,)
        example_null = np.full(len(ids), np.inf, dtype=null_score.dtype)
        example_null[example_of[g]] = null_score[g]
        null_at = np.bincount(example[score >= example_null[example]], minlength=len(ids)).tolist()

    outputs = []
    for x, context in enumerate(contexts):
        ranked, null = candidates[bounds[x]:bounds[x + 1]], nulls[x]
        if null is not None:
            at = null_at[x]
            ranked = ranked[:at] + [null] + ranked[at:]
            if at < k:
                ranked = ranked[:k]
        elif not version_2_with_negative and not ranked and (rows := np.flatnonzero(example_of == x)).size:
            found = best_valid_span([offsets[int(r)].as_py() for r in rows], start[rows], end[rows],
                                    max_answer_length)
            ranked = [found] if found else []
        outputs.append(finish(context, ranked, null and null[0], version_2_with_negative, null_score_diff_threshold))
    return collect(ids, outputs, version_2_with_negative, output_dir, prefix)


@dataclass(frozen=True)
class PostProcessing:
    """The settings that turn logits into answers, and the function that applies them: all that the QA
    Trainer needs to know of the run's data arguments."""
    version_2_with_negative: bool = False
    n_best_size: int = 20
    max_answer_length: int = 30
    null_score_diff_threshold: float = 0.0

    @classmethod
    def from_args(cls, data_args) -> "PostProcessing":
        return cls(**{f.name: getattr(data_args, f.name) for f in fields(cls)})

    def __call__(self, examples, features, start_logits, end_logits, output_dir=None, prefix=None):
        return postprocess_qa_predictions(examples, features, start_logits, end_logits, **asdict(self),
                                          output_dir=output_dir, prefix=prefix)
