"""No compilation inside a timed window: the benchmark's window (bench/timed_run.py) counts the
compilations between its ends (torch's counters), an unpadded batch no longer recompiles the regionally compiled
layers (they always see an attention mask), and the compile warm-up compiles every batch shape before
training without changing what training does (all in qa.training.compile).

The compiled runs take 30-90 s each on 2 cores; QA_TEST_COMPILE=0 skips them."""
import json
import logging
import subprocess
import sys

import pytest

from tests.helpers import (COMPILED_TINY, REPO, minilm_tokenizer, needs_compile, offline_env, run_qa,
                           running, tiny_bert, train_features, train_file)


def windowed_run(tmp_path, lengths, window, *extra):
    """compiled_run's training through bench/timed_run.py WINDOW: all_results.json with the window's figures
    (bench_window.json) and the CompletedProcess. Kept here: tests/helpers.py's compiled_run runs run_qa.py only."""
    tmp_path.mkdir(parents=True, exist_ok=True)
    out = tmp_path / "out"
    compiled = ["--train_file", train_file(tmp_path / "train.jsonl", lengths), "--do_train", "--model_name_or_path",
                "bundled:tiny-bert", "--max_seq_length", "128", "--doc_stride", "32", "--max_query_length", "16",
                "--pad_to_max_length", "false", "--train_sampling_strategy", "sequential", "--use_cpu", "true",
                "--per_device_train_batch_size", "4", "--dataloader_num_workers", "0", "--torch_compile", "true",
                "--compile_regional", "true", "--report_to", "none", "--save_strategy", "no", "--output_dir", str(out)]
    proc = subprocess.run([sys.executable, str(REPO / "bench" / "timed_run.py"), window, *compiled, *extra], cwd=REPO,
                          env=offline_env(tmp_path / "hf", OMP_NUM_THREADS="1"), capture_output=True, text=True,
                          timeout=900)
    assert proc.returncode == 0, proc.stderr[-4000:]
    window_file = json.loads((out / "bench_window.json").read_text())
    return {**json.loads((out / "all_results.json").read_text()), **window_file}, proc


def test_sdpa_with_mask_computes_what_sdpa_computes(tmp_path):
    """The same attention, with the mask passed even when nothing is padding."""
    import torch

    from qa.arguments import ModelArguments
    from qa.training.compile import SDPA_WITH_MASK
    from qa.model import load_model_and_tokenizer

    tok = minilm_tokenizer()
    padded = tok(["who is it?", "where?"], ["it is a test of attention", "here"], padding=True, return_tensors="pt")
    full = tok(["who is it?", "who was he?"], ["a test", "the end"], padding=True, return_tensors="pt")
    assert not bool(padded["attention_mask"].all()) and bool(full["attention_mask"].all())
    out = {}
    for compile in (False, True):
        model, _ = load_model_and_tokenizer(ModelArguments("bundled:tiny-bert"), work_dir=tmp_path, compile=compile)
        assert model.config._attn_implementation == (SDPA_WITH_MASK if compile else "sdpa")
        with torch.no_grad():
            out[compile] = [model.eval()(**batch).start_logits for batch in (padded, full)]
    for plain, masked in zip(out[False], out[True]):
        torch.testing.assert_close(plain, masked, atol=1e-6, rtol=1e-5)


@pytest.mark.slow
@needs_compile
@pytest.mark.compile
def test_an_unpadded_batch_after_warm_up_does_not_recompile(tmp_path):
    """Steps 1-2 are padded batches of two widths (the compiled layers trace symbolic lengths and
    an attention mask); step 3, inside the window, has no padding at all: transformers would hand
    the layers no mask, and they would recompile (measured: 1 compilation in the window)."""
    lengths = [40, 36, 36, 36] + [48, 44, 44, 44] + [48, 48, 48, 48]
    results, _ = windowed_run(tmp_path, lengths, "2:3", "--compile_dynamic", "true", "--max_steps", "3")
    assert results["train_window_steps"] == 1
    assert results["train_window_padding_fraction"] == 0  # the window's batch has no padding
    assert results["train_setup"]["attn_implementation"] == "sdpa_with_mask"
    assert results["train_setup"]["compile"]["unique_graphs"] > 0  # it compiled, before the window
    assert results["train_window_compiles"] == 0 and results["train_window_recompiles"] == 0


@pytest.mark.slow
@needs_compile
@pytest.mark.compile
def test_compile_warm_up_compiles_every_width_before_the_window(tmp_path):
    """Static graphs (one per padded width): widths 64 and 96 come first inside the window. Without
    the warm-up the window holds their compilations (and counts them); with it,
    every width was compiled before the first step and the window holds none."""
    lengths = [30, 28, 28, 28] + [31, 29, 29, 29] + [60, 50, 50, 50] + [90, 70, 70, 70]
    # one compile cache: the warm run loads the cold run's graphs (the counters below count dynamo's frames alike)
    common = ["--compile_dynamic", "false", "--pad_to_multiple_of", "32", "--dataloader_drop_last", "true",
              "--max_steps", "4", "--compile_cache_dir", str(tmp_path / "compiled")]
    cold, _ = windowed_run(tmp_path / "cold", lengths, "2:4", *common)
    assert cold["train_window_compiles"] >= 2 and cold["train_window_new_graphs"] >= 2, cold
    warm, proc = windowed_run(tmp_path / "warm", lengths, "2:4", *common, "--compile_warmup", "true")
    assert warm["compile_warmup_shapes"] == [[4, 32], [4, 64], [4, 96]]  # batch x width; drop_last: no smaller one
    assert warm["train_window_compiles"] == 0 and warm["train_window_new_graphs"] == 0, warm
    assert "compile warm-up: 3 batch shapes" in proc.stderr
    # the clocks start at the first step: the warm-up is in its own figure, not in the data time nor in
    # the window's warm-up (which, without it, holds the compilations)
    assert max(warm["train_data_time_total_s"], warm["train_window_warmup_s"]) < warm["compile_warmup_s"]
    assert warm["train_window_warmup_s"] < cold["train_window_warmup_s"]


def test_batch_shapes_cover_every_bucket():
    from qa.training.compile import batch_shapes

    lengths = [10, 70, 12, 90, 15, 65, 40]
    shapes = batch_shapes(lengths, 3, width_of=lambda n: -(-n // 32) * 32, last_batch=1)
    assert shapes == [(32, [0, 2, 4]), (32, [0]), (64, [6, 6, 6]), (64, [6]), (96, [1, 3, 5]), (96, [1])]
    assert batch_shapes([128] * 5, 4, width_of=lambda n: n) == [(128, [0, 1, 2, 3])]


def test_compile_warm_up_leaves_training_unchanged(tmp_path):
    """The warm-up's passes (here on an uncompiled model: the same passes, seconds instead of
    minutes) put back every random generator and clear the gradients: the run's losses and
    weights are exactly those of a run without it."""
    import torch
    from transformers import TrainingArguments

    from qa.arguments import ModelArguments
    from qa.data.collate import BucketPaddingCollator
    from qa.model import load_model_and_tokenizer
    from qa.training.compile import CompileWarmupCallback
    from trainer_qa import QuestionAnsweringTrainer

    tok = minilm_tokenizer()
    features = train_features([20, 33, 47, 26, 58, 40, 35, 61, 22, 50, 44, 29])
    runs = {}
    for warm in (False, True):
        model, _ = load_model_and_tokenizer(ModelArguments("bundled:tiny-bert"), work_dir=tmp_path)
        args = TrainingArguments(str(tmp_path / f"out-{warm}"), use_cpu=True, report_to="none", max_steps=6,
                                 per_device_train_batch_size=4, learning_rate=1e-3, logging_steps=1, seed=3,
                                 save_strategy="no")
        trainer = QuestionAnsweringTrainer(model=model, args=args, train_dataset=features, processing_class=tok,
                                           data_collator=BucketPaddingCollator(tok, 128, pad_to_multiple_of=16))
        callback = CompileWarmupCallback()
        if warm:
            callback.bind(trainer)
            trainer.add_callback(callback)
        trainer.train()
        runs[warm] = ([e["loss"] for e in trainer.state.log_history if "loss" in e],
                      [p.detach().clone() for p in model.parameters()], callback.record)
    assert runs[True][2]["compile_warmup_shapes"] == [[4, 32], [4, 48], [4, 64]]
    assert runs[True][0] == runs[False][0] and len(runs[True][0]) == 6
    assert all(torch.equal(a, b) for a, b in zip(runs[True][1], runs[False][1]))


def _fails(gm, example_inputs):
    raise RuntimeError("simulated inductor error\nwith a second line")


def _backward_fails():
    from functorch.compile import make_boxed_func
    from torch._dynamo.backends.common import aot_autograd

    return aot_autograd(fw_compiler=lambda gm, _: make_boxed_func(gm.forward), bw_compiler=_fails)


@pytest.mark.parametrize("backend", [lambda: _fails, _backward_fails], ids=["forward", "backward"])
def test_a_failed_compilation_runs_eagerly_and_says_so_in_one_line(backend, caplog):
    """A backend that fails (as inductor or Triton may, at the warm-up or at a later shape): the code
    runs eagerly with the same results, and one warning line names the failure instead of dynamo's
    report and its traceback. The backward graph too, though torch compiles it at the first backward
    pass unless told otherwise."""
    import torch

    from qa.training.compile import compile_outcome, fall_back_when_compile_fails

    torch._dynamo.reset()
    fall_back_when_compile_fails()
    dynamo = logging.getLogger("torch._dynamo.convert_frame")
    dynamo.addHandler(caplog.handler)  # what dynamo itself would show
    try:
        with caplog.at_level(logging.WARNING):
            model, x = torch.nn.Linear(4, 2), torch.randn(3, 4)
            out = torch.compile(model, backend=backend())(x)
            out.sum().backward()
    finally:
        dynamo.removeHandler(caplog.handler)
        torch._dynamo.reset()
    torch.testing.assert_close(out, model(x))
    assert compile_outcome() == "fell back: RuntimeError: simulated inductor error"
    assert [r.getMessage() for r in caplog.records] == [
        "torch.compile failed (RuntimeError: simulated inductor error): the code it was compiling runs eagerly, the "
        "run goes on"]


@pytest.mark.slow
@needs_compile
@pytest.mark.compile
def test_run_goes_on_eagerly_when_inductor_fails(tmp_path, monkeypatch, caplog, capfd):
    """The real compile path (the Trainer's torch.compile, inductor, the warm-up, evaluation) with
    inductor made to fail: torch's own test switch writes C++ that does not compile for every ReLU,
    in a tiny BERT with ReLU activations. The run finishes, and its results say it fell back."""
    import torch

    from run_qa import main
    from tests.helpers import go_offline

    go_offline(monkeypatch, tmp_path / "hf", drop=("TENSORBOARD_LOGGING_DIR",))
    model = tiny_bert(tmp_path / "relu-bert", hidden_act="relu")
    out = tmp_path / "out"
    torch._dynamo.reset()
    with torch._inductor.config.patch({"cpp.inject_relu_bug_TESTING_ONLY": "compile_error"}):
        code = main(["--model_name_or_path", str(model), "--dataset_name", "synthetic", "--synthetic_train_examples",
                     "32", "--synthetic_eval_examples", "8", "--do_train", "--do_eval", "--max_steps", "2",
                     "--max_seq_length", "128", "--doc_stride", "32", "--max_query_length", "32",
                     "--per_device_train_batch_size", "8", "--use_cpu", "true", "--torch_compile", "true",
                     "--compile_warmup", "true", "--report_to", "none", "--save_strategy", "no",
                     "--output_dir", str(out)])
    torch._dynamo.reset()
    err = capfd.readouterr().err
    assert code == 0, err[-3000:]
    results = json.loads((out / "all_results.json").read_text())
    assert results["compiled"].startswith("fell back: ") and "eval_f1" in results, results
    assert f"| compiled (torch.compile) | {results['compiled']} |" in (out / "results.md").read_text()
    failed = [r.getMessage() for r in caplog.records if r.getMessage().startswith("torch.compile failed (")]
    assert len(failed) == 1 and "Traceback" not in err, err[-3000:]


def test_compile_outcome_reads_dynamo_counters():
    """'yes' only with graphs and no frame left eager: the recompile limit, which dynamo passes over silently
    (one warning, then the frame runs eagerly for good), is a fallback; so is a compile that made no graph."""
    import torch

    from qa.training.compile import compile_outcome, fall_back_when_compile_fails

    torch._dynamo.reset()
    torch._dynamo.utils.counters.clear()  # process-wide: what earlier tests compiled
    fall_back_when_compile_fails()
    try:
        assert compile_outcome() == "fell back: no graph was compiled"
        double = torch.compile(lambda x: x * 2, backend="eager", dynamic=False)
        double(torch.ones(2))
        assert compile_outcome() == "yes"
        with torch._dynamo.config.patch(recompile_limit=1):
            for n in (3, 4, 5):
                torch.testing.assert_close(double(torch.ones(n)), torch.full((n,), 2.0))
        outcome = compile_outcome()
    finally:
        torch._dynamo.reset()
    assert outcome.startswith("fell back: the recompile limit was hit"), outcome


@pytest.mark.slow
@pytest.mark.compile
def test_the_compile_cache_is_shared_reused_and_mended(tmp_path):
    """--compile_cache_dir: two jobs compiling into it at once both finish compiled; a later job loads every graph
    from it (no FX graph compiled again); a damaged file (a module cut short) is removed and compiled again."""
    env = offline_env(tmp_path / "hf")
    cache = tmp_path / "compile_cache"
    args = lambda name: [*COMPILED_TINY, "--compile_cache_dir", str(cache), "--output_dir", str(tmp_path / name)]

    def finished(name, returncode, stderr):
        assert returncode == 0, stderr[-3000:]
        res = json.loads((tmp_path / name / "all_results.json").read_text())
        assert res["compiled"] == "yes", res["compiled"]
        return res["train_setup"]["compile"]

    logs = {name: open(tmp_path / f"{name}.log", "w+") for name in "ab"}  # no pipe to fill while both run
    with running(args("a"), env, stdout=logs["a"], stderr=logs["a"]) as a, \
            running(args("b"), env, stdout=logs["b"], stderr=logs["b"]) as b:
        for name, proc in (("a", a), ("b", b)):
            finished(name, proc.wait(timeout=900), (tmp_path / f"{name}.log").read_text())
    assert (cache / "verified.json").is_file()

    proc = run_qa(args("warm"), env)
    stats = finished("warm", proc.returncode, proc.stderr)
    assert stats["fxgraph_cache_hit"] > 0 and stats["fxgraph_cache_miss"] == 0, stats

    damaged = sorted(cache.rglob("*.py"))[0]
    damaged.write_text(damaged.read_text()[:40])  # torch alone would run eagerly after such a module
    proc = run_qa(args("mended"), env)
    finished("mended", proc.returncode, proc.stderr)
    assert f"1 damaged file(s) removed (e.g. {damaged.relative_to(cache)}), compiled again" in proc.stderr
