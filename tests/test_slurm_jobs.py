"""job_ft3.sh and job_ddp.sh, unmodified, on a real local 2-node SLURM cluster (tests/conftest.py;
fake A100 GRES, everything runs on the CPU with gloo), configured only through sbatch options,
environment variables and trailing arguments, as a user would. Both run one launcher,
jobs/launch.sh (srun -> torchrun -> run_qa.py); job_ft3.sh is its 1 node x 1 process case:

- the repository is the submit folder, or REPO_DIR (a copy at a path with a space, trailing
  arguments); neither holding run_qa.py is one line naming REPO_DIR;
- job_ft3.sh completes through torchrun with world size 1 and records its results and wall-clock
  time; logs land in the submit folder;
- job_ddp.sh, 1 node x 2 processes and 2 nodes x 1 process: every rank joins (environment.json's
  WORLD_SIZE, one "[rankN]: ... rank N of 2" line per rank), the same steps and metrics as each other;
- requeue: `scancel --signal=USR1 --batch` (what `--signal=B:USR1@T` does before the time limit)
  makes the job checkpoint, requeue itself (Restarts=1) and resume to the same final global step,
  the same metrics and the same files as an uninterrupted run, for both scripts;
- a rank killed mid-training (SIGKILL, like the OOM killer) ends the whole 2-node job promptly;
- a refused run, one out of memory and one interrupted without requeue end their jobs with run_qa.py's
  own status (2, 3, 143) and outcome, which rank 0 wrote into the launcher's outcome file (torchrun says 1);
- a check job warned of its time limit (by hand, and at a real one) stops not ready
  (status 2, its verdict once) and is not requeued, although job_ft3.sh asks for --requeue;
- job_ddp.sh, 2 nodes x 2 processes with STRATEGY=fsdp and GLOBAL_BATCH: world size 4, every rank trains, the
  global batch sets the steps; accelerate 1.15 shards only on GPUs (on CPUs it runs FSDP requests as plain DDP,
  MULTI_CPU), so DDP trains, its checkpoints are DDP's and the records say so, not the FSDP asked. Sharding, sharded
  checkpoints and NCCL are for a GPU cluster to check.

The fail-fast checks (missing environment file or config, GLOBAL_BATCH, #SBATCH header), the
output folder read without transformers and the run's own global batch arithmetic need no SLURM, and
no job script or launcher repeats a block of 6 lines of another. Each training job takes ~20-50 s on
2 cores; the SLURM tests are skipped, with the reason, where SLURM cannot be installed (not root, no apt).
"""
import contextlib
import json
import math
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from bench.local_slurm import TERMINAL, alive
from qa.errors import EXIT_INTERRUPTED, EXIT_OUT_OF_MEMORY, InputError, command
from tests.helpers import OFFLINE_VARS, REPO, SBATCH_CPU, job_times, results, write_job_env_file

FT3, DDP = REPO / "job_ft3.sh", REPO / "job_ddp.sh"
LAUNCHER = REPO / "jobs" / "launch.sh"
CONFIG = "configs/smoke_tiny.json"           # relative: the job finds it in the repository


# ---------------------------------------------------------------------------------------------
# Helpers

def _clean_env(**extra):
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("SLURM_", "SBATCH_", "SRUN_")) and k != "TENSORBOARD_LOGGING_DIR"}
    env.update(extra)
    return env


@pytest.fixture(scope="module")
def env_file(tmp_path_factory):
    return write_job_env_file(tmp_path_factory.mktemp("jobenv"))


class Job:
    def __init__(self, cluster, jobid, cwd, name, out):
        self.cluster, self.id, self.cwd, self.name, self.out = cluster, jobid, Path(cwd), name, Path(out)
        self.info = None
        self.submitted = time.monotonic()

    def log(self, ext="out") -> str:
        path = self.cwd / f"{self.name}-{self.id}.{ext}"
        return path.read_text(errors="replace") if path.exists() else ""

    def logs(self) -> str:
        return self.log("out") + self.log("err")

    def tail(self) -> str:
        return f"--- out\n{self.log('out')[-4000:]}\n--- err\n{self.log('err')[-6000:]}"

    def wait(self, timeout=600):
        self.info = self.cluster.wait(self.id, timeout=timeout, poll=0.5)
        self.seconds = time.monotonic() - self.submitted
        return self.info

    def state(self):
        info = self.cluster.job(self.id)
        return info.get("JobState") if info else None

    def wait_checkpoint(self, step, timeout=300):
        marker = self.out / f"checkpoint-{step}" / "checkpoint_complete.json"
        deadline = time.monotonic() + timeout
        while not marker.exists():
            assert self.state() not in TERMINAL, f"job ended before {marker} appeared\n{self.tail()}"
            assert time.monotonic() < deadline, f"{marker} did not appear in {timeout} s\n{self.tail()}"
            time.sleep(0.1)

    def completed(self):
        assert self.info["JobState"] == "COMPLETED" and self.info["ExitCode"] == "0:0", f"{self.info}\n{self.tail()}"


def submit(cluster, script, tmp_path, env_file, *sbatch_args, args=(), name=None, shell=None, **variables) -> Job:
    """sbatch [OPTIONS] --export=ALL,ENV_FILE=..,REPO_DIR=..,K=V.. SCRIPT [ARGS], from a fresh folder (no logs/),
    in the environment `shell` (the cluster's by default), which ALL passes on to the job."""
    cwd = tmp_path / f"submit-{time.monotonic_ns()}"
    cwd.mkdir()
    out = Path(variables.get("OUTPUT_DIR") or args[list(args).index("--output_dir") + 1])
    exports = ",".join(["ALL", f"ENV_FILE={env_file}", f"REPO_DIR={REPO}"] + [f"{k}={v}" for k, v in variables.items()])
    cmd = ["sbatch", "--parsable", *SBATCH_CPU, *sbatch_args, *(["-J", name] if name else []), f"--export={exports}",
           str(script), *args]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=30, cwd=cwd, env=shell or cluster.env)
    assert r.returncode == 0, f"{cmd}: {r.stderr}"
    default_name = "bert-squad" if Path(script).name == "job_ft3.sh" else "bert-squad-ddp"
    return Job(cluster, r.stdout.strip().split(";")[0], cwd, name or default_name, out)


TORCHRUN_CRASH = ("Traceback", "ChildFailedError", "SignalException")


def assert_no_torchrun_traceback(err: str):
    """What torchrun prints where a job ends as expected (a refused run, a check not ready, a requeue): one line
    (jobs/torchrun.py), not its traceback of a worker's exit status or of its SIGTERM, which reads as a crash."""
    assert not [word for word in TORCHRUN_CRASH if word in err], err


def global_step(out: Path) -> int:
    return json.loads((out / "trainer_state.json").read_text())["global_step"]


def run_files(out: Path) -> set:
    """What a finished run leaves, less what differs by design between an interrupted+resumed
    run and an uninterrupted one (which checkpoints are kept, one job_time line per run)."""
    return {p.name for p in out.iterdir() if not p.name.startswith("checkpoint-") and p.name != "job_time.jsonl"}


def rank_lines(log: str, world: int, from_step: int = 0) -> list:
    return [r for r in range(world)
            if re.search(rf"^\[rank{r}\]: .*rank {r} of {world} \(gloo backend\).*training from step {from_step};",
                         log, re.M)]


def job_processes(jobid: str) -> list:
    """PIDs of live processes started for this SLURM job (by the environment SLURM gave them)."""
    found = []
    needle = f"SLURM_JOB_ID={jobid}".encode()
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            if needle in (proc / "environ").read_bytes().split(b"\0") and alive(int(proc.name)):
                found.append(int(proc.name))
        except OSError:
            continue
    return found


def wait_no_processes(jobid: str, timeout: float = 30) -> list:
    """The job's processes still alive after `timeout` s (slurmstepd reaps stragglers)."""
    deadline = time.monotonic() + timeout
    while job_processes(jobid) and time.monotonic() < deadline:
        time.sleep(0.5)
    return job_processes(jobid)


def rank_process(jobid: str, rank: int) -> int:
    """The run_qa.py worker of global rank `rank` in this job."""
    for pid in job_processes(jobid):
        try:
            environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if f"RANK={rank}".encode() in environ and any(c.endswith(b"run_qa.py") for c in cmdline) \
                and not any(c.endswith(b"torchrun.py") for c in cmdline):
            return pid
    raise AssertionError(f"no rank {rank} process for job {jobid}")


# ---------------------------------------------------------------------------------------------
# Without SLURM: the header and the fail-fast paths

def _sbatch_options(script: Path) -> list:
    return [line.split(None, 1)[1].strip() for line in script.read_text().splitlines() if line.startswith("#SBATCH")]


@pytest.mark.parametrize("script", [FT3, DDP], ids=["ft3", "ddp"])
def test_header_defaults_and_no_log_folder(script):
    """sbatch fails (or the job dies unseen) when the folder of -o/-e does not exist, so the
    defaults name files only: %x-%j.out/.err in the submit folder."""
    opts = _sbatch_options(script)
    logs = [o.split(None, 1)[1] if " " in o else o.split("=", 1)[1]
            for o in opts if re.match(r"^(-o|-e|--output|--error)[ =]", o)]
    assert sorted(logs) == ["%x-%j.err", "%x-%j.out"], opts
    assert all("/" not in x for x in logs)
    for needed in ("-c 32", "--mem=64G", "--open-mode=append", "--requeue"):
        assert needed in opts, (needed, opts)
    assert any(re.fullmatch(r"--gres=gpu:a100:[12]", o) for o in opts), opts
    assert any(re.fullmatch(r"--signal=B:USR1@\d+", o) for o in opts), opts
    assert any(o.startswith("--time=") for o in opts) and any(o.startswith("--job-name=") for o in opts)
    assert subprocess.run(["bash", "-n", str(script)]).returncode == 0


@pytest.mark.parametrize("script", [FT3, DDP], ids=["ft3", "ddp"])
def test_missing_env_file_fails_fast(script, tmp_path):
    r = subprocess.run(["bash", str(script)], capture_output=True, text=True, timeout=30, cwd=tmp_path,
                       env=_clean_env(ENV_FILE=str(tmp_path / "missing.env.sh")))
    assert r.returncode == 1, r
    assert len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert "missing.env.sh not found" in r.stderr and "setup_bert.sh" in r.stderr


@pytest.mark.parametrize("script", [FT3, DDP], ids=["ft3", "ddp"])
def test_missing_config_fails_fast(script, tmp_path):
    env_file = write_job_env_file(tmp_path / "env")
    for how in (dict(CONFIG="configs/nope.json"), dict(args=["nope.json"])):
        r = subprocess.run(["bash", str(script), *how.get("args", [])], capture_output=True, text=True, timeout=60,
                           cwd=tmp_path, env=_clean_env(ENV_FILE=str(env_file), CONFIG=how.get("CONFIG", "")))
        assert r.returncode == 1, r
        assert "nope.json not found" in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr


@pytest.mark.parametrize("script", [FT3, DDP], ids=["ft3", "ddp"])
def test_outside_slurm_says_so(script, tmp_path):
    """srun is the launcher's first step, so both need a SLURM job; the check comes before the
    settings are read (no Python import to wait for)."""
    env_file = write_job_env_file(tmp_path / "env")
    t0 = time.monotonic()
    r = subprocess.run(["bash", str(script), CONFIG], capture_output=True, text=True, timeout=60, cwd=tmp_path,
                       env=_clean_env(ENV_FILE=str(env_file)))
    assert r.returncode == 1 and "not inside a SLURM job" in r.stderr, r
    assert len(r.stderr.strip().splitlines()) == 1 and time.monotonic() - t0 < 5, r


def test_offline_other_than_0_or_1_fails_fast(tmp_path):
    """Anything but 0 or 1 is a mistake to name, not a silent choice of offline or online."""
    env_file = write_job_env_file(tmp_path / "env")
    r = subprocess.run(["bash", str(FT3), CONFIG], capture_output=True, text=True, timeout=60, cwd=tmp_path,
                       env=_clean_env(ENV_FILE=str(env_file), OFFLINE="no"))
    assert r.returncode == 1, r
    assert r.stderr == ("job_ft3.sh: error: OFFLINE=no: use 1 (never reach the Hub, the default) or 0 "
                        "(the job may reach the Hub)\n"), r.stderr


def _blocks(path: Path, n: int = 6) -> set:
    lines = [line.rstrip() for line in path.read_text().splitlines()]
    return {tuple(lines[i:i + n]) for i in range(len(lines) - n + 1)}


def test_no_block_repeated_between_job_scripts():
    """One launcher: what both jobs do lives in jobs/launch.sh, not in a copy in each script."""
    files = [FT3, DDP, LAUNCHER]
    for i, a in enumerate(files):
        for b in files[i + 1:]:
            assert not _blocks(a) & _blocks(b), f"{a.name} and {b.name} share a block of 6 lines"


@pytest.mark.parametrize("argv, expect", [
    (["c.json"], "runs/from config"),                                    # the config's
    (["c.json", "--output_dir", "runs/a b"], "runs/a b"),               # a flag wins
    (["c.json", "--output_dir", "x", "--output_dir=runs/y"], "runs/y"),  # the last one wins, `=` form too
    (["--output_dir", "~/runs/z"], "~/runs/z"),                          # no config; `~` expanded
    ([], "trainer_output"),                                              # neither: the run's default
])
def test_output_dir_read_without_transformers_is_the_runs(tmp_path, monkeypatch, argv, expect):
    """The launcher learns where the run writes (job_time.jsonl goes there) from qa.arguments, which
    reads the config and the flags with the standard library only; run_qa.py's parser ends with
    the same folder, whatever the config, the flags and their order say."""
    from qa.arguments import expand, output_dir
    from qa.arguments import parse_args

    monkeypatch.chdir(tmp_path)
    (tmp_path / "c.json").write_text(json.dumps({"_comment": "x", "model_name_or_path": "bundled:tiny-bert",
                                                 "output_dir": "runs/from config"}))
    argv = argv or ["--model_name_or_path", "bundled:tiny-bert"]
    expected = os.path.expanduser(expect)
    assert output_dir(expand(argv)[1]) == expected
    assert parse_args([*argv, "--do_eval"])[3].output_dir == expected


def test_output_dir_command_imports_no_library(tmp_path):
    """`python -m qa.arguments output_dir CONFIG [ARGS]`, as the launcher runs it before srun: the folder
    on stdout, and none of transformers, torch, datasets imported (each costs seconds per job)."""
    config = tmp_path / "c.json"
    config.write_text(json.dumps({"output_dir": "runs/c", "learning_rate": 1e-3}))
    probe = ("import runpy, sys; sys.argv = ['qa.arguments'] + sys.argv[1:]\n"
             "try:\n    runpy.run_module('qa.arguments', run_name='__main__')\nexcept SystemExit as e:\n"
             "    print(sorted(m for m in ('transformers', 'torch', 'datasets') if m in sys.modules), e.code)")
    r = subprocess.run([sys.executable, "-c", probe, "output_dir", str(config), "--seed", "3", "--output_dir",
                        "runs/a b"], capture_output=True, text=True, timeout=60, cwd=tmp_path,
                       env=_clean_env(PYTHONPATH=str(REPO)))
    assert r.returncode == 0 and r.stdout.splitlines() == ["runs/a b", "[] 0"], r
    r = subprocess.run([sys.executable, "-m", "qa.arguments", "output_dir", str(config)], capture_output=True,
                       text=True, timeout=60, cwd=tmp_path, env=_clean_env(PYTHONPATH=str(REPO)))
    assert r.returncode == 0 and r.stdout == "runs/c\n", r


def test_output_dir_of_a_bad_config_is_one_line(tmp_path, capsys):
    """A config that is not JSON stops the job before srun: one line naming the file and the fix,
    status 2, nothing on stdout for the launcher to read."""
    from qa.arguments import main

    config = tmp_path / "c.json"
    config.write_text('{"learning_rate": 1e-3,}')
    assert main(["output_dir", str(config)]) == 2
    out, err = capsys.readouterr()
    assert out == "" and err.splitlines() == [f"error: {config}, line 1 column 24: malformed JSON: Expecting property "
                                              "name enclosed in double quotes. Fix: correct the JSON syntax at that point"]


def test_abbreviated_flags_are_refused():
    """argparse would take --output for --output_dir, which the reader above would not see."""
    from qa.arguments import parse_args
    from qa.errors import InputError

    with pytest.raises(InputError, match=r"unknown arguments \['--output', 'x'\]"):
        parse_args(["--model_name_or_path", "bundled:tiny-bert", "--output", "x"])


@pytest.mark.parametrize("global_batch, world, per_device, expect", [
    (48, 2, 12, (12, 2)),   # 24 per rank > 12 fits: accumulate 2 x 12
    (48, 4, 12, (12, 1)),
    (48, 8, 12, (6, 1)),    # fewer than configured: smaller batch, no accumulation
    (50, 2, 12, (5, 5)),    # 25 per rank: 5 x 5 (25 = 12 x ? has no solution)
    (96, 1, 12, (12, 8)),
    (7, 1, 4, (1, 7)),      # a prime above the configured batch: batch 1
])
def test_global_batch_is_kept(global_batch, world, per_device, expect):
    from qa.arguments import split_global_batch

    assert split_global_batch(global_batch, world, per_device) == expect


def test_global_batch_must_divide():
    from qa.arguments import split_global_batch
    from qa.errors import InputError

    with pytest.raises(InputError) as info:
        split_global_batch(5, 2, 12)
    assert str(info.value) == ("global_batch=5: does not divide over the 2 processes of this run. Fix: pick a "
                               "multiple of 2 (e.g. 4 or 6)")


def test_run_resolves_global_batch_and_its_defaults(tmp_path, monkeypatch):
    """What the launcher did in the shell is the run's own: --global_batch split at start (logged on
    the main process with the learning rate), and DDP's search for unused parameters off unless given."""
    from qa.arguments import parse_args
    from run_qa import finalize

    # finalize points TensorBoard at the output folder through the environment, which the jobs
    # submitted later in this process would inherit
    monkeypatch.setenv("TENSORBOARD_LOGGING_DIR", str(tmp_path / "tb"))
    base = ["--model_name_or_path", "bundled:tiny-bert", "--do_train", "--use_cpu", "true", "--report_to", "none",
            "--per_device_train_batch_size", "12", "--learning_rate", "3e-5", "--output_dir", str(tmp_path / "out")]
    _, _, run_args, training_args, explicit = parse_args(base + ["--global_batch", "96"])
    said = finalize(training_args, run_args, explicit)  # the run logs them once nothing refuses it
    assert (training_args.per_device_train_batch_size, training_args.gradient_accumulation_steps) == (12, 8)
    assert training_args.ddp_find_unused_parameters is False
    assert said == [
        "global_batch 96 over 1 processes: per-device batch 12 (configured 12) x gradient accumulation 8",
        "global batch 96 = per-device 12 x world size 1 x gradient accumulation 8; learning rate 3e-05 (not scaled "
        "with the batch)"]
    _, _, run_args, training_args, explicit = parse_args(base + ["--ddp_find_unused_parameters", "true",
                                                                 "--gradient_accumulation_steps", "2"])
    finalize(training_args, run_args, explicit)
    assert training_args.ddp_find_unused_parameters is True  # given: kept
    assert (training_args.per_device_train_batch_size, training_args.gradient_accumulation_steps) == (12, 2)


def _launcher(script, **variables):
    exports = "".join(f"{k}={v} " for k, v in variables.items())
    path = f"{Path(sys.executable).parent}:{os.environ['PATH']}"  # the project's python, as ENV_FILE gives the jobs
    return subprocess.run(["bash", "-c", f"source {LAUNCHER}; JL_NAME=t; RUN_QA_ARGS=(--seed 1); {exports}{script}"],
                          capture_output=True, text=True, timeout=30, env=dict(os.environ, PATH=path))


def test_launcher_passes_global_batch_after_checking_it():
    """Before srun: a positive integer, a multiple of the world size by run_qa.py's rule; then the run gets it."""
    r = _launcher('jl_global_batch 2; printf "%s\\n" "${RUN_QA_ARGS[@]}"', GLOBAL_BATCH=48)
    assert r.returncode == 0 and r.stdout.splitlines() == ["--seed", "1", "--global_batch", "48"], r
    r = _launcher('jl_global_batch 2; printf "%s\\n" "${RUN_QA_ARGS[@]}"')
    assert r.returncode == 0 and r.stdout.splitlines() == ["--seed", "1"], r
    for value, message in (("0", "GLOBAL_BATCH=0 is not a positive integer"),
                           ("4x", "GLOBAL_BATCH=4x is not a positive integer")):
        r = _launcher("jl_global_batch 2", GLOBAL_BATCH=value)
        assert r.returncode == 1 and r.stderr == f"t: error: {message}\n", r
    r = _launcher("jl_global_batch 2", GLOBAL_BATCH=5)
    assert r.returncode == 2 and r.stderr == ("error: global_batch=5: does not divide over the 2 processes of this "
                                              "run. Fix: pick a multiple of 2 (e.g. 4 or 6)\n"), r


@pytest.mark.parametrize("ended, outcome, code", [
    (InputError("--max_seq_length 0", "must be positive", "e.g. 384"), "refused", 2),
    (InputError("per_device_train_batch_size=48", "the device ran out of memory in a training step",
                "pass a smaller --per_device_train_batch_size (e.g. 24) with --global_batch 48", EXIT_OUT_OF_MEMORY),
     "out_of_memory", 3),
    (EXIT_INTERRUPTED, "interrupted", 143),
    (RuntimeError("Connection closed by peer"), "failed", 1),
    (0, "failed", 1),        # rank 0 finished, another rank did not
    (None, "failed", 1)])    # no file: run_qa.py never ran (an import failed, a node was lost)
def test_the_job_ends_with_the_status_its_run_wrote(tmp_path, monkeypatch, ended, outcome, code):
    """torchrun ends with its own status 1 whatever rank 0's was: the launcher takes rank 0's status, outcome
    and reason from the file its command wrote (qa/errors.py) and removes it; with none the job failed as it did."""
    file = tmp_path / ".outcome-7-0.json"

    @command
    def run_qa(argv=None):
        if isinstance(ended, Exception):
            raise ended
        return ended

    if ended is not None:
        monkeypatch.setenv("QA_OUTCOME_FILE", str(file))
        with contextlib.suppress(RuntimeError):
            run_qa()
        said = json.loads(file.read_text())
    out = tmp_path / "out"
    r = _launcher(f"OUTPUT={out}; QA_OUTCOME_FILE={file}; jl_run false")  # false: torchrun's 1
    assert r.returncode == code and not file.exists(), r
    assert [(t["outcome"], t["exit_code"]) for t in job_times(out)] == [(outcome, code)]
    if ended is not None:
        assert f"run_qa.py: {said['outcome']} (status {said['status']}): {said['reason']}\n" in r.stdout, r


def test_an_output_folder_under_home_is_a_warning_where_lustre_exists(tmp_path):
    """About 3 GB of checkpoints under a small $HOME quota: the job log says where to put them."""
    home, lustre = tmp_path / "home", tmp_path / "lustre"
    for folder in (home / "repo", lustre):
        folder.mkdir(parents=True)
    warning = (f"warning: output folder {home}/repo/runs/ref is under $HOME, whose quota is small (a bert-base run "
               "keeps about 3 GB there): set OUTPUT_DIR=$LUSTRE/runs/NAME, or submit from a folder on $LUSTRE "
               f"(cd $LUSTRE/bert-squad && REPO_DIR={REPO} sbatch {REPO}/t)")
    for cwd, output, has_lustre, warned in ((home / "repo", "runs/ref", True, True), (lustre, "runs/ref", True, False),
                                            (home / "repo", lustre / "runs/ref", True, False),
                                            (home / "repo", "runs/ref", False, False)):
        place = f"export HOME={home}; " + (f"export LUSTRE={lustre}; " if has_lustre else "unset LUSTRE; ")
        r = _launcher(f'{place}cd {cwd}; OUTPUT={output}; jl_output_place; printf "%s\\n" "${{JL_NOTES[@]}}"')
        assert r.returncode == 0 and r.stdout.strip() == (warning if warned else ""), (cwd, output, r)


# ---------------------------------------------------------------------------------------------
# On the local SLURM cluster: finding the repository from the spool folder's copy

@pytest.mark.slow  # a real local SLURM cluster
@pytest.mark.parametrize("script", [FT3.name, DDP.name])
@pytest.mark.slurm
def test_repository_is_the_submit_folder_or_repo_dir(slurm_cluster, env_file, tmp_path, script):
    """sbatch runs a copy of the script from the node's spool folder, so the repository is the submit
    folder, or REPO_DIR when set; a folder without run_qa.py is one line naming REPO_DIR. A copy of the
    repository's scripts (at a path with a space) reaches the config check, whose error names the
    repository it found."""
    repo = tmp_path / "a repo" / "copy"
    (repo / "jobs").mkdir(parents=True)
    for path in (FT3, DDP, REPO / "run_qa.py"):
        shutil.copy2(path, repo / path.name)
    shutil.copy2(LAUNCHER, repo / "jobs" / LAUNCHER.name)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    cases = {  # name: submit folder, more variables, the one error line expected
        "submit_dir": (repo, [], f"config nope.json not found (looked in {repo} and {repo})"),
        "repo_dir": (elsewhere, [f"REPO_DIR={repo}"], f"config nope.json not found (looked in {elsewhere} and {repo})"),
        "neither": (elsewhere, [], f"no run_qa.py in {elsewhere}: submit from the repository or set REPO_DIR="),
    }
    jobs = {}
    for name, (cwd, variables, _) in cases.items():
        exports = ",".join(["ALL", f"ENV_FILE={env_file}", *variables])
        cmd = ["sbatch", "--parsable", *SBATCH_CPU, "-o", f"{tmp_path}/{name}.out", "-e", f"{tmp_path}/{name}.err",
               f"--export={exports}", str(repo / script), "nope.json", "--output_dir", "runs/x y", "--seed", "7"]
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=30, cwd=cwd, env=slurm_cluster.env)
        assert r.returncode == 0, f"{cmd}: {r.stderr}"
        jobs[name] = r.stdout.strip().split(";")[0]
    for name, (*_, expect) in cases.items():
        info = slurm_cluster.wait(jobs[name], timeout=120, poll=0.5)
        err = (tmp_path / f"{name}.err").read_text().strip().splitlines()
        assert info["JobState"] == "FAILED" and len(err) == 1 and err[0].startswith(f"{script}: error: {expect}"), \
            (name, info, err)


# ---------------------------------------------------------------------------------------------
# On the local SLURM cluster: reference runs (module-scoped: the requeue tests compare with them)

@pytest.fixture(scope="module")
def ft3_run(slurm_cluster, env_file, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("ft3")
    job = submit(slurm_cluster, FT3, tmp, env_file, "--gres=gpu:a100:1", name="ft3-test",
                 args=[CONFIG, "--output_dir", str(tmp / "out")])
    job.wait()
    return job


@pytest.fixture(scope="module")
def ddp12_run(slurm_cluster, env_file, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("ddp12")
    job = submit(slurm_cluster, DDP, tmp, env_file, "-N", "1", "--gres=gpu:a100:2",
                 CONFIG=CONFIG, OUTPUT_DIR=tmp / "out")
    job.wait()
    return job


@pytest.mark.slow  # a real local SLURM cluster
@pytest.mark.slurm
@pytest.mark.torchrun
def test_ft3_completes_with_results(ft3_run):
    job = ft3_run
    job.completed()
    print(f"\njob {job.id} (job_ft3.sh): {job.seconds:.0f} s from submission to COMPLETED")
    res = results(job.out)
    assert 0 < res["train_runtime"] < res["WALL_CLOCK_SECONDS"], res
    # smoke_tiny's F1 is no measure of learning (a tiny random BERT, seconds of training; an untrained one scores
    # about 4), but every question has its answer, some overlap (empty answers score 0), an exact match is a full F1
    predictions = json.loads((job.out / "predictions.json").read_text())
    assert res["eval_examples"] == len(predictions) == 60 and 0 <= res["eval_exact_match"] <= res["eval_f1"], res
    assert res["eval_f1"] > 0, res
    env = json.loads((job.out / "environment.json").read_text())
    assert env["slurm"]["SLURM_JOB_ID"] == job.id and env["slurm"]["SLURM_GPUS_ON_NODE"] == "1"
    assert [env["offline"][v] for v in OFFLINE_VARS] == ["1", "1", "1"]
    # the world-size-1 case of the multi-GPU path: a torchrun worker, not a bare python
    assert env["distributed"]["WORLD_SIZE"] == "1" and env["distributed"]["LOCAL_RANK"] == "0", env["distributed"]
    assert global_step(job.out) == math.ceil(res["train_features"] / 4)
    times = job_times(job.out)
    assert [(t["job_id"], t["outcome"], t["exit_code"], t["restart"]) for t in times] == [(job.id, "completed", 0, 0)]
    assert (times[0]["script"], times[0]["world_size"]) == ("job_ft3.sh", 1)
    assert times[0]["seconds"] >= res["WALL_CLOCK_SECONDS"] - 1
    # -J overrides the header's name; the logs are in the submit folder, which had no logs/ folder
    assert sorted(p.name for p in job.cwd.iterdir()) == [f"ft3-test-{job.id}.err", f"ft3-test-{job.id}.out"]
    out = job.log()
    assert f"job {job.id} (ft3-test), restart 0" in out and "no nvidia-smi on this node" in out
    # logged by the run (its main process), no longer by the launcher
    assert "global batch 4 = per-device 4 x world size 1 x gradient accumulation 1; learning rate 0.001" in job.logs()
    assert "strategy ddp: 1 node(s) x 1 process(es) = world size 1; rendezvous 127.0.0.1:" in out
    assert re.search(r"running: srun --kill-on-bad-exit=1 --nodes=1 .* python \S*/jobs/torchrun\.py --nnodes=1 "
                     r"--nproc_per_node=1 --rdzv_backend=c10d .*/run_qa\.py \S*/configs/smoke_tiny\.json "
                     r"--output_dir ", out), out
    assert rank_lines(job.logs(), 1) == [0], job.tail()
    assert "warning" not in out  # 1 GPU granted, 1 used
    assert f"job wall clock {times[0]['seconds']} s, exit code 0, completed" in out
    assert "SLURM_GPUS_ON_NODE=1" in out and "HF_HOME=" in out


@pytest.mark.slow  # a real local SLURM cluster
@pytest.mark.slurm
@pytest.mark.torchrun
def test_ddp_one_node_two_processes(ddp12_run, ft3_run):
    job = ddp12_run
    job.completed()
    print(f"\njob {job.id} (job_ddp.sh 1x2): {job.seconds:.0f} s from submission to COMPLETED")
    env = json.loads((job.out / "environment.json").read_text())
    assert env["distributed"]["WORLD_SIZE"] == "2" and env["slurm"]["SLURM_NNODES"] == "1"
    log = job.logs()
    assert rank_lines(log, 2) == [0, 1], job.tail()
    assert "global batch 8 = per-device 4 x world size 2 x gradient accumulation 1" in log
    assert "--nproc_per_node=2" in log and "--rdzv_backend=c10d" in log and "--kill-on-bad-exit=1" in log
    res = results(job.out)
    assert global_step(job.out) == math.ceil(math.ceil(res["train_features"] / 2) / 4)
    assert env["config"]["ddp_find_unused_parameters"] is False  # the config's (the run's default otherwise)
    assert run_files(job.out) == run_files(ft3_run.out)


# ---------------------------------------------------------------------------------------------
# Requeue: checkpoint on USR1, requeue, resume to the same end as an uninterrupted run

def _check_requeued(job, reference):
    info = job.wait()
    job.completed()
    assert info["Restarts"] == "1", info
    print(f"\njob {job.id} ({job.name}): interrupted, requeued and resumed, {job.seconds:.0f} s from submission")
    log = job.logs()
    assert "SIGUSR1 received: asking training to save a checkpoint and stop" in log
    assert f"requeueing job {job.id}" in log and f"job {job.id} ({job.name}), restart 1" in log
    assert_no_torchrun_traceback(job.log("err"))
    stopped = re.findall(r"signal received: saving checkpoint-(\d+) and stopping", log)
    assert stopped and len(set(stopped)) == 1, job.tail()   # every rank stopped at the same step
    step = int(stopped[0])
    assert 10 <= step < global_step(reference.out)
    times = job_times(job.out)
    assert [(t["restart"], t["outcome"]) for t in times] == [(0, "requeued"), (1, "completed")]
    assert times[0]["exit_code"] != 0 and times[1]["exit_code"] == 0
    # the same end as the uninterrupted run: steps, metrics, files
    assert global_step(job.out) == global_step(reference.out)
    mine, ref = results(job.out), results(reference.out)
    # what the communication calibration says about links inside a node depends on how the ranks
    # sit on the nodes (2x1 against 1x2), not on training
    placement = {k for k in {*mine, *ref} if k.startswith("comm_intranode")}
    assert set(mine) - placement == set(ref) - placement
    for key in ("eval_f1", "eval_exact_match", "eval_loss"):
        assert mine[key] == pytest.approx(ref[key], rel=1e-5, abs=1e-6), key
    assert run_files(job.out) == run_files(reference.out)
    env = json.loads((job.out / "environment.json").read_text())
    assert env["slurm"]["SLURM_RESTART_COUNT"] == "1"
    return log, step


@pytest.mark.slow  # a real local SLURM cluster
@pytest.mark.slurm
@pytest.mark.torchrun
def test_ft3_requeue_resumes(slurm_cluster, env_file, tmp_path, ft3_run):
    ft3_run.completed()
    job = submit(slurm_cluster, FT3, tmp_path, env_file, "--gres=gpu:a100:1",
                 CONFIG=CONFIG, RUN_ARGS=f"--output_dir {tmp_path / 'out'} --resume never", OUTPUT_DIR=tmp_path / "out")
    job.wait_checkpoint(10)
    slurm_cluster.run("scancel", "--signal=USR1", "--batch", job.id)
    log, _ = _check_requeued(job, ft3_run)
    # run_qa.py's 143 from its outcome file, although torchrun, stopped by the same SIGTERM, ends the step with 1
    assert "interrupted by SIGTERM" in log and "exit code 143, requeued" in log, job.tail()
    assert "restart 1: --resume auto" in log  # the requeued run resumes even after --resume never


@pytest.mark.slow  # a real local SLURM cluster
@pytest.mark.slurm
@pytest.mark.torchrun
def test_ddp_two_nodes_requeue_resumes(slurm_cluster, env_file, tmp_path, ddp12_run):
    """2 nodes x 1 process, interrupted and resumed, ends like the uninterrupted 1 x 2 run (same
    world size, same data order): both runs of the job had every rank joined."""
    ddp12_run.completed()
    job = submit(slurm_cluster, DDP, tmp_path, env_file, "-N", "2", "--gres=gpu:a100:1",
                 CONFIG=CONFIG, OUTPUT_DIR=tmp_path / "out")
    job.wait_checkpoint(10)
    slurm_cluster.run("scancel", "--signal=USR1", "--batch", job.id)
    log, step = _check_requeued(job, ddp12_run)
    assert rank_lines(log, 2, 0) == [0, 1] and rank_lines(log, 2, step) == [0, 1], job.tail()
    env = json.loads((job.out / "environment.json").read_text())
    assert env["distributed"]["WORLD_SIZE"] == "2" and env["slurm"]["SLURM_JOB_NODELIST"] == "node[1-2]"
    assert "rendezvous 127.0.0.1:" in log  # NodeAddr: the fake node names do not resolve
    assert wait_no_processes(job.id) == []


# ---------------------------------------------------------------------------------------------
# OFFLINE: the job's access to the Hub

@pytest.mark.slow  # a real local SLURM cluster
@pytest.mark.slurm
@pytest.mark.torchrun
def test_offline_0_unsets_the_offline_variables_and_the_default_sets_them(slurm_cluster, env_file, tmp_path):
    """OFFLINE=0: none of the three offline variables in the job, although the env file and the
    submitting shell (whose environment sbatch passes on) export all three. Default: all three set
    to 1, although neither sets any. environment.json records each, null when unset."""
    exported = dict(slurm_cluster.env, **{v: "1" for v in OFFLINE_VARS})
    bare = {k: v for k, v in slurm_cluster.env.items() if k not in OFFLINE_VARS}
    tiny = [CONFIG, "--max_steps", "2", "--do_eval", "false"]  # no Hub access needed: seconds of training
    online = submit(slurm_cluster, FT3, tmp_path, env_file, "--gres=gpu:a100:1", shell=exported, OFFLINE=0,
                    args=[*tiny, "--output_dir", str(tmp_path / "online")])
    default = submit(slurm_cluster, FT3, tmp_path, write_job_env_file(tmp_path / "env", offline=False),
                     "--gres=gpu:a100:1", shell=bare, args=[*tiny, "--output_dir", str(tmp_path / "default")])
    for job, expect in ((online, [None, None, None]), (default, ["1", "1", "1"])):
        job.wait()
        job.completed()
        recorded = json.loads((job.out / "environment.json").read_text())["offline"]
        assert [recorded[v] for v in OFFLINE_VARS] == expect, (recorded, job.tail())
    assert "OFFLINE=0: HF_HUB_OFFLINE, HF_DATASETS_OFFLINE and TRANSFORMERS_OFFLINE unset" in online.log()
    assert "OFFLINE=0" not in default.log()


# ---------------------------------------------------------------------------------------------
# Failure and strategy

@pytest.mark.slow  # a real local SLURM cluster
@pytest.mark.slurm
@pytest.mark.torchrun
def test_failing_rank_ends_two_node_job_promptly(slurm_cluster, env_file, tmp_path):
    job = submit(slurm_cluster, DDP, tmp_path, env_file, "-N", "2", "--gres=gpu:a100:1",
                 CONFIG=CONFIG, OUTPUT_DIR=tmp_path / "out")
    job.wait_checkpoint(10)                        # training under way on both nodes
    os.kill(rank_process(job.id, 1), signal.SIGKILL)
    killed = time.monotonic()
    info = job.wait(timeout=300)
    ended_after = time.monotonic() - killed
    assert info["JobState"] == "FAILED" and info["ExitCode"] != "0:0", f"{info}\n{job.tail()}"
    assert ended_after < 60, f"job ended {ended_after:.0f} s after the kill (time limit 15 min)"
    print(f"\njob {job.id}: FAILED {ended_after:.1f} s after rank 1 was killed ({job.seconds:.0f} s in all)")
    assert wait_no_processes(job.id) == [], "processes of the failed job survive"
    assert [t["outcome"] for t in job_times(job.out)] == ["failed"]
    assert not (job.out / "all_results.json").exists()


@pytest.mark.slow  # a real local SLURM cluster
@pytest.mark.slurm
@pytest.mark.torchrun
def test_a_second_job_into_a_running_jobs_folder_is_refused(slurm_cluster, env_file, tmp_path):
    """A job submitted twice: the second finds the output folder's lock held by the first (another
    SLURM job), stops with one line and exit 2, and records itself as refused; the first finishes."""
    first = submit(slurm_cluster, FT3, tmp_path, env_file, "--gres=gpu:a100:1", args=[
        CONFIG, "--output_dir", str(tmp_path / "out"), "--num_train_epochs", "8"])  # still training when the second comes
    first.wait_checkpoint(10)
    second = submit(slurm_cluster, FT3, tmp_path, env_file, "--gres=gpu:a100:1", args=[CONFIG, "--output_dir",
                                                                                       str(tmp_path / "out")])
    info = second.wait(timeout=300)
    assert info["JobState"] == "FAILED", f"{info}\n{second.tail()}"
    refusals = [line for line in second.log("err").splitlines() if "error: " in line and "run.lock" in line]
    assert len(refusals) == 1 and f"SLURM job {first.id}" in refusals[0], second.tail()
    assert info["ExitCode"] == "2:0" and "run_qa.py: refused (status 2): " in second.log(), second.tail()
    first.wait()
    first.completed()
    outcomes = {(t["job_id"], t["outcome"], t["exit_code"]) for t in job_times(first.out)}
    assert outcomes == {(second.id, "refused", 2), (first.id, "completed", 0)}, outcomes


@pytest.mark.slow  # a real local SLURM cluster
@pytest.mark.parametrize("outcome, code, more, variables, reason", [
    ("refused", 2, ["--max_seq_length", "0"], {},
     "max_seq_length=0: must be at least 1 (tokens per feature). Fix: use e.g. 384"),
    ("out_of_memory", 3, ["--do_train", "false"], {"RUN_QA": "-m tests.eval_hooks oom 8 --", "PYTHONPATH": REPO},
     "per_device_eval_batch_size=32: the device ran out of memory in an evaluation (CUDA out of memory.")])
@pytest.mark.slurm
@pytest.mark.torchrun
def test_a_refused_or_out_of_memory_run_ends_its_job_with_its_status(slurm_cluster, env_file, tmp_path, outcome, code,
                                                                     more, variables, reason):
    """torchrun ends with 1 whatever rank 0's status: the job ends with the run's own (2 or 3, qa/errors.py), read
    from the file the run wrote, records it with its outcome and logs the one-line reason; the file is gone."""
    job = submit(slurm_cluster, FT3, tmp_path, env_file, "--gres=gpu:a100:1",
                 args=[CONFIG, "--output_dir", str(tmp_path / "out"), *more], **variables)
    info = job.wait(timeout=300)
    assert info["JobState"] == "FAILED" and info["ExitCode"] == f"{code}:0", f"{info}\n{job.tail()}"
    assert [(t["job_id"], t["outcome"], t["exit_code"]) for t in job_times(job.out)] == [(job.id, outcome, code)]
    assert f"run_qa.py: {outcome} (status {code}): {reason}" in job.log(), job.tail()
    assert_no_torchrun_traceback(job.log("err"))
    assert sorted(p.name for p in job.cwd.iterdir()) == [f"bert-squad-{job.id}.err", f"bert-squad-{job.id}.out"]


@pytest.mark.slow  # a real local SLURM cluster
@pytest.mark.slurm
@pytest.mark.torchrun
def test_an_interrupted_job_not_requeued_ends_with_the_runs_status(slurm_cluster, env_file, tmp_path):
    """REQUEUE=0: the USR1 warning makes the run checkpoint and stop; the job ends with run_qa.py's 143 (torchrun
    ends with 1), recorded as interrupted with the run's reason."""
    job = submit(slurm_cluster, FT3, tmp_path, env_file, "--gres=gpu:a100:1",
                 args=[CONFIG, "--output_dir", str(tmp_path / "out")], REQUEUE=0)
    job.wait_checkpoint(10)
    slurm_cluster.run("scancel", "--signal=USR1", "--batch", job.id)
    info = job.wait(timeout=300)
    assert info["JobState"] == "FAILED" and info["ExitCode"] == "143:0" and info["Restarts"] == "0", \
        f"{info}\n{job.tail()}"
    assert [(t["outcome"], t["exit_code"]) for t in job_times(job.out)] == [("interrupted", 143)]
    assert "run_qa.py: interrupted (status 143): stopped by SIGTERM" in job.log(), job.tail()


@pytest.mark.slow  # a real local SLURM cluster
@pytest.mark.slurm
@pytest.mark.torchrun
def test_fsdp_asked_of_two_nodes_of_two_cpu_processes_trains_as_ddp_recorded_as_ddp(slurm_cluster, env_file, tmp_path):
    """job_ddp.sh on 2 nodes x 2 processes (-N 2 --gres=gpu:a100:2: torchrun starts a process per granted GPU on each
    node) with STRATEGY=fsdp and GLOBAL_BATCH=32: world size 4, every rank trains, 32 = 4 per device x 4 x accumulation
    2 sets the steps. accelerate 1.15 shards only on GPUs (on CPUs its process group is MULTI_CPU: plain DDP), so what
    trains is DDP: its checkpoints hold DDP's optimizer.pt, none of FSDP's files, and the records say no FSDP, with
    the reason among the settings adjusted to the device, never the FSDP that was asked. Sharding, sharded
    checkpoints and NCCL are for a GPU cluster to check."""
    job = submit(slurm_cluster, DDP, tmp_path, env_file, "-N", "2", "--gres=gpu:a100:2",
                 CONFIG=CONFIG, OUTPUT_DIR=tmp_path / "out", STRATEGY="fsdp", GLOBAL_BATCH=32)
    job.wait()
    job.completed()
    print(f"\njob {job.id} (job_ddp.sh fsdp 2x2): {job.seconds:.0f} s from submission to COMPLETED")
    log, env, res = job.logs(), json.loads((job.out / "environment.json").read_text()), results(job.out)
    # the world: 2 nodes x 2 processes, each rank joined and training
    assert "strategy fsdp: 2 node(s) x 2 process(es) = world size 4; rendezvous 127.0.0.1:" in log, job.tail()
    assert "--nnodes=2 --nproc_per_node=2" in log
    assert env["slurm"]["SLURM_JOB_NODELIST"] == "node[1-2]" and env["slurm"]["SLURM_GPUS_ON_NODE"] == "2"
    assert (env["distributed"]["WORLD_SIZE"], env["distributed"]["LOCAL_WORLD_SIZE"]) == ("4", "2"), env["distributed"]
    assert rank_lines(log, 4) == [0, 1, 2, 3], job.tail()
    assert res["train_setup"]["world_size"] == 4  # read from the live Trainer
    (times,) = job_times(job.out)
    assert (times["script"], times["world_size"], times["outcome"]) == ("job_ddp.sh", 4, "completed"), times
    # the global batch: 32 over 4 processes, 4 per device x accumulation 2; each rank's share of the features in
    # batches of 4, two batches a step
    cfg = env["config"]
    assert cfg["global_batch"] == 32 and (cfg["per_device_train_batch_size"], cfg["gradient_accumulation_steps"]) == (4, 2)
    assert "global_batch 32 over 4 processes: per-device batch 4 (configured 4) x gradient accumulation 2" in log
    assert "global batch 32 = per-device 4 x world size 4 x gradient accumulation 2" in log
    assert global_step(job.out) == math.ceil(math.ceil(math.ceil(res["train_features"] / 4) / 4) / 2), res
    # the run's results: every question answered, the metric's bounds
    predictions = json.loads((job.out / "predictions.json").read_text())
    assert res["eval_examples"] == len(predictions) == 60 and 0 <= res["eval_exact_match"] <= res["eval_f1"], res
    assert 0 < res["train_runtime"] < res["WALL_CLOCK_SECONDS"], res
    # what trained: DDP, not FSDP
    assert "no GPU here: accelerate does not shard on CPUs, this runs as plain DDP" in log
    checkpoints = sorted(job.out.glob("checkpoint-*"))
    assert checkpoints, sorted(p.name for p in job.out.iterdir())
    for folder in checkpoints:
        names = {p.name for p in folder.iterdir()}
        assert "optimizer.pt" in names and not {n for n in names if "fsdp" in n or n.startswith("optimizer_")}, names
    assert not cfg["fsdp"] and not cfg["fsdp_config"], (cfg["fsdp"], cfg["fsdp_config"])
    assert "the CPU has no FSDP (accelerate shards on GPUs): plain DDP" in cfg["adjusted"], cfg["adjusted"]
    assert "the CPU has no FSDP" in (job.out / "results.md").read_text()  # its "adjusted to the device" row


@pytest.mark.slow  # a real local SLURM cluster
@pytest.mark.slurm
@pytest.mark.torchrun
def test_check_jobs_say_ready_or_not_and_leave_no_run_behind(slurm_cluster, env_file, tmp_path):
    """`--check` through both scripts: job_ft3.sh and job_ddp.sh (1 node x 2 processes, the world line) without
    the header's GPU (--gres=none) are ready (status 0); job_ft3.sh granted a fake A100 that torch cannot see is not
    ready (status 2, the verdict in the .out file). Each leaves check.md and check.json in its output folder, and no
    job_time.jsonl."""
    jobs = {
        "ft3": submit(slurm_cluster, FT3, tmp_path, env_file, "--gres=none", name="check-ft3",
                      args=[CONFIG, "--check", "--output_dir", str(tmp_path / "ft3")]),
        "ddp": submit(slurm_cluster, DDP, tmp_path, env_file, "-N", "1", "--gres=none", name="check-ddp",
                      NPROC_PER_NODE=2,
                      CONFIG=CONFIG, OUTPUT_DIR=tmp_path / "ddp", RUN_ARGS="--check"),
        "gpu": submit(slurm_cluster, FT3, tmp_path, env_file, "--gres=gpu:a100:1", name="check-gpu",
                      args=[CONFIG, "--check", "--output_dir", str(tmp_path / "gpu")]),
    }
    for job in jobs.values():
        job.wait()
    for name in ("ft3", "ddp"):
        jobs[name].completed()
    gpu = jobs["gpu"]
    assert gpu.info["JobState"] == "FAILED" and gpu.info["ExitCode"] == "2:0", f"{gpu.info}\n{gpu.tail()}"
    assert "[rank0]: not ready: GPUs: SLURM_" in gpu.log() and "granted, but torch" in gpu.log(), gpu.tail()
    assert_no_torchrun_traceback(gpu.log("err"))
    for name, job in jobs.items():
        record = json.loads((job.out / "check.json").read_text())
        assert record["ready"] == (name != "gpu"), (name, record["verdict"])
        assert {p.name for p in job.out.iterdir()} == {"check.json", "check.md"}, job.tail()
        assert "check job wall clock" in job.log(), job.tail()
    world = next(c["text"] for c in json.loads((jobs["ddp"].out / "check.json").read_text())["checks"]
                 if c["check"] == "world")
    assert world.startswith("2 ranks on 1 node(s)") and world.endswith("backend gloo"), world


# ---------------------------------------------------------------------------------------------
# A check job at its time limit: not ready, never requeued (it would start over and meet the same limit)

def _check_submitted(slurm_cluster, env_file, tmp_path, *sbatch_args) -> Job:
    """A check through job_ft3.sh (header: --requeue, USR1 300 s before the limit) whose measured training steps take
    8 s each (tests/eval_hooks.py slow): more than three minutes of checking."""
    return submit(slurm_cluster, FT3, tmp_path, env_file, "--gres=none", *sbatch_args, name="check-limit",
                  args=[CONFIG, "--check", "--output_dir", str(tmp_path / "out")],
                  RUN_QA="-m tests.eval_hooks slow 8 --", PYTHONPATH=REPO)


def _stopped_not_ready_and_not_requeued(job):
    info = job.wait(timeout=600)
    assert info["JobState"] == "FAILED" and info["ExitCode"] == "2:0" and info["Restarts"] == "0", \
        f"{info}\n{job.tail()}"
    log = job.logs()
    assert "SIGUSR1 received: stopping the check, which reports it" in log, job.tail()
    assert "not requeueing a check job: it would start over" in log, job.tail()
    verdict = json.loads((job.out / "check.json").read_text())["verdict"]
    assert verdict.startswith("not ready: --time: the check was stopped by SIGTERM "), verdict
    assert f"[rank0]: {verdict}" in job.log() and log.count("the check was stopped by SIGTERM") == 1, job.tail()
    assert {p.name for p in job.out.iterdir()} == {"check.json", "check.md"}, job.tail()  # and no job_time.jsonl
    assert "check job wall clock" in job.log()
    assert_no_torchrun_traceback(job.log("err"))


@pytest.mark.slow  # a real local SLURM cluster
@pytest.mark.slurm
@pytest.mark.torchrun
def test_a_check_job_warned_before_its_time_limit_is_not_ready_and_not_requeued(slurm_cluster, env_file, tmp_path):
    """The warning --signal=B:USR1@300 sends before the time limit, sent by hand (scancel --signal=USR1 --batch) while
    the check measures: the check stops not ready (status 2, "a longer --time"), the job ends with it, Restarts=0."""
    job = _check_submitted(slurm_cluster, env_file, tmp_path)
    deadline = time.monotonic() + 300
    while "check output folder" not in job.log():  # the slowed training steps follow
        assert job.state() not in TERMINAL and time.monotonic() < deadline, job.tail()
        time.sleep(0.2)
    slurm_cluster.run("scancel", "--signal=USR1", "--batch", job.id)
    _stopped_not_ready_and_not_requeued(job)


@pytest.mark.slow  # a real local SLURM cluster
@pytest.mark.slurm
@pytest.mark.torchrun
def test_a_check_job_that_meets_its_time_limit_is_not_ready_and_not_requeued(slurm_cluster, env_file, tmp_path):
    """--time=2 (minutes: SLURM's unit) with the warning 60 s before it. slurmctld looks at time limits every 30 s and
    sends a warning due before its next look at once, so it comes 30-60 s after the start: start-up and imports are
    over (about 10 s here), the slowed check is still measuring, and the limit's own SIGTERM is a minute or more
    later, time enough for the check to say so."""
    job = _check_submitted(slurm_cluster, env_file, tmp_path, "--time=2", "--signal=B:USR1@60")
    _stopped_not_ready_and_not_requeued(job)
