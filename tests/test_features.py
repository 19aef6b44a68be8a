"""Feature preparation: sliding windows, answer labels from character offsets, CLS fallback."""
import pytest

from qa.errors import InputError
from utils_qa import (CLS_INDEX, prepare_train_features, prepare_validation_features,
                         truncate_questions)
from qa.arguments import check_window
from tests.helpers import DEV_SET, dev_set_columns, minilm_tokenizer


def _example(context, question, answer, start=None):
    start = context.index(answer) if start is None else start
    return {"id": ["q1"], "question": [question], "context": [context],
            "answers": [{"text": [answer], "answer_start": [start]}]}


def test_answer_span_in_a_short_context():
    tok = minilm_tokenizer()
    ex = _example("The Eiffel Tower was finished in 1889 in Paris.", "When was it finished?", "1889")
    f = prepare_validation_features(ex, tok, max_seq_length=64, doc_stride=16, max_query_length=16)
    assert len(f["input_ids"]) == 1
    s, e = f["start_positions"][0], f["end_positions"][0]
    offsets = f["offset_mapping"][0]
    assert ex["context"][0][offsets[s][0]:offsets[e][1]] == "1889"
    assert offsets[0] is None and all(o is None for o in offsets[:f["input_ids"][0].index(102) + 1])


def test_long_context_windows_overlap_and_fall_back_to_cls():
    tok = minilm_tokenizer()
    filler = " ".join(f"word{i}" for i in range(120))
    context = f"{filler} The treasure is buried under the old oak. {filler}"
    ex = _example(context, "Where is the treasure?", "under the old oak")
    f = prepare_train_features(ex, tok, max_seq_length=64, doc_stride=16, max_query_length=16, pad_to_max_length=True)
    n = len(f["input_ids"])
    assert n > 5 and all(len(ids) == 64 for ids in f["input_ids"])
    labelled = [i for i in range(n) if f["start_positions"][i] != CLS_INDEX]
    assert labelled, "some window must contain the answer"
    assert len(labelled) < n, "windows without the answer must point at CLS"
    for i in labelled:
        ids = f["input_ids"][i][f["start_positions"][i]:f["end_positions"][i] + 1]
        assert tok.decode(ids) == "under the old oak"


def test_unanswerable_question_points_at_cls():
    tok = minilm_tokenizer()
    ex = {"id": ["q"], "question": ["Who?"], "context": ["Nobody is named here."],
          "answers": [{"text": [], "answer_start": []}]}
    f = prepare_train_features(ex, tok, 64, 16, 16)
    assert (f["start_positions"][0], f["end_positions"][0]) == (CLS_INDEX, CLS_INDEX)


def test_question_truncated_to_max_query_length():
    tok = minilm_tokenizer()
    long_q = "   " + " ".join(["what"] * 50) + "?"
    (q,) = truncate_questions([long_q], tok, max_query_length=10)
    assert not q.startswith(" ")
    assert len(tok(q, add_special_tokens=False)["input_ids"]) == 10
    ex = _example("Short context about 1889.", long_q, "1889")
    f = prepare_validation_features(ex, tok, max_seq_length=32, doc_stride=4, max_query_length=10)
    assert f["input_ids"][0].index(102) == 11  # [CLS] + 10 question tokens, then [SEP]


@pytest.mark.parametrize("max_len,stride,max_q", [(128, 128, 32), (128, 93, 32), (64, 10, 64)])
def test_window_settings_the_tokenizer_would_reject_are_refused(max_len, stride, max_q):
    with pytest.raises(InputError, match="doc_stride"):
        check_window(max_len, stride, max_q)
    check_window(384, 128, 64)


@pytest.mark.parametrize("max_len,stride,max_q", [(10, 32, 32), (128, 128, 32), (40, 5, 32), (36, 1, 32),
                                                 (64, 10, 64), (68, 33, 32)])
def test_every_suggested_window_fix_works(max_len, stride, max_q):
    """--max_seq_length 10 (the question alone overflows it) was told "lower doc_stride (e.g. 1)": each change the
    line suggests must, made alone, give a window the tokenizer accepts."""
    import re

    with pytest.raises(InputError) as refused:
        check_window(max_len, stride, max_q)
    fix = refused.value.fix
    changes = [dict(doc_stride=int(n)) for n in re.findall(r"lower doc_stride \(e\.g\. (-?\d+)\)", fix)]
    changes += [dict(max_query_length=int(n)) for n in re.findall(r"lower max_query_length to (-?\d+)", fix)]
    changes += [dict(max_seq_length=int(n)) for n in re.findall(r"raise max_seq_length to (-?\d+)", fix)]
    assert changes and fix.count(", or ") == len(changes) - 1, fix  # every suggestion has its number
    for change in changes:
        window = {"max_seq_length": max_len, "doc_stride": stride, "max_query_length": max_q, **change}
        check_window(**window)


@pytest.mark.parametrize("stride,max_q,culprit", [(0, 32, "doc_stride=0"), (-8, 32, "doc_stride=-8"),
                                                  (32, 0, "max_query_length=0"), (32, -1, "max_query_length=-1")])
def test_non_positive_stride_or_query_length_is_refused(stride, max_q, culprit):
    """A negative stride is an OverflowError inside the tokenizer; a zero stride makes windows
    that do not overlap; a query length below 1 leaves no question."""
    with pytest.raises(InputError, match=f"^{culprit}: must be at least 1.*Fix: use a positive value"):
        check_window(128, stride, max_q)


def test_every_dev_answer_is_recovered_from_token_offsets():
    """On the official dev set (10,570 questions; a question's first answer is its label): every window that contains the first answer is
    labelled with it, and the label's character span is exactly the answer whenever the
    answer starts and ends on token boundaries (else the smallest token span covering it)."""
    if not DEV_SET.exists():
        pytest.skip(f"official dev set not found at {DEV_SET}")
    tok = minilm_tokenizer()
    ex = dev_set_columns()
    f = prepare_validation_features(ex, tok, max_seq_length=384, doc_stride=128, max_query_length=64)
    assert len(f["input_ids"]) == 10784
    index = {qid: i for i, qid in enumerate(ex["id"])}
    covered, exact, labelled_questions = 0, 0, set()
    for k, qid in enumerate(f["example_id"]):
        i = index[qid]
        context = ex["context"][i]
        a_start = ex["answers"][i]["answer_start"][0]
        a_end = a_start + len(ex["answers"][i]["text"][0])
        offsets = [o for o in f["offset_mapping"][k] if o is not None]
        inside = offsets[0][0] <= a_start and a_end <= offsets[-1][1]
        s, e = f["start_positions"][k], f["end_positions"][k]
        if not inside:
            assert (s, e) == (CLS_INDEX, CLS_INDEX), qid
            continue
        covered += 1
        labelled_questions.add(qid)
        span_start, span_end = f["offset_mapping"][k][s][0], f["offset_mapping"][k][e][1]
        assert span_start <= a_start and a_end <= span_end, qid
        on_boundaries = any(o[0] == a_start for o in offsets) and any(o[1] == a_end for o in offsets)
        if on_boundaries:
            assert context[span_start:span_end] == ex["answers"][i]["text"][0], qid
            exact += 1
        else:  # minimal: shrinking either end would lose part of the answer
            assert f["offset_mapping"][k][s][1] > a_start and f["offset_mapping"][k][e][0] < a_end, qid
    assert len(labelled_questions) == len(ex["id"]), "every dev answer fits some 384-token window"
    assert exact / covered > 0.97
