"""Start/end logits over tokenized features (windows) into answer texts, SQuAD v1.1 and v2.0.

`postprocess_qa_predictions` is vectorised with numpy (the 10,784 dev features in under a second;
bench/bench_postprocess.py); `postprocess_qa_predictions_reference` is the plain loop of the
well-known Hugging Face example, kept as the oracle the tests hold it to. Both: the n_best
start/end positions per window, candidate spans inside the context and max_answer_length, ranked
by start + end logit across a question's windows (v1.1: never empty while the context has a
valid span), each n-best entry with its character offsets in the context; v2 adds the null answer
and null_odds. The reference's docstring is the specification, ties and fallbacks included."""
import collections
import logging
import math
import os
from dataclasses import dataclass, fields

import numpy as np

from qa.io import atomic_write_json

logger = logging.getLogger(__name__)

_FALLBACK = (0.0, 0.0, 0.0, (0, 0))  # (score, start_logit, end_logit, char span): the empty answer


# ---------------------------------------------------------------------------------------------
# Shared helpers: reading columns, building the outputs, writing files.

def _rows(table, name, rows):
    """Column `name` of the rows `rows` only, as a list."""
    if _is_dataset(table):
        return table.with_format(None)[rows.tolist()][name]
    return [table[name][r] for r in rows]


def _is_dataset(table):
    return hasattr(table, "with_format")  # a datasets.Dataset, without importing datasets


def _column(table, name):
    """A whole column as a Python list, read at once (never row by row from a datasets table)."""
    if _is_dataset(table):
        return table.with_format("arrow")[name].to_pylist()
    return list(table[name])


def _check_inputs(ids, feature_example_ids, start_logits, end_logits, n_best_size):
    if n_best_size < 1:
        raise ValueError(f"n_best_size must be at least 1, got {n_best_size}")
    n = len(feature_example_ids)
    if start_logits.shape != end_logits.shape or start_logits.ndim != 2 or len(start_logits) != n:
        raise ValueError(f"expected start and end logits of shape (n_features={n}, seq_len); got "
                         f"{start_logits.shape} and {end_logits.shape}")
    unknown = set(feature_example_ids) - set(ids)
    if unknown:
        raise ValueError(f"{len(unknown)} feature(s) belong to no example, e.g. example_id "
                         f"{next(iter(unknown))!r}")


def _finish(context, ranked, null_score, version_2_with_negative, threshold):
    """(prediction, n-best entries, null_odds) of one question.

    `ranked`: its n-best as (score, start_logit, end_logit, span) tuples of Python floats, best
    first, where span is a (char_start, char_end) pair, or None for the null answer.
    """
    best = next((c for c in ranked if c[3] is not None), None)
    if best is None:
        best = _FALLBACK
        ranked = sorted(ranked + [best], key=lambda c: -c[0])
    top = max(c[0] for c in ranked)
    exps = [math.exp(c[0] - top) for c in ranked]
    total = sum(exps)
    # Where each answer is in the context (characters, end excluded; None for the null answer): a
    # text can occur more than once, and a user of the answers needs to know which one was meant.
    nbest = [{"text": "" if span is None else context[span[0]:span[1]],
              "answer_start": None if span is None else span[0], "answer_end": None if span is None else span[1],
              "probability": x / total, "start_logit": s, "end_logit": e}
             for (_, s, e, span), x in zip(ranked, exps)]
    best_text = context[best[3][0]:best[3][1]]
    if not version_2_with_negative:
        return best_text, nbest, None
    odds = (0.0 if null_score is None else null_score) - best[0]
    return ("" if odds > threshold else best_text), nbest, odds


def best_valid_span(offset_rows, start_rows, end_rows, max_answer_length):
    """The best valid span over every position of a question's windows, as a ranked entry
    (score, start_logit, end_logit, char span), or None when no window has a context token.

    SQuAD v1.1 always has an answer, and an empty one is always wrong: when no pair among the
    n_best start and end positions is valid (a poorly trained model puts its highest logits on
    [CLS] or the question), the answer is the best pair among all positions. Ties: the first
    window, then the shorter span, then the earlier start."""
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


def _warn_featureless(ids, featureless):
    missing = [i for i, none in zip(ids, featureless) if none]
    if missing:
        logger.warning("%d example(s) have no features, so an empty prediction (e.g. %r): were "
                       "some windows dropped?", len(missing), missing[0])


def _collect(ids, outputs, version_2_with_negative, output_dir, prefix):
    predictions = {i: out[0] for i, out in zip(ids, outputs)}
    nbest = {i: out[1] for i, out in zip(ids, outputs)}
    null_odds = {i: out[2] for i, out in zip(ids, outputs)} if version_2_with_negative else None
    if output_dir is not None:
        def path(name):
            return os.path.join(output_dir, name if prefix is None else f"{prefix}_{name}")
        atomic_write_json(path("predictions.json"), predictions, indent=4)
        atomic_write_json(path("nbest_predictions.json"), nbest, indent=4)
        if version_2_with_negative:
            atomic_write_json(path("null_odds.json"), null_odds, indent=4)
    return predictions, nbest, null_odds


# ---------------------------------------------------------------------------------------------
# The reference: plain loops over features, start positions and end positions.

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
    _check_inputs(ids, feature_example_ids, all_start_logits, all_end_logits, n_best_size)
    features_of = collections.defaultdict(list)
    for f, example_id in enumerate(feature_example_ids):
        features_of[example_id].append(f)
    _warn_featureless(ids, [not features_of[i] for i in ids])

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
        outputs.append(_finish(context, ranked, null and null[0], version_2_with_negative,
                               null_score_diff_threshold))
    return _collect(ids, outputs, version_2_with_negative, output_dir, prefix)


# ---------------------------------------------------------------------------------------------
# The vectorised version.

def _read_offsets(features):
    """(lengths, gather) for the offset_mapping column, read whole.

    lengths[f] is len(offset_mapping[f]). gather(idx, side) gives, for the token idx[f, r] of each
    feature f, offset_mapping[f][idx[f, r]][side] (side 0: start char, 1: end char) and whether it
    is a context token; both arrays are shaped like idx. Positions past the end are not context.
    """
    if _is_dataset(features):  # Arrow to numpy: no Python object per token
        column = features.with_format("arrow")["offset_mapping"].combine_chunks()
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

    column = features["offset_mapping"]
    lengths = np.fromiter(map(len, column), dtype=np.int64, count=len(column))

    def gather(idx, side):  # only the selected tokens are touched
        inside = idx < lengths[:, None]
        pairs = []
        for offsets, row in zip(column, np.minimum(idx, lengths[:, None] - 1).tolist()):
            pairs.extend(map(offsets.__getitem__, row) if len(offsets) else [None] * len(row))
        chars = np.array([-1 if p is None else p[side] for p in pairs], dtype=np.int64)
        return chars.reshape(idx.shape), (chars >= 0).reshape(idx.shape) & inside
    return lengths, gather


def _top_positions(logits, lengths, k):
    """Per row, the positions of the k highest logits among the first lengths[f], best first,
    ties by position: np.argsort(-row[:length], kind="stable")[:k] for every row at once."""
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
    if len(sorted_keys) == 0:
        return np.zeros(0, dtype=np.int64)
    return np.flatnonzero(np.r_[True, sorted_keys[1:] != sorted_keys[:-1]])


def postprocess_qa_predictions(examples, features, all_start_logits, all_end_logits, *,
                               version_2_with_negative=False, n_best_size=20, max_answer_length=30,
                               null_score_diff_threshold=0.0, output_dir=None, prefix=None):
    """Answer texts from start/end logits: (predictions, nbest, null_odds) keyed by example id.

    examples: datasets.Dataset or dict of lists with `id` and `context`. features: datasets.Dataset
    or dict of lists with `example_id` and `offset_mapping` (None for non-context tokens).
    all_start_logits, all_end_logits: arrays (n_features, seq_len). null_odds is None for SQuAD v1.
    With `output_dir`, writes [prefix_]predictions.json, [prefix_]nbest_predictions.json and, for
    v2, [prefix_]null_odds.json there, atomically. See the module docstring for the algorithm.
    """
    ids, contexts = _column(examples, "id"), _column(examples, "context")
    feature_example_ids = _column(features, "example_id")
    start, end = np.asarray(all_start_logits), np.asarray(all_end_logits)
    _check_inputs(ids, feature_example_ids, start, end, n_best_size)
    position = {example_id: x for x, example_id in enumerate(ids)}
    example_of = np.array([position[i] for i in feature_example_ids], dtype=np.int64)
    n_features, seq_len = start.shape
    lengths, gather = _read_offsets(features)
    lengths = np.minimum(lengths, seq_len)
    _warn_featureless(ids, np.bincount(example_of, minlength=len(ids)) == 0)

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
            found = best_valid_span(_rows(features, "offset_mapping", rows), start[rows], end[rows],
                                    max_answer_length)
            ranked = [found] if found else []
        outputs.append(_finish(context, ranked, null and null[0], version_2_with_negative,
                               null_score_diff_threshold))
    return _collect(ids, outputs, version_2_with_negative, output_dir, prefix)


@dataclass(frozen=True)
class PostProcessing:
    """The settings that turn logits into answers, and the function that applies them: all that
    the QA Trainer needs to know of the run's data arguments."""
    version_2_with_negative: bool = False
    n_best_size: int = 20
    max_answer_length: int = 30
    null_score_diff_threshold: float = 0.0

    @classmethod
    def from_args(cls, data_args) -> "PostProcessing":
        return cls(**{f.name: getattr(data_args, f.name) for f in fields(cls)})

    def __call__(self, examples, features, start_logits, end_logits, output_dir=None, prefix=None):
        """-> (predictions, nbest, null_odds) as postprocess_qa_predictions."""
        return postprocess_qa_predictions(
            examples, features, start_logits, end_logits, version_2_with_negative=self.version_2_with_negative,
            n_best_size=self.n_best_size, max_answer_length=self.max_answer_length,
            null_score_diff_threshold=self.null_score_diff_threshold, output_dir=output_dir, prefix=prefix)
