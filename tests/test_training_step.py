"""What a training step costs the host, and the shapes it runs at. Static batch shapes (qa/data/collate.py): with
--length_buckets every training batch has one of the buckets' widths and the full batch's rows, the epoch's last filled
with rows the loss ignores, so that a whole-model compile with static shapes makes one graph per width; the filled
batch trains exactly as the partial one would, and the telemetry counts no filled row as a sample. The Trainer's
per-step work (trainer_qa.py): its FLOP count without a walk of the modules, gradients cleared by the optimizer."""
import pytest
import torch

from tests.helpers import compiled_run, losses, minilm_tokenizer, needs_compile, train_features
from tests.test_compile import windowed_run

CUDA_GRAPHS = ["--torch_compile_mode", "reduce-overhead", "--compile_regional", "false", "--length_buckets", "128", "384"]


def test_a_short_training_batch_is_filled_with_ignored_rows_and_trains_the_same(tmp_path):
    from qa.arguments import ModelArguments
    from qa.data.collate import BucketPaddingCollator
    from qa.model import load_model_and_tokenizer

    features = train_features([30, 45])
    rows = [features[i] for i in range(2)]
    collate = BucketPaddingCollator(minilm_tokenizer(), 128, length_buckets=[32, 64, 128], rows=4)
    filled, plain = collate(rows), BucketPaddingCollator(minilm_tokenizer(), 128, length_buckets=[32, 64, 128])(rows)
    assert filled["input_ids"].shape == (4, 64) and plain["input_ids"].shape == (2, 64)
    assert filled["start_positions"][2:].tolist() == [64, 64] == filled["end_positions"][2:].tolist()
    assert filled["attention_mask"][2:].sum(dim=1).tolist() == [1, 1]
    evaluation = [{k: v for k, v in r.items() if not k.endswith("_positions")} for r in rows]
    assert collate(evaluation)["input_ids"].shape == (2, 64)  # evaluation keeps its rows: logits pair with features

    model, _ = load_model_and_tokenizer(ModelArguments("bundled:tiny-bert"), work_dir=tmp_path)
    model.eval()  # no dropout: the two passes compute the same real rows
    grads = []
    for batch in (plain, filled):
        model.zero_grad()
        loss = model(**batch).loss
        loss.backward()
        grads.append((loss.detach(), [p.grad.clone() for p in model.parameters()]))
    torch.testing.assert_close(grads[0][0], grads[1][0])
    for a, b in zip(grads[0][1], grads[1][1], strict=True):
        torch.testing.assert_close(a, b, atol=1e-6, rtol=1e-5)


@pytest.mark.slow
@pytest.mark.compile
@needs_compile
def test_the_whole_model_compiles_once_for_every_width(tmp_path):
    """14 features in batches of 4 at widths 32, 64 and 128 (sequential): the last batch holds 2 features and is
    filled to 4 rows. The whole model compiled with symbolic lengths and CUDA graphs asked (on a GPU, one recorded
    per width), warmed up: one graph, no graph break, nothing compiled in the window (steps 2-4, the filled batch
    last), 10 samples counted there, the losses of the regional compilation; on a CPU the graph runs as compiled
    code, and the results say so."""
    lengths = [30, 28, 28, 28] + [60, 50, 50, 50] + [90, 70, 70, 70] + [40, 20]
    same = ["--compile_dynamic", "true", "--length_buckets", "32", "64", "128", "--compile_warmup", "true",
            "--max_steps", "4", "--logging_steps", "1"]
    run, proc = windowed_run(tmp_path / "whole", lengths, "1:4", *same, *CUDA_GRAPHS[:4])
    compiled_run(tmp_path / "regional", lengths, *same)  # configs/fast.json's compilation, one layer for all
    # the same computation: the same losses, step by step, but for the order of floating-point sums
    assert len(losses(tmp_path / "whole" / "out")) == 4
    assert losses(tmp_path / "whole" / "out") == pytest.approx(losses(tmp_path / "regional" / "out"), rel=1e-4)
    assert run["compile_warmup_shapes"] == [[4, 32], [4, 64], [4, 128]]  # no smaller last batch
    compiled = run["train_setup"]["compile"]
    assert compiled["unique_graphs"] == 1 and compiled["graph_breaks"] == 0 and compiled["recompiles"] == 0
    assert run["train_window_compiles"] == 0 and run["train_window_new_graphs"] == 0
    assert run["train_window_samples"] == 4 + 4 + 2 and run["train_window_batch_tokens"] == 4 * (64 + 128 + 64)
    assert run["compiled"] == "yes" and run["cuda_graphs"] == "skipped" and compiled["cudagraph_skips"] >= 1
    assert proc.stderr.count("CUDA graphs were skipped") == 1


@pytest.mark.parametrize("extra, refused", [
    (["--compile_regional", "true"], "compile_regional=true"),
    (["--length_buckets"], "needs a few fixed widths"),  # none: configs/fast.json has none
    (["--gradient_accumulation_steps", "2"], "gradient_accumulation_steps=2"),
])
def test_cuda_graphs_refuse_what_a_replayed_step_cannot_do(tmp_path, extra, refused):
    from qa.arguments import parse_args
    from qa.errors import InputError

    base = ["configs/fast.json", "--use_cpu", "true", "--output_dir", str(tmp_path / "out"), *CUDA_GRAPHS]
    parse_args(base)
    with pytest.raises(InputError, match=refused):
        parse_args(base[:-3] if extra == ["--length_buckets"] else [*base, *extra])


def test_the_trainer_steps_without_walking_the_modules(tmp_path, monkeypatch):
    """The same total_flos as the Trainer's own count, with the modules walked once for the whole run; after every
    step the gradients are gone (set to None), cleared through the optimizer, not a walk of the model's modules; the
    step's model.train() walks them only when the mode changes (after an evaluation), and then every module's."""
    from transformers import Trainer, TrainerCallback, TrainingArguments

    from qa.arguments import ModelArguments
    from qa.data.collate import BucketPaddingCollator
    from qa.model import load_model_and_tokenizer
    from trainer_qa import QuestionAnsweringTrainer

    class Watch(TrainerCallback):
        def __init__(self):
            self.cleared, self.walks, self.module_clears, self.mode_walks = [], 0, [], []

        def on_step_begin(self, args, state, control, **kwargs):
            self.walks_at_step_1 = getattr(self, "walks_at_step_1", len(self.mode_walks))

        def on_step_end(self, args, state, control, model=None, **kwargs):
            self.cleared.append(all(p.grad is None for p in model.parameters()))

    watch = Watch()
    model, tok = load_model_and_tokenizer(ModelArguments("bundled:tiny-bert"), work_dir=tmp_path)
    walk = type(model).num_parameters
    monkeypatch.setattr(type(model), "num_parameters",
                        lambda self, *a, **k: setattr(watch, "walks", watch.walks + 1) or walk(self, *a, **k))
    clear, train = type(model).zero_grad, type(model).train
    monkeypatch.setattr(type(model), "zero_grad",
                        lambda self, *a, **k: watch.module_clears.append(1) or clear(self, *a, **k))
    monkeypatch.setattr(type(model), "train", lambda self, mode=True: watch.mode_walks.append(mode) or train(self, mode))
    args = TrainingArguments(str(tmp_path / "out"), use_cpu=True, report_to="none", max_steps=3,
                             per_device_train_batch_size=4, save_strategy="no", logging_steps=1,
                             train_sampling_strategy="sequential")
    features = train_features([20, 33, 47, 26, 58, 40, 35, 61, 22, 50, 44, 29])
    trainer = QuestionAnsweringTrainer(model=model, args=args, train_dataset=features, processing_class=tok,
                                       data_collator=BucketPaddingCollator(tok, 128), callbacks=[watch])
    walks_before = watch.walks
    trainer.train()
    assert watch.cleared == [True, True, True] and len(watch.module_clears) == 1  # once, before training
    walks = len(watch.mode_walks)
    # each step's model.train(): a walk at the first (from_pretrained leaves the model in eval mode), none after
    assert model.training and watch.mode_walks[watch.walks_at_step_1:] == [True]
    model.eval()
    assert not any(m.training for m in model.modules()) and watch.mode_walks[walks:] == [False]
    model.train()
    assert all(m.training for m in model.modules()) and watch.mode_walks[walks:] == [False, True]
    assert watch.walks - walks_before == 1  # once for the run, not once a step
    batches = [BucketPaddingCollator(tok, 128)([features[i] for i in range(j, j + 4)]) for j in (0, 4, 8)]
    assert trainer.state.total_flos == sum(Trainer.floating_point_ops(trainer, b) for b in batches)


def test_cuda_graphs_refuse_the_accumulation_a_global_batch_sets(tmp_path, capsys):
    from run_qa import main

    status = main(["configs/fast.json", "--use_cpu", "true", "--model_name_or_path", "bundled:tiny-bert",
                   "--output_dir", str(tmp_path / "out"), *CUDA_GRAPHS, "--global_batch", "96"])
    err = capsys.readouterr().err.strip().splitlines()
    assert status == 2 and err[-1].startswith("error: torch_compile_mode=reduce-overhead, gradient_accumulation_steps=2")
    assert not (tmp_path / "out").exists()  # refused before anything was written


def test_the_clipping_without_walks_clips_as_the_trainer_does(tmp_path):
    """trainer_qa's gradient clipping (torch's, on the optimizer's parameters) returns the norm and leaves the
    gradients that the Trainer's own (accelerate's, on the model's parameters) does."""
    from transformers import Trainer, TrainingArguments

    from qa.arguments import ModelArguments
    from qa.model import load_model_and_tokenizer
    from trainer_qa import QuestionAnsweringTrainer

    model, tok = load_model_and_tokenizer(ModelArguments("bundled:tiny-bert"), work_dir=tmp_path)
    args = TrainingArguments(str(tmp_path / "out"), use_cpu=True, report_to="none", max_grad_norm=0.5)
    trainer = QuestionAnsweringTrainer(model=model, args=args, processing_class=tok)
    trainer.create_optimizer()
    torch.manual_seed(0)
    grads = [torch.randn_like(p) for p in model.parameters()]
    clipped = {}
    for name, clip in (("ours", trainer._clip_grad_norm), ("trainer", lambda m: Trainer._clip_grad_norm(trainer, m))):
        for p, g in zip(model.parameters(), grads):
            p.grad = g.clone()
        clipped[name] = (clip(model), [p.grad.clone() for p in model.parameters()])
    assert clipped["ours"][0] == pytest.approx(float(clipped["trainer"][0])) and clipped["ours"][0] > 0.5
    for a, b in zip(clipped["ours"][1], clipped["trainer"][1], strict=True):
        torch.testing.assert_close(a, b)
    assert not torch.equal(clipped["ours"][1][0], grads[0])  # the norm was above 0.5: the gradients were clipped
