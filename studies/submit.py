"""bert-squad-study: the sbatch line(s) that run a study file, one array task per cell; printed, or submitted.

    bert-squad-study STUDY.json [--submit] [--parallel N] [--script JOB] [SBATCH OPTIONS...] [-- RUN_QA ARGS...]

A study of recipes and seeds is one array (`--array=1-N`, `%N` with --parallel: at most N at once) of job_ft3.sh
(--script job_ddp.sh for several GPUs per task). A scaling study (shapes) is one array per shape: its 1x1 cells
with job_ft3.sh, the others with job_ddp.sh on NODES nodes of GPUS GPUs, all with --no-requeue (a resumed run's
training time covers its last part only). Logs go to OUTPUT/logs/; options not listed go to sbatch as they are,
what follows `--` to every run. Refused, before anything is printed or submitted: jobs that would pend forever on
the partition's nodes (more CPUs, memory or GPUs a node than they have: PartitionConfig), or whose ENV_FILE is
missing. Then: bert-squad-compare OUTPUT."""
import argparse
import os
import shlex
import subprocess
import sys
from itertools import groupby

from qa.arguments import last_value
from qa.errors import InputError, command, environment_file
from studies.study import REPO, load

# sbatch's spellings of what a job asks a node for, and of the partition it asks
ASKS = {"-c": "cpus", "--cpus-per-task": "cpus", "--mem": "mem", "--mem-per-cpu": "mem_per_cpu", "--gres": "gres",
        "-p": "partition", "--partition": "partition", "--export": "export"}
MB = {"K": 1 / 1024, "M": 1, "G": 1024, "T": 1024 ** 2}


def asked(script, options=()) -> dict:
    """What a job of SCRIPT asks: its #SBATCH lines, then the sbatch options, the last one winning as in sbatch."""
    words = [w for line in (REPO / script).read_text().splitlines() if line.startswith("#SBATCH")
             for w in shlex.split(line)[1:]] + list(options)
    found = {}
    for i, word in enumerate(words):
        key, eq, value = word.partition("=")
        if key in ASKS and (eq or i + 1 < len(words)):
            found[ASKS[key]] = value if eq else words[i + 1]
            if key in ("--mem", "--mem-per-cpu"):  # sbatch takes one or the other
                found.pop("mem" if key == "--mem-per-cpu" else "mem_per_cpu", None)
    return found


def megabytes(size: str) -> int:
    """sbatch's --mem: a number of MB, or with a K, M, G or T suffix."""
    unit = size[-1:].upper()
    return int(float(size[:-1]) * MB[unit]) if unit in MB else int(size)


def gpus(gres: str) -> dict:
    """gpu:a100:2(S:0-1),gpu:v100:1 -> {"a100": 2, "v100": 1}; an untyped gpu:2 as type ""."""
    found = {}
    for item in gres.split(","):
        parts = item.split("(")[0].split(":")
        if parts[0] == "gpu" and len(parts) > 1:
            kind = parts[1] if len(parts) > 2 else ""
            found[kind] = found.get(kind, 0) + int(parts[-1] if parts[-1].isdigit() else 1)
    return found


def slurm(*cmd) -> str | None:
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.SubprocessError):
        return None
    return done.stdout if done.returncode == 0 else None


def partition_nodes(partition=None):
    """(partition, [(cpus, MB, {gpu type: count})] a job may have of each node, capped by the partition's
    MaxCPUsPerNode and MaxMemPerNode), the default partition if none is named; None where SLURM does not answer."""
    listed = slurm("scontrol", "show", "partition", "-o", *([partition] if partition else []))
    fields = [dict(kv.split("=", 1) for kv in line.split() if "=" in kv) for line in (listed or "").splitlines()]
    fields = [f for f in fields if partition or f.get("Default") == "YES"]
    nodes = fields and slurm("sinfo", "-h", "-N", "-p", fields[0]["PartitionName"], "-o", "%c|%m|%G")
    if not nodes:
        return None
    cap = {k: int(fields[0][k]) if fields[0].get(k, "").isdigit() else float("inf")
           for k in ("MaxCPUsPerNode", "MaxMemPerNode")}
    return fields[0]["PartitionName"], [(min(int(c), cap["MaxCPUsPerNode"]), min(int(m), cap["MaxMemPerNode"]), gpus(g))
                                        for c, m, g in (line.split("|") for line in nodes.split())]


def unmet(request: dict, nodes: list):
    """(what of the request no node can meet, the sbatch options that fit the roomiest node), or None."""
    cpus = int(request.get("cpus", 1))
    mem = megabytes(request["mem"]) if "mem" in request else \
        cpus * megabytes(request["mem_per_cpu"]) if "mem_per_cpu" in request else 0
    kind, count = next(iter(gpus(request.get("gres", "none")).items()), ("", 0))

    def has(node):
        return sum(n for k, n in node[2].items() if k == kind or not kind)

    if any(node[0] >= cpus and node[1] >= mem and has(node) >= count for node in nodes):
        return None
    best = max(nodes, key=lambda node: (has(node) >= count, node[0], node[1]))
    short, fits = [], []
    if best[0] < cpus:
        short.append(f"-c {cpus}")
        fits.append(f"-c {best[0]}")
    if best[1] < mem:
        short.append(f"--mem={request['mem']}" if "mem" in request else f"--mem-per-cpu={request['mem_per_cpu']}")
        fits.append(f"--mem={best[1] // 1024}G" if best[1] >= 1024 else f"--mem={best[1]}M")
    if has(best) < count:
        short.append(f"--gres={request['gres']}")
        kinds = [f"gpu:{k}:{min(n, count)}".replace("::", ":") for k, n in best[2].items()]
        fits.append(f"--gres={kinds[0]}" if kinds else "--gres=none")
    return " ".join(short), " ".join(fits)


def spelled(request: dict) -> str:
    """The request as sbatch options: -c 32 --mem=64G --gres=gpu:a100:1."""
    return " ".join(f"{flag}{request[key]}" for flag, key in (("-c ", "cpus"), ("--mem=", "mem"),
                                                               ("--mem-per-cpu=", "mem_per_cpu"), ("--gres=", "gres"))
                    if key in request)


def offered(nodes: list) -> str:
    """What the roomiest node offers a job, in words."""
    cpus, mem, kinds = max(nodes, key=lambda node: node[:2])
    return f"at most {cpus} CPUs and {mem:,} MB a node, " + (", ".join(
        f"{n} GPU(s) {k}".rstrip() for k, n in kinds.items()) or "no GPUs")


def jobs_env_file(options) -> str:
    """The ENV_FILE jobs/launch.sh will source: --export's, the submitting shell's where --export passes it, else
    its default."""
    export = asked("job_ft3.sh", options).get("export", "ALL").split(",")
    given = next((item.split("=", 1)[1] for item in export if item.startswith("ENV_FILE=")), None)
    shell = os.environ.get("ENV_FILE") if "ALL" in export else None
    store = os.environ.get("STORE") or os.path.expanduser("~")
    return given or shell or os.path.join(store, "venvs", "bert-squad.env.sh")


def refuse_what_cannot_run(lines) -> None:
    """InputError for jobs that could never run: an ENV_FILE that is missing (they stop at once), or a request no
    node of the partition can meet (they pend forever, PartitionConfig, or sbatch refuses them)."""
    for line in lines:
        at = next(i for i, word in enumerate(line) if word in (str(REPO / "job_ft3.sh"), str(REPO / "job_ddp.sh")))
        script, options = os.path.basename(line[at]), line[1:at]
        env = jobs_env_file(options)
        if not os.path.isfile(env):
            found = environment_file()
            raise InputError(f"ENV_FILE={env}", "not found: every job sources it (setup_bert.sh writes it)",
                             f"add --export=ALL,ENV_FILE={found}" if found else
                             "run ./setup_bert.sh first, or add --export=ALL,ENV_FILE=/path/to/env.sh")
        request = asked(script, options)
        partition = partition_nodes(request.get("partition"))
        short = partition and unmet(request, partition[1])
        if short:
            raise InputError(f"{script} {short[0]}", f"more than partition {partition[0]} has "
                             f"({offered(partition[1])}): the jobs would pend forever (PartitionConfig)",
                             f"add {short[1]} (sbatch options) to the bert-squad-study command")


def ranges(tasks) -> str:
    """1,2,3,7 -> '1-3,7' (SLURM's own spelling of an array's task ids)."""
    runs = [[t for _, t in g] for _, g in groupby(enumerate(sorted(tasks)), lambda p: p[1] - p[0])]
    return ",".join(f"{r[0]}-{r[-1]}" if len(r) > 1 else str(r[0]) for r in runs)


def commands(study, script, parallel=None, sbatch=(), run=()) -> list:
    out = os.path.abspath(last_value(list(run), "output_dir", study.output_dir))
    shapes = {}
    for cell in study.cells:
        shapes.setdefault((cell.nodes, cell.gpus_per_node) if study.scaling else None, []).append(cell.task)
    lines = []
    for shape, tasks in shapes.items():
        array = ranges(tasks) + (f"%{parallel}" if parallel else "")
        opts, job = [], script
        if shape is not None:
            nodes, per = shape
            job = "job_ft3.sh" if nodes * per == 1 else "job_ddp.sh"
            opts = ["-N", str(nodes), f"--gres=gpu:a100:{per}", "--no-requeue"]
        lines.append(["sbatch", f"--array={array}", "-J", os.path.splitext(os.path.basename(study.path))[0],
                      f"--output={out}/logs/%x-%A_%a.out", f"--error={out}/logs/%x-%A_%a.err", *opts, *sbatch,
                      str(REPO / job), study.path, *run])
    return lines


@command
def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    run = argv[argv.index("--") + 1:] if "--" in argv else []
    parser = argparse.ArgumentParser(prog="bert-squad-study", description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    parser.add_argument("study", help="the study file (JSON)")
    parser.add_argument("--submit", action="store_true", help="submit, not only print")
    parser.add_argument("--parallel", type=int, help="at most this many tasks of an array at once (%%N)")
    parser.add_argument("--script", default="job_ft3.sh", choices=["job_ft3.sh", "job_ddp.sh"])
    args, sbatch = parser.parse_known_args(argv[:len(argv) - len(run) - bool(run)])
    study = load(args.study)
    lines = commands(study, args.script, args.parallel, sbatch, run)
    refuse_what_cannot_run(lines)
    out = os.path.abspath(last_value(run, "output_dir", study.output_dir))
    for line in lines:
        if not args.submit:
            print(shlex.join(line))
            continue
        os.makedirs(os.path.join(out, "logs"), exist_ok=True)  # sbatch does not make the folder of --output
        done = subprocess.run([line[0], "--parsable", *line[1:]], capture_output=True, text=True)
        if done.returncode != 0:
            raise InputError(shlex.join(line), f"sbatch failed: {done.stderr.strip()}", "fix the options and rerun")
        print(f"array job {done.stdout.strip().split(';')[0]}: {line[1]} -> {out}")
    print(f"{len(study.cells)} cells; the report: bert-squad-compare {out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
