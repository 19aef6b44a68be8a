"""The fast path's switches on a CPU: fused attention, dynamic padding to a few lengths,
length-grouped batches (with evaluation kept in order), the compile settings, a cached rerun that
tokenizes nothing, and a small run of configs/fast.json's switches through run_qa.py."""
import json
import logging
import os
import subprocess
import sys
import time
from types import SimpleNamespace

import pytest

from tests.helpers import REPO, go_offline, minilm_tokenizer, offline_env
from tests.helpers import losses as logged_losses

EXAMPLES = {
    "id": [f"q{i}" for i in range(40)],
    "title": ["t"] * 40,
    "question": [("what is " + "very " * (i % 7) + "here?") for i in range(40)],
    "context": [" ".join(["word"] * (5 + 9 * i)) + " The answer is Paris." for i in range(40)],
}
EXAMPLES["answers"] = [{"text": ["Paris"], "answer_start": [c.index("Paris")]} for c in EXAMPLES["context"]]


@pytest.fixture(scope="module")
def features():
    from datasets import Dataset

    from utils_qa import prepare_train_features

    ds = Dataset.from_dict(EXAMPLES)
    return ds.map(prepare_train_features, batched=True, remove_columns=ds.column_names,
                  fn_kwargs=dict(tokenizer=minilm_tokenizer(), max_seq_length=128, doc_stride=32,
                                 max_query_length=32, pad_to_max_length=False))


# ---------------------------------------------------------------------------------------------
# Attention kernel and compile settings


@pytest.mark.parametrize("kernel", ["sdpa", "eager"])
def test_attention_implementation_reaches_the_model(tmp_path, kernel):
    from qa.arguments import ModelArguments
    from qa.model import load_model_and_tokenizer

    model, _ = load_model_and_tokenizer(ModelArguments("bundled:tiny-bert", attn_implementation=kernel),
                                        work_dir=tmp_path)
    assert model.config._attn_implementation == kernel


def test_unknown_attention_implementation_is_an_input_error(tmp_path):
    from qa.arguments import ModelArguments
    from qa.errors import InputError
    from qa.model import load_model_and_tokenizer

    with pytest.raises(InputError, match="attn_implementation"):
        load_model_and_tokenizer(ModelArguments("bundled:tiny-bert", attn_implementation="nonsense"),
                                 work_dir=tmp_path)


def test_sdpa_and_eager_compute_the_same_logits(tmp_path):
    import torch

    from qa.arguments import ModelArguments
    from qa.model import load_model_and_tokenizer

    out = {}
    batch = minilm_tokenizer()(["who is it?", "where?"], ["it is a test of attention", "here"],
                               padding=True, return_tensors="pt")
    for kernel in ("sdpa", "eager"):
        model, _ = load_model_and_tokenizer(ModelArguments("bundled:tiny-bert", attn_implementation=kernel),
                                            work_dir=tmp_path)
        with torch.no_grad():
            out[kernel] = model.eval()(**batch).start_logits
    torch.testing.assert_close(out["sdpa"], out["eager"], atol=1e-5, rtol=1e-4)


def test_compile_settings_reach_accelerate(monkeypatch, tmp_path):
    import torch._dynamo
    from accelerate.utils import TorchDynamoPlugin

    from qa.training.compile import STATIC_RECOMPILE_LIMIT, configure_compile

    for var in ("ACCELERATE_DYNAMO_USE_DYNAMIC", "ACCELERATE_DYNAMO_USE_REGIONAL_COMPILATION"):
        monkeypatch.delenv(var, raising=False)
    for var in ("TORCHINDUCTOR_CACHE_DIR", "TRITON_CACHE_DIR"):  # set by configure_compile: put back afterwards
        monkeypatch.setenv(var, os.environ.get(var, ""))
    import torch.fx.experimental._config as shapes

    args = lambda dynamic, regional: SimpleNamespace(compile_dynamic=dynamic, compile_regional=regional,  # noqa
                                                     compile_cache_dir=None)
    # The config modules' own patch(): pytest's monkeypatch would delete (and so hide) these
    # attributes when it undoes, as they live outside the module's __dict__.
    with torch._dynamo.config.patch(recompile_limit=8, specialize_float=False), shapes.patch(use_duck_shape=True):
        configure_compile(args("auto", False), tmp_path)
        plugin = TorchDynamoPlugin(backend="inductor", dynamic=None)  # what the Trainer builds
        assert plugin.dynamic is None and not plugin.use_regional_compilation
        assert os.environ["TORCHINDUCTOR_CACHE_DIR"] == str(tmp_path.resolve() / "torch_compile")  # the features cache's
        assert torch._dynamo.config.specialize_float  # no restarted frame, whose first attempt no cache holds
        configure_compile(args("true", True), tmp_path)
        plugin = TorchDynamoPlugin(backend="inductor", dynamic=None)
        assert plugin.dynamic is True and plugin.use_regional_compilation
        assert shapes.use_duck_shape is False  # equal sizes at tracing get symbols of their own
        configure_compile(args("false", True), tmp_path)
        assert TorchDynamoPlugin(backend="inductor", dynamic=None).dynamic is False
        assert torch._dynamo.config.recompile_limit >= STATIC_RECOMPILE_LIMIT
        configure_compile(args("false", False), tmp_path)  # after a regional run in the same process: its own choice
        assert not TorchDynamoPlugin(backend="inductor", dynamic=None).use_regional_compilation


@pytest.mark.parametrize("capability, bf16, changes, note", [
    ((7, 5), True, {"bf16": False, "fp16": True, "tf32": False}, "this GPU (compute capability 7.5) has no native "
     "bf16 and no TF32: training in fp16 with loss scaling instead of bf16, tf32 off"),
    ((7, 0), False, {"tf32": False}, "this GPU (compute capability 7.0) has no TF32: tf32 off"),
    ((8, 0), True, {}, None),
    ((9, 0), True, {}, None),
    (None, True, {"tf32": False}, "the CPU has no TF32: tf32 off"),
], ids=["T4", "V100 fp32", "A100", "H100", "CPU"])
def test_precision_follows_the_device(capability, bf16, changes, note):
    """configs/fast.json asks for bf16 and TF32: what each device gets instead, and the line saying so."""
    from qa.training.flops import device_precision
    from qa.errors import InputError

    assert device_precision(capability, bf16, True) == (changes, note)
    assert device_precision(capability, bf16, None)[0].get("tf32") is None
    if capability is None:  # no fp16 autocast on a CPU: refused, not trained in fp32 under fp16's name
        with pytest.raises(InputError, match="fp16=true: the CPU cannot train in fp16"):
            device_precision(capability, False, None, fp16=True)
    else:  # every GPU runs fp16 autocast
        assert device_precision(capability, False, None, fp16=True) == ({}, None)


def test_fast_config_parses_on_a_cpu(tmp_path, caplog):
    """configs/fast.json as it is: bf16 stays on a CPU (autocast runs it), TF32 is dropped with one line and
    recorded (transformers itself refuses --tf32 without an Ampere GPU)."""
    from qa.arguments import parse_args

    with caplog.at_level(logging.WARNING, logger="qa.arguments"):
        _, _, run_args, training_args, _ = parse_args([str(REPO / "configs" / "fast.json"), "--use_cpu", "true",
                                                       "--output_dir", str(tmp_path / "out")])
    assert training_args.bf16 and not training_args.fp16 and training_args.tf32 is False
    said = [r.getMessage() for r in caplog.records if r.name == "qa.arguments"]
    assert run_args.adjusted == ["the CPU has no TF32: tf32 off"] == said


# ---------------------------------------------------------------------------------------------
# Dynamic padding to buckets


def test_bucketed_padding_yields_only_bucket_lengths(features):
    from qa.data.collate import BucketPaddingCollator

    tok = minilm_tokenizer()
    rows = [features[i] for i in range(len(features))]
    lengths = [len(r["input_ids"]) for r in rows]
    assert len(set(lengths)) > 10 and max(lengths) <= 128
    for kwargs, allowed in ((dict(pad_to_multiple_of=64), {64, 128}),
                            (dict(pad_to_multiple_of=8), set(range(8, 129, 8))),
                            (dict(length_buckets=[48, 96, 128]), {48, 96, 128})):
        collate = BucketPaddingCollator(tok, 128, **kwargs)
        seen = set()
        for i in range(0, len(rows), 5):
            batch = collate(rows[i:i + 5])
            width = batch["input_ids"].shape[1]
            seen.add(width)
            assert width in allowed and width >= max(lengths[i:i + 5]), (kwargs, width)
            assert batch["attention_mask"].sum().item() == sum(lengths[i:i + 5])
        assert len(seen) > 1 or len(allowed) == 1


def test_bucket_collator_matches_the_transformers_collator(features):
    """With multiples of 8 the batches are exactly DataCollatorWithPadding(pad_to_multiple_of=8)'s
    (what dynamic padding used before); the length column is dropped, labels are kept."""
    import torch
    from transformers import DataCollatorWithPadding

    from qa.data.collate import BucketPaddingCollator, add_length_column

    tok = minilm_tokenizer()
    with_length = add_length_column(features)
    rows = [with_length[i] for i in range(7)]
    ours = BucketPaddingCollator(tok, 128, pad_to_multiple_of=8)(rows)
    theirs = DataCollatorWithPadding(tok, pad_to_multiple_of=8)([{k: v for k, v in r.items() if k != "length"}
                                                                for r in rows])
    assert "length" not in ours and set(ours) == set(theirs)
    for key in theirs:
        assert torch.equal(ours[key], theirs[key]), key


def test_length_column_is_computed_without_reading_rows(features):
    from qa.data.collate import add_length_column

    with_length = add_length_column(features)
    assert with_length["length"][:] == [len(ids) for ids in features["input_ids"][:]]
    sub = with_length.select([3, 1, 2])  # a view with indices
    assert add_length_column(features.select([3, 1, 2]))["length"][:] == sub["length"][:]


# ---------------------------------------------------------------------------------------------
# Length-grouped sampling through the Trainer


def _trainer(tmp_path, features, eval_features=None, **kwargs):
    from transformers import TrainingArguments

    from qa.arguments import ModelArguments
    from qa.data.collate import BucketPaddingCollator, add_length_column
    from qa.model import load_model_and_tokenizer
    from trainer_qa import QuestionAnsweringTrainer

    model, tok = load_model_and_tokenizer(ModelArguments("bundled:tiny-bert"), work_dir=tmp_path)
    args = TrainingArguments(str(tmp_path / "out"), use_cpu=True, report_to="none", per_device_train_batch_size=4,
                             per_device_eval_batch_size=4, **kwargs)
    return QuestionAnsweringTrainer(model=model, args=args, train_dataset=add_length_column(features),
                                    eval_dataset=eval_features, processing_class=tok,
                                    data_collator=BucketPaddingCollator(tok, 128))


def test_grouped_batches_read_the_length_column_and_hold_little_padding(tmp_path, features, monkeypatch):
    """remove_unused_columns (on by default) drops `length` before transformers builds the
    sampler; the trainer must still use the column, not measure every row."""
    from transformers.trainer_pt_utils import LengthGroupedSampler

    trainer = _trainer(tmp_path, features, train_sampling_strategy="group_by_length")
    assert trainer.args.remove_unused_columns
    calls = []
    original = LengthGroupedSampler.__init__

    def spy(self, *args, **kwargs):
        calls.append(kwargs.get("lengths"))
        original(self, *args, **kwargs)

    monkeypatch.setattr(LengthGroupedSampler, "__init__", spy)
    loader = trainer.get_train_dataloader()
    assert calls and calls[0] == features.map(lambda r: {"n": len(r["input_ids"])})["n"][:]
    real = padded = 0
    for batch in loader:
        assert "length" not in batch
        real += batch["attention_mask"].sum().item()
        padded += batch["attention_mask"].numel()
    random_trainer = _trainer(tmp_path, features)
    r_real = r_padded = 0
    for batch in random_trainer.get_train_dataloader():
        r_real += batch["attention_mask"].sum().item()
        r_padded += batch["attention_mask"].numel()
    assert real == r_real  # the same features, every one once
    assert padded < r_padded, (padded, r_padded)


def test_evaluation_keeps_feature_order_with_group_by_length(tmp_path, features):
    """Post-processing pairs logits and features by position: transformers 5.23 would shuffle
    the evaluation set by length too when train_sampling_strategy is group_by_length. Both public
    loaders keep the order, and training's strategy is left as it was."""
    eval_features = features.remove_columns(["start_positions", "end_positions"])
    trainer = _trainer(tmp_path, features, eval_features, train_sampling_strategy="group_by_length")
    expected = eval_features["input_ids"][:]
    for loader in (trainer.get_eval_dataloader(), trainer.get_test_dataloader(eval_features)):
        rows = [ids for batch in loader for ids in batch["input_ids"].tolist()]
        assert [r[:len(f)] for r, f in zip(rows, expected)] == expected
    assert trainer.args.train_sampling_strategy == "group_by_length"
    # what the loaders above prevent: the Trainer's own evaluation sampler under group_by_length
    from transformers import Trainer

    shuffled = list(Trainer._get_eval_sampler(trainer, trainer.eval_dataset))
    assert shuffled != list(range(len(expected)))


# ---------------------------------------------------------------------------------------------
# Cache: a rerun tokenizes nothing, for every split


def test_cache_key_does_not_depend_on_what_was_tokenized_before(tmp_path):
    """A fast tokenizer keeps the truncation/padding of its last call; a key that hashed it made
    a rerun whose training split was a cache hit miss its validation split."""
    from datasets import Dataset

    from qa.data.cache import cached_features, features_key
    from utils_qa import prepare_train_features, prepare_validation_features

    tok = minilm_tokenizer()
    ds = Dataset.from_dict(EXAMPLES)
    params = dict(max_seq_length=128, doc_stride=32, max_query_length=32, pad_to_max_length=True)
    key = features_key(ds, tok, prepare_validation_features, params)
    cached_features(ds, tok, prepare_train_features, params, cache_dir=tmp_path)  # changes the tokenizer's state
    assert features_key(ds, tok, prepare_validation_features, params) == key
    _, hit = cached_features(ds, tok, prepare_validation_features, params, cache_dir=tmp_path)
    assert not hit
    _, hit = cached_features(ds, tok, prepare_train_features, params, cache_dir=tmp_path)
    assert hit
    _, hit = cached_features(ds, tok, prepare_validation_features, params, cache_dir=tmp_path)
    assert hit


# ---------------------------------------------------------------------------------------------
# The fast config's switches, end to end through run_qa.py


# configs/fast.json, adapted to a CPU (no TF32 there; compilation tested apart) and to a tiny
# model on generated data.
FAST_ON_CPU = ["--model_name_or_path", "bundled:tiny-bert", "--dataset_name", "synthetic",
               "--synthetic_train_examples", "600", "--synthetic_eval_examples", "150",
               "--max_seq_length", "128", "--doc_stride", "32", "--max_query_length", "32",
               "--learning_rate", "2e-3", "--num_train_epochs", "3", "--per_device_eval_batch_size", "32",
               "--logging_steps", "4", "--use_cpu", "true", "--tf32", "false", "--torch_compile", "false",
               "--report_to", "none", "--dataloader_num_workers", "1"]


def _run(args, tmp_path, monkeypatch):
    """run_qa.main in this process: the process boundary is not what these tests test."""
    from run_qa import main

    go_offline(monkeypatch, tmp_path / "hf_home", drop=("TENSORBOARD_LOGGING_DIR",))
    assert main([str(arg) for arg in args]) == 0


def test_records_say_what_trained(tmp_path, monkeypatch):
    """bf16 on a CPU runs (accelerate autocasts it there): its losses differ from fp32's at the first step, and
    results.md and the model card name the precision, attention and optimizer the telemetry read from the live
    Trainer. Without the telemetry, the precision the settings gave (after device_precision)."""
    tiny = ["--max_steps", "2", "--logging_steps", "1", "--synthetic_train_examples", "40",
            "--synthetic_eval_examples", "8", "--per_device_train_batch_size", "8", "--do_train", "--do_eval",
            "--pad_to_max_length", "false", "--dataloader_num_workers", "0", "--attn_implementation", "eager",
            "--optim", "adamw_torch"]
    runs = {}
    for name, flags in (("bf16", ["--bf16", "true"]), ("fp32", ["--telemetry", "false"])):
        runs[name] = out = tmp_path / name
        _run([*FAST_ON_CPU, *tiny, *flags, "--output_dir", str(out)], tmp_path, monkeypatch)
    setup = json.loads((runs["bf16"] / "all_results.json").read_text())["train_setup"]
    assert (setup["matmul_precision"], setup["attn_implementation"], setup["optimizer"]) == ("bf16", "eager", "AdamW")
    said = "bf16 matmuls, eager attention, AdamW"
    assert f"| trained with | {said} |" in (runs["bf16"] / "results.md").read_text()
    assert f"weight decay 0, {said}; windows" in (runs["bf16"] / "README.md").read_text()
    assert "| trained with | fp32 matmuls |" in (runs["fp32"] / "results.md").read_text()
    assert logged_losses(runs["bf16"])[0] != logged_losses(runs["fp32"])[0]


@pytest.mark.slow
def test_fast_config_trains_and_evaluates_through_run_qa(tmp_path, monkeypatch):
    """configs/fast.json's switches train (the loss falls) and evaluate; evaluating the saved
    model again without length grouping gives the very same predictions, so the grouped run
    paired every feature with its own logits."""
    out = tmp_path / "fast"
    _run([str(REPO / "configs" / "fast.json"), *FAST_ON_CPU, "--output_dir", str(out)], tmp_path, monkeypatch)
    results = json.loads((out / "all_results.json").read_text())
    config = json.loads((out / "environment.json").read_text())["config"]
    assert config["bf16"] and config["attn_implementation"] == "sdpa" and not config["pad_to_max_length"]
    assert config["train_sampling_strategy"] == "group_by_length" and config["per_device_train_batch_size"] == 48
    assert config["optim"] == "adamw_torch_fused" and config["dataloader_persistent_workers"]
    losses = logged_losses(out)
    assert len(losses) >= 3 and losses[-1] < losses[0] - 0.5, losses
    # On these 150 held-out questions an untrained model's loss is 4.87 (F1 4.2), this run's 4.07 (F1 6.3, too close)
    assert results["eval_loss"] < 4.5, results["eval_loss"]
    again = tmp_path / "again"
    _run([*FAST_ON_CPU, "--model_name_or_path", str(out), "--do_eval", "--bf16", "true", "--pad_to_max_length",
          "false", "--output_dir", str(again)], tmp_path, monkeypatch)
    assert json.loads((again / "predictions.json").read_text()) == json.loads((out / "predictions.json").read_text())
    assert json.loads((again / "all_results.json").read_text())["eval_f1"] == results["eval_f1"]


@pytest.mark.slow
@pytest.mark.compile
def test_torch_compile_with_symbolic_lengths_does_not_recompile(tmp_path):
    """configs/fast.json's compilation (regional, dynamic, warmed up) through run_qa.py: compiled
    graphs are made, all of them in the warm-up before the first step, and the training steps,
    with batches of many widths, compile nothing. Symbolic lengths keep that to a few graphs (with
    --compile_dynamic auto a change of width recompiles every region, measured); the warm-up takes
    the few specialisations that remain (measured on a CPU: a guard batch x width <= 4096, which
    a 48 x 48 batch meets and a 48 x 128 one does not). About 60 s on 2 idle cores, 90-120 s on a
    busy machine; QA_TEST_COMPILE=0 skips it."""
    if os.environ.get("QA_TEST_COMPILE") == "0":
        pytest.skip("QA_TEST_COMPILE=0")
    out = tmp_path / "compiled"
    started = time.perf_counter()
    env = offline_env(tmp_path / "hf_home", OMP_NUM_THREADS="1", TORCH_LOGS="recompiles,guards")
    proc = subprocess.run([sys.executable, str(REPO / "bench" / "timed_run.py"), "1:6",
                           str(REPO / "configs" / "fast.json"), *FAST_ON_CPU, "--torch_compile", "true", "--max_steps", "6", "--do_eval", "false",
                           "--dataloader_num_workers", "0", "--dataloader_persistent_workers", "false",
                           "--output_dir", str(out)], cwd=REPO, env=env, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert "GUARDS" in proc.stderr, "nothing was compiled"
    results = json.loads((out / "all_results.json").read_text())
    compiled = results["train_setup"]["compile"]
    widths = {width for _, width in results["compile_warmup_shapes"]}
    assert len(widths) > 5, widths  # batches of many widths
    assert compiled["compiles"] == results["compile_warmup_compiles"] > 0  # all in the warm-up
    assert compiled["unique_graphs"] <= 6, compiled  # a few, not one per width
    assert json.loads((out / "bench_window.json").read_text())["train_window_compiles"] == 0  # steps 2-6
    print(f"compiled run: {time.perf_counter() - started:.0f} s, {compiled}")
