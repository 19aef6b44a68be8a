"""The supported range of transformers releases, declared in pyproject.toml (transformers>=5.17,<5.24).

trainer_qa.py overrides Trainer methods, four of them internal (_get_train_sampler, _get_eval_sampler,
_save_checkpoint, _clip_grad_norm): a release that renamed one, changed its parameters or stopped calling it would
run without any error and silently lose what the override does (the length column, the evaluation order, the
completion marker, a clipping without walks of the parameters).
CONTRACTS checks each such fact, read from the installed classes and functions: here on the release the
suite runs (requirements.txt's pin, the newest of the range) and, in a second environment that .ci/run
builds (tools/transformers_env.sh, QA_TRANSFORMERS_OLDEST_PYTHON), on the oldest, 5.17 with
huggingface_hub 1.33, where the project also trains, evaluates and predicts."""
import inspect
import json
import re
import subprocess

import pytest
from transformers import Trainer, TrainerState, TrainingArguments
from transformers.integrations import TensorBoardCallback
from transformers.trainer_pt_utils import LengthGroupedSampler
from transformers.trainer_utils import EvalLoopOutput, rotate_checkpoints, speed_metrics

from tests.helpers import OLDEST, OLDEST_PYTHON, REPO, assert_complete_checkpoint, losses, needs_oldest, offline_env


def _params(fn) -> list:
    return list(inspect.signature(fn).parameters)


def _uses(fn, text: str) -> bool:
    """Whether `fn`'s source contains `text`: the Trainer still reaches the internal an override replaces."""
    return text in inspect.getsource(fn)


def _in_library(t, text: str) -> bool:
    """Whether the Trainer's code (any method of transformers' classes `t` derives from) contains `text`."""
    return any(text in inspect.getsource(c) for c in t.__mro__ if c.__module__.startswith("transformers."))


# What trainer_qa.QuestionAnsweringTrainer relies on in a Trainer class `t`: {what: check(t) -> holds}.
CONTRACTS = {
    "Trainer.log(logs, start_time)": lambda t: _params(t.log)[1:3] == ["logs", "start_time"],
    "Trainer._get_train_sampler(train_dataset), called by get_train_dataloader":
        lambda t: _params(t._get_train_sampler)[1:] == ["train_dataset"]
        and _uses(t.get_train_dataloader, "self._get_train_sampler"),
    "Trainer.get_eval_dataloader(eval_dataset) and get_test_dataloader(test_dataset), choosing the sampler when "
    "called": lambda t: _params(t.get_eval_dataloader)[1:] == ["eval_dataset"]
        and _params(t.get_test_dataloader)[1:] == ["test_dataset"]
        and _uses(t.get_eval_dataloader, "self._get_eval_sampler")
        and _uses(t.get_test_dataloader, "self._get_eval_sampler"),
    "Trainer._get_eval_sampler(eval_dataset)": lambda t: _params(t._get_eval_sampler)[1:] == ["eval_dataset"],
    "Trainer._save_checkpoint(model, trial), rotating by args.save_total_limit":
        lambda t: _params(t._save_checkpoint)[1:] == ["model", "trial"]
        and _uses(t._save_checkpoint, "rotate_checkpoints(")
        and _uses(t._save_checkpoint, "self.args.save_total_limit"),
    "Trainer._get_output_dir(trial)": lambda t: _params(t._get_output_dir)[1:] == ["trial"],
    "Trainer._clip_grad_norm(model), the training loop's clipping":
        lambda t: _params(t._clip_grad_norm)[1:] == ["model"] and _in_library(t, "self._clip_grad_norm(model)"),
    "The loop's model.zero_grad() and training_step's model.train(), on the model the loop runs (model_wrapped)":
        lambda t: _in_library(t, "model.zero_grad()") and _uses(t.training_step, "model.train()")
        and _in_library(t, "self.model_wrapped = model"),
    "Trainer.floating_point_ops(inputs)": lambda t: _params(t.floating_point_ops)[1:] == ["inputs"],
    "Trainer.save_model(output_dir, _internal_call)":
        lambda t: _params(t.save_model)[1:3] == ["output_dir", "_internal_call"],
    "Trainer.evaluation_loop(dataloader, description, prediction_loss_only, ignore_keys, metric_key_prefix)":
        lambda t: _params(t.evaluation_loop)[1:6] == ["dataloader", "description", "prediction_loss_only",
                                                      "ignore_keys", "metric_key_prefix"],
    "EvalLoopOutput with predictions, metrics, num_samples":
        lambda t: {"predictions", "metrics", "num_samples"} <= set(EvalLoopOutput._fields),
    "rotate_checkpoints(output_dir, save_total_limit, best_model_checkpoint, use_mtime)":
        lambda t: {"output_dir", "save_total_limit", "best_model_checkpoint", "use_mtime"} <= set(
            _params(rotate_checkpoints)),
    "speed_metrics(split, start_time, num_samples, num_steps)":
        lambda t: _params(speed_metrics)[:4] == ["split", "start_time", "num_samples", "num_steps"],
    "LengthGroupedSampler(batch_size, lengths=...)":
        lambda t: {"batch_size", "lengths"} <= set(_params(LengthGroupedSampler.__init__)),
    "Trainer.is_in_train, set by train() while it runs (the clock of evaluations during training)":
        lambda t: _uses(t.train, "self.is_in_train = True") and _uses(t.__init__, "self.is_in_train = False"),
    "Trainer.save_state() through TrainerState.save_to_json(json_path), written whole by the override":
        lambda t: _params(t.save_state) == ["self"] and _uses(t.save_state, "save_to_json(")
        and _params(TrainerState.save_to_json)[1:] == ["json_path"],
    "TensorBoardCallback(): its folder in logging_dir from TENSORBOARD_LOGGING_DIR, its writes in on_train_begin, "
    "on_log and on_train_end (qa/training/callbacks.py wraps them)":
        lambda t: _uses(TensorBoardCallback.__init__, "TENSORBOARD_LOGGING_DIR")
        and all(name in vars(TensorBoardCallback) for name in ("on_train_begin", "on_log", "on_train_end")),
    "TrainingArguments.train_sampling_strategy, length_column_name, save_total_limit":
        lambda t: {"train_sampling_strategy", "length_column_name", "save_total_limit"}
        <= set(TrainingArguments.__dataclass_fields__),
}


def broken(trainer_cls=Trainer) -> list:
    return [what for what, holds in CONTRACTS.items() if not holds(trainer_cls)]


def test_installed_release_keeps_every_contract():
    assert broken() == []


class _RenamedParameter(Trainer):
    def get_test_dataloader(self, dataset):  # a release that renamed the parameter
        return super().get_test_dataloader(dataset)


class _NoLongerCalled(Trainer):
    def get_train_dataloader(self):  # a release that builds its sampler elsewhere
        return None


class _LogWithoutStartTime(Trainer):
    def log(self, logs):
        return None


class _ClippingRenamed(Trainer):
    def _clip_grad_norm(self, wrapped):  # a release that renamed the parameter
        return None


@pytest.mark.parametrize("cls, names", [
    (_RenamedParameter, "Trainer.get_eval_dataloader(eval_dataset) and get_test_dataloader(test_dataset), "
                        "choosing the sampler when called"),
    (_NoLongerCalled, "Trainer._get_train_sampler(train_dataset), called by get_train_dataloader"),
    (_LogWithoutStartTime, "Trainer.log(logs, start_time)"),
    (_ClippingRenamed, "Trainer._clip_grad_norm(model), the training loop's clipping"),
])
def test_a_broken_contract_is_found(cls, names):
    assert broken(cls) == [names]  # only what is broken is named


def test_the_declared_range_starts_at_the_oldest_tested_release():
    declared = re.search(r'"transformers>=([\d.]+),<', (REPO / "pyproject.toml").read_text())
    assert declared and declared.group(1) == OLDEST


@needs_oldest
def test_oldest_release_keeps_every_contract():
    code = ("import transformers; from tests.test_transformers_range import broken; "
            "print(transformers.__version__, broken())")
    proc = subprocess.run([OLDEST_PYTHON, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-4000:]
    version, found = proc.stdout.strip().splitlines()[-1].split(" ", 1)
    assert version.startswith(OLDEST + ".") and found == "[]", proc.stdout


@needs_oldest
@pytest.mark.slow
def test_oldest_release_trains_evaluates_and_predicts(tmp_path):
    """A tiny train + eval + predict through run_qa.py on transformers 5.17, exercising every
    override: the length column for grouped batches, checkpoints marked and rotated, evaluation
    in order and scored, prediction files."""
    env = offline_env(tmp_path / "hf", OMP_NUM_THREADS="1")
    out = tmp_path / "out"
    proc = subprocess.run(
        [OLDEST_PYTHON, str(REPO / "run_qa.py"), str(REPO / "configs" / "smoke_tiny.json"), "--do_predict",
         "--synthetic_train_examples", "200", "--synthetic_eval_examples", "40", "--per_device_train_batch_size", "8",
         "--learning_rate", "2e-3", "--num_train_epochs", "2", "--save_steps", "10", "--save_total_limit", "1",
         "--train_sampling_strategy", "group_by_length", "--report_to", "none", "--output_dir", str(out)],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-4000:]
    record = json.loads((out / "environment.json").read_text())
    assert record["versions"]["transformers"].startswith(OLDEST + "."), record["versions"]
    results = json.loads((out / "all_results.json").read_text())
    # Its F1 on 40 questions hardly tells a trained model (4.5 here) from an untrained one (3.7): its loss does
    logged = losses(out)
    assert len(logged) >= 5 and logged[-1] < logged[0] - 0.5, logged  # 4.62 down to 3.49 (seed 42)
    assert results["eval_examples"] == 40 and results["predict_examples"] == 40
    assert len(json.loads((out / "predict_predictions.json").read_text())) == 40
    assert results["train_setup"]["sampler"] == "LengthGroupedSampler"
    state = json.loads((out / "trainer_state.json").read_text())
    checkpoints = sorted(p.name for p in out.glob("checkpoint-*"))
    assert checkpoints == [f"checkpoint-{state['global_step']}"], checkpoints  # rotated after marking
    assert_complete_checkpoint(out / checkpoints[0], state["global_step"])
