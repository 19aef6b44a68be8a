"""One run folder as a report sees it: what the run recorded (all_results.json, environment.json, job_time.jsonl,
task.json) and, where those do not say how it ended, what SLURM says of its job. Every run gets a status, finished,
failed or running, and a reason when it did not finish: none is dropped."""
import re
import shutil
import subprocess
from pathlib import Path

from qa.errors import InputError
from qa.io import parse_json_lines, read_json, read_text
from scaling.baseline import as_number

ACTIVE = {"PENDING", "CONFIGURING", "RUNNING", "COMPLETING", "REQUEUED", "REQUEUE_HOLD", "REQUEUE_FED",
          "RESIZING", "SUSPENDED", "STOPPED", "SIGNALING", "STAGE_OUT", "RESV_DEL_HOLD"}
# "Key=Value" pairs of `scontrol -o`; values may hold '=' (TRES=cpu=1,...) or spaces.
_KV = re.compile(r"(?:^|\s)([A-Za-z][\w:/.]*)=(.*?)(?=\s[A-Za-z][\w:/.]*=|$)")
RECORDS = ("all_results.json", "environment.json", "job_time.jsonl", "task.json")
# Settings that name or place a run, not what it trains: runs that differ only in these (and the seed) are one recipe
NOT_RECIPE = {"seed", "data_seed", "output_dir", "run_name", "resume", "resume_from_checkpoint", "features_cache_dir",
              "compile_cache_dir", "cache_dir", "overwrite_cache", "local_rank", "adjusted", "check", "logging_dir"}


def parse_kv(line: str) -> dict:
    return {k: v for k, v in _KV.findall(line.strip())}


class Slurm:
    """Job states from scontrol (sacct for jobs slurmctld has purged); None when unknown.
    Stops asking after the first sign that no controller answers."""

    def __init__(self, enabled: bool):
        self.reachable = bool(enabled and shutil.which("scontrol"))
        self.asked = False

    def _run(self, *cmd):
        try:
            return subprocess.run(cmd, capture_output=True, text=True, timeout=20)
        except (OSError, subprocess.SubprocessError):
            return None

    def state(self, job_id):
        if not self.reachable or not job_id:
            return None
        self.asked = True
        r = self._run("scontrol", "show", "job", "-o", str(job_id))
        if r is not None and r.returncode == 0 and r.stdout.strip():
            info = parse_kv(r.stdout.splitlines()[0])
            if "JobState" in info:
                return info
        if r is None or "invalid job id" not in (r.stderr or "").lower():
            self.reachable = False   # no controller: do not wait on it for every run
            return None
        if shutil.which("sacct"):   # purged from slurmctld (MinJobAge): ask accounting
            r = self._run("sacct", "-j", str(job_id), "-X", "-n", "-P", "-o", "State,ExitCode,Reason")
            if r is not None and r.returncode == 0 and r.stdout.strip():
                state, code, reason = (r.stdout.splitlines()[0].split("|") + ["", ""])[:3]
                return {"JobState": state.split()[0], "ExitCode": code, "Reason": reason}
        return None

    def verdict(self, job_id) -> tuple:
        """(status, what SLURM says) of a job that left no outcome of its own."""
        info = self.state(job_id)
        if info is None:
            known = ("SLURM not asked" if not self.asked else "job unknown to SLURM" if self.reachable
                     else "SLURM not reachable")
            return ("failed" if self.reachable else "running"), f"job {job_id or '?'} state unknown ({known})"
        state, code = info["JobState"], info.get("ExitCode")
        said = f"job {job_id} {state}" + (f", exit code {code}" if code and state not in ACTIVE else "")
        reason = info.get("Reason")
        said += f" ({reason})" if reason not in (None, "", "None") else ""
        return ("running" if state in ACTIVE else "failed"), said


def last_error(folder: Path, job_id) -> str:
    """'; <log>: <its last line>' from the job's stderr (else stdout) log, or ''."""
    for ext in ("err", "out"):
        for log in sorted(folder.glob(f"slurm-{job_id or '*'}.{ext}"), reverse=True):
            try:
                lines = [x.strip() for x in log.read_text(errors="replace")[-20000:].splitlines() if x.strip()]
            except OSError:
                continue
            if lines:
                last = lines[-1] if len(lines[-1]) <= 200 else lines[-1][:197] + "..."
                return f"; last line of {log.name}: `{last.replace('`', chr(39))}`"
    return ""


def _read(path: Path, lines=False):
    """(what the file holds, None) or (None, why not)."""
    if not path.is_file():
        return None, f"no {path.name}"
    try:
        return ([value for _, value in parse_json_lines(read_text(path), path)] if lines else read_json(path)), None
    except InputError as err:
        return None, f"{path.name} unreadable ({err.problem})"


def is_run(folder: Path) -> bool:
    return any((folder / name).is_file() for name in RECORDS)


def recipe_key(env: dict) -> str:
    config = {k: v for k, v in (env.get("config") or {}).items() if k not in NOT_RECIPE}
    world = (env.get("distributed") or {}).get("WORLD_SIZE", "1")
    nodes = (env.get("slurm") or {}).get("SLURM_NNODES", 1)
    return repr(sorted(config.items(), key=str)) + f"|world {world}|nodes {nodes}"


def read_run(folder: Path, slurm: Slurm) -> dict:
    """The run's records, figures and status (finished, failed, running) with the reason it is not finished."""
    env, _ = _read(folder / "environment.json")
    results, why = _read(folder / "all_results.json")
    parts, _ = _read(folder / "job_time.jsonl", lines=True)
    task, _ = _read(folder / "task.json")
    env, results, parts, task = env or {}, results or {}, parts or [], task or {}
    slurm_env = env.get("slurm") or {}
    job_id = slurm_env.get("SLURM_JOB_ID") or task.get("job_id") or (parts[-1].get("job_id") if parts else None)
    # lines of another job are a duplicate submission the run's lock refused, not a part of this run
    mine = [p for p in parts if not job_id or str(p.get("job_id")) == str(job_id)]
    seconds = sum(p.get("seconds") or 0 for p in mine if str(p.get("job_id")) == str(job_id))  # requeued parts too
    run = {"folder": str(folder), "name": folder.name, "env": env, "results": results, "task": task,
           "job_id": job_id, "parts": len(mine), "job_seconds": seconds, "recipe_key": recipe_key(env) if env else None,
           "seed": (env.get("config") or {}).get("seed", task.get("seed")), "reason": ""}
    run["resumed"] = len(mine) > 1
    world = int((env.get("distributed") or {}).get("WORLD_SIZE") or 1)
    asked = task["nodes"] * task["gpus_per_node"] if "nodes" in task else world  # a study's cell has a shape
    if as_number(results.get("WALL_CLOCK_SECONDS")) is not None and env and world != asked:
        run["status"], run["recipe_key"] = "failed", None  # it joins its cell's recipe
        run["reason"] = f"ran with world size {world}, its cell asks for {asked}: not counted"
    elif as_number(results.get("WALL_CLOCK_SECONDS")) is not None:  # finish_run writes it last
        run["status"] = "finished"
        if run["resumed"]:
            run["reason"] = f"resumed: ran in {len(mine)} parts; its times cover the last one only (not counted)"
    elif mine and mine[-1].get("outcome") not in ("requeued", "completed"):
        last = mine[-1]
        run["status"] = "failed"
        run["reason"] = f"{last.get('outcome')}, exit code {last.get('exit_code')}" + (
            f": {last['reason']}" if last.get("reason") else "")
    else:
        run["status"], said = slurm.verdict(job_id)
        run["reason"] = said + ("; requeued, not finished yet" if mine else f"; {why}") + (
            last_error(folder, job_id) if run["status"] == "failed" else "")
    return run


def figures(run: dict) -> dict:
    """The numbers a report compares, None where the run did not record them."""
    results, env = run["results"], run["env"]
    number = results.get
    training = as_number(number("train_seconds_excluding_evaluation"))
    devices = env.get("devices") or {}
    gpus = devices.get("gpus") or []
    config = env.get("config") or {}
    world = int((env.get("distributed") or {}).get("WORLD_SIZE", 1))
    per_device = as_number(config.get("per_device_train_batch_size"))
    return {"f1": as_number(number("eval_f1")), "em": as_number(number("eval_exact_match")),
            "training_s": training if training is not None else as_number(number("train_runtime")),
            "wall_s": run["job_seconds"] or as_number(number("WALL_CLOCK_SECONDS")),
            "windows_per_s": as_number(number("train_samples_per_second")),
            "target_f1": as_number(number("target_f1")), "to_target_s": as_number(number("train_seconds_to_target_f1")),
            "world_size": world, "strategy": run["task"].get("strategy") or ("fsdp" if config.get("fsdp") else "ddp"),
            "global_batch": per_device and int(per_device * world * (config.get("gradient_accumulation_steps") or 1)),
            "nodes": int((env.get("slurm") or {}).get("SLURM_NNODES", 1)),
            "device": f"{gpus[0].get('name')}" if gpus else "CPU",
            "busbw_GBps": as_number(number("comm_allreduce_busbw_GBps")),
            "exposed_comm_s": as_number(number("comm_exposed_s"))}
