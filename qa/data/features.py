"""SQuAD examples -> model features: windows of at most `max_seq_length` tokens over each context,
sharing `doc_stride` tokens, labelled with the answer's token span or CLS when the window lacks it;
evaluation features keep their question's id and each token's character span in the context, which
is all post-processing needs to turn logits into answer text."""
from qa.errors import InputError
from qa.arguments import check_window

# Every feature starts with CLS (check_tokenizer makes sure; features are padded on the right), so
# windows without the answer, unanswerable questions and the SQuAD v2 null score all use position 0.
CLS_INDEX = 0


def question_first(tokenizer) -> bool:
    """The well-known example's rule, so a model fine-tuned there reads its inputs in the same order:
    a tokenizer that pads on the right takes the question first, one that pads on the left the context."""
    return getattr(tokenizer, "padding_side", "right") != "left"


def check_tokenizer(tokenizer, max_seq_length=None, doc_stride=None, max_query_length=None) -> None:
    """Refuse a tokenizer whose features would be mislabelled, and window settings its template leaves no room for."""
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
    return [q[: offsets[max_query_length - 1][1]] if len(offsets) > max_query_length else q
            for q, offsets in zip(questions, enc["offset_mapping"])]


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
        # Right, whatever the tokenizer's own side, as the dynamic path's collator pads: a label, an
        # offset and a logit index the same token in every batch, and positions start at 0 as in pretraining.
        padding_side="right",
    )


def answer_token_span(offsets, sequence_ids, start_char: int, end_char: int, context_id: int = 1):
    """Token (start, end) covering characters [start_char, end_char) of the context (sequence
    `context_id`), or (CLS_INDEX, CLS_INDEX) when that span is not wholly inside this window."""
    first = sequence_ids.index(context_id)
    last = len(sequence_ids) - 1 - sequence_ids[::-1].index(context_id)
    if offsets[first][0] > start_char or offsets[last][1] < end_char:
        return CLS_INDEX, CLS_INDEX
    start = first
    while start <= last and offsets[start][0] <= start_char:
        start += 1
    end = last
    while end >= first and offsets[end][1] >= end_char:
        end -= 1
    return start - 1, end + 1


def _labels(enc, sample_of, answers_of, context_id):
    """Start and end positions of every feature of `enc`."""
    starts, ends = [], []
    for i, sample in enumerate(sample_of):
        answers = answers_of[sample]
        if not answers["answer_start"]:
            span = CLS_INDEX, CLS_INDEX
        else:
            start_char = answers["answer_start"][0]
            span = answer_token_span(enc["offset_mapping"][i], enc.sequence_ids(i), start_char,
                                     start_char + len(answers["text"][0]), context_id)
        starts.append(span[0])
        ends.append(span[1])
    return starts, ends


def prepare_train_features(examples, tokenizer, max_seq_length=384, doc_stride=128,
                           max_query_length=64, pad_to_max_length=True):
    """Batched: dict of lists (id, question, context, answers) -> training features."""
    enc = _tokenize(examples, tokenizer, max_seq_length, doc_stride, max_query_length, pad_to_max_length)
    sample_of = enc.pop("overflow_to_sample_mapping")
    context_id = 1 if question_first(tokenizer) else 0  # the context's sequence id in a feature
    enc["start_positions"], enc["end_positions"] = _labels(enc, sample_of, examples["answers"], context_id)
    enc.pop("offset_mapping")
    return enc


def prepare_validation_features(examples, tokenizer, max_seq_length=384, doc_stride=128,
                                max_query_length=64, pad_to_max_length=True, with_labels=None):
    """Batched: dict of lists -> evaluation features with `example_id` and context-only `offset_mapping`;
    with labels (default: when the examples carry answers) the model also reports an evaluation loss."""
    enc = _tokenize(examples, tokenizer, max_seq_length, doc_stride, max_query_length, pad_to_max_length)
    sample_of = enc.pop("overflow_to_sample_mapping")
    context_id = 1 if question_first(tokenizer) else 0
    with_labels = "answers" in examples if with_labels is None else with_labels
    labels = _labels(enc, sample_of, examples["answers"], context_id) if with_labels else None
    enc["example_id"] = [examples["id"][sample] for sample in sample_of]
    for i, offsets in enumerate(enc["offset_mapping"]):
        seq_ids = enc.sequence_ids(i)
        enc["offset_mapping"][i] = [o if seq_ids[k] == context_id else None for k, o in enumerate(offsets)]
    if labels:
        enc["start_positions"], enc["end_positions"] = labels
    return enc
