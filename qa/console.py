"""What a run prints, readable in a terminal and in a SLURM job's log file (docs/running.md#the-log): a log file
would keep tqdm's redraws as hundreds of half-lines, and the Trainer's printer writes numbers as strings."""
import contextlib
import json
import logging
import sys

import torch
from transformers import PrinterCallback, ProgressCallback, TrainerCallback
from transformers.utils import logging as transformers_logging

logger = logging.getLogger(__name__)


def configure_output(training_args, explicit: set, terminal=None) -> None:
    """`explicit`: the argument names the user gave, kept as given. The bars for loading and writing weights are off
    on a terminal too: they flash by and, at every checkpoint, break the training bar."""
    import datasets

    if terminal is None:
        terminal = sys.stderr is not None and sys.stderr.isatty()
    if "disable_tqdm" not in explicit:
        training_args.disable_tqdm = not terminal
    if training_args.disable_tqdm:
        datasets.disable_progress_bars()
    transformers_logging.disable_progress_bar()
    if training_args.dataloader_pin_memory and not torch.accelerator.is_available():
        # Pinning is for copies to an accelerator; without one torch pins nothing and warns.
        if "dataloader_pin_memory" in explicit:
            logger.info("dataloader_pin_memory: no GPU or other accelerator here, so there is nothing to pin for; off")
        training_args.dataloader_pin_memory = False


def configure_logging(verbose: bool) -> None:
    """transformers keeps its own handler (its level follows --log_level) and stops propagating: where `CI` is set,
    its loggers would pass each record on to the root logger's handler too, every line twice."""
    logging.basicConfig(format="%(asctime)s %(levelname)s %(name)s: %(message)s",
                        level=logging.INFO if verbose else logging.WARNING)
    transformers_logging.disable_propagation()


@contextlib.contextmanager
def held_back(name: str):
    """The lines of logger `name` kept back until the block ends (-> them: what the block drops is never said), and
    dropped when it fails: a refusal's one line is then all that is said."""
    held = []
    hold = held.append  # a filter that returns None: the record is not emitted now
    logging.getLogger(name).addFilter(hold)
    try:
        yield held
    finally:
        logging.getLogger(name).removeFilter(hold)
    for record in held:
        logging.getLogger(name).handle(record)


def format_log(logs: dict, step=None) -> str:
    entry = {} if step is None else {"step": step}
    entry.update((k, float(f"{v:.4g}") if isinstance(v, float) else v)
                 for k, v in logs.items() if k != "total_flos")
    return json.dumps(entry, default=str)


class LogLinesCallback(TrainerCallback):
    def on_log(self, args, state, control, logs=None, **kwargs):
        if state.is_world_process_zero and logs:
            print(format_log(logs, state.global_step), flush=True)


class LogLinesProgressCallback(ProgressCallback):
    def on_log(self, args, state, control, logs=None, **kwargs):
        if self.training_bar is None:  # evaluation after training, which the Trainer's bar does not print at all
            LogLinesCallback.on_log(self, args, state, control, logs)
        elif state.is_world_process_zero and logs:
            self.training_bar.write(format_log(logs, state.global_step))


def replace_log_printer(trainer) -> None:
    """A Trainer with neither printer nor progress bar (a notebook's progress display) is left as it is."""
    if any([trainer.pop_callback(cls) for cls in (ProgressCallback, PrinterCallback)]):  # a list: both popped
        trainer.add_callback(LogLinesCallback() if trainer.args.disable_tqdm else LogLinesProgressCallback())
