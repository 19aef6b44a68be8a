"""What a run leaves behind, written atomically by the main process: metrics, the environment, a short report, plots."""
import logging
import os
import platform
import socket
import subprocess
import sys
from datetime import datetime, timezone
from functools import partial
from pathlib import Path

from qa.data.sources import split_source
from qa.data.synthetic import synthetic_squad
from qa.io import atomic_write_json, atomic_write_text, optional_output, read_json, read_record, replacing
from qa.results.model_card import number, trained_with, write_model_card
from qa.results.wall_clock import breakdown_lines

logger = logging.getLogger(__name__)

REPO_DIR = Path(__file__).resolve().parents[2]
SLURM_VARS = ("SLURM_JOB_ID", "SLURM_JOB_NAME", "SLURM_JOB_NODELIST", "SLURM_NNODES", "SLURM_NTASKS",
              "SLURM_GPUS_ON_NODE", "SLURM_RESTART_COUNT", "SLURM_JOB_PARTITION", "SLURM_ARRAY_TASK_ID")
DIST_VARS = ("WORLD_SIZE", "RANK", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")
# Generated questions a run evaluated or predicted on exist nowhere else: split -> (step, question limit, file).
GENERATED_DATA = {"validation": ("do_eval", "max_eval_samples", "eval_data.json"),
                  "test": ("do_predict", "max_predict_samples", "predict_data.json")}


def _git_commit():
    def git(*args):
        return subprocess.run(["git", "-C", str(REPO_DIR), *args], capture_output=True, text=True, timeout=10).stdout
    try:
        commit, dirty = git("rev-parse", "HEAD").strip(), git("status", "--porcelain", "--untracked-files=no").strip()
    except (OSError, subprocess.SubprocessError):
        return None
    return (commit + ("-dirty" if dirty else "")) or None


def _versions():
    names = ("torch", "transformers", "datasets", "accelerate", "tokenizers", "numpy")  # all dependencies: importable
    return {"python": platform.python_version(), **{name: __import__(name).__version__ for name in names}}


def _devices():
    import torch

    gpus = [torch.cuda.get_device_properties(i) for i in range(torch.cuda.device_count())]
    return {"cuda_available": torch.cuda.is_available(), "torch_cuda": torch.version.cuda,
            "cudnn": torch.backends.cudnn.version() if torch.cuda.is_available() else None,
            "gpu_count": len(gpus), "gpus": [{"name": p.name, "memory_gib": round(p.total_memory / 2**30, 1)}
                                             for p in gpus],
            "cpu_count": os.cpu_count(), "processor": platform.processor() or platform.machine()}


def environment_record(config: dict) -> dict:
    return {"started_utc": datetime.now(timezone.utc).isoformat(timespec="seconds"),
            "command": [sys.executable] + sys.argv,
            "host": socket.gethostname(),
            "platform": platform.platform(),
            "git_commit": _git_commit(),
            "versions": _versions(),
            "devices": _devices(),
            "slurm": {k: os.environ[k] for k in SLURM_VARS if k in os.environ},
            "distributed": {k: os.environ[k] for k in DIST_VARS if k in os.environ},
            # null: unset (OFFLINE=0 in a job: the run may reach the Hub)
            "offline": {k: os.environ.get(k) for k in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE", "TRANSFORMERS_OFFLINE",
                                                       "HF_HOME")},
            "config": config}


def save_split_metrics(output_dir, split: str, metrics: dict) -> None:
    """`{split}_results.json`, merged into `all_results.json` (what the HF examples write)."""
    output_dir = Path(output_dir)
    metrics = {k: (round(v, 6) if isinstance(v, float) else v) for k, v in metrics.items()}
    atomic_write_json(output_dir / f"{split}_results.json", metrics)
    atomic_write_json(output_dir / "all_results.json", _all_results(output_dir, metrics))


def _all_results(output_dir: Path, metrics: dict) -> dict:
    path = output_dir / "all_results.json"
    return {**(read_json(path) if path.exists() else {}), **metrics}


def device_name(env: dict) -> str:
    """The run's device in words, from its environment record: '1 x NVIDIA A100-SXM4-40GB', 'CPU (2 cores)'."""
    gpus = env["devices"]["gpus"]
    return f"{len(gpus)} x {gpus[0]['name']}" if gpus else f"CPU ({env['devices']['cpu_count']} cores)"


def results_markdown(results: dict, env: dict) -> str:
    fmt, cfg = partial(number, results), env["config"]
    rows = [("model", cfg.get("model_name_or_path")), ("device", device_name(env)),
            ("world size", env["distributed"].get("WORLD_SIZE", "1")),
            ("SLURM job", env["slurm"].get("SLURM_JOB_ID")), ("git commit", env["git_commit"]),
            ("wall clock, whole run", fmt("WALL_CLOCK_SECONDS", " s", 1)),
            ("adjusted to the device", "; ".join(cfg.get("adjusted") or ()) or None),
            ("compiled (torch.compile)", results.get("compiled")),
            ("plots", ", ".join(results.get("plots") or ()) or None)]
    if cfg.get("do_train"):
        # The Trainer's clock runs through evaluations during training; say so where there were some.
        evals = results.get("eval_during_training_count")
        questions, features = results.get("train_examples"), results.get("train_features")
        rows += [
            ("training data", split_source(cfg, "train")),
            ("trained with", trained_with(results, cfg)),
            ("training questions (features)", None if questions is None or features is None else
             f"{questions:,} ({features:,})"),
            ("training time (evaluations included)" if evals else "training time", fmt("train_runtime", " s", 1)),
            ("training samples/s (features, evaluations included)" if evals else "training samples/s (features)",
             fmt("train_samples_per_second")),
            ("training real tokens/s", fmt("train_real_tokens_per_second", "", 0)),
            ("mean optimizer step time", fmt("train_step_time_mean_s", " s", 4)),
            ("data-loading share (of step + data time)", fmt("train_data_loading_share", "", 3)),
            ("padding in training batches", fmt("train_batches_padding_fraction", "", 3)),
            ("MFU (model FLOPs / device peak)", fmt("train_mfu", "", 3)),
            ("peak GPU memory (allocated)", fmt("train_peak_memory_gib", " GiB", 2)),
            ("peak host memory (process RSS)", fmt("train_peak_rss_gib", " GiB", 2)),
            ("epochs trained", fmt("epoch")),
            (f"training loss, mean of steps {results.get('train_loss_steps', 'trained')}", fmt("train_loss", "", 4)),
            (f"training loss, last logged (mean of steps {results.get('train_loss_last_logged_steps')})",
             fmt("train_loss_last_logged", "", 4))]
    if cfg.get("do_eval"):
        rows += [("evaluation data", _data_source(cfg, "validation")),
                 ("evaluation questions", fmt("eval_examples", "", 0)), ("eval exact match", fmt("eval_exact_match")),
                 ("eval F1", fmt("eval_f1")), ("eval loss", fmt("eval_loss", "", 4))]
    if results.get("eval_during_training_count"):
        rows += time_to_accuracy_rows(results, cfg, fmt)
    if cfg.get("do_predict"):
        answered = results.get("predict_predictions")
        rows += [
            ("prediction data", _data_source(cfg, "test")),
            ("predictions", None if answered is None else
             f"{answered:,} of {results.get('predict_examples', answered):,} questions, in predict_predictions.json"),
            ("prediction exact match", fmt("predict_exact_match")), ("prediction F1", fmt("predict_f1"))]
    if "comm_world_size" in results:
        rows += communication_rows(results, lambda *a: fmt(*a) or "n/a")
    lines = ["# Run summary", "", f"Finished {datetime.now(timezone.utc).isoformat(timespec='seconds')} "
             f"on {env['host']}.", "", "| | |", "|---|---|"]
    lines += [f"| {k} | {v} |" for k, v in rows if v is not None]
    if "wall_clock_breakdown" in results:
        lines += breakdown_lines(results["wall_clock_breakdown"], results["WALL_CLOCK_SECONDS"])
    lines += ["", "Every figure above is in `all_results.json`; the full configuration and versions are in "
              "`environment.json`.", ""]
    return "\n".join(lines)


def loss_figures(log_history: list, first_step: int, last_step: int) -> dict:
    """The steps the Trainer's train_loss averages (those this process trained: a resumed run's start after its
    checkpoint), and the last logged loss, the mean of the steps since the entry before it: where the training ended."""
    figures = {"train_loss_steps": f"{first_step + 1}-{last_step}"}
    if logged := [(entry["step"], entry["loss"]) for entry in log_history if "loss" in entry]:
        since = max([first_step] + [step for step, _ in logged[:-1]])
        step, loss = logged[-1]
        figures.update(train_loss_last_logged=loss, train_loss_last_logged_steps=f"{since + 1}-{step}")
    return figures


def generated_data_files(cfg: dict) -> dict:
    """split -> (file name, questions) of the generated splits the run evaluated or predicted on."""
    if cfg.get("dataset_name") != "synthetic":
        return {}
    questions = cfg["synthetic_eval_examples"]
    return {split: (name, questions if cfg.get(limit) is None else min(questions, cfg[limit]))
            for split, (step, limit, name) in GENERATED_DATA.items()
            if cfg.get(step) and not cfg.get(f"{split}_file") and not cfg.get(f"{split}_articles")}


def write_generated_data(output_dir, cfg: dict) -> None:
    """The generated questions the run evaluated or predicted on, as SQuAD JSON for `bert-squad-score`."""
    for split, (name, questions) in generated_data_files(cfg).items():
        squad = synthetic_squad(split, questions, cfg["synthetic_seed"], cfg["version_2_with_negative"])
        atomic_write_json(Path(output_dir) / name, squad, indent=None)


def _data_source(cfg: dict, split: str) -> str:
    written = generated_data_files(cfg).get(split)
    return split_source(cfg, split) + (f", written to {written[0]}" if written else "")


def time_to_accuracy_rows(results: dict, cfg: dict, fmt) -> list:
    subset = cfg.get("eval_every_questions")
    rows = [("evaluations during training", f"{results['eval_during_training_count']}, every "
             f"{results.get('eval_during_training_interval_steps')} steps, on "
             f"{'the first ' + format(subset, ',') if subset else 'all'} validation questions"),
            ("training time without evaluations", fmt("train_seconds_excluding_evaluation", " s", 1)),
            ("best F1 during training", None if results.get("best_f1_during_training") is None else
             f"{fmt('best_f1_during_training')} (step {results.get('best_f1_during_training_step')})")]
    if (target := results.get("target_f1")) is not None:
        reached = results.get("train_seconds_to_target_f1")
        rows.append((f"training time to F1 {target:g}", "not reached" if reached is None else
                     f"{fmt('train_seconds_to_target_f1', ' s', 1)} ({results.get('target_f1_method')})"))
    return rows


def communication_rows(results: dict, fmt) -> list:
    """What the scaling study's communication measurement recorded (scaling/comm_measure.py), switches included."""
    mb = results.get("comm_allreduce_bytes")
    rows = [("gradient communication", f"{results.get('comm_world_size')} ranks on {fmt('comm_nodes', '', 0)} "
             f"node(s), {results.get('comm_backend')}, {results.get('comm_wrapper')}; hook "
             f"{results.get('comm_ddp_comm_hook')}, buckets {fmt('comm_ddp_bucket_cap_mb', ' MiB', 0)}")]
    if mb is not None:
        rows.append(("all-reduce of the gradients, whole group",
                     f"{mb / 1e6:,.1f} MB ({results.get('comm_allreduce_dtype')}) in "
                     f"{fmt('comm_allreduce_s', ' s', 4)}: algbw {fmt('comm_allreduce_algbw_GBps', ' GB/s', 2)}, "
                     f"busbw {fmt('comm_allreduce_busbw_GBps', ' GB/s', 2)}"))
    if results.get("comm_intranode_s") is not None:
        ranks = results.get("comm_intranode_ranks")
        rows.append(("all-reduce within one node", f"{fmt('comm_intranode_s', ' s', 4)} over {ranks} ranks: "
                     f"busbw {fmt('comm_intranode_busbw_GBps', ' GB/s', 2)}"))
    if results.get("comm_step_sync_s") is not None:
        rows.append(("exposed communication per step", f"{fmt('comm_exposed_s', ' s', 4)} "
                     f"({fmt('comm_exposed_share', '', 3)} of a {fmt('comm_step_sync_s', ' s', 4)} forward + "
                     f"backward; {fmt('comm_step_nosync_s', ' s', 4)} without synchronisation)"))
    return rows


def draw_series(ax, points, label, alone):
    """(x, y) points as a curve, dotted while few; a single value as a dot whose legend entry (`alone`) gives it."""
    xs, ys = zip(*points)
    if len(xs) == 1:
        ax.plot(xs, ys, "o", markersize=6, label=alone)
    else:
        ax.plot(xs, ys, marker="o" if len(xs) < 30 else None, markersize=3, label=label or None)


def plot_data(output_dir, results: dict, subset=None) -> dict:
    """What write_plots draws, from the run's records: file -> (y label, y limits, x label, [(points, legend)])."""
    out = Path(output_dir)
    log = read_record(out / "trainer_state.json").get("log_history") or []
    during = [(e["train_seconds"], e["f1"]) for e in read_record(out / "time_to_accuracy.json").get("evaluations", [])]
    seconds = results.get("train_seconds_excluding_evaluation") or results.get("train_runtime")
    return {"loss.png": ("loss: cross-entropy (nats)", (None, None), "optimizer step",
                         [([(e["step"], e["loss"]) for e in log if "loss" in e], "training")]),
            "f1.png": ("F1 (%)", (0, 100), "training seconds (evaluations excluded)",
                       [(during, "during training" + (f" (first {subset:,} questions)" if subset else "")),
                        ([(seconds, results.get("eval_f1"))], "final evaluation")])}


def write_plots(output_dir, results: dict, subset=None) -> list:
    """Those of plots/loss.png and plots/f1.png (plot_data) written, from the run's records: no TensorBoard needed
    (tools/plot_tb.py draws all it logged). Optional: a full disk is one warning, and no plots."""
    from matplotlib.figure import Figure  # not pyplot: no window, no state shared with the rest of the process

    folder, written = Path(output_dir) / "plots", []
    with optional_output(folder, "the run's plots"):
        for name, (ylabel, ylim, xlabel, curves) in plot_data(output_dir, results, subset).items():
            if not (curves := [(points, label) for points, label in curves if points and None not in points[0]]):
                continue
            ax = Figure(figsize=(6.4, 3.6), layout="tight").subplots()
            for points, label in curves:
                draw_series(ax, points, label, f"{label}: {points[0][1]:.2f}")
            ax.set(xlabel=xlabel, ylabel=ylabel, ylim=ylim)
            ax.legend(fontsize="small")
            with replacing(folder / name) as tmp:
                ax.figure.savefig(tmp, format="png", dpi=100)
            written.append(f"plots/{name}")
    logger.info("plots: %s", ", ".join(str(Path(output_dir) / name) for name in written) or "none")
    return written


def finish_run(output_dir, wall_clock_seconds: float, env: dict, extra=None) -> dict:
    """all_results.json completed with the wall clock and `extra` (known only at the end), and results.md."""
    output_dir = Path(output_dir)
    results = _all_results(output_dir, {**(extra or {}), "WALL_CLOCK_SECONDS": round(wall_clock_seconds, 3)})
    write_generated_data(output_dir, env["config"])
    if env["config"].get("do_train"):  # a trained model: its plots, and how to use it
        results["plots"] = write_plots(output_dir, results, env["config"].get("eval_every_questions"))
        write_model_card(output_dir, results, env, device_name(env))
    atomic_write_text(output_dir / "results.md", results_markdown(results, env))
    # Last: its WALL_CLOCK_SECONDS says that the run ended; stopped before (a full disk), the rerun evaluates again
    atomic_write_json(output_dir / "all_results.json", results)
    return results


def write_environment(output_dir, env: dict) -> None:
    atomic_write_json(Path(output_dir) / "environment.json", env)
