"""SQuAD examples -> model features (plain functions over dicts of lists; no model needed).

A context longer than the window is split into overlapping windows ("features") of at most
`max_seq_length` tokens, consecutive windows sharing `doc_stride` tokens. Each feature is
`[CLS] question [SEP] context-window [SEP]`. A training feature is labelled with the token
span of the answer, or with the [CLS] position (0) when the answer is not wholly inside
its window (and for unanswerable v2 questions). Evaluation features keep the id of their
question and, per token, the character span in the context (None outside the context),
which is all that post-processing needs to turn logits back into answer text.
"""
from .errors import InputError

CLS_INDEX = 0


def check_window(max_seq_length: int, doc_stride: int, max_query_length: int) -> None:
    """Fail early, with the fix, on settings the tokenizer would reject mid-run."""
    # 3 special tokens: [CLS] q [SEP] c [SEP]; the longest question leaves this much context.
    room = max_seq_length - max_query_length - 3
    if room <= 0 or doc_stride >= room:
        raise InputError(
            f"doc_stride={doc_stride}, max_seq_length={max_seq_length}, max_query_length={max_query_length}",
            f"doc_stride must be smaller than the context room max_seq_length - max_query_length - 3 = {room}",
            f"lower doc_stride (e.g. {max(1, room // 2)}) or max_query_length, or raise max_seq_length",
        )


def truncate_questions(questions, tokenizer, max_query_length: int):
    """Strip leading blanks (some SQuAD questions have hundreds) and cut each question after
    `max_query_length` tokens, at a character boundary so the pair tokenizes the same way."""
    questions = [q.lstrip() for q in questions]
    enc = tokenizer(questions, add_special_tokens=False, return_offsets_mapping=True)
    out = []
    for q, offsets in zip(questions, enc["offset_mapping"]):
        out.append(q[: offsets[max_query_length - 1][1]] if len(offsets) > max_query_length else q)
    return out


def _tokenize(examples, tokenizer, max_seq_length, doc_stride, max_query_length, pad_to_max_length):
    questions = truncate_questions(examples["question"], tokenizer, max_query_length)
    return tokenizer(
        questions,
        examples["context"],
        truncation="only_second",
        max_length=max_seq_length,
        stride=doc_stride,
        return_overflowing_tokens=True,
        return_offsets_mapping=True,
        padding="max_length" if pad_to_max_length else False,
    )


def _context_range(sequence_ids):
    """First and last token index of the context (sequence 1) in a feature."""
    start = sequence_ids.index(1)
    end = len(sequence_ids) - 1 - sequence_ids[::-1].index(1)
    return start, end


def answer_token_span(offsets, sequence_ids, start_char: int, end_char: int):
    """Token (start, end) covering characters [start_char, end_char) of the context, or
    (CLS_INDEX, CLS_INDEX) when that span is not wholly inside this window."""
    first, last = _context_range(sequence_ids)
    if offsets[first][0] > start_char or offsets[last][1] < end_char:
        return CLS_INDEX, CLS_INDEX
    start = first
    while start <= last and offsets[start][0] <= start_char:
        start += 1
    end = last
    while end >= first and offsets[end][1] >= end_char:
        end -= 1
    return start - 1, end + 1


def _labels(enc, i, answers):
    if not answers["answer_start"]:
        return CLS_INDEX, CLS_INDEX
    start_char = answers["answer_start"][0]
    end_char = start_char + len(answers["text"][0])
    return answer_token_span(enc["offset_mapping"][i], enc.sequence_ids(i), start_char, end_char)


def prepare_train_features(examples, tokenizer, max_seq_length=384, doc_stride=128,
                           max_query_length=64, pad_to_max_length=True):
    """Batched: dict of lists (id, question, context, answers) -> training features."""
    enc = _tokenize(examples, tokenizer, max_seq_length, doc_stride, max_query_length, pad_to_max_length)
    sample_of = enc.pop("overflow_to_sample_mapping")
    starts, ends = [], []
    for i, sample in enumerate(sample_of):
        s, e = _labels(enc, i, examples["answers"][sample])
        starts.append(s)
        ends.append(e)
    enc.pop("offset_mapping")
    enc["start_positions"] = starts
    enc["end_positions"] = ends
    return enc


def prepare_validation_features(examples, tokenizer, max_seq_length=384, doc_stride=128,
                                max_query_length=64, pad_to_max_length=True, with_labels=None):
    """Batched: dict of lists -> evaluation features with `example_id` and context-only
    `offset_mapping`. With labels (default: when the examples carry answers) the model
    also reports an evaluation loss."""
    enc = _tokenize(examples, tokenizer, max_seq_length, doc_stride, max_query_length, pad_to_max_length)
    sample_of = enc.pop("overflow_to_sample_mapping")
    if with_labels is None:
        with_labels = "answers" in examples
    example_ids, offsets_out, starts, ends = [], [], [], []
    for i, sample in enumerate(sample_of):
        seq_ids = enc.sequence_ids(i)
        if with_labels:
            s, e = _labels(enc, i, examples["answers"][sample])
            starts.append(s)
            ends.append(e)
        example_ids.append(examples["id"][sample])
        offsets_out.append([o if seq_ids[k] == 1 else None for k, o in enumerate(enc["offset_mapping"][i])])
    enc["example_id"] = example_ids
    enc["offset_mapping"] = offsets_out
    if with_labels:
        enc["start_positions"] = starts
        enc["end_positions"] = ends
    return enc
