"""The model card of a trained output_dir (README.md, where the Hub looks), from the run's configuration and figures."""
import os
import re
from pathlib import Path

from qa.data.sources import split_source
from qa.io import atomic_write_text
from qa.training.flops import matmul_precision

CARD = "README.md"
# Hub ids of the bundled models that have one (bundled:tiny-bert is built at random: none).
BUNDLED_HUB_IDS = {"bundled:minilm": "sentence-transformers/all-MiniLM-L6-v2"}
_HUB_ID = re.compile(r"[\w.-]+/[\w.-]+")
GENERATED = ("**Trained on generated data** (made-up sentences about people who never lived), not on real text: it "
             "will not answer real questions well. It shows that the training works; train on SQuAD for a useful "
             "model.", "")


def _front_matter(cfg: dict) -> list:
    lines = ["---", "library_name: transformers", "pipeline_tag: question-answering",
             "tags: [question-answering, extractive-qa, squad]"]
    name = cfg.get("model_name_or_path") or ""
    # The Hub id the base model was loaded from; none for a local folder or a random build.
    if base := BUNDLED_HUB_IDS.get(name) or (name if _HUB_ID.fullmatch(name) and not os.path.exists(name) else None):
        lines.append(f"base_model: {base}")
    if (data := cfg.get("dataset_name")) and data != "synthetic" and not cfg.get("train_file"):
        lines.append(f"datasets: [{data}]")
    return lines + ["---", ""]


def trained_with(results: dict, cfg: dict) -> str:
    """The matmul precision, attention and optimizer training ran with, as the telemetry read them from the live
    Trainer (train_setup); without it (--telemetry false), the precision the settings gave after device_precision."""
    setup = results.get("train_setup") or {}
    precision = setup.get("matmul_precision") or results.get("train_matmul_precision") or matmul_precision(
        cfg.get("bf16"), cfg.get("fp16"), bool(cfg.get("tf32")))
    said = [f"{precision} matmuls"]
    if setup.get("attn_implementation"):
        said.append(f"{setup['attn_implementation']} attention")
    if setup.get("optimizer"):
        said.append(setup["optimizer"] + (" (fused)" if setup.get("optimizer_fused") else ""))
    return ", ".join(said)


def _recipe(cfg: dict, world: int, results: dict) -> str:
    batch, accumulation = cfg.get("per_device_train_batch_size"), cfg.get("gradient_accumulation_steps") or 1
    length = (f"{cfg['max_steps']} steps" if (cfg.get("max_steps") or -1) > 0
              else f"{cfg.get('num_train_epochs'):g} epochs")
    return (f"{length}, global batch {batch * world * accumulation} (per device {batch} x {world} process(es) x "
            f"accumulation {accumulation}), learning rate {cfg.get('learning_rate'):g}, warm-up "
            f"{cfg.get('warmup_steps') or 0:g}, weight decay {cfg.get('weight_decay') or 0:g}, "
            f"{trained_with(results, cfg)}; windows of {cfg.get('max_seq_length')} tokens, stride "
            f"{cfg.get('doc_stride')}, questions cut at {cfg.get('max_query_length')} tokens; seed {cfg.get('seed')}")


def number(results: dict, key: str, unit: str = "", digits: int = 2):
    """results[key] as the results tables show it; None when absent."""
    if (value := results.get(key)) is None:
        return None
    numeric = isinstance(value, (int, float)) and not isinstance(value, bool)
    return f"{value:,.{digits}f}{unit}" if numeric else str(value)


def _training_time(results: dict):
    runtime = number(results, "train_runtime", " s", 1)
    alone = number(results, "train_seconds_excluding_evaluation", " s", 1)
    if runtime and alone:  # the Trainer's clock ran on through the evaluations during training
        return f"{runtime}, of which {alone} training and the rest {results.get('eval_during_training_count')} " \
               "evaluations during training"
    return runtime


def write_model_card(output_dir, results: dict, env: dict, device: str) -> None:
    cfg, folder = env["config"], os.fspath(output_dir)
    world = int(env["distributed"].get("WORLD_SIZE", "1"))
    version = "SQuAD v2.0 (may answer that there is no answer)" if cfg.get("version_2_with_negative") else "SQuAD v1.1"
    f1, em = number(results, "eval_f1"), number(results, "eval_exact_match")
    scores = f"F1 {f1} / EM {em} on {results.get('eval_examples', 0):,} questions" if f1 and em else "not evaluated"
    rows = [("base model", cfg.get("model_name_or_path")), ("task", f"extractive question answering, {version}"),
            ("training data", split_source(cfg, "train")),
            ("evaluation data", split_source(cfg, "validation") if cfg.get("do_eval") else None),
            ("recipe", _recipe(cfg, world, results)), ("evaluation", scores),
            ("training time", _training_time(results)),
            ("device", device + (f", {world} processes" if world > 1 else "")),
            ("run", env.get("started_utc") and f"started {env['started_utc']} on {env.get('host')}, "
             f"commit {env.get('git_commit')}")]
    lines = _front_matter(cfg) + [
        f"# {Path(folder).name}: {cfg.get('model_name_or_path')} fine-tuned for question answering", "",
        "Fine-tuned with bert-squad-slurm (`run_qa.py`). All figures: `all_results.json`; the full "
        "configuration and versions: `environment.json`; the run in short: `results.md`.", "",
        *(GENERATED if cfg.get("dataset_name") == "synthetic" and not cfg.get("train_file") else ()),  # a file wins
        "| | |", "|---|---|"]
    lines += [f"| {name} | {value} |" for name, value in rows if value]
    lines += ["", "## Ask it questions", "", "```bash",
              f'bert-squad-answer {folder} --question "Who wrote it?" --context "..."   # or python -m answer_qa',
              f"bert-squad-answer {folder} --file questions.jsonl --top_k 3", "```", "", "```python",
              "from answer_qa import Answerer", "", f"qa = Answerer({folder!r})",
              'qa("Who wrote it?", "...")  # {"answer": ..., "start": ..., "end": ..., "score": ...}', "```", "",
              "Both window the context, batch and post-process as the training run did (its settings are read "
              "from `environment.json`), so their answers are those of `run_qa.py --do_predict`.", ""]
    atomic_write_text(Path(output_dir) / CARD, "\n".join(lines))
