"""Every shipped config and study file passes the project's own reading and checks (qa/arguments.py's parse_args, the
study reader studies/study.py and the array task's resolution studies/task.py) as a run would read it, without
training; and the published recipe that bench/ restates (batch 12, lr 3e-5, 384/128, 2 epochs, fp32, every feature
padded) is configs/reference.json's, setting by setting, so that the two cannot drift apart."""
import json
import re

import pytest

from tests.helpers import REPO, bench_module

CONFIGS = sorted((REPO / "configs").glob("*.json"))
STUDIES = sorted((REPO / "configs" / "studies").glob("*.json"))


def _on_this_machine():
    """--use_cpu true where no accelerator is visible: a GPU config's bf16 is refused by TrainingArguments on a
    machine without one (the device is the one thing a config cannot be checked for here)."""
    import torch

    return [] if torch.accelerator.is_available() else ["--use_cpu", "true"]


def _parsed(argv):
    """parse_args's dataclasses merged into one {setting: value}, and the run arguments' notes."""
    from dataclasses import fields

    from qa.arguments import parse_args

    model_args, data_args, run_args, training_args, _ = parse_args(argv)
    values = {}
    for group in (model_args, data_args, run_args, training_args):
        values.update({f.name: getattr(group, f.name) for f in fields(group)})
    return values, run_args.adjusted


def test_the_shipped_configs_are_the_expected_ones():
    """The parametrised checks below cover each of these (a config added without its check fails here)."""
    assert [p.name for p in CONFIGS] == ["baseline_a100.json", "fast.json", "reference.json", "smoke.json",
                                         "smoke_tiny.json", "subset_10k.json"]
    assert [p.name for p in STUDIES] == ["scaling.json", "smoke_tiny_lr.json"]


@pytest.mark.parametrize("config", CONFIGS, ids=[p.name for p in CONFIGS])
def test_a_shipped_config_parses_with_every_setting_as_written(config, tmp_path):
    """run_qa.py's parse_args accepts the config (every rule of qa/arguments.py, then TrainingArguments), and each
    setting the file gives reaches the run with its value: none renamed, dropped or changed on the way, but for what
    the device changes and says (TF32 off on a CPU)."""
    written = json.loads(config.read_text())
    assert written.pop("_comment").strip()
    values, adjusted = _parsed([str(config), *_on_this_machine(), "--output_dir", str(tmp_path / "out")])
    assert values["output_dir"] == str(tmp_path / "out")
    written.pop("output_dir")
    changed = {}
    for name, value in written.items():
        assert name in values, name
        got = values[name]
        if name == "accelerator_config":
            got = {key: getattr(got, key) for key in value}
        elif name in ("optim", "train_sampling_strategy") or hasattr(got, "value"):  # enums as written
            got = getattr(got, "value", got)
        if got != value:
            changed[name] = (value, got)
    said = " ".join(adjusted)
    if _on_this_machine():  # TrainingArguments pins no memory with use_cpu: no GPU to copy to
        assert changed.pop("dataloader_pin_memory", (True, False)) == (True, False)
    assert all(name == "tf32" and "tf32 off" in said for name in changed), (changed, adjusted)


def _study_tasks(study_path, tmp_path):
    """Every array task of the study as jobs/launch.sh gets it from studies/task.py: (the study's cells, and for each
    task its strategy, config and run_qa.py arguments)."""
    from studies.study import load
    from studies.task import resolve

    study = load(study_path)
    tasks = [resolve(str(study_path), ["--output_dir", str(tmp_path / "study")],
                     environ={"SLURM_ARRAY_TASK_ID": str(cell.task)}) for cell in study.cells]
    return study, tasks


@pytest.mark.parametrize("study_path", STUDIES, ids=[p.name for p in STUDIES])
def test_every_task_of_a_shipped_study_parses(study_path, tmp_path):
    """The study reader takes the file; each of its array tasks' runs (its config with the cell's overrides, seed
    and folder) passes parse_args with the overrides in force, each task in a folder of its own."""
    study, tasks = _study_tasks(study_path, tmp_path)
    overrides = json.loads(study_path.read_text()).get("overrides", {"": {}})
    assert study.cells
    folders = set()
    for cell, (strategy, config, args) in zip(study.cells, tasks):
        assert strategy == (cell.strategy if study.scaling else "")
        values, _ = _parsed([config, *args, *_on_this_machine()])
        settings = overrides[cell.recipe if cell.recipe in overrides else ""]  # one config: the recipe is its name
        assert {k: values[k] for k in settings} == settings, (cell.recipe, settings)
        assert values["seed"] == cell.seed and values["output_dir"] == cell.folder(str(tmp_path / "study"))
        assert values["measure_communication"] == (cell.nodes * cell.gpus_per_node > 1), cell.recipe
        folders.add(values["output_dir"])
    assert len(folders) == len(study.cells)


def test_the_scaling_study_global_batch_divides_over_every_shape(tmp_path):
    """configs/studies/scaling.json says to hold the global batch with GLOBAL_BATCH=N: N divides over every shape's
    processes (what jobs/launch.sh asks qa.arguments before it submits), with the reference's per-device batch."""
    from qa.arguments import split_global_batch

    path = REPO / "configs" / "studies" / "scaling.json"
    global_batch = int(re.search(r"GLOBAL_BATCH=(\d+)", json.loads(path.read_text())["_comment"])[1])
    study, tasks = _study_tasks(path, tmp_path)
    worlds = sorted({cell.nodes * cell.gpus_per_node for cell in study.cells})
    assert worlds == [1, 2, 4]
    for cell, (_, config, args) in zip(study.cells, tasks):
        values, _ = _parsed([config, *args, *_on_this_machine()])
        world = cell.nodes * cell.gpus_per_node
        batch, accumulation = split_global_batch(global_batch, world, values["per_device_train_batch_size"])
        assert batch * accumulation * world == global_batch, cell.recipe


# The settings that make a recipe (what it trains, not where or how fast); the other defaults are shared.
RECIPE = ("per_device_train_batch_size", "learning_rate", "num_train_epochs", "max_seq_length", "doc_stride",
          "max_query_length", "pad_to_max_length", "warmup_steps", "weight_decay", "lr_scheduler_type", "optim",
          "bf16", "fp16", "tf32", "gradient_accumulation_steps", "adam_beta1", "adam_beta2", "adam_epsilon",
          "max_grad_norm", "label_smoothing_factor", "model_name_or_path", "dataset_name", "version_2_with_negative")


def _recipe(values):
    return {name: getattr(values[name], "value", values[name]) for name in RECIPE}


@pytest.mark.parametrize("script", ["run_bench", "parity"])
def test_bench_restates_the_reference_recipe_as_configs_reference_json(script, tmp_path):
    """bench/run_bench.py (the speed benchmark's `reference` variant at --size gpu) and bench/parity.py (time to F1,
    its `reference` recipe at --size gpu) restate the published recipe rather than read configs/reference.json: the
    run they describe, parsed as run_qa.py parses it, trains with reference.json's recipe, setting by setting."""
    module = bench_module(script)
    run_bench = module if script == "run_bench" else bench_module("run_bench")
    size = module.SIZES["gpu"]
    epochs = run_bench.EPOCHS if script == "run_bench" else size["epochs"]
    reference = json.loads((REPO / "configs" / "reference.json").read_text())
    restated = {**run_bench.REFERENCE, "num_train_epochs": epochs,
                **{k: size[k] for k in ("max_seq_length", "doc_stride", "max_query_length")},
                "model_name_or_path": reference["model_name_or_path"], "dataset_name": reference["dataset_name"]}
    from qa.arguments import to_flags

    common = [*_on_this_machine(), "--do_train", "--output_dir", str(tmp_path / "out")]
    ours = _recipe(_parsed([str(REPO / "configs" / "reference.json"), *common])[0])
    theirs = _recipe(_parsed([*to_flags(restated), *common])[0])
    assert theirs == ours
    # the figures the docs quote for it, as parsed
    assert (ours["per_device_train_batch_size"], ours["learning_rate"], ours["max_seq_length"], ours["doc_stride"],
            ours["num_train_epochs"], ours["bf16"], ours["pad_to_max_length"]) == (12, 3e-5, 384, 128, 2, False, True)
