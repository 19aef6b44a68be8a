"""SQuAD examples -> model features (plain functions over dicts of lists; no model needed).

A context longer than the window is split into overlapping windows ("features") of at most
`max_seq_length` tokens, consecutive windows sharing `doc_stride` tokens. Each feature is the
tokenizer's pair template around the question and a context window, e.g. BERT's
`[CLS] question [SEP] context-window [SEP]` or RoBERTa's `<s> question </s></s> context </s>`
(context first for a tokenizer that pads on the left: see `question_first`). A training feature
is labelled with the token span of the answer, or with the CLS position (0) when the answer is
not wholly inside its window (and for unanswerable v2 questions). Evaluation features keep the
id of their question and, per token, the character span in the context (None outside the
context), which is all that post-processing needs to turn logits back into answer text.
"""
from qa.errors import InputError
from qa.arguments import check_window

# Every feature starts with the tokenizer's CLS token (check_tokenizer refuses a tokenizer whose
# pair template does not, and features are always padded on the right), so windows without the
# answer, unanswerable questions and post-processing's SQuAD v2 null score all use position 0.
CLS_INDEX = 0


def question_first(tokenizer) -> bool:
    """The well-known example's rule, kept so that a model fine-tuned there reads its inputs in the
    same order here: a tokenizer that pads on the right takes the question first, one that pads
    on the left (XLNet-style) the context first."""
    return getattr(tokenizer, "padding_side", "right") != "left"


def check_tokenizer(tokenizer, max_seq_length=None, doc_stride=None, max_query_length=None) -> None:
    """Refuse a tokenizer whose features these functions would mislabel, and window settings
    its pair template leaves no room for (with the window settings given)."""
    where = f"tokenizer of {getattr(tokenizer, 'name_or_path', '') or type(tokenizer).__name__}"
    fix = "use an encoder whose tokenizer starts every question/context pair with a CLS token (BERT-, " \
          "RoBERTa-, ELECTRA-style)"
    if getattr(tokenizer, "cls_token_id", None) is None:
        raise InputError(where, "has no CLS token, which windows without the answer and unanswerable questions "
                         "are labelled with", fix)
    ids = tokenizer("q", "c")["input_ids"]
    if ids[0] != tokenizer.cls_token_id:
        at = ids.index(tokenizer.cls_token_id) if tokenizer.cls_token_id in ids else None
        problem = ("does not put its CLS token in a question/context pair" if at is None else
                   f"puts its CLS token at position {at} of a question/context pair, not first (XLNet-style)")
        raise InputError(where, f"{problem}; labels and the SQuAD v2 null score use the first position", fix)
    if max_seq_length is not None:
        check_window(max_seq_length, doc_stride, max_query_length, tokenizer.num_special_tokens_to_add(pair=True))


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
    check_tokenizer(tokenizer)
    questions = truncate_questions(examples["question"], tokenizer, max_query_length)
    first = question_first(tokenizer)
    return tokenizer(
        *((questions, examples["context"]) if first else (examples["context"], questions)),
        truncation="only_second" if first else "only_first",
        max_length=max_seq_length,
        stride=doc_stride,
        return_overflowing_tokens=True,
        return_offsets_mapping=True,
        padding="max_length" if pad_to_max_length else False,
        # Right, whatever the tokenizer's own side: the dynamic path's collator pads on the right
        # too, so a label, an offset and a logit index the same token in training, evaluation,
        # padded and dynamic batches, and CLS stays at position 0. With an attention mask the
        # real tokens' outputs do not depend on where the padding is, and padding on the right
        # keeps the positions the model was pretrained with (0 for the first token).
        padding_side="right",
    )


def context_sequence_id(tokenizer) -> int:
    """The sequence id of the context in a feature (see `question_first`)."""
    return 1 if question_first(tokenizer) else 0


def _context_range(sequence_ids, context_id=1):
    """First and last token index of the context (sequence `context_id`) in a feature."""
    start = sequence_ids.index(context_id)
    end = len(sequence_ids) - 1 - sequence_ids[::-1].index(context_id)
    return start, end


def answer_token_span(offsets, sequence_ids, start_char: int, end_char: int, context_id: int = 1):
    """Token (start, end) covering characters [start_char, end_char) of the context (sequence
    `context_id`), or (CLS_INDEX, CLS_INDEX) when that span is not wholly inside this window."""
    first, last = _context_range(sequence_ids, context_id)
    if offsets[first][0] > start_char or offsets[last][1] < end_char:
        return CLS_INDEX, CLS_INDEX
    start = first
    while start <= last and offsets[start][0] <= start_char:
        start += 1
    end = last
    while end >= first and offsets[end][1] >= end_char:
        end -= 1
    return start - 1, end + 1


def _labels(enc, i, answers, context_id):
    if not answers["answer_start"]:
        return CLS_INDEX, CLS_INDEX
    start_char = answers["answer_start"][0]
    end_char = start_char + len(answers["text"][0])
    return answer_token_span(enc["offset_mapping"][i], enc.sequence_ids(i), start_char, end_char, context_id)


def prepare_train_features(examples, tokenizer, max_seq_length=384, doc_stride=128,
                           max_query_length=64, pad_to_max_length=True):
    """Batched: dict of lists (id, question, context, answers) -> training features."""
    enc = _tokenize(examples, tokenizer, max_seq_length, doc_stride, max_query_length, pad_to_max_length)
    sample_of = enc.pop("overflow_to_sample_mapping")
    context_id = context_sequence_id(tokenizer)
    starts, ends = [], []
    for i, sample in enumerate(sample_of):
        s, e = _labels(enc, i, examples["answers"][sample], context_id)
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
    context_id = context_sequence_id(tokenizer)
    example_ids, offsets_out, starts, ends = [], [], [], []
    for i, sample in enumerate(sample_of):
        seq_ids = enc.sequence_ids(i)
        if with_labels:
            s, e = _labels(enc, i, examples["answers"][sample], context_id)
            starts.append(s)
            ends.append(e)
        example_ids.append(examples["id"][sample])
        offsets_out.append([o if seq_ids[k] == context_id else None for k, o in enumerate(enc["offset_mapping"][i])])
    enc["example_id"] = example_ids
    enc["offset_mapping"] = offsets_out
    if with_labels:
        enc["start_positions"] = starts
        enc["end_positions"] = ends
    return enc
