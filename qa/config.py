"""Parsing the run's arguments: flags, or a JSON config file optionally followed by flags
that override it (`run_qa.py configs/reference.json --output_dir runs/x`; qa.cmdline reads them),
and the run's own defaults (finalize), the global batch among them."""
import logging
import os

from transformers import HfArgumentParser, TrainingArguments

from qa.args import DataArguments, ModelArguments, RunArguments
from qa.cmdline import DEFAULT_OUTPUT_DIR, expand
from qa.console import configure_output
from qa.errors import EXIT_OUT_OF_MEMORY, InputError
from qa.settings import check_settings

DATACLASSES = (ModelArguments, DataArguments, RunArguments, TrainingArguments)
# What --help shows first: the form every example uses, a config followed by flags that override it.
USAGE = "%(prog)s [CONFIG.json] [--ARGUMENT VALUE ...]"
DESCRIPTION = (
    "Fine-tune and evaluate a BERT-style model for extractive question answering. CONFIG.json is a JSON "
    "object of argument names to values (configs/ holds the shipped recipes); the flags after it override "
    "it, e.g. `run_qa.py configs/reference.json --output_dir runs/ref2 --seed 7`. Without a config every "
    "argument comes from the flags. Under torchrun the same arguments start one process per GPU.")
logger = logging.getLogger(__name__)


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
    is checked against qa.settings before the dataclasses are built, and bf16/TF32 follow the
    device (device_precision). Without an output_dir the run writes to
    qa.cmdline.DEFAULT_OUTPUT_DIR, where the job scripts expect it."""
    source, argv, explicit = expand(argv)
    if "output_dir" not in explicit:
        argv = ["--output_dir", DEFAULT_OUTPUT_DIR] + argv
    if _gpu_less_distributed_launch():
        # Without a GPU the Trainer forms the process group only with use_cpu: otherwise each
        # process would train alone on all the data under one world size and all of them would
        # write the same files. What the user asked for is one group: gloo on the CPU.
        logger.warning("%s processes started (WORLD_SIZE) and no GPU is visible here: training as one gloo "
                       "group on the CPU (--use_cpu true)", os.environ["WORLD_SIZE"])
        argv = argv + ["--use_cpu", "true"]
    # One spelling per flag (no abbreviations), as qa.cmdline reads them.
    parser = _Parser(DATACLASSES, allow_abbrev=False, usage=USAGE, description=DESCRIPTION)
    parser.source = source
    namespace, unknown = parser.parse_known_args(args=argv)  # --help: prints it, SystemExit(0)
    if unknown:
        raise InputError(source, f"unknown arguments {unknown}",
                         "remove them or run `python run_qa.py --help` for the accepted ones")
    values = vars(namespace)
    check_settings(values)
    changes, note = device_precision(_capability(values), values.get("bf16"), values.get("tf32"))
    if note:
        logger.warning("%s", note)
        values.update(changes)
    try:
        built = parser.parse_dict(values, allow_extra_keys=True)
    except (TypeError, ValueError) as err:  # a combination TrainingArguments refuses
        raise InputError(source, f"invalid arguments: {str(err).splitlines()[0]}",
                         "run `python run_qa.py --help` for the accepted arguments") from None
    if note:
        built[2].adjusted.append(note)  # into environment.json and results.md
    return (*built, explicit)


def device_precision(capability, bf16: bool, tf32) -> tuple:
    """-> (settings to change, the one line that says so, or None) for a run asking for `bf16`
    and `tf32` on a device of CUDA compute `capability` ((major, minor); None: no GPU).

    bf16 and TF32 arrive together with compute capability 8.0 (Ampere). Below it (T4, V100) there
    are no bf16 tensor cores (torch emulates bf16) while fp16 with loss scaling (the Trainer's
    GradScaler) runs on the tensor cores; TF32 does not exist there nor on a CPU, where
    transformers refuses --tf32. bf16 on a CPU stays: autocast runs it natively."""
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


def _capability(values: dict):
    """The compute capability of the GPU this process will use, or None (none, or --use_cpu)."""
    if not (values.get("bf16") or values.get("tf32")) or values.get("use_cpu"):
        return None
    import torch

    if not torch.cuda.is_available():
        return None
    return torch.cuda.get_device_capability(int(os.environ.get("LOCAL_RANK") or 0) % torch.cuda.device_count())


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


def finalize(training_args, run_args, explicit: set) -> None:
    """The run's own defaults, where they differ from transformers 5's: TensorBoard on unless
    asked otherwise, its event files inside the run's output folder; progress bars only on a
    terminal, no memory pinning without an accelerator (qa.console); DDP without its search for
    unused parameters (BERT-QA uses every one; FSDP does not read it); --global_batch split over
    the world size. Needs the process group (the world size): call it once devices are set up."""
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
    """-> (per-device batch, gradient accumulation) whose product with `world` is `global_batch`:
    the fewest accumulation steps whose per-device batch is at most `per_device_max` (the
    memory limit). InputError when `global_batch` does not divide over `world` processes."""
    if global_batch % world:
        near = [n for n in (global_batch // world * world, (global_batch // world + 1) * world) if n > 0]
        raise InputError(f"global_batch={global_batch}", f"does not divide over the {world} processes of this run",
                         f"pick a multiple of {world} (e.g. {' or '.join(map(str, near))})")
    per_rank = global_batch // world
    accumulation = next(a for a in range(1, per_rank + 1) if per_rank % a == 0 and per_rank // a <= per_device_max)
    return per_rank // accumulation, accumulation


def out_of_memory(training_args, error) -> InputError:
    """The line for the device running out of memory in a training step: the per-device batch and
    the fix that keeps the global batch, so that the run resumes from its checkpoints (qa.training.checkpoints
    allows another split of the same global batch)."""
    batch = training_args.per_device_train_batch_size
    global_batch = batch * training_args.gradient_accumulation_steps * training_args.world_size
    fix = (f"pass a smaller --per_device_train_batch_size (e.g. {batch // 2}) with --global_batch {global_batch}: the "
           "same global batch, gradient accumulation making up the rest; the run resumes from its last checkpoint"
           if batch > 1 else "lower --max_seq_length, or use a device with more memory")
    said = (str(error).strip().splitlines() or ["OutOfMemoryError"])[0][:160]
    return InputError(f"per_device_train_batch_size={batch}", f"the device ran out of memory in a training step "
                      f"({said})", fix, exit_code=EXIT_OUT_OF_MEMORY)
