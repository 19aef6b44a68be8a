"""The run's arguments as given: a JSON config file, then flags that override it.

Read with the standard library only, so a job script learns where the run writes in a fraction of
a second (`python -m qa.cmdline output_dir CONFIG [ARGS...]`) without importing transformers
(about 9 s); qa.config parses the same arguments into the run's settings.
"""
import json
import os
import sys

from qa.errors import InputError, command
from qa.io import read_json

# Where a run writes when neither the config nor the flags say: transformers' own default
# (TrainingArguments turns output_dir=None into it), fixed here so that the job script, which
# writes job_time.jsonl there, and the run agree whatever a release does.
DEFAULT_OUTPUT_DIR = "trainer_output"


def read_config(path: str) -> dict:
    if not os.path.exists(path):  # not read_json's message: the fix points at the shipped configs
        raise InputError(path, "config file not found", "check the path (configs/ lists the shipped ones)")
    config = read_json(path, "config file")
    if not isinstance(config, dict):
        raise InputError(path, "a config must be a JSON object of argument names to values",
                         "write it as {\"model_name_or_path\": ..., ...}")
    config.pop("_comment", None)
    return config


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


def expand(argv) -> tuple:
    """-> (source, flags, given): where the arguments came from (the config file or "command
    line"), the config as flags followed by the rest of `argv` (the last of a flag wins), and
    the names of the arguments the user gave."""
    argv = [str(a) for a in argv]
    source, config = "command line", {}
    if argv and argv[0].endswith(".json"):
        source, config = argv[0], read_config(argv[0])
        argv = to_flags(config) + argv[1:]
    given = set(config) | {a[2:].split("=")[0] for a in argv if a.startswith("--")}
    return source, argv, given


def output_dir(flags) -> str:
    """The folder a run with these (expanded) flags writes into: the last --output_dir, else
    DEFAULT_OUTPUT_DIR; `~` expanded as TrainingArguments does."""
    found = DEFAULT_OUTPUT_DIR
    for i, arg in enumerate(flags):
        if arg == "--output_dir" and i + 1 < len(flags):
            found = flags[i + 1]
        elif arg.startswith("--output_dir="):
            found = arg.split("=", 1)[1]
    return os.path.expanduser(found)


@command
def main(argv=None) -> int:
    """`python -m qa.cmdline output_dir CONFIG [ARGS...]`: prints the run's output folder (for
    jobs/launch.sh); a config that cannot be read is the one-line error and exit 2."""
    argv = sys.argv[1:] if argv is None else list(argv)
    if not argv or argv[0] != "output_dir":
        raise InputError("qa.cmdline", f"unknown request {argv[:1]}", "run `python -m qa.cmdline output_dir CONFIG "
                         "[ARGS...]`")
    print(output_dir(expand(argv[1:])[1]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
