"""What one task of an array job runs. jobs/launch.sh asks before srun:

    python -m studies.task CONFIG_OR_STUDY [RUN_QA ARGS...]

and reads back, one per line: the STRATEGY the task sets (empty: the job's), the config to run, then the run_qa.py
arguments. Outside an array a config comes back as it was. An array task of a config trains with the config's seed
plus the task id (unless the arguments give --seed) in OUTPUT/task<ID>-seed<SEED>; a study's task i runs cell i in
OUTPUT/task<i>-<recipe>-seed<SEED> (studies/study.py). Either way task.json in that folder records the array job, the
task, the recipe and the seed, and a study's folder gets study.json, the cells it expects: the report
(bert-squad-compare) counts the ones never started. The standard library only: nothing imports transformers here."""
import os
import sys

from qa.arguments import DEFAULT_OUTPUT_DIR, expand, last_value
from qa.errors import InputError, command
from qa.io import atomic_write_json, read_json
from studies.study import Study, config_seed, is_study, load

STUDY_RECORD, TASK_RECORD = "study.json", "task.json"


def _given(args, name) -> bool:
    return any(a == f"--{name}" or a.startswith(f"--{name}=") for a in args)


def _settings(args) -> list:
    """`args` less the ones that name a run rather than its recipe."""
    out, skip = [], False
    for a in args:
        own = a.split("=")[0] in ("--output_dir", "--seed", "--resume")
        if not skip and not own:
            out.append(a)
        skip = own and "=" not in a
    return out


def array_task(config: str, args: list, task: int) -> tuple:
    """(arguments, record) of task `task` of an array over `config`: its seed and its folder."""
    flags = expand([config, *args])[1]
    seed = int(last_value(flags, "seed")) if _given(args, "seed") else config_seed(config) + task
    folder = os.path.join(os.path.expanduser(last_value(flags, "output_dir", DEFAULT_OUTPUT_DIR)),
                          f"task{task}-seed{seed}")
    recipe = " ".join([os.path.splitext(os.path.basename(config))[0], *_settings(args)])
    return [*args, "--seed", str(seed), "--output_dir", folder], {"recipe": recipe, "seed": seed}


def study_task(study: Study, args: list, task: int) -> tuple:
    """(strategy, config, arguments, record) of cell `task` of `study`; the arguments after the cell's own win, but
    for the seed and the folder, which make the cell what it is."""
    if not 1 <= task <= len(study.cells):
        raise InputError(f"array task {task}", f"the study {study.path} has cells 1 to {len(study.cells)}",
                         f"submit --array=1-{len(study.cells)} (bert-squad-study {study.path} prints the line)")
    cell = study.cells[task - 1]
    parent = os.path.expanduser(last_value(args, "output_dir", study.output_dir))
    record_study(study, parent)
    args = [*cell.args, *args, "--seed", str(cell.seed), "--output_dir", cell.folder(parent)]
    record = {"recipe": cell.recipe, "seed": cell.seed, "study": study.path, "nodes": cell.nodes,
              "gpus_per_node": cell.gpus_per_node, "strategy": cell.strategy}
    return cell.strategy if study.scaling else "", cell.config, args, record


def record_study(study: Study, parent: str) -> None:
    cells = [{"task": c.task, "recipe": c.recipe, "seed": c.seed, "folder": os.path.basename(c.folder(parent)),
              "nodes": c.nodes, "gpus_per_node": c.gpus_per_node, "strategy": c.strategy} for c in study.cells]
    atomic_write_json(os.path.join(parent, STUDY_RECORD), {"study": study.path, "scaling": study.scaling,
                                                          "cells": cells})


def resolve(first: str, args: list, environ=os.environ) -> tuple:
    """-> (strategy or "", config, run_qa.py arguments) of this job; writes the task's record when it is a task."""
    task = environ.get("SLURM_ARRAY_TASK_ID")
    spec = read_json(first, "config file") if first.endswith(".json") else None
    if not is_study(spec) and task is None:
        return "", first, args
    if is_study(spec) and task is None:
        raise InputError(first, "a study file runs as an array job, one task per cell",
                         f"submit it with --array (bert-squad-study {first} prints the line)")
    if is_study(spec):
        strategy, config, args, record = study_task(load(first), args, int(task))
    else:
        strategy, config = "", first
        args, record = array_task(first, args, int(task))
    record.update(array_job_id=environ.get("SLURM_ARRAY_JOB_ID"), array_task_id=int(task),
                  job_id=environ.get("SLURM_JOB_ID"), config=config)
    atomic_write_json(os.path.join(last_value(args, "output_dir"), TASK_RECORD), record)
    return strategy, config, args


@command
def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    strategy, config, args = resolve(argv[0], argv[1:])
    if any("\n" in str(x) for x in [config, *args]):
        raise InputError("arguments", "an argument holds a line break", "write it on one line")
    print("\n".join([strategy, config, *args]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
