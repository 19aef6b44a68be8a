"""The checks of a Table: one InputError for the first problem found, naming the question and saying
how many others share it."""
from collections import Counter

from qa.data.table import Table
from qa.errors import InputError, plural, short


def validate(table: Table, version_2_with_negative: bool, check_answer_spans: bool = True) -> None:
    for column, fix in (("id", "give every question a unique id"), ("question", "write the question or delete it"),
                        ("context", "give the paragraph or delete the question")):
        values = getattr(table, column)
        bad = [i for i, value in enumerate(values) if not value.strip()]
        if bad:
            also = f" ({len(bad)} of {len(values)} questions)" if len(bad) > 1 else ""
            raise InputError(table.name(bad[0]), f"has an empty {column}{also}", fix)
    counts = Counter(table.id)
    if len(counts) < len(table.id):
        qid, times = counts.most_common(1)[0]
        repeated = plural(sum(1 for c in counts.values() if c > 1), "id")
        raise InputError(table.where, f"question id {qid!r} occurs {times} times ({repeated} repeated in all)",
                         "give every question a unique id (predictions and the metric are keyed by id)")
    unanswerable = [i for i, a in enumerate(table.answers) if not a["text"]]
    if table.has_answers and not version_2_with_negative and unanswerable:
        raise InputError(table.name(unanswerable[0]), f"has no answer: this is SQuAD v2.0 data ("
                         f"{len(unanswerable)} of {len(table.id)} questions are unanswerable)",
                         "pass --version_2_with_negative, or remove them (bert-squad-score reads v2.0 from "
                         "\"version\": \"v2.0\" or an \"is_impossible\" question)")
    _check_answers(table, check_answer_spans)


def _check_answers(table: Table, check_spans: bool) -> None:
    """Every answer text is non-empty and (`check_spans`) sits exactly at its answer_start."""
    empty, wrong = [], []
    for i, (context, answers) in enumerate(zip(table.context, table.answers)):
        for text, start in zip(answers["text"], answers["answer_start"]):
            if not text:
                empty.append((i, start))
            elif check_spans and (start < 0 or context[start:start + len(text)] != text):
                wrong.append((i, text, start))
    if empty:
        i, start = empty[0]
        raise InputError(table.name(i), f"has an empty answer text (answer_start {start}; "
                         f"{plural(len(empty), 'empty answer')} in all)",
                         "write the answer as it appears in the context; an unanswerable question "
                         "(SQuAD v2.0) has no answers at all")
    if wrong:
        i, text, start = wrong[0]
        context = table.context[i]
        found = (short(context[start:start + len(text)]) if 0 <= start < len(context) else
                 f"nothing (the context has {len(context)} characters)")
        first = context.find(text)
        hint = f"the text occurs at offset {first}" if first >= 0 else "the text does not occur in the context at all"
        n_answers = sum(len(a["text"]) for a in table.answers)
        raise InputError(table.name(i), f"answer_start {start} does not point at the answer: expected "
                         f"{short(text)}, found {found} ({len(wrong)} of {plural(n_answers, 'answer')} wrong)",
                         f"correct answer_start or the answer text ({hint}; whitespace and case must match exactly)")
