"""A 1-GPU run's records as the scaling model's baseline (scaling.model.Baseline).

Step and data time from the run's all_results.json, batch and accumulation from its
environment.json, the gradient size where recorded, and the embedding block from its model's
config.json; each input comes with a line saying where it was read, which tools/scaling_predict.py
prints under its table. A record that cannot serve is an InputError naming the file.
"""
from pathlib import Path

from qa.errors import InputError
from qa.io import read_json

from .model import BERT_BASE_EMBEDDING_PARAMS, BERT_BASE_QA_PARAMS, Baseline, dtype_bytes


def as_number(value):
    """A recorded value when it is a number (not a bool), else None."""
    return value if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def number(results, key):
    return as_number(results.get(key))


def embedding_params(config: dict):
    """Parameters of a BERT-style embedding block from the model's config.json: the word,
    position and token-type tables (vocab_size, max_position_embeddings, type_vocab_size rows of
    embedding_size, or hidden_size when the model has no separate embedding size) and their
    LayerNorm (a weight and a bias). None when the config lacks the sizes."""
    width = config.get("embedding_size") or config.get("hidden_size")
    rows = [config.get(k) for k in ("vocab_size", "max_position_embeddings")]
    if not isinstance(width, int) or not all(isinstance(r, int) for r in rows):
        return None
    types = config.get("type_vocab_size") or 0
    return (rows[0] + rows[1] + types) * width + 2 * width


def model_config_of_run(run_dir, env: dict):
    """(the config.json of the model a run trained, as a dict, where it was read) or (None, None):
    the copy the run saved with its model, else the folder it started from (a local path or the
    bundled MiniLM)."""
    candidates = [Path(run_dir) / "config.json"]
    start = str((env.get("config") or {}).get("model_name_or_path") or "")
    if start == "bundled:minilm":
        from qa.model import bundled_minilm_dir

        try:
            candidates.append(bundled_minilm_dir() / "config.json")
        except InputError:
            pass
    elif start and not start.startswith("bundled:"):
        candidates.append(Path(start).expanduser() / "config.json")
    for path in candidates:
        if not path.is_file():
            continue
        try:
            config = read_json(path, "model config")
        except InputError:
            continue
        if isinstance(config, dict):
            return config, str(path)
    return None, None


def tail_from_run(run_dir, env: dict):
    """(embedding parameters of the run's model, a line saying where the figure comes from)."""
    config, where = model_config_of_run(run_dir, env)
    count = embedding_params(config) if config else None
    if count is None:
        return BERT_BASE_EMBEDDING_PARAMS, (
            f"embedding gradients {BERT_BASE_EMBEDDING_PARAMS:,} parameters: the model's config.json was not found "
            "(neither in the run folder nor at model_name_or_path), bert-base-uncased's embedding block assumed "
            "(--tail_params to change)")
    width = config.get("embedding_size") or config.get("hidden_size")
    return count, (f"embedding gradients {count:,} parameters ({where}: ({config['vocab_size']:,} words + "
                   f"{config['max_position_embeddings']} positions + {config.get('type_vocab_size') or 0} token types)"
                   f" x {width} + LayerNorm), all-reduced only once backward ends")


def grad_dtype_bytes(name: str, where: str) -> int:
    """Bytes per gradient element of the dtype `name`; an unknown one is an error naming `where`."""
    try:
        return dtype_bytes(name)
    except ValueError:
        raise InputError(where, f"unknown dtype {name!r}", "use float32, bfloat16 or float16") from None


def run_device(env: dict):
    """(True when the run trained on a CPU, a description of its device) from environment.json."""
    devices = env.get("devices") or {}
    gpus = devices.get("gpus") or []
    on_cpu = bool((env.get("config") or {}).get("use_cpu")) or not gpus
    if on_cpu:
        cores = devices.get("cpu_count")
        return True, f"CPU{f' ({cores} cores)' if cores else ''}"
    return False, str(gpus[0].get("name"))


def baseline_from_records(results: dict, env: dict, run_dir, params=None, grad_dtype=None, tail_params=None):
    """(Baseline, input lines) from what a 1-GPU run recorded: its all_results.json (`results`)
    and environment.json (`env`), read from the folder `run_dir`. `tail_params` None: the
    embedding block of the run's model, from its config.json (tail_from_run)."""
    run_dir = Path(run_dir)
    where = str(run_dir / "all_results.json")
    try:
        world = int((env.get("distributed") or {}).get("WORLD_SIZE") or 1)
    except (TypeError, ValueError):
        world = 0
    if world != 1:
        raise InputError(str(run_dir / "environment.json"),
                         f"the run used {world or 'an unreadable number of'} processes (WORLD_SIZE), not one",
                         "predict from a 1-GPU run (job_ft3.sh, or the 1x1 cell of the scaling study)")
    step = number(results, "train_step_time_mean_s")
    if not step or step <= 0:
        raise InputError(where, "no train_step_time_mean_s (the run did not train, or ran with --telemetry false)",
                         "use a run that trained with telemetry on (the default), or give --step_time and --batch")
    config = env.get("config") or {}
    batch = config.get("per_device_train_batch_size")
    if not isinstance(batch, int) or batch < 1:
        raise InputError(str(run_dir / "environment.json"), "config has no per_device_train_batch_size",
                         "use a run written by run_qa.py, or give --step_time and --batch")
    accum = config.get("gradient_accumulation_steps") or 1
    if not isinstance(accum, int) or accum < 1:
        raise InputError(str(run_dir / "environment.json"), f"gradient_accumulation_steps is {accum!r}",
                         "use a run written by run_qa.py, or give --step_time and --batch")
    lines = [f"run: {run_dir}", f"device: {run_device(env)[1]}"]
    lines.append(f"step time {step * 1e3:.2f} ms per optimizer step (train_step_time_mean_s)"
                 + (f", over {accum} micro-batches (gradient_accumulation_steps)" if accum != 1 else ""))

    step_total, data_total = number(results, "train_step_time_total_s"), number(results, "train_data_time_total_s")
    if step_total and data_total is not None and step_total > 0:
        data = data_total / (step_total / step)   # total / number of steps
        lines.append(f"data loading {data * 1e3:.2f} ms per step (train_data_time_total_s over "
                     f"{step_total / step:,.0f} steps), kept as a part that does not shrink with more GPUs")
    else:
        data = 0.0
        lines.append("data loading: not recorded (train_data_time_total_s), taken as 0")

    dtype_name = results.get("train_grad_dtype") or grad_dtype or "float32"
    dbytes = grad_dtype_bytes(dtype_name, where if results.get("train_grad_dtype") else "--grad_dtype")
    grad_bytes = number(results, "train_grad_bytes")
    n_params = number(results, "train_trainable_params")
    if n_params:
        source = "train_trainable_params"
    elif grad_bytes:
        n_params, source = int(grad_bytes // dbytes), "train_grad_bytes / dtype size"
    else:
        n_params = params or BERT_BASE_QA_PARAMS
        source = "--params" if params else "not recorded: bert-base-uncased's QA model (--params to change)"
    dtype_source = "train_grad_dtype" if results.get("train_grad_dtype") else (
        "--grad_dtype" if grad_dtype else "not recorded: float32 (--grad_dtype to change)")
    lines.append(f"gradients {int(n_params):,} parameters ({source}) x {dbytes} bytes ({dtype_name}, {dtype_source})")
    if tail_params is None:
        tail_params, line = tail_from_run(run_dir, env)
    else:
        line = f"embedding gradients {tail_params:,} parameters (--tail_params)"
    lines.append(line)
    measured = number(results, "train_samples_per_second")
    base = Baseline(compute_s=step / accum, data_s=data / accum, batch=batch, params=int(n_params),
                    grad_dtype_bytes=dbytes, tail_params=tail_params)
    if measured:
        lines.append(f"the run's own train_samples_per_second: {measured:,.1f} (the model's 1-GPU figure: "
                     f"{base.samples_per_s:,.1f}; train_runtime also counts logging, evaluation and checkpoints)")
    return base, lines
