"""The callbacks a run adds to the Trainer, built and installed in one place (`RunCallbacks`).

Each callback lives with its job (qa.training.telemetry, qa.training.profiling, qa.training.preemption, qa.training.trial_steps for
the compile warm-up, qa.communication, qa.evaluation.time_to_accuracy) and takes plain values; this module alone reads the run's
settings (qa.arguments.RunArguments) to build them, installs them through the Trainer's public
`add_callback`, hands the Trainer the values to add to its log entries (`log_values`, for
QuestionAnsweringTrainer's `log_extras`) and gathers what they measured (`summary`).
"""
import logging
import os

from qa.communication import CommunicationCallback
from qa.console import log_lines_callback, replace_log_printer
from qa.training.preemption import CheckpointOnSignalCallback
from qa.training.profiling import ProfilerCallback
from qa.training.telemetry import TelemetryCallback
from qa.evaluation.time_to_accuracy import TimeToAccuracyCallback
from qa.training.trial_steps import CompileWarmupCallback

logger = logging.getLogger(__name__)


class RunCallbacks:
    """Every callback a run adds to the Trainer, each built from its own settings in `__init__`.

    `install(trainer)` puts the console's log printer (qa.console) in place of the Trainer's and
    adds the others after the Trainer's own (flow control, reporting), in the order of
    `callbacks`: the time-to-accuracy clock first (the warm-up and the measurement are part of
    the time to train, and the preemption callback after it may cancel an evaluation it asked
    for); then the telemetry, so the time the others spend inside its measured stretches (the
    profiler in on_step_end; the compile warm-up and the communication measurement in
    on_train_begin, after the telemetry started its clock) falls between two of its marks and is
    set aside (each reports it as `overhead_s`); the warm-up before the measurement, whose passes
    then reuse the graphs it compiled. Nothing here needs to run before the reporting callbacks:
    the throughput figures join the log entries in the Trainer's `log` (`log_values`), before any
    callback sees them.
    """

    def __init__(self, run_args, training_args):
        self.profiler = None
        if run_args.profile:
            self.profiler = ProfilerCallback(training_args.output_dir, wait=run_args.profile_wait,
                                             warmup=run_args.profile_warmup, active=run_args.profile_active,
                                             repeat=run_args.profile_repeat, with_stack=run_args.profile_with_stack)
        self.preemption = None
        if run_args.checkpoint_on_sigterm:
            self.preemption = CheckpointOnSignalCallback(run_args.preemption_check_steps)
        self.warmup = None
        if run_args.compile_warmup and getattr(training_args, "torch_compile", False):
            self.warmup = CompileWarmupCallback()
        elif run_args.compile_warmup:
            logger.warning("--compile_warmup: the run does not compile (--torch_compile false): nothing to warm up")
        # Always built: it finds out itself whether the run is distributed.
        self.communication = CommunicationCallback(run_args.measure_communication, run_args.ddp_comm_hook,
                                                   run_args.fsdp_reduce_dtype)
        self.telemetry = None
        if run_args.telemetry:  # built last: it sets aside the time of those above
            overhead = [c for c in (self.profiler, self.warmup, self.communication) if c is not None]
            self.telemetry = TelemetryCallback(peak_tflops=run_args.peak_tflops, timed_steps=run_args.timed_steps(),
                                               window_min_s=run_args.telemetry_window_min_s,
                                               overhead_sources=overhead)
        self.time_to_accuracy = None
        if run_args.eval_every is not None:
            tensorboard = "tensorboard" in (training_args.report_to or [])
            self.time_to_accuracy = TimeToAccuracyCallback(
                run_args.eval_every, run_args.target_f1,
                tensorboard_dir=os.environ.get("TENSORBOARD_LOGGING_DIR") if tensorboard else None)
        self.console = None  # the log printer, chosen in install() from the Trainer's arguments

    @property
    def callbacks(self) -> list:
        return [c for c in (self.time_to_accuracy, self.telemetry, self.profiler, self.preemption, self.warmup,
                            self.communication) if c is not None]

    def install(self, trainer) -> None:
        for needs_trainer in (self.warmup, self.communication):  # they act on its model before training
            if needs_trainer is not None:
                needs_trainer.bind(trainer)
        self.console = log_lines_callback(trainer.args)
        if not replace_log_printer(trainer, self.console):
            self.console = None
        for callback in self.callbacks:
            trainer.add_callback(callback)

    def log_values(self, logs: dict) -> dict:
        return self.telemetry.log_values(logs) if self.telemetry is not None else {}

    def stopped_at(self):
        """The global step at which a SIGTERM stopped training, or None."""
        return self.preemption.stopped_at if self.preemption is not None else None

    def summary(self) -> dict:
        """What the telemetry, the profiler, the compile warm-up, the communication measurement and
        the evaluations during training recorded, for train_results.json."""
        out = {}
        for callback in (self.telemetry, self.profiler, self.warmup, self.communication, self.time_to_accuracy):
            if callback is not None:
                out.update(callback.summary())
        return out
