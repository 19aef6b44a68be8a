"""Trainer callbacks a run adds on top of the Trainer's own (telemetry, profiling)."""


def run_callbacks(run_args, training_args, train_stats=None) -> list:
    """`train_stats`: qa.telemetry.token_stats of the training features, or None."""
    return []
