"""Tokenizers other than BERT's as it ships: the same BERT tokenizer padding on the left, a
RoBERTa-style model whose byte-level BPE tokenizer is trained here in seconds (no
token_type_ids, <s>/</s> special tokens, positions offset by the padding index), and the
tokenizers and settings refused before anything runs."""
import json
import logging
import re
import unicodedata

import numpy as np
import pytest

from qa.errors import InputError
from utils_qa import CLS_INDEX, check_tokenizer, prepare_train_features, prepare_validation_features
from tests.helpers import DEV_SET, dev_set_columns, go_offline, minilm_tokenizer
from tests.helpers import losses as logged_losses

WINDOW = dict(max_seq_length=128, doc_stride=32, max_query_length=32)
SLICE_TITLES = ("Normans", "Teacher")  # long contexts: most questions get several windows


def _need_dev_set():
    if not DEV_SET.exists():
        pytest.skip(f"official dev set not found at {DEV_SET}")


def _dev_slice(titles=SLICE_TITLES, per_title=40):
    """The first `per_title` questions of each article in `titles`, as columns."""
    _need_dev_set()
    cols = dev_set_columns()
    rows = []
    for title in titles:
        rows += [i for i, t in enumerate(cols["title"]) if t == title][:per_title]
    return {k: [cols[k][i] for i in rows] for k in ("id", "title", "question", "context", "answers")}


def _tokenizer(side):
    if side == "right":
        return minilm_tokenizer()
    from transformers import AutoTokenizer

    from qa.model import bundled_minilm_dir

    tok = AutoTokenizer.from_pretrained(bundled_minilm_dir(), padding_side="left")
    assert tok.padding_side == "left"
    return tok


def _key(text):
    """Text compared as an uncased wordpiece decoding can reproduce it: no accents, case, spaces
    or punctuation (BERT's decoder puts spaces around punctuation)."""
    text = unicodedata.normalize("NFD", text.lower())
    return re.sub(r"[\W_]", "", "".join(c for c in text if unicodedata.category(c) != "Mn"))


def _batches(features, tokenizer, padded, batch_size=8):
    """The batches the model sees: the padded path's default collator, or the dynamic path's."""
    from transformers import default_data_collator

    from qa.data.collate import BucketPaddingCollator

    keys = [k for k in features.keys() if k not in ("example_id", "offset_mapping")]
    rows = [{k: features[k][i] for k in keys} for i in range(len(features["input_ids"]))]
    collate = default_data_collator if padded else BucketPaddingCollator(tokenizer, WINDOW["max_seq_length"])
    for i in range(0, len(rows), batch_size):
        yield i, collate(rows[i:i + batch_size])


# ---------------------------------------------------------------------------------------------
# A tokenizer that pads on the left


@pytest.mark.parametrize("padded", [True, False], ids=["padded", "dynamic"])
@pytest.mark.parametrize("side", ["right", "left"])
def test_labels_point_at_the_answer_in_the_batches_the_model_sees(side, padded):
    """In every batch, a labelled window's start..end tokens decode to the gold answer, and a
    window without it is labelled with the position of the CLS token; on the left-padding
    tokenizer the context comes first (the well-known example's order for it)."""
    tok = _tokenizer(side)
    ex = _dev_slice()
    train = prepare_train_features(ex, tok, **WINDOW, pad_to_max_length=padded)
    f = prepare_validation_features(ex, tok, **WINDOW, pad_to_max_length=padded)
    for key in ("input_ids", "attention_mask", "start_positions", "end_positions"):
        assert train[key] == f[key], key  # the training features are the labelled evaluation ones
    context_first = f["offset_mapping"][0][1] is not None
    assert context_first == (side == "left")
    gold = {qid: a["text"][0] for qid, a in zip(ex["id"], ex["answers"])}
    exact, labelled, unlabelled, answered = 0, 0, 0, set()
    for first, batch in _batches(f, tok, padded):
        for i, ids in enumerate(batch["input_ids"].tolist()):
            s, e = batch["start_positions"][i].item(), batch["end_positions"][i].item()
            qid = f["example_id"][first + i]
            if (s, e) == (CLS_INDEX, CLS_INDEX):
                assert ids[s] == tok.cls_token_id, (qid, tok.convert_ids_to_tokens(ids[:3]))
                unlabelled += 1
                continue
            labelled += 1
            answered.add(qid)
            decoded = tok.decode(ids[s:e + 1])
            assert _key(gold[qid]) in _key(decoded), (qid, gold[qid], decoded)
            exact += _key(gold[qid]) == _key(decoded)
    assert labelled > 60 and unlabelled > 30, (labelled, unlabelled)
    assert len(answered) >= 0.97 * len(ex["id"])
    assert exact >= 0.95 * labelled, (exact, labelled)


def _oracle_predictions(tok, ex, padded, version_2):
    """Post-processed predictions from logits that peak where each feature's labels point, in
    the batches and at the widths the model's outputs would have (gathered across batches and
    padded with -100, as the Trainer does)."""
    from utils_qa import rank_answers

    f = prepare_validation_features(ex, tok, **WINDOW, pad_to_max_length=padded)
    width = WINDOW["max_seq_length"]
    start = np.full((len(f["input_ids"]), width), -100.0)
    end = start.copy()
    for first, batch in _batches(f, tok, padded):
        b, w = batch["input_ids"].shape
        rows = np.arange(b)
        s_logits, e_logits = np.full((b, w), -10.0), np.full((b, w), -10.0)
        s_logits[rows, batch["start_positions"].numpy()] = 10.0
        e_logits[rows, batch["end_positions"].numpy()] = 10.0
        start[first:first + b, :w], end[first:first + b, :w] = s_logits, e_logits
    feats = {"example_id": f["example_id"], "offset_mapping": f["offset_mapping"]}
    predictions, _, _ = rank_answers(ex, feats, start, end, version_2_with_negative=version_2)
    return predictions


def test_oracle_logits_give_back_the_gold_answers_whatever_the_padding():
    """Labels, offsets and logits index the same tokens for right and left padding, padded and
    dynamic: logits peaked at the labels post-process to the gold answers (and, for questions
    without an answer in SQuAD v2, to the null answer read at the CLS position)."""
    ex = _dev_slice()
    unanswerable = {"id": [f"{i}-none" for i in ex["id"][:10]], "title": ex["title"][:10],
                    "question": ex["question"][:10], "context": ex["context"][-10:],
                    "answers": [{"text": [], "answer_start": []}] * 10}
    with_none = {k: ex[k] + unanswerable[k] for k in ex}
    gold = {qid: a["text"][0] for qid, a in zip(ex["id"], ex["answers"])}
    results = {}
    for side in ("right", "left"):
        tok = _tokenizer(side)
        for padded in (True, False):
            results[side, padded] = _oracle_predictions(tok, ex, padded, version_2=False)
            v2 = _oracle_predictions(tok, with_none, padded, version_2=True)
            assert all(v2[qid] == "" for qid in unanswerable["id"]), (side, padded)
            assert {q: v2[q] for q in ex["id"]} == results[side, padded], (side, padded)
    reference = results["right", True]
    for combination, predictions in results.items():
        assert predictions == reference, combination
    exact = sum(reference[q] == gold[q] for q in ex["id"])
    contained = sum(gold[q] in reference[q] for q in ex["id"])
    assert contained >= 0.97 * len(ex["id"]) and exact >= 0.95 * len(ex["id"]), (exact, contained)


# ---------------------------------------------------------------------------------------------
# Tokenizers that are refused


def test_a_tokenizer_without_cls_is_refused():
    from transformers import PreTrainedTokenizerFast

    backend = minilm_tokenizer().backend_tokenizer
    tok = PreTrainedTokenizerFast(tokenizer_object=backend.__class__.from_str(backend.to_str()), pad_token="[PAD]")
    assert tok.cls_token_id is None
    with pytest.raises(InputError, match="has no CLS token.*Fix: use an encoder"):
        check_tokenizer(tok)
    with pytest.raises(InputError, match="no CLS token"):
        prepare_train_features(_example(), tok, **WINDOW)


def _cls_last_tokenizer():
    """BERT's vocabulary with XLNet's pair template: context <sep> question <sep> <cls>."""
    from tokenizers import Tokenizer, processors
    from transformers import PreTrainedTokenizerFast

    backend = Tokenizer.from_str(minilm_tokenizer().backend_tokenizer.to_str())
    backend.post_processor = processors.TemplateProcessing(
        single="$A [SEP] [CLS]", pair="$A [SEP] $B:1 [SEP]:1 [CLS]:2", special_tokens=[("[SEP]", 102), ("[CLS]", 101)])
    return PreTrainedTokenizerFast(tokenizer_object=backend, cls_token="[CLS]", sep_token="[SEP]", pad_token="[PAD]",
                                   unk_token="[UNK]", padding_side="left")


def _example():
    context = "The Eiffel Tower was finished in 1889 in Paris."
    return {"id": ["q1"], "question": ["When was it finished?"], "context": [context],
            "answers": [{"text": ["1889"], "answer_start": [context.index("1889")]}]}


def test_a_tokenizer_that_puts_cls_last_is_refused():
    tok = _cls_last_tokenizer()
    with pytest.raises(InputError, match=r"puts its CLS token at position 4 .* not first \(XLNet-style\)"):
        check_tokenizer(tok)
    with pytest.raises(InputError, match="XLNet-style"):
        prepare_validation_features(_example(), tok, **WINDOW)


# ---------------------------------------------------------------------------------------------
# A RoBERTa-style model: byte-level BPE trained on the dev set, no token_type_ids

ROBERTA_MAX_SEQ_LENGTH = 128


@pytest.fixture(scope="module")
def roberta_dir(tmp_path_factory):
    """A tiny random RobertaForQuestionAnswering and a byte-level BPE tokenizer trained on the
    dev set's contexts and questions (about a second), saved as a model folder."""
    _need_dev_set()
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers
    from transformers import RobertaConfig, RobertaForQuestionAnswering, RobertaTokenizer, set_seed

    cols = dev_set_columns()
    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    # RoBERTa's special tokens at RoBERTa's ids: <s> 0, <pad> 1, </s> 2.
    trainer = trainers.BpeTrainer(vocab_size=3000, special_tokens=["<s>", "<pad>", "</s>", "<unk>", "<mask>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    bpe.train_from_iterator(list(dict.fromkeys(cols["context"])) + cols["question"], trainer)
    learned = json.loads(bpe.to_str())["model"]
    # RoBERTa's own fast tokenizer around the learned vocabulary: its post-processor makes
    # <s> q </s></s> c </s> with trimmed offsets.
    tok = RobertaTokenizer(vocab=learned["vocab"], merges=[tuple(m) for m in learned["merges"]])
    assert (tok.cls_token_id, tok.pad_token_id, tok.sep_token_id) == (0, 1, 2)
    set_seed(0)
    config = RobertaConfig(vocab_size=len(tok), hidden_size=64, num_hidden_layers=2, num_attention_heads=2,
                           intermediate_size=256, type_vocab_size=1, pad_token_id=tok.pad_token_id,
                           bos_token_id=tok.cls_token_id, eos_token_id=tok.sep_token_id,
                           # positions are numbered from pad_token_id + 1
                           max_position_embeddings=ROBERTA_MAX_SEQ_LENGTH + tok.pad_token_id + 1)
    folder = tmp_path_factory.mktemp("tiny-roberta")
    RobertaForQuestionAnswering(config).save_pretrained(folder)
    tok.save_pretrained(folder)
    return folder


def _roberta_tokenizer(folder):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(folder)


def test_roberta_labels_map_back_to_the_answers(roberta_dir):
    tok = _roberta_tokenizer(roberta_dir)
    assert type(tok).__name__ == "RobertaTokenizer" and "token_type_ids" not in tok.model_input_names
    ex = _dev_slice(per_title=15)
    f = prepare_validation_features(ex, tok, **WINDOW)
    train = prepare_train_features(ex, tok, **WINDOW)
    assert "token_type_ids" not in f and "token_type_ids" not in train
    assert train["start_positions"] == f["start_positions"] and train["input_ids"] == f["input_ids"]
    index = {qid: i for i, qid in enumerate(ex["id"])}
    exact = labelled = unlabelled = 0
    for k, qid in enumerate(f["example_id"]):
        ids, s, e = f["input_ids"][k], f["start_positions"][k], f["end_positions"][k]
        last = sum(f["attention_mask"][k]) - 1  # padded on the right, with <pad>
        assert ids[0] == tok.cls_token_id and tok.convert_ids_to_tokens(ids[last]) == "</s>"
        assert set(ids[last + 1:]) <= {tok.pad_token_id}
        if (s, e) == (CLS_INDEX, CLS_INDEX):
            unlabelled += 1
            continue
        labelled += 1
        i = index[qid]
        answer = ex["answers"][i]["text"][0]
        text = ex["context"][i][f["offset_mapping"][k][s][0]:f["offset_mapping"][k][e][1]]
        assert answer in text and answer in tok.decode(ids[s:e + 1]), (qid, answer, text)
        exact += text == answer
    assert labelled > 20 and unlabelled > 20 and exact >= 0.95 * labelled, (labelled, unlabelled, exact)


def _main(monkeypatch, tmp_path, args):
    """run_qa.main in-process (a fresh interpreter would cost ~10 s of imports)."""
    from run_qa import main

    go_offline(monkeypatch, tmp_path / "hf")
    return main([*args, "--features_cache_dir", str(tmp_path / "features"), "--use_cpu", "true",
                 "--report_to", "none"])


@pytest.mark.slow
def test_roberta_trains_and_answers_every_question_through_run_qa(roberta_dir, tmp_path, monkeypatch):
    """Train (40 steps) on one dev article, evaluate on another, with dynamic padding (<pad> is
    id 1, and the model has a single token type). About 25 s on 2 cores."""
    out = tmp_path / "out"
    code = _main(monkeypatch, tmp_path, [
        "--model_name_or_path", str(roberta_dir), "--do_train", "--do_eval",
        "--train_file", str(DEV_SET), "--train_articles", "1:2", "--validation_file", str(DEV_SET),
        "--validation_articles", "2:3", "--max_seq_length", str(ROBERTA_MAX_SEQ_LENGTH), "--doc_stride", "32",
        "--max_query_length", "32", "--pad_to_max_length", "false", "--per_device_train_batch_size", "16",
        "--per_device_eval_batch_size", "64", "--learning_rate", "2e-3", "--max_steps", "40",
        "--logging_steps", "8", "--seed", "0", "--output_dir", str(out)])
    assert code == 0
    results = json.loads((out / "all_results.json").read_text())
    predictions = json.loads((out / "predictions.json").read_text())
    validation = [i for i, t in enumerate(dev_set_columns()["title"]) if t == "Normans"]
    assert sorted(predictions) == sorted(dev_set_columns()["id"][i] for i in validation)
    assert all(isinstance(p, str) and p for p in predictions.values())
    # An F1 of about 4 after 40 steps tells little; the losses do: 4.33 down to 2.22 in training, 2.85 held out
    losses = logged_losses(out)
    assert len(losses) >= 3 and losses[-1] < losses[0] - 1, losses
    assert results["eval_loss"] < losses[0] - 1, (results["eval_loss"], losses)  # learnt beyond its training article


def _assert_refused(code, capsys, out, must_mention):
    assert code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err and err[-1].startswith("error:") and "Fix:" in err[-1], err
    assert must_mention in err[-1], err[-1]
    assert not out.exists(), "bad input must leave no output behind"
    return err[-1]


SYNTHETIC = ["--dataset_name", "synthetic", "--synthetic_train_examples", "20", "--do_train",
             "--doc_stride", "32", "--max_query_length", "32"]


def test_roberta_positions_reserved_for_padding_are_not_usable(roberta_dir, tmp_path, monkeypatch, capsys):
    """max_position_embeddings is 130, but RoBERTa numbers positions from padding_idx + 1 = 2."""
    from transformers import AutoModelForQuestionAnswering

    from qa.model import usable_positions

    model = AutoModelForQuestionAnswering.from_pretrained(roberta_dir)
    assert model.config.max_position_embeddings == ROBERTA_MAX_SEQ_LENGTH + 2
    assert usable_positions(model) == ROBERTA_MAX_SEQ_LENGTH
    out = tmp_path / "out"
    code = _main(monkeypatch, tmp_path, ["--model_name_or_path", str(roberta_dir), *SYNTHETIC, "--max_seq_length",
                                         str(ROBERTA_MAX_SEQ_LENGTH + 1), "--output_dir", str(out)])
    line = _assert_refused(code, capsys, out, "max_seq_length=129")
    assert "position embeddings for 128 tokens only (130 rows, the first padding_idx + 1 = 2 reserved)" in line
    assert "Fix: lower --max_seq_length to 128 or less" in line


def test_bert_tokenizer_on_a_model_without_token_types_is_refused(roberta_dir, tmp_path, monkeypatch, capsys):
    from qa.model import bundled_minilm_dir

    out = tmp_path / "out"
    code = _main(monkeypatch, tmp_path, ["--model_name_or_path", str(roberta_dir), "--tokenizer_name",
                                         str(bundled_minilm_dir()), *SYNTHETIC, "--max_seq_length", "128",
                                         "--output_dir", str(out)])
    line = _assert_refused(code, capsys, out, "token type 1")
    assert "type_vocab_size" in line


def test_cls_last_tokenizer_is_refused_before_anything_runs(tmp_path, monkeypatch, capsys):
    folder = tmp_path / "cls-last"
    _cls_last_tokenizer().save_pretrained(folder)
    out = tmp_path / "out"
    code = _main(monkeypatch, tmp_path, ["--model_name_or_path", "bundled:tiny-bert", "--tokenizer_name",
                                         str(folder), *SYNTHETIC, "--max_seq_length", "128", "--output_dir", str(out)])
    _assert_refused(code, capsys, out, "XLNet-style")


def test_window_room_counts_the_tokenizers_own_special_tokens(roberta_dir):
    """RoBERTa's pair template has 4 special tokens, BERT's 3: a stride that fits BERT's room
    would make the RoBERTa tokenizer panic mid-run."""
    tok = _roberta_tokenizer(roberta_dir)
    check_tokenizer(minilm_tokenizer(), 128, 92, 32)  # room 128 - 32 - 3 = 93
    with pytest.raises(InputError, match="max_seq_length - max_query_length - 4 = 92"):
        check_tokenizer(tok, 128, 92, 32)


def test_max_seq_length_beyond_the_positions_is_refused_before_the_weights_load(tmp_path, monkeypatch, capsys,
                                                                               caplog):
    """The refusal needs the configuration only: no weights read, so no word about the new QA head either."""
    out = tmp_path / "out"
    with caplog.at_level(logging.INFO):
        code = _main(monkeypatch, tmp_path, ["--model_name_or_path", "bundled:minilm", *SYNTHETIC,
                                             "--max_seq_length", "520", "--output_dir", str(out)])
    line = _assert_refused(code, capsys, out, "max_seq_length=520")
    assert "has position embeddings for 512 tokens only" in line
    assert not [r.getMessage() for r in caplog.records if r.name == "qa.model"], "the weights were loaded"
