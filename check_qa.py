"""The check job (`run_qa.py CONFIG --check`, docs/slurm.md#the-check-job---check) runs the job's own stages, which
run_qa.py hands it, for a few steps, not a model of them, so that what it finds missing on the node and the time it
predicts cannot drift from the job. A training run never imports it."""
import importlib.util
import math
import os
import shutil
import socket
import subprocess
import tempfile
import time
from collections import Counter
from datetime import datetime, timezone
from pathlib import Path

import psutil
import torch
from transformers import TrainerCallback
from transformers.trainer_utils import IntervalStrategy, SaveStrategy

from qa.distributed import close_process_group, distributed, every_rank, on_main_rank
from qa.errors import EXIT_INPUT_ERROR, InputError, Interrupted
from qa.evaluation.time_to_accuracy import eval_interval, first_questions
from qa.io import atomic_write_json, atomic_write_text
from qa.results.records import environment_record
from qa.results.wall_clock import PHASES
from qa.training.preemption import interrupted_by_signals
from qa.training.compile import compile_stats
from qa.training.telemetry import autocast_precision, gib
from studies.submit import asked, offered, partition_nodes, spelled, unmet

WARM_STEPS, TIMED_STEPS = 5, 20  # steps that compile and warm up, then the steps whose time is extrapolated
# --time: the prediction, 30% more, 2 minutes for the job's own start (environment, srun, torchrun), in 5 minutes
MARGIN, JOB_START_S, ROUND_S = 0.3, 120, 300
MIN_EVAL_QUESTIONS = 64  # the evaluations timed: a tenth of the questions, at least this many


class Report:
    def __init__(self, main: bool):
        self.main, self.lines, self.measured, self.predicted, self.problem = main, [], {}, {}, None
        self.writable = True  # the output folder, for check.md and check.json
        self.caveat = None  # what a ready verdict adds: the sbatch options the job scripts' defaults need here

    def line(self, name: str, text: str, problem: InputError | None = None) -> None:
        self.lines.append({"check": name, "ok": problem is None, "text": text,
                           **({"problem": verdict(problem)} if problem else {})})
        self.problem = self.problem or problem
        if self.main:
            print(f"check {name}: {text}" + (" -> not ready (below)" if problem else ""), flush=True)


def verdict(problem: InputError | None, caveat: str | None = None) -> str:
    if problem is None:
        return f"ready, {caveat}" if caveat else "ready"
    return f"not ready: {problem.where}: {problem.problem} - {problem.fix}"


def say_verdict(problem: InputError | None, main: bool = True, caveat: str | None = None) -> None:
    """The check's last line; a not-ready one is its reason's only line (no error line after it, qa.errors.command)."""
    if main:
        print(verdict(problem, caveat), flush=True)
    if problem is not None:
        problem.said = True


def check_job(parsed, stages) -> int:
    """0 when ready; else an InputError, once check.md is written."""
    _, _, run_args, args = parsed
    report = Report(main=args.process_index == 0)
    start = time.perf_counter()
    env = environment_record({})  # the job writes it too, with git's commit and every GPU's name
    report.measured["record_s"] = time.perf_counter() - start
    stopped = False
    try:
        with interrupted_by_signals():
            checks(report, env, run_args, args, stages)
    except Interrupted:
        stopped, seconds = True, time.time() - psutil.Process().create_time()
        report.line("time limit", "stopped before the end", InputError(
            "--time", f"the check was stopped by SIGTERM {seconds:.0f} s after it started, before its end (the job's "
            "time limit, or a preemption)", "submit it again with a longer --time (a check job is not requeued: it "
            "would start over)"))
    write(report, args.output_dir, env)
    say_verdict(report.problem, report.main, report.caveat)
    if not stopped:  # stopped: where each rank was is unknown, a barrier could wait for one that left
        close_process_group()  # every rank leaves once rank 0 has written the check
    if report.problem is not None:
        report.problem.exit_code = EXIT_INPUT_ERROR  # not ready, whatever found it: an out of memory too
        raise report.problem
    return 0


def checks(report, env, run_args, args, stages) -> None:
    """The checks in their order; after a problem, none that needs what failed."""
    versions_and_devices(report, env, args, run_args)
    partition_request(report)
    if report.problem is not None:
        return
    resume, run_args.resume = run_args.resume, None  # the output folder is the job's: nothing there is resumed or moved
    try:
        setup = stages.load()
    except InputError as err:
        report.line("model and data", "not loaded", err)
        return
    seconds = setup.clock.seconds["data_loading"] + setup.clock.seconds["model_loading"]
    splits = ", ".join(f"{split} {len(examples):,}" for split, examples in setup.examples.items())
    offline = ", offline" if os.environ.get("HF_HUB_OFFLINE", "0").lower() in ("1", "true", "yes") else ""
    report.line("model and data", f"{setup.model_args.model_name_or_path} and the questions ({splits}) in "
                                  f"{seconds:.1f} s{offline}")
    earlier_run(report, setup, resume)
    if report.problem is None:
        measure_and_predict(report, setup, stages)


def earlier_run(report, setup, resume) -> None:
    """By the job's own rule (Checkpoints.choose, told to move nothing), so the check says what the job will do."""
    folder = Path(setup.training_args.output_dir)
    held = [p for p in folder.iterdir() if p.name not in ("check.md", "check.json")] if folder.is_dir() else []
    if not held:
        return
    said = f"{folder} holds files of an earlier run"
    try:
        start = on_main_rank(lambda: setup.checkpoints.choose(resume, move=False))
    except InputError as err:
        report.line("earlier run", f"{said}, which the job refuses to overwrite", err)
        return
    does = ("moves them to previous-<time>/ there and starts afresh" if resume == "never" else
            "starts afresh" if start is None else "evaluates the model trained there, without training"
            if Path(start) == folder else f"resumes from {Path(start).name} (the prediction is for a whole run)")
    report.line("earlier run", f"{said}: the job {does}")


def versions_and_devices(report, env, args, run_args) -> None:
    v, d = env["versions"], env["devices"]
    report.line("versions", f"Python {v['python']}, torch {v['torch']} (CUDA build {d['torch_cuda'] or 'none'}), "
                            f"transformers {v['transformers']}, accelerate {v['accelerate']}, datasets {v['datasets']}")
    gpus, granted = d["gpus"], granted_gpus()
    problem = None if gpus or not granted else InputError(
        "GPUs", f"{granted} granted, but torch {v['torch']} sees none ({cuda_failure()})", "install the torch build "
        "for this node's driver (TORCH_CUDA=cuXYZ ./setup_bert.sh on the cluster, docs/slurm.md) and load its CUDA "
        "module in the environment file; or check the job's --gres")
    seen = (f"{len(gpus)} x {gpus[0]['name']} ({gpus[0]['memory_gib']} GiB)" if gpus else
            f"none; the run trains on the CPU ({d['cpu_count']} cores)")
    report.line("GPUs", f"{seen}" + (f"; granted: {granted}" if granted else ""), problem)
    notes = "; ".join(run_args.adjusted)
    report.line("precision", f"{autocast_precision(args)} matmuls" + (", TF32" if args.tf32 else "")
                + (f" (adjusted to the device: {notes})" if notes else " (as the config asks)"))
    if args.torch_compile:
        report.line("compilation", *compiler_available(bool(gpus) and not args.use_cpu))
    ranks = every_rank({"host": socket.gethostname(), "gpus": len(gpus), "problem": report.problem})
    if distributed():
        hosts = Counter(rank["host"] for rank in ranks)
        where = ", ".join(f"{host}: {n}" for host, n in hosts.items())
        failing = next((r for r in ranks if r["problem"]), None)
        report.line("world", f"{len(ranks)} ranks on {len(hosts)} node(s) ({where}), backend "
                             f"{torch.distributed.get_backend()}", failing and failing["problem"])


def partition_request(report) -> None:
    """In a SLURM job, where SLURM answers: the job scripts' default request (#SBATCH -c, --mem, --gres) against the
    nodes of this job's partition. This job runs, so its own request fits; a default that does not would pend forever
    (PartitionConfig) or be refused, so a ready verdict names it and the sbatch options that fit."""
    if "SLURM_JOB_ID" not in os.environ:
        return

    def compare():
        found = partition_nodes(os.environ.get("SLURM_JOB_PARTITION"))
        requests = {script: asked(script) for script in ("job_ft3.sh", "job_ddp.sh")}
        return found and (found[0], offered(found[1]), {
            script: (spelled(request), unmet(request, found[1])) for script, request in requests.items()})

    found = on_main_rank(compare)
    if not found:
        return
    partition, offer, defaults = found
    short = {script: gap for script, (_, gap) in defaults.items() if gap}
    report.line("request", f"partition {partition}: {offer}; " + "; ".join(
        f"{script} asks {request}" + (" (more than that)" if script in short else "")
        for script, (request, _) in defaults.items()))
    if short:
        report.caveat = (f"with {', '.join(dict.fromkeys(fits for _, fits in short.values()))} on every sbatch: "
                         + " and ".join(f"{script}'s {asks}" for script, (asks, _) in short.items())
                         + f" (their #SBATCH defaults) cannot be met on partition {partition} ({offer}): such a job "
                           "pends forever (PartitionConfig)")


def granted_gpus() -> str | None:
    for var in ("SLURM_STEP_GPUS", "SLURM_JOB_GPUS"):  # the GPUs' indices
        if os.environ.get(var):
            return f"{var}={os.environ[var]}"
    if os.environ.get("SLURM_GPUS_ON_NODE", "0") not in ("", "0"):  # how many
        return f"SLURM_GPUS_ON_NODE={os.environ['SLURM_GPUS_ON_NODE']}"
    if "SLURM_JOB_ID" not in os.environ and os.environ.get("CUDA_VISIBLE_DEVICES") not in ("", "-1") \
            and shutil.which("nvidia-smi"):
        try:
            listed = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=30).stdout
        except (OSError, subprocess.SubprocessError) as err:  # a driver that hangs or fails: torch will say more
            return f"nvidia-smi failed ({type(err).__name__})"
        return f"nvidia-smi lists {listed.count('GPU ')}" if "GPU " in listed else None
    return None


def cuda_failure() -> str:
    if torch.version.cuda is None:
        return "it is a CPU-only build"
    try:
        torch.cuda.init()
    except Exception as err:  # torch says why: no driver, a driver too old for the build, no device
        return (str(err).strip().splitlines() or [type(err).__name__])[0][:200]
    return f"CUDA_VISIBLE_DEVICES={os.environ.get('CUDA_VISIBLE_DEVICES')!r}"


def compiler_available(on_gpu: bool) -> tuple:
    if on_gpu:
        if importlib.util.find_spec("triton") is None:
            return "no Triton", InputError("torch_compile=true", "Triton, which compiles for the GPU, is not "
                                           "installed", "rerun ./setup_bert.sh (torch brings it), or pass "
                                           "--torch_compile false")
        return "Triton for the GPU; the warm-up is in the measured steps below", None
    compiler = os.environ.get("CXX") or "g++"
    if shutil.which(compiler) is None:
        return f"no {compiler}", InputError("torch_compile=true", f"no C++ compiler ({compiler}) for the CPU kernels",
                                            "load a compiler (module load gcc), or pass --torch_compile false")
    return f"{compiler} for the CPU; the warm-up is in the measured steps below", None


def measure_and_predict(report, setup, stages) -> None:
    args, run_args, m = setup.training_args, setup.run_args, report.measured
    plan = {"eval_strategy": args.eval_strategy, "eval_steps": args.eval_steps, "save_strategy": args.save_strategy,
            "save_steps": args.save_steps, "save_total_limit": args.save_total_limit,
            "eval_every": run_args.eval_every}
    output_dir = args.output_dir
    train = args.do_train
    stages.features(setup, train)
    before = setup.clock.seconds["features"]
    features, collator = stages.features(setup, train)  # what the job takes: the check left them in the cache
    m["features_cached_s"] = setup.clock.seconds["features"] - before
    with tempfile.TemporaryDirectory(prefix="bert-squad-check-") as scratch:
        args.output_dir, args.report_to, args.load_best_model_at_end = scratch, [], False
        args.eval_strategy, args.save_strategy = IntervalStrategy.NO, SaveStrategy.NO
        run_args.telemetry, run_args.eval_every, run_args.profile = True, None, False
        run_args.checkpoint_on_sigterm = False  # a SIGTERM stops the check (check_job): no checkpoint of its steps
        try:
            callbacks, _, trainer = stages.trainer(setup, features, collator)
            steps = job_steps(trainer) if train else (0, 1)
            write_rate(report, setup, output_dir, plan, steps)
            if train and report.problem is None:
                measure_training(report, trainer, callbacks["telemetry"], steps[0])
            split = "validation" if "validation" in features else "test" if "test" in features else None
            if split and report.problem is None:
                measure_evaluation(report, trainer, setup.examples[split], features[split])
        except torch.OutOfMemoryError as err:  # in a training step or an evaluation: the run's own fix
            in_training = train and "train_s" not in m
            report.line("training" if in_training else "evaluation", "out of memory",
                        stages.out_of_memory(args, err, None if in_training else "then check again"))
        except InputError as err:  # what the job would refuse too, found on the way (features, scoring)
            report.line("training" if train and "train_s" not in m else "evaluation", "refused", err)
        finally:
            args.output_dir = output_dir
    if report.problem is None:
        predict(report, setup, features, plan, steps)


def job_steps(trainer) -> tuple:
    """(optimizer steps, steps per epoch) by train()'s own arithmetic, before the check sets its own max_steps."""
    values = trainer.set_initial_training_values(trainer.args, trainer.get_train_dataloader())
    return values[-1], values[1]


def write_rate(report, setup, output_dir, plan, steps) -> None:
    """Free space for the checkpoints the config keeps, one more while a new one is written before the oldest goes."""
    model, m = setup.model, report.measured
    weights = sum(p.numel() * p.element_size() for p in model.parameters())
    checkpoint = weights + 2 * sum(p.numel() * 4 for p in model.parameters() if p.requires_grad)  # AdamW's moments
    saves = len(acts(plan["save_strategy"], plan["save_steps"], *steps))
    kept = min(saves, plan["save_total_limit"] + 1 if plan["save_total_limit"] else saves)
    needed = kept * checkpoint + weights

    def probe():
        try:
            Path(output_dir).mkdir(parents=True, exist_ok=True)
            with tempfile.TemporaryDirectory(dir=output_dir, prefix=".check-write-") as probe_dir:
                start = time.perf_counter()
                model.save_pretrained(probe_dir)
                written = sum(f.stat().st_size for f in Path(probe_dir).iterdir())
                return written / (time.perf_counter() - start), shutil.disk_usage(output_dir).free
        except Exception as err:  # OSError, or safetensors' own error for a full disk or a quota
            raise InputError(f"output_dir={output_dir}", f"cannot be written ({getattr(err, 'strerror', None) or err})",
                             "pass --output_dir on a file system this job can write to (e.g. $LUSTRE/runs/NAME)")

    try:
        rate, free = on_main_rank(probe)
    except InputError as err:
        report.line("output folder", "not writable", err)
        report.writable = False
        return
    m.update(write_bytes_per_s=rate, checkpoint_bytes=checkpoint, weights_bytes=weights, checkpoints_saved=saves,
             disk_free_bytes=free, disk_needed_bytes=needed)
    problem = None if free >= needed else InputError(
        f"output_dir={output_dir}", f"{gib(free):.1f} GiB free, the run keeps up to {gib(needed):.1f} GiB",
        "free space there, pass --output_dir on a larger file system, or a smaller --save_total_limit")
    report.line("output folder", f"{output_dir}: writes {rate / 2**20:.0f} MiB/s, {gib(free):.1f} GiB free; the run "
                f"keeps up to {gib(needed):.2f} GiB ({kept} checkpoint(s) of {gib(checkpoint):.2f} GiB "
                f"and the model)", problem)


def acts(strategy, every, steps: int, per_epoch: int) -> set:
    if strategy == "steps":
        interval = max(math.ceil(every * steps) if every < 1 else int(every), 1)
        return {*range(interval, steps + 1, interval), steps} if steps else set()
    if strategy == "epoch":
        return {min(e * per_epoch, steps) for e in range(1, math.ceil(steps / per_epoch) + 1)}
    return set()


def measure_training(report, trainer, telemetry, steps: int) -> None:
    """The first steps (compilation, warm-up) then timed ones, from the telemetry's counts, which the job's remaining
    steps extrapolate."""
    warm = min(WARM_STEPS, max(steps // 4, 1))
    stop = min(steps, warm + TIMED_STEPS)
    trainer.add_callback(warmed := WarmedUp(telemetry, warm))  # after the telemetry: its counts include step `warm`
    trainer.args.max_steps = stop
    start = time.perf_counter()
    trainer.train()
    wall = time.perf_counter() - start
    s, timed = telemetry.summary(), warmed.counts and telemetry.counts.snapshot(since=warmed.counts)
    step_s = (timed["step_s"] + timed["data_s"]) / timed["steps"] if timed and timed["steps"] else wall / stop
    peak, rate = s.get("train_peak_memory_gib"), timed and telemetry.figures(timed)["samples_per_s"]
    report.measured.update(train_steps=stop, train_s=wall, step_s=step_s, peak_memory_gib=peak, samples_per_s=rate,
                           compiles_in_window=timed and compile_stats(since=warmed.compiles)["compiles"])
    if trainer.args.device.type == "cuda" and peak:
        card = gib(torch.cuda.get_device_properties(trainer.args.device).total_memory)
        memory = f"peak GPU memory {peak:.1f} of {card:.1f} GiB ({peak / card:.0%})"
    else:
        memory = f"peak host memory {s.get('train_peak_rss_gib') or 0:.1f} GiB"
    report.line("training", f"{stop} steps in {wall:.1f} s; from step {warm + 1}: {step_s:.3f} s a step"
                + (f", {rate:.1f} samples/s" if rate else "") + f"; {memory}")


class WarmedUp(TrainerCallback):
    """The telemetry's counts and the compilations so far at the end of step `step`: the timed steps come after."""

    def __init__(self, telemetry, step: int):
        self.telemetry, self.step, self.counts, self.compiles = telemetry, step, None, None

    def on_step_end(self, args, state, control, **kwargs):
        if state.global_step == self.step:
            self.counts, self.compiles = self.telemetry.counts.snapshot(), compile_stats()


def measure_evaluation(report, trainer, examples, features) -> None:
    """Two evaluations of the first questions: the first pays the warm-up, the second gives the time per feature."""
    questions = min(len(examples), max(MIN_EVAL_QUESTIONS, len(examples) // 10))
    examples, features = first_questions(examples, features, questions)
    seconds = []
    for _ in range(2):
        start = time.perf_counter()
        trainer.evaluate(eval_dataset=features, eval_examples=examples)
        seconds.append(time.perf_counter() - start)
    report.measured.update(eval_questions=questions, eval_features=len(features), eval_first_s=seconds[0],
                           eval_s=seconds[1], eval_s_per_feature=seconds[1] / len(features))
    report.line("evaluation", f"{questions} questions ({len(features)} features) in {seconds[1]:.1f} s "
                f"({seconds[0]:.1f} s the first time)")


def predict(report, setup, features, plan, steps) -> None:
    m, clock, args = report.measured, setup.clock.seconds, setup.training_args
    total_steps, per_epoch = steps
    per_feature = m.get("eval_s_per_feature", 0.0)
    evaluated = acts(plan["eval_strategy"], plan["eval_steps"], total_steps, per_epoch)
    if plan["eval_every"] is not None:  # time to accuracy: every interval and the last step; one evaluation a step
        evaluated |= acts("steps", eval_interval(plan["eval_every"], per_epoch), total_steps, per_epoch)
    during = len(evaluated)
    during_features = len(first_questions(setup.examples["validation"], features["validation"],
                                          setup.run_args.eval_every_questions)[1]) if during else 0
    rate = m["write_bytes_per_s"]
    p = dict.fromkeys(PHASES, 0.0)
    p.update({phase: clock[phase] for phase in ("startup", "data_loading", "model_loading", "compile_warmup")},
             features=m["features_cached_s"],
             training=m.get("train_s", 0.0) - clock["compile_warmup"]
             + max(total_steps - m.get("train_steps", 0), 0) * m.get("step_s", 0.0),
             evaluation_during_training=during * during_features * per_feature,
             final_evaluation=len(features["validation"]) * per_feature if args.do_eval else 0.0,
             prediction=len(features["test"]) * per_feature if args.do_predict else 0.0,
             saving=(m["checkpoints_saved"] * m["checkpoint_bytes"] + m["weights_bytes"]) / rate + m["record_s"])
    first = next((name for name in ("evaluation_during_training", "final_evaluation", "prediction") if p[name]), None)
    if first:  # the first evaluation warms up (compiles) once
        p[first] += max(m["eval_first_s"] - m["eval_s"], 0.0)
    total = sum(p.values())
    limit = math.ceil((total * (1 + MARGIN) + JOB_START_S) / ROUND_S) * ROUND_S
    report.predicted.update(seconds={k: round(v, 2) for k, v in p.items()}, total_s=round(total, 1),
                            steps=total_steps, evaluations_during_training=during, time_limit=slurm_time(limit))
    report.line("prediction", f"the job takes about {total / 60:.1f} min ({total_steps} steps, {during} evaluation(s) "
                f"during training); ask for --time={slurm_time(limit)} (30% and 2 minutes more)")


def slurm_time(seconds: int) -> str:
    return f"{seconds // 3600:02d}:{seconds % 3600 // 60:02d}:{seconds % 60:02d}"


def write(report, output_dir, env) -> None:
    if not (report.main and report.writable):
        return
    record = {"verdict": verdict(report.problem, report.caveat), "ready": report.problem is None,
              "finished_utc": datetime.now(timezone.utc).isoformat(timespec="seconds"), "host": env["host"],
              "command": env["command"], "checks": report.lines,
              "measured": {k: round(v, 4) if isinstance(v, float) else v for k, v in report.measured.items()},
              "predicted": report.predicted}
    atomic_write_json(Path(output_dir) / "check.json", record)  # the folder too, if need be
    rows = [f"| {line['check']} | {line['text']}{' **' + line['problem'] + '**' if 'problem' in line else ''} |"
            for line in report.lines]
    phases = [f"| {name.replace('_', ' ')} | {seconds:.1f} |"
              for name, seconds in report.predicted.get("seconds", {}).items() if seconds]
    text = ["# Check", "", f"{record['finished_utc']} on {env['host']}: **{record['verdict']}**", "",
            "| check | result |", "|---|---|", *rows]
    if phases:
        text += ["", "## Predicted job time", "", "| phase | seconds |", "|---|---|", *phases,
                 f"| **total** | **{report.predicted['total_s']:.1f}** |", "",
                 f"Ask for `--time={report.predicted['time_limit']}`: the prediction, 30% and 2 minutes more."]
    atomic_write_text(Path(output_dir) / "check.md", "\n".join(text) + "\n")
