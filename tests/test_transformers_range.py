"""The supported range of transformers releases: trainer_qa.py checks at start-up what its
overrides of Trainer internals rely on, refuses with one line only when that is broken, and
the project trains, evaluates and predicts on the oldest release of the range (5.17, with
huggingface_hub 1.33) in a second environment that .ci/run builds (tools/transformers_env.sh)."""
import json
import os
import subprocess

import pytest
from transformers import Trainer

from qa.errors import InputError
from tests.helpers import REPO
from trainer_qa import TESTED_TRANSFORMERS, check_trainer_contracts, trainer_contracts

OLDEST = "5.17"
# Set by .ci/run: the Python of an environment with the oldest release of the range.
OLDEST_PYTHON = os.environ.get("QA_TRANSFORMERS_OLDEST_PYTHON")


def test_installed_release_keeps_every_contract():
    broken = [what for what, holds in trainer_contracts() if not holds]
    assert not broken, broken
    check_trainer_contracts()
    assert TESTED_TRANSFORMERS[0] == OLDEST


class _RenamedParameter(Trainer):
    def get_test_dataloader(self, dataset):  # a release that renamed the parameter
        return super().get_test_dataloader(dataset)


class _NoLongerCalled(Trainer):
    def get_train_dataloader(self):  # a release that builds its sampler elsewhere
        return None


class _LogWithoutStartTime(Trainer):
    def log(self, logs):
        return None


@pytest.mark.parametrize("cls, names", [
    (_RenamedParameter, "Trainer.get_eval_dataloader(eval_dataset) and get_test_dataloader(test_dataset), "
                        "choosing the sampler when called"),
    (_NoLongerCalled, "Trainer._get_train_sampler(train_dataset), called by get_train_dataloader"),
    (_LogWithoutStartTime, "Trainer.log(logs, start_time)"),
])
def test_a_broken_contract_is_refused_with_one_line(cls, names):
    with pytest.raises(InputError) as info:
        check_trainer_contracts(cls, version="9.9.9")
    message = str(info.value)
    assert message.startswith("transformers 9.9.9: ") and "\n" not in message
    assert names in message and "Fix: install a release from the tested range 5.17 to 5.23" in message
    # only what is broken is named
    assert [what for what, holds in trainer_contracts(cls) if not holds] == [names]


def test_other_releases_are_not_refused_by_number():
    check_trainer_contracts(version="5.17.0")
    check_trainer_contracts(version="5.99.0")


@pytest.mark.skipif(not OLDEST_PYTHON, reason=f"no transformers {OLDEST} environment: .ci/run builds one with "
                    "tools/transformers_env.sh and sets QA_TRANSFORMERS_OLDEST_PYTHON to its python")
@pytest.mark.slow
def test_oldest_release_trains_evaluates_and_predicts(tmp_path):
    """A tiny train + eval + predict through run_qa.py on transformers 5.17, exercising every
    override: the length column for grouped batches, checkpoints marked and rotated, evaluation
    in order and scored, prediction files."""
    env = dict(os.environ, HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1", HF_HOME=str(tmp_path / "hf"),
               PYTHONUNBUFFERED="1", OMP_NUM_THREADS="1")
    env.pop("TENSORBOARD_LOGGING_DIR", None)
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
    assert results["train_loss"] > 0 and 0 <= results["eval_f1"] <= 100 and results["eval_examples"] == 40
    assert 0 <= results["predict_f1"] <= 100 and results["predict_examples"] == 40
    assert len(json.loads((out / "predict_predictions.json").read_text())) == 40
    assert results["train_setup"]["sampler"] == "LengthGroupedSampler"
    state = json.loads((out / "trainer_state.json").read_text())
    checkpoints = sorted(p.name for p in out.glob("checkpoint-*"))
    assert checkpoints == [f"checkpoint-{state['global_step']}"], checkpoints  # rotated after marking
    assert (out / checkpoints[0] / "checkpoint_complete.json").is_file()
    losses = [e["loss"] for e in state["log_history"] if "loss" in e]
    assert losses[-1] < losses[0], losses
