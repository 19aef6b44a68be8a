"""A student's first jobs on the local 2-node SLURM cluster (tests/conftest.py), whose nodes are smaller than the job
scripts' default request (-c 32 --mem=64G):

- the README's array command names each task's logs by array and task (NAME-ARRAY_TASK.out/.err), a plain job's
  stay NAME-JOBID.out/.err (%a in a plain job's name would be 4294967294);
- a job with the scripts' default request pends with reason PartitionConfig, for ever: the situation the check job
  and bert-squad-study now name, with the sbatch options that fit;
- the check job, submitted with options that fit, is ready and says which default cannot be met and what fits;
- bert-squad-study refuses, in one line with the fix, lines whose request the partition cannot meet, and jobs whose
  ENV_FILE does not exist."""
import json
import re
import shlex
import subprocess
import sys
import time

import pytest

from tests.helpers import REPO, SBATCH_CPU, one_error_line, write_job_env_file
from tests.test_slurm_arrays import sbatch, wait_array

FT3 = str(REPO / "job_ft3.sh")
CONFIG = "configs/smoke_tiny.json"


@pytest.fixture(scope="module")
def env_file(tmp_path_factory):
    return write_job_env_file(tmp_path_factory.mktemp("newcomerenv"))


def readme_array_options() -> list:
    """The sbatch options of the README quickstart's array command, as a student copies them."""
    text = (REPO / "README.md").read_text()
    (line,) = [line for line in text.splitlines() if line.startswith("sbatch --array=")]
    words = shlex.split(line.split("#")[0])
    return words[1:words.index("$REPO_DIR/job_ft3.sh")]


@pytest.mark.slow
@pytest.mark.slurm
def test_the_readme_array_names_logs_by_array_and_task_and_a_plain_job_keeps_its_id(slurm_cluster, env_file,
                                                                                     tmp_path):
    """Jobs that stop at once (a config that is not there): SLURM names the logs when the job starts."""
    options = [o.replace("--array=1-5", "--array=1-2") for o in readme_array_options()]
    assert "--array=1-2" in options, options
    array_dir, plain_dir = tmp_path / "array", tmp_path / "plain"
    array_dir.mkdir()
    plain_dir.mkdir()
    array = sbatch(slurm_cluster, array_dir, env_file, *options, FT3, "configs/missing.json")
    plain = sbatch(slurm_cluster, plain_dir, env_file, FT3, "configs/missing.json")
    wait_array(slurm_cluster, array, timeout=120)
    wait_array(slurm_cluster, plain, timeout=120)
    assert sorted(p.name for p in array_dir.iterdir()) == [
        f"bert-squad-{array}_{task}.{ext}" for task in (1, 2) for ext in ("err", "out")]
    assert sorted(p.name for p in plain_dir.iterdir()) == [f"bert-squad-{plain}.err", f"bert-squad-{plain}.out"]
    for err in [*array_dir.glob("*.err"), *plain_dir.glob("*.err")]:
        assert "config configs/missing.json not found" in err.read_text(), err.read_text()


@pytest.mark.slow
@pytest.mark.slurm
def test_the_scripts_default_request_pends_with_partition_config(slurm_cluster, env_file, tmp_path):
    cmd = ["sbatch", "--parsable", f"--export=ALL,ENV_FILE={env_file},REPO_DIR={REPO}", FT3, CONFIG]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=30, cwd=tmp_path, env=slurm_cluster.env)
    assert done.returncode == 0, done.stderr
    job = done.stdout.strip().split(";")[0]
    try:
        deadline, said = time.monotonic() + 30, ""
        while said != "PENDING PartitionConfig" and time.monotonic() < deadline:
            time.sleep(0.5)
            said = slurm_cluster.run("squeue", "-h", "-j", job, "-o", "%T %r").stdout.strip()
        assert said == "PENDING PartitionConfig", said
    finally:
        slurm_cluster.run("scancel", job, check=False)


@pytest.mark.slow
@pytest.mark.slurm
@pytest.mark.torchrun
def test_the_check_names_the_default_request_the_partition_cannot_meet_and_the_fix(slurm_cluster, env_file,
                                                                                    tmp_path):
    """Submitted with options that fit (-c 2 --mem=3G, no GPU): ready, and its verdict names job_ft3.sh's and
    job_ddp.sh's -c 32 --mem=64G and the options of the nodes' size (2 CPUs, their memory)."""
    out = tmp_path / "check"
    job = sbatch(slurm_cluster, tmp_path, env_file, "--gres=none", FT3, CONFIG, "--check", "--output_dir", str(out))
    info = slurm_cluster.wait(job, timeout=600)
    log = (tmp_path / f"bert-squad-{job}.out").read_text()
    assert info["JobState"] == "COMPLETED", log[-3000:]
    record = json.loads((out / "check.json").read_text())
    node = slurm_cluster.node("node1")
    fits = f"-c {node['CPUTot']} --mem={int(node['RealMemory']) // 1024}G"
    assert record["ready"] and record["verdict"] == (
        f"ready, with {fits} on every sbatch: job_ft3.sh's -c 32 --mem=64G and job_ddp.sh's -c 32 --mem=64G (their "
        f"#SBATCH defaults) cannot be met on partition gpu (at most {node['CPUTot']} CPUs and "
        f"{int(node['RealMemory']):,} MB a node, 2 GPU(s) a100): such a job pends forever (PartitionConfig)"), record
    assert f"[rank0]: {record['verdict']}" in log, log[-3000:]
    (request,) = [c for c in record["checks"] if c["check"] == "request"]
    assert request["text"].endswith("job_ft3.sh asks -c 32 --mem=64G --gres=gpu:a100:1 (more than that); "
                                    "job_ddp.sh asks -c 32 --mem=64G --gres=gpu:a100:2 (more than that)"), request


@pytest.mark.slow
@pytest.mark.slurm
def test_bert_squad_study_refuses_a_request_the_partition_cannot_meet_and_a_missing_env_file(slurm_cluster, env_file,
                                                                                             tmp_path):
    study = tmp_path / "lr.json"
    study.write_text(json.dumps({"output_dir": str(tmp_path / "study"), "config": CONFIG, "seeds": [1, 2]}))

    def study_lines(*options):
        return subprocess.run([sys.executable, "-m", "studies.submit", str(study), *options], capture_output=True,
                              text=True, timeout=60, cwd=tmp_path, env={**slurm_cluster.env, "PYTHONPATH": str(REPO)})

    export = f"--export=ALL,ENV_FILE={env_file}"
    done = study_lines(export)
    assert done.returncode == 2 and not done.stdout, done
    node = slurm_cluster.node("node1")
    assert one_error_line(done.stderr) == (
        f"error: job_ft3.sh -c 32 --mem=64G: more than partition gpu has (at most {node['CPUTot']} CPUs and "
        f"{int(node['RealMemory']):,} MB a node, 2 GPU(s) a100): the jobs would pend forever (PartitionConfig). Fix: "
        f"add -c {node['CPUTot']} --mem={int(node['RealMemory']) // 1024}G (sbatch options) to the bert-squad-study "
        "command")
    missing = tmp_path / "no.env.sh"
    done = study_lines(*SBATCH_CPU, f"--export=ALL,ENV_FILE={missing}")
    assert done.returncode == 2 and not done.stdout, done
    assert one_error_line(done.stderr).startswith(
        f"error: ENV_FILE={missing}: not found: every job sources it (setup_bert.sh writes it). Fix: "), done.stderr
    done = study_lines(*SBATCH_CPU, export)
    assert done.returncode == 0 and re.match(r"sbatch --array=1-2 ", done.stdout), done
