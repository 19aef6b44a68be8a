"""Every numeric and path setting of a run, and the rule its value must follow: one table.

`SETTINGS` covers the numbers and paths of ModelArguments, DataArguments and RunArguments and
of the TrainingArguments a run uses. `check_settings` applies it to the values as parsed, right
after parsing and before the argument dataclasses are built (so TrainingArguments' own checks,
which raise multi-line errors without a fix, never see an out-of-range value) and before
anything is written. A value that breaks its rule stops the run with one line: the setting and
its value, what it must be and what it means, and the fix (qa.errors.InputError, exit 2).

A rule that involves another setting (buckets within max_seq_length, the window's room) is
checked after every single value is known to be in range. tests/test_settings.py walks every
numeric field of the argument dataclasses, so a new one without a rule here fails the tests.
"""
import math
import os
from dataclasses import dataclass
from typing import Callable, Optional

from qa.errors import InputError

SEED_LIMIT = 2**32  # numpy's seeding (transformers' set_seed seeds numpy too) takes 0 .. 2**32 - 1


def _plain(value) -> str:
    if isinstance(value, float) and value.is_integer() and math.isfinite(value):
        return str(int(value)) if abs(value) < 1e15 else repr(value)
    return str(value)


@dataclass(frozen=True)
class Number:
    """A number in [low, high] (`low_open`/`high_open` exclude an end), whole if `whole`; `also`
    lists values allowed outside the range (e.g. -1, "no limit"); None only if `optional`."""
    means: str
    fix: str
    low: float = -math.inf
    high: float = math.inf
    whole: bool = False
    optional: bool = False
    low_open: bool = False
    high_open: bool = False
    also: tuple = ()
    needs: Optional[str] = None  # another setting that must be given for this one to mean anything

    def describe(self) -> str:
        low, high = _plain(self.low), _plain(self.high)
        if math.isinf(self.low) and math.isinf(self.high):
            text = "a finite number"
        elif math.isinf(self.high):
            text = f"greater than {low}" if self.low_open else f"at least {low}"
        elif math.isinf(self.low):
            text = f"below {high}" if self.high_open else f"at most {high}"
        elif self.low_open or self.high_open:
            text = (f"{'greater than' if self.low_open else 'at least'} {low} and "
                    f"{'below' if self.high_open else 'at most'} {high}")
        else:
            text = f"from {low} to {high}"
        if self.whole and not math.isinf(self.low) and not math.isinf(self.high):
            text = "a whole number " + text
        return " or ".join([*map(_plain, self.also), text])

    def accepts(self, value) -> bool:
        if value in self.also:
            return True
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            return False
        if self.whole and value != int(value):
            return False
        above = value > self.low if self.low_open else value >= self.low
        below = value < self.high if self.high_open else value <= self.high
        return above and below

    def check(self, name, value, values) -> None:
        if value is None:
            if self.optional:
                return
            raise InputError(f"{name}=None", f"must be {self.describe()} ({self.means})", self.fix)
        if not self.accepts(value):
            raise InputError(f"{name}={_plain(value)}", f"must be {self.describe()} ({self.means})", self.fix)
        if self.needs and values.get(self.needs) is None:
            raise InputError(f"{name}={_plain(value)}", f"means nothing without --{self.needs} ({self.means})",
                             f"give --{self.needs} too, or leave {name} out")

    def outside(self):
        """A value this rule refuses (the tests walk every setting with one)."""
        if not math.isinf(self.low):
            return self.low if self.low_open else self.low - 1
        if not math.isinf(self.high):
            return self.high if self.high_open else self.high + 1
        return math.nan


@dataclass(frozen=True)
class StepsOrRatio:
    """Transformers' step intervals and warm-up: a fraction of the run's total steps below 1, a
    whole number of steps from 1 on (a fraction above 1 would be cut silently)."""
    means: str
    fix: str
    zero: bool = False      # 0 allowed (no warm-up)
    optional: bool = False
    fraction_of: str = "the training steps"

    def check(self, name, value, values) -> None:
        if value is None and self.optional:
            return
        kinds = ("0, " if self.zero else "") + f"a fraction of {self.fraction_of} between 0 and 1, or a whole " \
                                                "number of steps"
        if value is None or not math.isfinite(value) or value < 0 or (value == 0 and not self.zero) \
                or (value > 1 and value != int(value)):
            raise InputError(f"{name}={_plain(value)}", f"must be {kinds} ({self.means})", self.fix)

    def outside(self):
        return -1 if self.zero else 0


@dataclass(frozen=True)
class Folder:
    """A folder that exists or can be created; `writable`: the run writes into it."""
    means: str
    fix: str
    writable: bool = True

    def check(self, name, value, values) -> None:
        if value is None or value == "":
            return
        problem = folder_problem(os.path.expanduser(str(value)), self.writable)
        if problem:
            raise InputError(f"{name}={value}", f"{problem} ({self.means})", self.fix)


def folder_problem(path: str, writable: bool = True) -> Optional[str]:
    """Why `path` cannot be (made) a folder the run can write into, or None. Asked with access(),
    so nothing is created to find out (read-only file systems answer too)."""
    if os.path.exists(path):
        if not os.path.isdir(path):
            return "is a file, not a folder"
        if writable and not os.access(path, os.W_OK | os.X_OK):
            return "is not writable by this user"
        return None
    parent = os.path.dirname(os.path.abspath(path))
    while not os.path.exists(parent):
        parent = os.path.dirname(parent)
    if not os.path.isdir(parent):
        return f"cannot be created: {parent} is a file"
    if not os.access(parent, os.W_OK | os.X_OK):
        return f"cannot be created: {parent} is not writable by this user"
    return None


@dataclass(frozen=True)
class Checked:
    """A setting checked by the function of the module that owns it (so its message is that
    module's): check(value) raises InputError; None is not checked."""
    check_value: Callable

    def check(self, name, value, values) -> None:
        if value is not None:
            self.check_value(value)


def _data_file(value) -> None:
    from qa.data.files import check_data_file

    check_data_file(str(value))


def _model_source(value) -> None:
    from qa.model import check_model_source

    check_model_source(str(value))


def _articles(option):
    def check(value):
        from qa.data.sources import parse_slice

        parse_slice(value, option)
    return check


def _resume(value) -> None:
    if value in ("auto", "never"):
        return
    if not os.path.isdir(value):
        raise InputError(f"resume={value}", "is neither 'auto', 'never' nor an existing checkpoint folder",
                         "pass --resume auto (the last complete checkpoint in output_dir), never (start "
                         "afresh), or the path of a checkpoint-N folder")


def _telemetry_window(value) -> None:
    from qa.args import steps_window

    try:
        start, stop = steps_window(value)
    except ValueError:
        start = stop = None
    if start is None or not 1 <= start < stop:
        raise InputError(f"telemetry_window={value!r}", "must be 'START:STOP' with 1 <= START < STOP (optimizer "
                         "steps; the window opens at the end of step START)", "give e.g. '10:50'")


class Buckets:
    """--length_buckets: whole lengths from 1 to max_seq_length."""

    def check(self, name, value, values) -> None:
        max_seq_length = values.get("max_seq_length") or math.inf
        for bucket in value or ():
            if bucket < 1 or bucket > max_seq_length:
                why = ("no feature is longer than max_seq_length, so a larger bucket only pads beyond it"
                       if bucket > max_seq_length else "a batch cannot be padded to fewer than 1 token")
                examples = " ".join(str(max_seq_length * k // 4) for k in (1, 2, 3, 4))
                raise InputError(f"length_buckets={list(value)}",
                                 f"bucket {bucket} is outside 1..max_seq_length={max_seq_length} ({why})",
                                 f"give lengths from 1 to {max_seq_length} (e.g. {examples}), or raise "
                                 "--max_seq_length")

    def outside(self):
        return [0]


def _count(means, fix, low=1, optional=False, needs=None):
    return Number(means, fix, low=low, whole=True, optional=optional, needs=needs)


def _seed(means):
    return Number(means, "use a whole number from 0 to 4294967295, e.g. 42", low=0, high=SEED_LIMIT - 1, whole=True)


_SAMPLES = "keep the first N questions with all their windows"

SETTINGS = {
    # ModelArguments
    "model_name_or_path": Checked(_model_source),
    "tokenizer_name": Checked(_model_source),
    "cache_dir": Folder("where Hub downloads are cached", "give a folder that exists or can be created",
                        writable=False),
    # DataArguments
    "train_file": Checked(_data_file),
    "validation_file": Checked(_data_file),
    "test_file": Checked(_data_file),
    "train_articles": Checked(_articles("--train_articles")),
    "validation_articles": Checked(_articles("--validation_articles")),
    "synthetic_train_examples": _count("generated training questions", "use e.g. 2000"),
    "synthetic_eval_examples": _count("generated evaluation questions", "use e.g. 400"),
    "synthetic_seed": _seed("the seed of the generated data"),
    "max_seq_length": _count("tokens per feature", "use e.g. 384"),
    # Negative: the tokenizer's overflow arithmetic fails. Zero: windows would not overlap, so an
    # answer that crosses a window boundary would be in no window at all.
    "doc_stride": _count("consecutive windows share this many context tokens",
                         "use a positive value, e.g. 128 with max_seq_length 384"),
    "max_query_length": _count("questions are cut to this many tokens", "use a positive value, e.g. 64"),
    "pad_to_multiple_of": _count("dynamic padding rounds each batch up to a multiple of it",
                                 "use 8 (tensor-core friendly), or 1 to pad each batch to its longest feature"),
    "length_buckets": Buckets(),
    "max_train_samples": _count(_SAMPLES, "give a positive number, or leave it out for all", optional=True),
    "max_eval_samples": _count(_SAMPLES, "give a positive number, or leave it out for all", optional=True),
    "max_predict_samples": _count(_SAMPLES, "give a positive number, or leave it out for all", optional=True),
    "preprocessing_num_workers": _count("processes that tokenize", "give 1 or more, or leave it out for one",
                                        optional=True),
    "features_cache_dir": Folder("where tokenized features are cached", "give a folder this user can write to"),
    "n_best_size": _count("start and end candidates per window", "use e.g. 20"),
    "max_answer_length": _count("the longest answer, in tokens", "use e.g. 30"),
    "null_score_diff_threshold": Number("SQuAD v2: answer nothing when the null score beats the best by more",
                                        "use e.g. 0.0"),
    # RunArguments
    "resume": Checked(_resume),
    "peak_tflops": Number("one device's dense TFLOP/s, for MFU", "give the device's peak, e.g. 312 for an A100 "
                          "in bf16, or leave it out", low=0, low_open=True, optional=True),
    "telemetry_window": Checked(_telemetry_window),
    "telemetry_window_min_s": Number("the timed window's least duration, seconds; needs --telemetry_window",
                                     "give a positive number of seconds, e.g. 20, or leave it out", low=0,
                                     low_open=True, optional=True, needs="telemetry_window"),
    "eval_every": StepsOrRatio("evaluations during training", "use e.g. 0.25 (four per epoch) or 200 (steps), or "
                               "leave it out", optional=True, fraction_of="an epoch"),
    "eval_every_questions": _count("validation questions of each evaluation during training; needs --eval_every",
                                   "use e.g. 1000, or leave it out to evaluate on all of them", optional=True,
                                   needs="eval_every"),
    "target_f1": Number("the F1 whose time to reach is reported; needs --eval_every", "give an F1 from 0 to "
                        "100, e.g. 88.5", low=0, high=100, low_open=True, optional=True, needs="eval_every"),
    "global_batch": _count("features per optimizer step over all processes; it must also divide by the world size",
                           "give a positive whole number, e.g. 48, or leave it out", optional=True),
    "preemption_check_steps": _count("optimizer steps between the ranks' agreement on a SIGTERM",
                                     "use 1 or more, e.g. 10"),
    "profile_wait": _count("steps skipped before each profiling cycle", "use 0 or more, e.g. 1", low=0),
    "profile_warmup": _count("steps traced and discarded in each cycle", "use 0 or more, e.g. 1", low=0),
    "profile_active": _count("steps recorded in each cycle", "use 1 or more, e.g. 3"),
    "profile_repeat": _count("profiling cycles, 0 = until training ends", "use 0 or more, e.g. 1", low=0),
    # TrainingArguments
    "output_dir": Folder("where the run writes", "give a folder this user can create and write to"),
    "per_device_train_batch_size": _count("features per device in each step", "use e.g. 12"),
    "per_device_eval_batch_size": _count("features per device in each evaluation step", "use e.g. 64"),
    "num_train_epochs": Number("passes over the training data", "use e.g. 2", low=0, low_open=True),
    "max_steps": Number("optimizer steps; -1 lets num_train_epochs decide", "use -1, or the number of steps",
                        low=1, whole=True, also=(-1,)),
    "learning_rate": Number("the peak learning rate", "use e.g. 3e-5", low=0),
    "warmup_steps": StepsOrRatio("the learning-rate warm-up", "use 0, a fraction such as 0.1, or a number of "
                                 "steps", zero=True),
    "weight_decay": Number("AdamW's decoupled weight decay", "use 0 or e.g. 0.01", low=0),
    "adam_beta1": Number("AdamW's first-moment decay", "use e.g. 0.9", low=0, high=1, high_open=True),
    "adam_beta2": Number("AdamW's second-moment decay", "use e.g. 0.999", low=0, high=1, high_open=True),
    "adam_epsilon": Number("AdamW's denominator term", "use e.g. 1e-8", low=0, low_open=True),
    "max_grad_norm": Number("gradient clipping; 0 turns it off", "use e.g. 1.0, or 0", low=0),
    "label_smoothing_factor": Number("label smoothing of the loss", "use 0, or e.g. 0.1", low=0, high=1,
                                     high_open=True),
    "gradient_accumulation_steps": _count("batches per optimizer step", "use 1 or more"),
    "neftune_noise_alpha": Number("NEFTune embedding noise", "use e.g. 5, or leave it out", low=0, optional=True),
    "torch_empty_cache_steps": _count("steps between emptying the device cache", "use e.g. 100, or leave it out",
                                      optional=True),
    "logging_steps": StepsOrRatio("steps between log entries", "use e.g. 50, or a fraction such as 0.01"),
    "eval_steps": StepsOrRatio("steps between evaluations", "use e.g. 500, or a fraction such as 0.1, or leave it "
                               "out", optional=True),
    "eval_delay": Number("epochs or steps before the first evaluation", "use 0 or more", low=0),
    "eval_accumulation_steps": _count("evaluation steps whose outputs are gathered at once",
                                      "use 1 or more, or leave it out", optional=True),
    "save_steps": StepsOrRatio("steps between checkpoints", "use e.g. 500, or a fraction such as 0.1"),
    "save_total_limit": _count("checkpoints kept", "use 1 or more (2 or more keeps one to fall back on), or "
                               "leave it out to keep them all", optional=True),
    "seed": _seed("the run's seed"),
    "data_seed": Number("the data order's seed", "use a whole number from 0 to 4294967295, or leave it out",
                        low=0, high=SEED_LIMIT - 1, whole=True, optional=True),
    "dataloader_num_workers": _count("data-loading processes per rank", "use 0 (load in the main process) or "
                                     "more", low=0),
    "dataloader_prefetch_factor": _count("batches each loading process prepares ahead", "use e.g. 2, or leave it "
                                         "out", optional=True),
    "ddp_bucket_cap_mb": _count("DDP's gradient bucket size, MB", "use e.g. 25, or leave it out", optional=True),
    "ddp_timeout": _count("seconds a collective may wait", "use e.g. 1800", low=1),
    "local_rank": Number("set by the launcher", "leave it out: torchrun sets it", low=-1, whole=True),
}


def check_settings(values: dict) -> None:
    """Raise InputError on the first setting in `values` (name -> parsed value) that breaks its
    rule, then on the window (max_seq_length, doc_stride, max_query_length) if it leaves no room."""
    for name, rule in SETTINGS.items():  # max_seq_length comes before length_buckets, which needs it
        if name in values:
            rule.check(name, values[name], values)
    if all(k in values for k in ("max_seq_length", "doc_stride", "max_query_length")):
        check_window(values["max_seq_length"], values["doc_stride"], values["max_query_length"])


PAIR_SPECIAL_TOKENS = 3  # BERT's [CLS] q [SEP] c [SEP]; qa.data.features.check_tokenizer counts the tokenizer's own


def check_window(max_seq_length: int, doc_stride: int, max_query_length: int,
                 special_tokens: int = PAIR_SPECIAL_TOKENS) -> None:
    """Fail early, with the fix, on window settings the tokenizer would reject mid-run: each value
    by its rule, then the room the longest question leaves for the context."""
    for name, value in (("max_query_length", max_query_length), ("doc_stride", doc_stride)):
        SETTINGS[name].check(name, value, {})
    room = max_seq_length - max_query_length - special_tokens
    if room <= 0 or doc_stride >= room:
        raise InputError(
            f"doc_stride={doc_stride}, max_seq_length={max_seq_length}, max_query_length={max_query_length}",
            f"doc_stride must be smaller than the context room max_seq_length - max_query_length - "
            f"{special_tokens} = {room}",
            f"lower doc_stride (e.g. {max(1, room // 2)}) or max_query_length, or raise max_seq_length",
        )
