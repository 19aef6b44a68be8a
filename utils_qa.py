#!/usr/bin/env python
"""SQuAD's own code: the pre-processing (questions and contexts -> windows of at most `max_seq_length` tokens
sharing `doc_stride`), the post-processing (logits -> answer texts, v1.1 and v2.0) and the metric, exactly as
the official scripts compute it. Scoring a predictions file: score_qa.py (bert-squad-score), which imports this.

The two halves of one contract sit together: every window starts with [CLS] (the label of a window without the
answer, and the SQuAD v2 null score) and keeps character offsets for context tokens only, which is all the
post-processing needs to turn logits into answer text."""
import collections
import logging
import math
import os
import re
import string
from dataclasses import asdict, dataclass, fields

from qa.errors import InputError, require_packages

require_packages("numpy", "pyarrow", "datasets")  # before importing them: one line, no traceback
import numpy as np
import pyarrow as pa

from qa.arguments import check_window
from qa.io import atomic_write_json, optional_output

logger = logging.getLogger(__name__)


# ---- Pre-processing. check_tokenizer makes sure that every window starts with CLS; padding goes on the right.
CLS_INDEX = 0


def question_first(tokenizer) -> bool:
    """The well-known example's rule, so a model fine-tuned there reads its inputs in the same order:
    a tokenizer that pads on the right takes the question first, one that pads on the left the context."""
    return getattr(tokenizer, "padding_side", "right") != "left"


def check_tokenizer(tokenizer, max_seq_length=None, doc_stride=None, max_query_length=None) -> None:
    """Refuse a tokenizer whose features would be mislabelled, and window settings its template leaves no room for."""
    where = f"tokenizer of {getattr(tokenizer, 'name_or_path', '') or type(tokenizer).__name__}"
    fix = "use an encoder whose tokenizer starts each question/context pair with a CLS token (BERT, RoBERTa, ELECTRA)"
    if getattr(tokenizer, "cls_token_id", None) is None:
        raise InputError(where, "has no CLS token, which windows without the answer and unanswerable questions "
                         "are labelled with", fix)
    ids = tokenizer("q", "c")["input_ids"]
    if ids[0] != tokenizer.cls_token_id:
        at = ids.index(tokenizer.cls_token_id) if tokenizer.cls_token_id in ids else None
        problem = ("does not put its CLS token in a question/context pair" if at is None else
                   f"puts its CLS token at position {at} of a question/context pair, not first (XLNet-style)")
        raise InputError(where, f"{problem}; labels and the SQuAD v2 null score use position 0", fix)
    if max_seq_length is not None:
        check_window(max_seq_length, doc_stride, max_query_length, tokenizer.num_special_tokens_to_add(pair=True))


def truncate_questions(questions, tokenizer, max_query_length: int):
    """Strip leading blanks (some SQuAD questions have hundreds) and cut each question after
    `max_query_length` tokens, at a character boundary so the pair tokenizes the same way."""
    questions = [q.lstrip() for q in questions]
    enc = tokenizer(questions, add_special_tokens=False, return_offsets_mapping=True)
    return [q[: offsets[max_query_length - 1][1]] if len(offsets) > max_query_length else q
            for q, offsets in zip(questions, enc["offset_mapping"])]


def _tokenize(examples, tokenizer, max_seq_length, doc_stride, max_query_length, pad_to_max_length):
    """(encoding, the example of each feature, the context's sequence id in a feature)."""
    check_tokenizer(tokenizer)
    questions = truncate_questions(examples["question"], tokenizer, max_query_length)
    first = question_first(tokenizer)
    enc = tokenizer(
        *((questions, examples["context"]) if first else (examples["context"], questions)),
        truncation="only_second" if first else "only_first",
        max_length=max_seq_length,
        stride=doc_stride,
        return_overflowing_tokens=True,
        return_offsets_mapping=True,
        padding="max_length" if pad_to_max_length else False,
        padding_side="right",  # whatever the tokenizer's side, as the collator pads: token indices start at 0
    )
    return enc, enc.pop("overflow_to_sample_mapping"), int(first)


def answer_token_span(offsets, sequence_ids, start_char: int, end_char: int, context_id: int = 1):
    """Token (start, end) covering characters [start_char, end_char) of the context (sequence
    `context_id`), or (CLS_INDEX, CLS_INDEX) when that span is not wholly inside this window."""
    first = sequence_ids.index(context_id)
    last = len(sequence_ids) - 1 - sequence_ids[::-1].index(context_id)
    if offsets[first][0] > start_char or offsets[last][1] < end_char:
        return CLS_INDEX, CLS_INDEX
    start = next((t for t in range(first, last + 1) if offsets[t][0] > start_char), last + 1)
    end = next((t for t in range(last, first - 1, -1) if offsets[t][1] < end_char), first - 1)
    return start - 1, end + 1


def _labels(enc, sample_of, answers_of, context_id):
    """Start and end positions of every feature of `enc`."""
    spans = []
    for i, sample in enumerate(sample_of):
        answers = answers_of[sample]
        start = answers["answer_start"][0] if answers["answer_start"] else None
        spans.append((CLS_INDEX, CLS_INDEX) if start is None else answer_token_span(
            enc["offset_mapping"][i], enc.sequence_ids(i), start, start + len(answers["text"][0]), context_id))
    return [span[0] for span in spans], [span[1] for span in spans]


def prepare_train_features(examples, tokenizer, max_seq_length=384, doc_stride=128,
                           max_query_length=64, pad_to_max_length=True):
    """Batched: dict of lists (id, question, context, answers) -> training features."""
    enc, sample_of, context_id = _tokenize(examples, tokenizer, max_seq_length, doc_stride, max_query_length,
                                           pad_to_max_length)
    enc["start_positions"], enc["end_positions"] = _labels(enc, sample_of, examples["answers"], context_id)
    enc.pop("offset_mapping")
    return enc


def prepare_validation_features(examples, tokenizer, max_seq_length=384, doc_stride=128,
                                max_query_length=64, pad_to_max_length=True, with_labels=None):
    """Batched: dict of lists -> evaluation features with `example_id` and context-only `offset_mapping`;
    with labels (default: when the examples carry answers) the model also reports an evaluation loss."""
    enc, sample_of, context_id = _tokenize(examples, tokenizer, max_seq_length, doc_stride, max_query_length,
                                           pad_to_max_length)
    enc["example_id"] = [examples["id"][sample] for sample in sample_of]
    if ("answers" in examples if with_labels is None else with_labels):  # labels need the offsets unmasked
        enc["start_positions"], enc["end_positions"] = _labels(enc, sample_of, examples["answers"], context_id)
    enc["offset_mapping"] = [[o if s == context_id else None for o, s in zip(offsets, enc.sequence_ids(i))]
                             for i, offsets in enumerate(enc["offset_mapping"])]
    return enc


# ---- Post-processing: the Hugging Face example's loop (bench/postprocess_reference.py, the specification), vectorised.
_FALLBACK = (0.0, 0.0, 0.0, (0, 0))  # (score, start_logit, end_logit, char span): the empty answer


def _column(table, name) -> list:
    """A whole column as a list: a datasets table's read at once, never row by row."""
    return table.with_format("arrow")[name].to_pylist() if hasattr(table, "with_format") else list(table[name])


def check_inputs(ids, feature_example_ids, start_logits, end_logits, n_best_size) -> None:
    if n_best_size < 1:
        raise ValueError(f"n_best_size must be at least 1, got {n_best_size}")
    n = len(feature_example_ids)
    if start_logits.shape != end_logits.shape or start_logits.ndim != 2 or len(start_logits) != n:
        raise ValueError(f"expected start and end logits of shape (n_features={n}, seq_len); got "
                         f"{start_logits.shape} and {end_logits.shape}")
    if unknown := set(feature_example_ids) - set(ids):
        raise ValueError(f"{len(unknown)} feature(s) belong to no example, e.g. example_id {next(iter(unknown))!r}")


def warn_featureless(ids, featureless) -> None:
    if missing := [i for i, none in zip(ids, featureless) if none]:
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
    if (best := next((c for c in ranked if c[3] is not None), None)) is None:
        best, ranked = _FALLBACK, sorted(ranked + [_FALLBACK], key=lambda c: -c[0])
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
    values = [{i: out[j] for i, out in zip(ids, outputs)} for j in range(3 if version_2_with_negative else 2)]
    if output_dir is not None:
        def path(name):
            return os.path.join(output_dir, name if prefix is None else f"{prefix}_{name}")
        atomic_write_json(path("predictions.json"), values[0], indent=4)
        for name, value in zip(("nbest_predictions.json", "null_odds.json"), values[1:]):  # details, not results
            with optional_output(output_dir, os.path.basename(path(name))):
                atomic_write_json(path(name), value, indent=4)
    return values[0], values[1], values[2] if version_2_with_negative else None


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


def postprocess_qa_predictions(examples, features, predictions, version_2_with_negative=False, n_best_size=20,
                               max_answer_length=30, null_score_diff_threshold=0.0, output_dir=None, prefix=None):
    """Question id -> answer text from `predictions` = (start_logits, end_logits), called as in the HF example."""
    return rank_answers(examples, features, *predictions[:2], version_2_with_negative=version_2_with_negative,
                        n_best_size=n_best_size, max_answer_length=max_answer_length,
                        null_score_diff_threshold=null_score_diff_threshold, output_dir=output_dir, prefix=prefix)[0]


def rank_answers(examples, features, all_start_logits, all_end_logits, *, version_2_with_negative=False,
                 n_best_size=20, max_answer_length=30, null_score_diff_threshold=0.0, output_dir=None, prefix=None):
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
    offsets = (features.with_format("arrow")["offset_mapping"].combine_chunks() if hasattr(features, "with_format")
               else pa.array(features["offset_mapping"], type=pa.list_(pa.list_(pa.int64()))))  # [start, end] or null
    lengths, gather = _offset_gather(offsets)
    lengths = np.minimum(lengths, seq_len)
    warn_featureless(ids, np.bincount(example_of, minlength=len(ids)) == 0)

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
        for x, *entry in zip(example_of[g].tolist(), null_score[g].tolist(), start[g, 0].tolist(), end[g, 0].tolist()):
            nulls[x] = (*entry, None)
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
    """The settings that turn logits into answers, and their function: all the Trainer needs of the data arguments."""
    version_2_with_negative: bool = False
    n_best_size: int = 20
    max_answer_length: int = 30
    null_score_diff_threshold: float = 0.0

    @classmethod
    def from_args(cls, data_args) -> "PostProcessing":
        return cls(**{f.name: getattr(data_args, f.name) for f in fields(cls)})

    def __call__(self, examples, features, start_logits, end_logits, output_dir=None, prefix=None):
        return rank_answers(examples, features, start_logits, end_logits, **asdict(self), output_dir=output_dir,
                            prefix=prefix)


# ---- The metric: the official scripts' normalisation, token-overlap F1, maximum over gold answers and float
# summation, so the numbers compare with published ones to the last digit. One deliberate difference: a question
# without a prediction scores 0 and counts in every denominator (the official v2.0 script drops it, or crashes).
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
    if hasattr(examples, "with_format"):
        return list(zip(_column(examples, "id"), [a["text"] for a in _column(examples, "answers")]))
    return [(example["id"], list(example["answers"]["text"])) for example in examples]


def _v1_scores(questions, predictions) -> dict:
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
    exact, f1 = dict(exact_raw), dict(f1_raw)
    for qid in exact_raw:
        if qid in predictions and (na_probs or {}).get(qid, 0.0) > na_prob_thresh:
            exact[qid] = f1[qid] = float(not has_answer[qid])  # predicted "no answer"

    result = collections.OrderedDict(_percentages(exact, f1, list(exact)))
    for prefix, wanted in (("HasAns", True), ("NoAns", False)):
        if qids := [qid for qid, has in has_answer.items() if has is wanted]:
            result.update((f"{prefix}_{key}", value) for key, value in _percentages(exact, f1, qids))
    for key, raw in (("exact", exact_raw), ("f1", f1_raw)) if na_probs is not None else ():
        result[f"best_{key}"], result[f"best_{key}_thresh"] = _best_threshold(predictions, raw, na_probs, has_answer)
    return result


def scores_from_examples(examples, predictions, version_2_with_negative: bool, na_probs=None, na_prob_thresh=1.0):
    """{"exact_match", "f1"} in percent as evaluate-v1.1.py computes them, or evaluate-v2.0.py's result
    (_v2_scores) when `version_2_with_negative`, from flat examples (see _questions) and `predictions`
    (question id -> answer text)."""
    if not (questions := _questions(examples)):
        raise InputError("dataset", "contains no questions", "score a dataset that has questions")
    if version_2_with_negative:
        return _v2_scores(questions, predictions, na_probs, na_prob_thresh)
    return _v1_scores(questions, predictions)

