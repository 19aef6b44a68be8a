"""The callbacks a run adds to the Trainer, built from its settings (qa.arguments.RunArguments) and
installed in one place. Each keeps its own clock; the one order that matters is said where it is."""
import threading

from transformers.integrations import TensorBoardCallback

from qa.arguments import CUDA_GRAPH_MODES
from qa.console import replace_log_printer
from qa.distributed import DDPCompressionHook, set_fsdp_reduce_dtype
from qa.evaluation.time_to_accuracy import TimeToAccuracyCallback
from qa.io import disk_full, optional_output
from qa.training.compile import CompileWarmupCallback
from qa.training.preemption import CheckpointOnSignalCallback
from qa.training.profiling import ProfilerCallback
from qa.training.telemetry import TelemetryCallback


def run_callbacks(run_args, training_args) -> dict:
    out = {}
    if run_args.eval_every is not None:  # first: the time to accuracy counts the compile warm-up's time
        out["time_to_accuracy"] = TimeToAccuracyCallback(run_args.eval_every, run_args.target_f1)
    if run_args.telemetry:
        out["telemetry"] = TelemetryCallback(peak_tflops=run_args.peak_tflops)
    if run_args.profile:
        out["profiler"] = ProfilerCallback(training_args.output_dir, wait=run_args.profile_wait,
                                           warmup=run_args.profile_warmup, active=run_args.profile_active,
                                           repeat=run_args.profile_repeat, with_stack=run_args.profile_with_stack)
    if run_args.checkpoint_on_sigterm:
        out["preemption"] = CheckpointOnSignalCallback(run_args.preemption_check_steps)
    if run_args.compile_warmup and training_args.torch_compile:  # else idle, said by qa.arguments.check_together
        # CUDA graphs are recorded at a shape's second pass
        out["compile_warmup"] = CompileWarmupCallback(2 if training_args.torch_compile_mode in CUDA_GRAPH_MODES else 1)
    if run_args.ddp_comm_hook != "none":
        out["ddp_comm_hook"] = DDPCompressionHook(run_args.ddp_comm_hook)
    return out


def install(trainer, callbacks, run_args) -> None:
    """`callbacks` after the Trainer's own; FSDP's reduction dtype here, before train() wraps the model."""
    plugin = getattr(trainer.accelerator.state, "fsdp_plugin", None)
    if run_args.fsdp_reduce_dtype != "auto" and plugin is not None:  # else idle, said by check_together
        set_fsdp_reduce_dtype(plugin, run_args.fsdp_reduce_dtype)
    if run_args.log_lines:
        replace_log_printer(trainer)
    if trainer.pop_callback(TensorBoardCallback) is not None:  # the Trainer's, for report_to tensorboard
        trainer.add_callback(TensorBoardEvents())
    for callback in callbacks:
        if hasattr(callback, "bind"):
            callback.bind(trainer)
        trainer.add_callback(callback)


def summary(callbacks) -> dict:
    return {k: v for callback in callbacks for k, v in getattr(callback, "summary", dict)().items()}


def _writing_events(method):
    """`method` of the Trainer's TensorBoard callback, until a full disk or quota stops the events (optional_output)."""
    def written(self, args, state, control, **kwargs):
        if not self.stopped:
            with optional_output(self.logging_dir or args.output_dir, "TensorBoard events") as said:
                method(self, args, state, control, **kwargs)
            self.stopped = said.stopped
    return written


class TensorBoardEvents(TensorBoardCallback):
    """The Trainer's TensorBoard callback, whose writes into a full disk stop the events, not the training: the curves
    are worth less than the steps a stop would lose since the last checkpoint."""
    stopped = False

    def __init__(self):
        super().__init__()
        if threading.excepthook is not _said_by_the_next_write:
            _said_by_the_next_write.previous, threading.excepthook = threading.excepthook, _said_by_the_next_write

    on_train_begin = _writing_events(TensorBoardCallback.on_train_begin)
    on_log = _writing_events(TensorBoardCallback.on_log)
    on_train_end = _writing_events(TensorBoardCallback.on_train_end)


def _said_by_the_next_write(hook_args):
    # the error tensorboard's writer thread keeps is said in one line by the next write: its traceback would repeat it
    if not (type(hook_args.thread).__module__.startswith("tensorboard.") and disk_full(hook_args.exc_value)):
        _said_by_the_next_write.previous(hook_args)
