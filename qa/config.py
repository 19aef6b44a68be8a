"""Parsing the run's arguments: flags, or a JSON config file optionally followed by flags
that override it (`run_qa.py configs/reference.json --output_dir runs/x`)."""
import dataclasses
import json
import logging
import os
import sys

from transformers import HfArgumentParser, TrainingArguments

from .args import DataArguments, ModelArguments, RunArguments
from .console import configure_output
from .errors import InputError, command
from .io import read_json
from .settings import check_settings

DATACLASSES = (ModelArguments, DataArguments, RunArguments, TrainingArguments)
logger = logging.getLogger(__name__)


def to_flags(config: dict) -> list:
    """A config dict as command-line flags (None = the default, so left out)."""
    flags = []
    for key, value in config.items():
        if value is None:
            continue
        if isinstance(value, bool):
            flags += [f"--{key}", str(value).lower()]
        elif isinstance(value, list):
            flags += [f"--{key}", *map(str, value)]
        elif isinstance(value, dict):
            flags += [f"--{key}", json.dumps(value)]
        else:
            flags += [f"--{key}", str(value)]
    return flags


def _read_config(path: str) -> dict:
    if not os.path.exists(path):  # not read_json's message: the fix points at the shipped configs
        raise InputError(path, "config file not found", "check the path (configs/ lists the shipped ones)")
    config = read_json(path, "config file")
    if not isinstance(config, dict):
        raise InputError(path, "a config must be a JSON object of argument names to values",
                         "write it as {\"model_name_or_path\": ..., ...}")
    config.pop("_comment", None)
    return config


class _Parser(HfArgumentParser):
    """argparse reports a bad flag in a usage block and exits; here it is the project's one-line
    error, naming where the arguments came from. --help still prints the help and exits 0."""

    source = "command line"

    def error(self, message):
        raise InputError(self.source, f"invalid arguments: {message}",
                         "run `python run_qa.py --help` for the accepted arguments")


def parse_args(argv):
    """-> (model_args, data_args, run_args, training_args, explicit) where `explicit` is the
    set of argument names the user gave (flags or config keys). Every numeric and path value
    is checked against qa.settings before the dataclasses are built."""
    argv = [str(a) for a in argv]
    source = "command line"
    config = {}
    if argv and argv[0].endswith(".json"):
        source = argv[0]
        config = _read_config(argv[0])
        argv = to_flags(config) + argv[1:]
    explicit = set(config) | {a[2:].split("=")[0] for a in argv if a.startswith("--")}
    if _gpu_less_distributed_launch():
        # Without a GPU the Trainer forms the process group only with use_cpu: otherwise each
        # process would train alone on all the data under one world size and all of them would
        # write the same files. What the user asked for is one group: gloo on the CPU.
        logger.warning("%s processes started (WORLD_SIZE) and no GPU is visible here: training as one gloo "
                       "group on the CPU (--use_cpu true)", os.environ["WORLD_SIZE"])
        argv = argv + ["--use_cpu", "true"]
    parser = _Parser(DATACLASSES)
    parser.source = source
    namespace, unknown = parser.parse_known_args(args=argv)  # --help: prints it, SystemExit(0)
    if unknown:
        raise InputError(source, f"unknown arguments {unknown}",
                         "remove them or run `python run_qa.py --help` for the accepted ones")
    values = vars(namespace)
    check_settings(values)
    built = []
    try:
        for dtype in DATACLASSES:
            names = {f.name for f in dataclasses.fields(dtype) if f.init}
            built.append(dtype(**{k: v for k, v in values.items() if k in names}))
    except (TypeError, ValueError) as err:  # a combination TrainingArguments refuses
        raise InputError(source, f"invalid arguments: {str(err).splitlines()[0]}",
                         "run `python run_qa.py --help` for the accepted arguments") from None
    return (*built, explicit)


def _gpu_less_distributed_launch() -> bool:
    """torchrun (or srun) started several processes, and this one sees no GPU (none on the node,
    or CUDA_VISIBLE_DEVICES empty)."""
    try:
        world = int(os.environ.get("WORLD_SIZE") or 1)
    except ValueError:
        return False
    if world <= 1:
        return False
    import torch

    return not torch.cuda.is_available()


def finalize(training_args, explicit: set) -> None:
    """Defaults that differ from transformers 5's: TensorBoard on unless asked otherwise, and
    its event files inside the run's output folder; progress bars only on a terminal, no
    memory pinning without an accelerator (qa.console)."""
    if "report_to" not in explicit:
        training_args.report_to = ["tensorboard"]
    os.environ.setdefault("TENSORBOARD_LOGGING_DIR", os.path.join(training_args.output_dir, "runs"))
    configure_output(training_args, explicit)


# What a SLURM job needs before it starts run_qa.py: where the run writes (job_time.jsonl goes
# there), and the batch size, accumulation and learning rate it logs and GLOBAL_BATCH works from.
JOB_SETTINGS = ("output_dir", "per_device_train_batch_size", "gradient_accumulation_steps", "learning_rate")


def job_settings(argv) -> dict:
    """JOB_SETTINGS as run_qa.py will resolve `argv` (a config, then flags; TrainingArguments'
    own defaults for what neither gives), plus `given`: the argument names the user gave."""
    *_, training_args, explicit = parse_args(argv)
    return {**{name: getattr(training_args, name) for name in JOB_SETTINGS}, "given": sorted(explicit)}


@command
def main(argv=None) -> int:
    """`python -m qa.config CONFIG [ARGS...]`: job_settings() as `name=value` lines, for the job
    scripts (jobs/launch.sh); `given` is a space-separated list."""
    settings = job_settings(sys.argv[1:] if argv is None else argv)
    for name, value in settings.items():
        print(f"{name}={' '.join(value) if isinstance(value, list) else value}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
