"""A real 2-node SLURM cluster on this machine, for the tests (the slurm_cluster fixture, tests/conftest.py) and for
bench/job_start.py: ``tools/slurm_local.sh`` (slurm-wlm 22.05 + munge, nodes node1/node2 with two
fake A100s each, partition ``gpu``) on free ports. A cluster is always stopped by the PIDs in its
pid files, never by process name.
"""
from __future__ import annotations

import os
import re
import socket
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "tools" / "slurm_local.sh"
TERMINAL = {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "PREEMPTED",
            "OUT_OF_MEMORY", "BOOT_FAIL", "DEADLINE"}
# "Key=Value" pairs of `scontrol -o`; values may hold '=' (TRES=cpu=1,...) or spaces.
_KV = re.compile(r"(?:^|\s)([A-Za-z][\w:/.]*)=(.*?)(?=\s[A-Za-z][\w:/.]*=|$)")


def parse_kv(line: str) -> dict[str, str]:
    return {k: v for k, v in _KV.findall(line.strip())}


def alive(pid: int) -> bool:
    """Running, not a zombie (PID 1 here reaps exited daemons only now and then)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def free_port_base(start: int = 17000, step: int = 10, tries: int = 50) -> int:
    """First base where base, base+1, base+2 (slurmctld, node1, node2) can all be bound."""
    for base in range(start, start + step * tries, step):
        socks = []
        try:
            for port in range(base, base + 3):
                s = socket.socket()
                socks.append(s)
                s.bind(("", port))
            return base
        except OSError:
            continue
        finally:
            for s in socks:
                s.close()
    raise RuntimeError("no free port range for a local SLURM cluster")


def slurm_script(*args: str, env: dict | None = None, timeout: float = 120):
    return subprocess.run(["bash", str(SCRIPT), *args], capture_output=True, text=True,
                          env=env, timeout=timeout)


def clean_env(conf: Path) -> dict[str, str]:
    """os.environ + SLURM_CONF, without SLURM_*/SBATCH_*/SRUN_* from any enclosing job."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("SLURM_", "SBATCH_", "SRUN_", "SALLOC_"))}
    env["SLURM_CONF"] = str(conf)
    env["PATH"] = env.get("PATH", "/usr/bin:/bin") + ":/usr/sbin:/sbin"
    return env


@dataclass
class SlurmCluster:
    dir: Path
    port: int
    conf: Path = field(init=False)
    env: dict[str, str] = field(init=False)

    def __post_init__(self):
        self.conf = self.dir / "slurm.conf"
        self.env = clean_env(self.conf)
        self.jobs_dir = self.dir / "jobs"

    # --- lifecycle -------------------------------------------------------------------------
    def start(self) -> None:
        env = dict(self.env, SLURM_LOCAL_PORT=str(self.port))
        r = slurm_script("start", str(self.dir), env=env)
        if r.returncode != 0:
            logs = "\n".join(f"--- {p.name}\n" + p.read_text()[-2000:]
                             for p in sorted((self.dir / "log").glob("*.log")))
            self.stop()
            raise RuntimeError(f"slurm_local.sh start failed: {r.stderr}\n{logs}")
        self.jobs_dir.mkdir(exist_ok=True)

    def stop(self) -> None:
        slurm_script("stop", str(self.dir), env=self.env)

    def pids(self) -> dict[str, int]:
        """PIDs of this cluster's daemons (from pid files) that are still alive."""
        out = {}
        for f in sorted((self.dir / "run").glob("*.pid")):
            try:
                pid = int(f.read_text().split()[0])
            except (OSError, ValueError, IndexError):
                continue
            if alive(pid):
                out[f.stem] = pid
        return out

    # --- commands ----------------------------------------------------------------------------
    def run(self, *cmd: str, check: bool = True, timeout: float = 30,
            env: dict | None = None) -> subprocess.CompletedProcess:
        return subprocess.run(list(cmd), capture_output=True, text=True, check=check,
                              timeout=timeout, env={**self.env, **(env or {})})

    def sbatch(self, script: str | os.PathLike, *args: str, env: dict | None = None,
               cwd: str | os.PathLike | None = None) -> str:
        """Submit a script (a path, or the script's text starting with '#!'); return job id."""
        if isinstance(script, str) and script.startswith("#!"):
            path = self.jobs_dir / f"job-{time.monotonic_ns()}.sh"
            path.write_text(script)
            script = path
        r = subprocess.run(["sbatch", "--parsable", *args, str(script)], capture_output=True,
                           text=True, timeout=30, cwd=str(cwd or self.jobs_dir),
                           env={**self.env, **(env or {})})
        if r.returncode != 0:
            raise RuntimeError(f"sbatch failed: {r.stderr.strip()}")
        return r.stdout.strip().split(";")[0]

    def job(self, jobid: str) -> dict[str, str] | None:
        """`scontrol show job -o` as a dict; the jobcomp record once the job is purged."""
        r = self.run("scontrol", "show", "job", "-o", str(jobid), check=False)
        if r.returncode == 0 and r.stdout.strip():
            return parse_kv(r.stdout.splitlines()[0])
        comp = self.dir / "jobcomp.txt"
        recs = [parse_kv(line) for line in comp.read_text().splitlines()] if comp.exists() else []
        recs = [d for d in recs if d.get("JobId") == str(jobid)]
        return recs[-1] if recs else None

    def wait(self, jobid: str, timeout: float = 60, poll: float = 0.2) -> dict[str, str]:
        """Poll until the job reaches a final state; return its `scontrol show job` fields
        (JobState, ExitCode, NodeList, Restarts, StdOut, ...). A requeued job is not final."""
        deadline = time.monotonic() + timeout
        info = None
        while time.monotonic() < deadline:
            info = self.job(jobid)
            if info and info.get("JobState") in TERMINAL:
                return info
            time.sleep(poll)
        raise TimeoutError(f"job {jobid} not finished after {timeout}s: {info}")

    def wait_file(self, path: Path, timeout: float = 30) -> None:
        deadline = time.monotonic() + timeout
        while not Path(path).exists():
            if time.monotonic() > deadline:
                raise TimeoutError(f"{path} did not appear in {timeout}s")
            time.sleep(0.1)

    def node(self, name: str) -> dict[str, str]:
        return parse_kv(self.run("scontrol", "show", "node", "-o", name).stdout)


def start_cluster(path: Path) -> SlurmCluster:
    """Start a cluster in `path` on free ports (callers must stop it)."""
    cluster = SlurmCluster(path, free_port_base())
    cluster.start()
    return cluster
