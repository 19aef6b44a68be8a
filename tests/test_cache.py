"""The tokenized-features cache: keyed by everything that matters, reused, never torn."""
from qa.data.cache import cached_features, features_key
from qa.data.features import prepare_train_features, prepare_validation_features
from qa.arguments import DataArguments
from qa.data.sources import load_raw_datasets
from tests.helpers import minilm_tokenizer

PARAMS = dict(max_seq_length=128, doc_stride=32, max_query_length=32, pad_to_max_length=False)


def _examples(n=60, seed=0):
    args = DataArguments(dataset_name="synthetic", synthetic_train_examples=n, synthetic_seed=seed)
    return load_raw_datasets(args, splits=("train",))["train"]


def test_key_depends_on_data_parameters_function_and_tokenizer():
    tok = minilm_tokenizer()
    ex = _examples()
    key = features_key(ex, tok, prepare_train_features, PARAMS)
    assert key == features_key(_examples(), tok, prepare_train_features, PARAMS), "same content, same key"
    assert key != features_key(_examples(seed=1), tok, prepare_train_features, PARAMS)
    assert key != features_key(ex.select(range(30)), tok, prepare_train_features, PARAMS)
    assert key != features_key(ex, tok, prepare_validation_features, PARAMS)
    assert key != features_key(ex, tok, prepare_train_features, {**PARAMS, "doc_stride": 16})
    tok2 = minilm_tokenizer().__class__.from_pretrained(minilm_tokenizer().name_or_path, do_lower_case=False)
    assert key != features_key(ex, tok2, prepare_train_features, PARAMS)


def test_second_call_is_a_hit_with_identical_features(tmp_path):
    tok = minilm_tokenizer()
    ex = _examples()
    first, hit1 = cached_features(ex, tok, prepare_train_features, PARAMS, cache_dir=tmp_path)
    second, hit2 = cached_features(ex, tok, prepare_train_features, PARAMS, cache_dir=tmp_path)
    assert (hit1, hit2) == (False, True)
    assert first.to_dict() == second.to_dict()
    assert not [p for p in tmp_path.iterdir() if ".tmp-" in p.name], "no staging folder left behind"
    again, hit3 = cached_features(ex, tok, prepare_train_features, PARAMS, cache_dir=tmp_path, overwrite=True)
    assert hit3 is False and again.to_dict() == first.to_dict()


def test_worker_processes_give_the_same_features(tmp_path):
    tok = minilm_tokenizer()
    ex = _examples(120)
    one, _ = cached_features(ex, tok, prepare_validation_features, PARAMS, cache_dir=tmp_path / "a")
    two, _ = cached_features(ex, tok, prepare_validation_features, PARAMS, cache_dir=tmp_path / "b", num_proc=2)
    assert one.to_dict() == two.to_dict()


def test_key_depends_on_the_tokenizer_settings_that_change_the_features():
    """The padding side picks the question/context order, the truncation side where windows
    start, the input names whether token_type_ids are made: none of them is in the backend
    tokenizer's definition."""
    from transformers import AutoTokenizer

    from qa.model import bundled_minilm_dir

    ex = _examples()
    key = features_key(ex, minilm_tokenizer(), prepare_train_features, PARAMS)
    assert key == features_key(ex, AutoTokenizer.from_pretrained(bundled_minilm_dir()), prepare_train_features, PARAMS)
    for setting in (dict(padding_side="left"), dict(truncation_side="left"),
                    dict(model_input_names=["input_ids", "attention_mask"])):
        other = AutoTokenizer.from_pretrained(bundled_minilm_dir(), **setting)
        assert key != features_key(ex, other, prepare_train_features, PARAMS), setting
    left = AutoTokenizer.from_pretrained(bundled_minilm_dir(), padding_side="left")
    right = minilm_tokenizer()
    assert prepare_train_features(ex[:3], left, **PARAMS) != prepare_train_features(ex[:3], right, **PARAMS)
