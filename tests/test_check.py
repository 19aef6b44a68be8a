"""The check job (`--check`, check_qa.py) on this machine's CPU: "ready" with a prediction the real job in the same
folder then bears out (its steps and evaluations exactly; its seconds are bench/check_prediction.py's), nothing of
a run left behind; "not ready" with one verdict line, the reason's only line, and status 2 for GPUs granted that torch
cannot see, a dataset missing offline, an output folder that cannot be written, one that holds a finished run (as the
job would be refused, by its own rule) and a check stopped by SIGTERM (a job's time limit). The same through
job_ft3.sh and job_ddp.sh on the local SLURM cluster is in tests/test_slurm_jobs.py."""
import json
import math
import signal
import subprocess
import sys
import time

import pytest

from check_qa import acts, slurm_time, verdict
from qa.results.wall_clock import PHASES
from tests.helpers import OLDEST_PYTHON, REPO, SMOKE_TINY, go_offline, needs_oldest, offline_env, run_qa, wait_until

RUN_FILES = {"check.json", "check.md"}


def _env(tmp_path, **extra):
    """Offline, and outside any SLURM job (the check reads a job's GPUs from these)."""
    slurm = ("SLURM_JOB_ID", "SLURM_STEP_GPUS", "SLURM_JOB_GPUS", "SLURM_GPUS_ON_NODE")
    return offline_env(tmp_path / "hf", drop=slurm, **extra)


def _check(out):
    return json.loads((out / "check.json").read_text())


@pytest.mark.parametrize("strategy, every, steps, per_epoch, expect", [
    ("steps", 10, 79, 79, {10, 20, 30, 40, 50, 60, 70, 79}),  # and the last step
    ("steps", 10, 80, 80, {10, 20, 30, 40, 50, 60, 70, 80}),  # the last is a multiple
    ("steps", 0.25, 79, 79, {20, 40, 60, 79}),                # a fraction of the steps: every 20
    ("epoch", None, 158, 79, {79, 158}),
    ("epoch", None, 100, 79, {79, 100}),                      # max_steps ends the second epoch early
    ("no", None, 79, 79, set()),
])
def test_evaluations_and_checkpoints_fall_on_the_steps_the_trainer_acts_at(strategy, every, steps, per_epoch, expect):
    assert acts(strategy, every, steps, per_epoch) == expect


JOB_STEPS = """
import json, sys, tempfile
import torch
from datasets import Dataset
from transformers import Trainer, TrainingArguments
from check_qa import job_steps
steps = []
with tempfile.TemporaryDirectory() as folder:
    for rows, batch, accumulation, epochs, max_steps in json.loads(sys.argv[1]):
        args = TrainingArguments(output_dir=folder, use_cpu=True, per_device_train_batch_size=batch, report_to=[],
                                 gradient_accumulation_steps=accumulation, num_train_epochs=epochs,
                                 max_steps=max_steps, remove_unused_columns=False)
        data = Dataset.from_dict({"x": [[0.0]] * rows})
        steps.append(job_steps(Trainer(model=torch.nn.Linear(1, 1), args=args, train_dataset=data)))
print(json.dumps(steps))
"""


@pytest.mark.parametrize("python", [sys.executable, pytest.param(OLDEST_PYTHON, marks=needs_oldest)],
                         ids=["installed", "oldest"])
def test_the_jobs_steps_are_the_trainers_own_on_both_ends_of_the_range(python):
    """job_steps asks the Trainer's own arithmetic (set_initial_training_values, an internal of transformers): the
    same (optimizer steps, steps per epoch) on the newest and the oldest release of the range."""
    cases = [[50, 4, 3, 2.5, -1], [50, 4, 3, 2.5, 7], [5, 8, 4, 1, -1], [97, 8, 1, 0.3, -1]]
    done = subprocess.run([python, "-c", JOB_STEPS, json.dumps(cases)], cwd=REPO, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    # 13 batches of 4 in 5 steps of 3 an epoch, 2.5 epochs; max_steps wins; one step an epoch at least; 0.3 epochs
    assert json.loads(done.stdout.splitlines()[-1]) == [[13, 5], [7, 5], [1, 1], [4, 13]]


@pytest.mark.parametrize("options, short", [
    ([], ("-c 32 --mem=64G", "-c 16 --mem=62G")),                       # the roomiest node's, not another's
    (["-c", "8", "--mem=6G"], None),
    (["-c", "8", "--mem-per-cpu=16G"], ("--mem-per-cpu=16G", "--mem=62G")),
    (["-c", "4", "--mem=6G", "--gres=gpu:a100:4"], ("--gres=gpu:a100:4", "--gres=gpu:a100:1")),
    (["-c", "4", "--mem=6G", "--gres=gpu:h100:1"], ("--gres=gpu:h100:1", "--gres=gpu:a100:1")),
])
def test_a_request_no_node_can_meet_is_named_with_the_options_that_fit(options, short):
    """job_ft3.sh's #SBATCH lines, then the options, against nodes of 4 CPUs, 8 GB and 2 A100s and of 16 CPUs, 63.5 GB
    and one A100; a ready verdict says it."""
    from studies.submit import asked, unmet

    nodes = [(4, 8000, {"a100": 2}), (16, 63500, {"a100": 1})]
    assert unmet(asked("job_ft3.sh", options), nodes) == short
    assert verdict(None, "with -c 2 on every sbatch: ...") == "ready, with -c 2 on every sbatch: ..."


def test_the_time_to_ask_for_is_slurms_format():
    assert slurm_time(300) == "00:05:00" and slurm_time(3 * 3600 + 25 * 60) == "03:25:00"


@pytest.mark.slow
def test_a_ready_check_predicts_the_job_that_then_runs_in_its_folder(tmp_path):
    """smoke_tiny with evaluations during training (time to accuracy's and the Trainer's, on steps that coincide): the
    check says ready (status 0, last line "ready"), leaves check.md and check.json only, and predicts the job's steps
    and evaluations during training exactly."""
    env, out = _env(tmp_path), tmp_path / "run"
    flags = ["--eval_every", "0.25", "--eval_every_questions", "20", "--output_dir", str(out),
             "--eval_strategy", "steps", "--eval_steps", "40"]  # steps 40 and 79 are asked for twice, done once
    proc = run_qa([SMOKE_TINY, *flags, "--check"], env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.strip().splitlines()[-1] == "ready", proc.stdout
    assert {p.name for p in out.iterdir()} == RUN_FILES  # no lock, checkpoint, weights or results
    record = _check(out)
    assert record["ready"] and [c["check"] for c in record["checks"]] == [
        "versions", "GPUs", "precision", "model and data", "output folder", "training", "evaluation", "prediction"]
    predicted, seconds = record["predicted"], record["predicted"]["seconds"]
    assert set(seconds) == set(PHASES) and predicted["total_s"] == pytest.approx(sum(seconds.values()), abs=0.1)
    for phase in ("startup", "features", "training", "evaluation_during_training", "final_evaluation", "saving"):
        assert seconds[phase] > 0, phase
    assert "--time=" + predicted["time_limit"] in (out / "check.md").read_text()

    proc = run_qa([SMOKE_TINY, *flags], env)  # the real job, in the same folder: it starts fresh
    assert proc.returncode == 0, proc.stderr[-3000:]
    state = json.loads((out / "trainer_state.json").read_text())
    evaluations = json.loads((out / "time_to_accuracy.json").read_text())["evaluations"]
    assert predicted["steps"] == state["global_step"]
    assert predicted["evaluations_during_training"] == len(evaluations)
    assert math.ceil(predicted["steps"] / 10) == record["measured"]["checkpoints_saved"]


def test_gpus_granted_that_torch_cannot_see_are_not_ready(tmp_path, monkeypatch, capsys):
    """A job granted a GPU (SLURM's variables) whose torch sees none: not ready, status 2, nothing trained."""
    from run_qa import main

    go_offline(monkeypatch, tmp_path / "hf", drop=("TENSORBOARD_LOGGING_DIR", "SLURM_JOB_ID"))
    monkeypatch.setenv("SLURM_STEP_GPUS", "0")
    out = tmp_path / "run"
    assert main([SMOKE_TINY, "--check", "--output_dir", str(out)]) == 2
    lines = capsys.readouterr().out.strip().splitlines()
    assert lines[-1].startswith("not ready: GPUs: SLURM_STEP_GPUS=0 granted, but torch"), lines
    record = _check(out)
    assert not record["ready"] and record["verdict"] == lines[-1]
    assert [c["check"] for c in record["checks"] if not c["ok"]] == ["GPUs"]
    assert "training" not in [c["check"] for c in record["checks"]]


def test_a_dataset_missing_offline_is_not_ready(tmp_path):
    env, out = _env(tmp_path), tmp_path / "run"
    proc = run_qa([SMOKE_TINY, "--dataset_name", "squad", "--check", "--output_dir", str(out)], env, timeout=300)
    assert proc.returncode == 2, proc.stderr[-3000:]
    verdict = proc.stdout.strip().splitlines()[-1]
    assert verdict.startswith("not ready: Hub dataset 'squad': cannot be loaded: offline mode is on"), verdict
    assert _check(out)["verdict"] == verdict and {p.name for p in out.iterdir()} == RUN_FILES
    assert "error:" not in proc.stderr and (proc.stdout + proc.stderr).count("offline mode is on") == 1  # said once


def test_an_output_folder_that_cannot_be_written_is_not_ready(tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    proc = run_qa([SMOKE_TINY, "--check", "--output_dir", str(blocker / "run")], _env(tmp_path), timeout=300)
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert proc.stdout.strip().splitlines() == [
        f"not ready: output_dir={blocker / 'run'}: cannot be created: {blocker} is a file (where the run writes) - "
        "give a folder this user can create and write to"]


def test_the_check_moves_nothing_in_a_folder_that_holds_an_earlier_run(tmp_path, monkeypatch):
    """--resume never would move an earlier run aside; the check leaves the folder as it was, but for its two files."""
    from run_qa import main

    go_offline(monkeypatch, tmp_path / "hf", drop=("TENSORBOARD_LOGGING_DIR", "SLURM_JOB_ID"))
    out = tmp_path / "run"
    (out / "checkpoint-10").mkdir(parents=True)
    (out / "all_results.json").write_text("{}")
    assert main([SMOKE_TINY, "--check", "--resume", "never", "--output_dir", str(out)]) == 0
    assert {p.name for p in out.iterdir()} == {"checkpoint-10", "all_results.json", *RUN_FILES}


def test_out_of_memory_in_the_measured_steps_is_not_ready_with_the_batch_fix(tmp_path, monkeypatch, capsys):
    """The device running out of memory in a measured training step (raised on a CPU, as torch raises it): not
    ready with the run's own fix (a smaller per-device batch), status 2 like every other finding, not the run's 3."""
    import functools

    import torch
    from transformers import BertForQuestionAnswering

    from run_qa import main

    go_offline(monkeypatch, tmp_path / "hf", drop=("TENSORBOARD_LOGGING_DIR", "SLURM_JOB_ID"))
    forward = BertForQuestionAnswering.forward

    @functools.wraps(forward)
    def runs_out_in_training(self, *args, **kwargs):
        if self.training:
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB.")
        return forward(self, *args, **kwargs)

    monkeypatch.setattr(BertForQuestionAnswering, "forward", runs_out_in_training)
    out = tmp_path / "run"
    assert main([SMOKE_TINY, "--check", "--output_dir", str(out)]) == 2
    verdict = capsys.readouterr().out.strip().splitlines()[-1]
    assert verdict.startswith("not ready: per_device_train_batch_size=") and "pass a smaller" in verdict, verdict
    record = _check(out)
    assert [c["check"] for c in record["checks"] if not c["ok"]] == ["training"] and "prediction" not in [
        c["check"] for c in record["checks"]]
    assert {p.name for p in out.iterdir()} == RUN_FILES


def test_a_folder_holding_a_finished_run_is_not_ready_with_the_jobs_own_refusal(tmp_path, monkeypatch, capsys):
    """The same command twice: the second's check says not ready, by the rule the job applies (Checkpoints.choose,
    which moves nothing for the check), in the job's own words, once; the job is then refused with that reason, and
    the finished run's files stay as they were."""
    from run_qa import main

    go_offline(monkeypatch, tmp_path / "hf", drop=("TENSORBOARD_LOGGING_DIR", "SLURM_JOB_ID"))
    out = tmp_path / "run"
    flags = [SMOKE_TINY, "--max_steps", "3", "--do_eval", "false", "--report_to", "none", "--output_dir", str(out)]
    assert main(flags) == 0
    finished = {p.name: p.stat().st_mtime_ns for p in out.iterdir()}
    capsys.readouterr()
    assert main([*flags, "--check"]) == 2
    said = capsys.readouterr()
    verdict = said.out.strip().splitlines()[-1]
    assert verdict.startswith(f"not ready: {out}: holds a finished run (trained to step 3, "), verdict
    assert (said.out + said.err).count("holds a finished run") == 1  # no error line repeats the verdict
    record = _check(out)
    assert record["verdict"] == verdict and [c["check"] for c in record["checks"] if not c["ok"]] == ["earlier run"]
    assert "training" not in [c["check"] for c in record["checks"]]  # refused before the measured steps
    assert main(flags) == 2
    refusal = capsys.readouterr().err.strip().splitlines()[-1]
    assert refusal == "error: " + verdict.removeprefix("not ready: ").replace(" - ", ". Fix: ", 1), (refusal, verdict)
    assert {p.name: p.stat().st_mtime_ns for p in out.iterdir() if p.name not in RUN_FILES} == finished


def test_a_check_stopped_by_sigterm_is_not_ready_and_asks_for_more_time(tmp_path):
    """SIGTERM in the measured steps (what jobs/launch.sh sends on SLURM's warning before the time limit), twice as
    torchrun passes it on: not ready (status 2) with the fix, a longer --time; check.md and check.json written, no
    traceback, the reason once."""
    out, flag = tmp_path / "run", tmp_path / "out.txt"
    cmd = [sys.executable, "-m", "tests.eval_hooks", "slow", "2", "--", SMOKE_TINY, "--check", "--output_dir", str(out)]
    with open(flag, "w") as stdout:
        proc = subprocess.Popen(cmd, cwd=REPO, env=_env(tmp_path), stdout=stdout, stderr=subprocess.PIPE, text=True)
    try:
        # the line before the slowed training steps
        wait_until(lambda: "check output folder" in flag.read_text(), proc, "check output folder", flag.read_text)
        proc.send_signal(signal.SIGTERM)
        time.sleep(0.01)
        proc.send_signal(signal.SIGTERM)
        _, stderr = proc.communicate(timeout=120)
    finally:
        proc.kill()
    lines = flag.read_text().strip().splitlines()
    assert proc.returncode == 2, stderr[-3000:]
    assert lines[-2] == "check time limit: stopped before the end -> not ready (below)", lines
    assert lines[-1].startswith("not ready: --time: the check was stopped by SIGTERM ") and lines[-1].endswith(
        "before its end (the job's time limit, or a preemption) - submit it again with a longer --time (a check job is "
        "not requeued: it would start over)"), lines[-1]
    assert "Traceback" not in stderr and "error:" not in stderr, stderr[-3000:]
    assert _check(out)["verdict"] == lines[-1] and {p.name for p in out.iterdir()} == RUN_FILES
