"""A study file: configs and run_qa.py overrides crossed with seeds, one cell per array task (task i runs cell i).
JSON like the configs:

    {"output_dir": "runs/studies/lr",
     "configs": ["configs/smoke_tiny.json"],
     "overrides": {"lr1e-3": {}, "lr3e-3": {"learning_rate": 0.003}},
     "seeds": [1, 2]}

"config" may stand for a one-config "configs"; "repeats": N for the seeds CONFIG_SEED+1 .. CONFIG_SEED+N (what a
plain `--array=1-N` gives). "shapes" (NODESxGPUS) and "strategies" (ddp, fsdp) make it a scaling study: the 1x1
baseline once per repeat, every other shape once per strategy. Cells go repeat by repeat, so a slow hour on the
cluster, or an array cut short, touches every recipe. Relative config paths are looked up beside the study file,
in the current folder, then in the repository. The standard library only: jobs/launch.sh reads it before srun."""
import os
import re
from dataclasses import dataclass, field
from pathlib import Path

from qa.arguments import expand, last_value, to_flags
from qa.errors import InputError
from qa.io import read_json

REPO = Path(__file__).resolve().parents[1]
DEFAULT_SEED = 42  # transformers' own, what a config without a seed trains with
KEYS = {"_comment", "output_dir", "config", "configs", "overrides", "seeds", "repeats", "shapes", "strategies"}
NAME = re.compile(r"^[A-Za-z0-9_.=+-]+$")


def is_study(obj) -> bool:
    return isinstance(obj, dict) and bool({"configs", "seeds", "repeats"} & set(obj))


@dataclass
class Cell:
    task: int
    recipe: str
    seed: int
    config: str
    args: list = field(default_factory=list)  # run_qa.py flags of the recipe (the overrides; a shape's own)
    nodes: int = 1
    gpus_per_node: int = 1
    strategy: str = "ddp"

    def folder(self, parent: str) -> str:
        return os.path.join(parent, f"task{self.task}-{self.recipe}-seed{self.seed}")


@dataclass
class Study:
    path: str
    output_dir: str
    cells: list
    scaling: bool


def _problem(path, problem, fix="see docs/slurm.md, 'A study'"):
    return InputError(str(path), problem, fix)


def config_seed(config: str) -> int:
    return int(last_value(expand([config])[1], "seed", DEFAULT_SEED))


def find_config(name: str, beside: Path) -> str:
    for folder in (beside, Path.cwd(), REPO):
        if (folder / name).is_file():
            return str((folder / name).resolve())
    raise _problem(name, "config file not found (looked beside the study file, here and in the repository)",
                   "check the path (configs/ lists the shipped ones)")


def _shapes(path, spec) -> list:
    shapes = spec.get("shapes")
    if shapes is None:
        return [None]
    bad = [s for s in shapes if not re.fullmatch(r"[1-9][0-9]*x[1-9][0-9]*", str(s))]
    if bad or not shapes:
        raise _problem(path, f"bad shapes {bad or shapes}", "give NODESxGPUS_PER_NODE, e.g. [\"1x1\", \"2x2\"]")
    strategies = spec.get("strategies", ["ddp"])
    if not strategies or set(strategies) - {"ddp", "fsdp"}:
        raise _problem(path, f"bad strategies {strategies}", "use ddp and/or fsdp")
    out = []
    for shape in shapes:
        nodes, per = map(int, shape.split("x"))
        out += [(1, 1, "ddp")] if nodes * per == 1 else [(nodes, per, s) for s in strategies]
    return out


def load(path) -> Study:
    """The study's cells, numbered from 1; InputError (one line) on anything the file gets wrong."""
    spec = read_json(path, "study file")
    if not is_study(spec):
        raise _problem(path, "not a study file (no configs, seeds or repeats)", "see docs/slurm.md, 'A study'")
    unknown = set(spec) - KEYS
    if unknown:
        raise _problem(path, f"unknown keys {sorted(unknown)}", f"use only {sorted(KEYS - {'_comment'})}")
    beside = Path(path).resolve().parent
    configs = spec.get("configs") or [spec.get("config") or "configs/reference.json"]
    configs = [find_config(str(c), beside) for c in configs]
    overrides = spec.get("overrides") or {"": {}}
    if not isinstance(overrides, dict) or not all(isinstance(v, dict) for v in overrides.values()) \
            or not all(NAME.match(k) or k == "" for k in overrides):
        raise _problem(path, "overrides must map a name (letters, digits, _.=+-) to run_qa.py settings",
                       "write e.g. {\"lr3e-4\": {\"learning_rate\": 3e-4}}")
    seeds, repeats = spec.get("seeds"), spec.get("repeats")
    if (seeds is None) == (repeats is None):
        raise _problem(path, "give either seeds (a list) or repeats (a number)", "e.g. \"seeds\": [1, 2, 3]")
    if seeds is not None and not (seeds and all(isinstance(s, int) and 0 <= s < 2 ** 32 for s in seeds)):
        raise _problem(path, f"seeds {seeds} must be whole numbers from 0 to 4294967295", "e.g. [1, 2, 3]")
    if repeats is not None and not (isinstance(repeats, int) and repeats > 0):
        raise _problem(path, f"repeats={repeats} must be a positive whole number", "e.g. 3")
    shapes = _shapes(path, spec)
    cells = []
    for r in range(len(seeds) if seeds is not None else repeats):
        for config in configs:
            seed = seeds[r] if seeds is not None else config_seed(config) + r + 1
            for name, settings in overrides.items():
                for shape in shapes:
                    parts = [Path(config).stem] * (len(configs) > 1 or not name) + [name] * bool(name)
                    cell = Cell(len(cells) + 1, "-".join(parts), seed, config, to_flags(settings))
                    if shape:
                        cell.nodes, cell.gpus_per_node, cell.strategy = shape
                        cell.recipe += f"-{cell.strategy}-{cell.nodes}x{cell.gpus_per_node}"
                        # the study's measurement of its communication (scaling/comm_measure.py): several processes
                        cell.args += ["--measure_communication", "true"] * (cell.nodes * cell.gpus_per_node > 1)
                    cells.append(cell)
    output = spec.get("output_dir") or os.path.join("runs", "studies", Path(path).stem)
    return Study(str(Path(path).resolve()), os.path.expanduser(output), cells, spec.get("shapes") is not None)
