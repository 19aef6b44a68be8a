"""Where each split comes from: data files, the Hugging Face Hub or the generator, and the
official SQuAD v1.1 dev set that tests and benchmarks read.

Every source ends the same way: a Table (qa.data.normalise), validated (qa.data.validate),
as a `datasets.Dataset` with the columns of the Hub's `rajpurkar/squad`.
"""
import contextlib
import gc
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Optional, Sequence

from qa.errors import InputError
from qa.data.files import read_raw_file
from qa.data.normalise import COLUMNS, squad_features, table_from_columns, table_from_nested, table_from_raw
from qa.data.validate import validate

SPLITS = ("train", "validation", "test")
SETUP_SCRIPT = "setup_bert.sh"
# The official SQuAD v1.1 dev set, which the tests and benchmarks read: $SQUAD_DEV (the file as
# published, plain or gzip-compressed), else this file in a shared/ folder beside the repository.
SQUAD_DEV_VARIABLE = "SQUAD_DEV"
SQUAD_DEV_DEFAULT = Path(__file__).resolve().parents[3] / "shared" / "data" / "squad" / "dev-v1.1.json.gz"
SQUAD_DEV_URL = "https://rajpurkar.github.io/SQuAD-explorer/dataset/dev-v1.1.json"
# Seed offsets of the synthetic evaluation splits, so they never repeat the training questions.
SYNTHETIC_SEED_OFFSET = {"train": 0, "validation": 1_000_003, "test": 2_000_006}


def load_raw_datasets(data_args, splits: Sequence[str] = SPLITS, cache_dir: Optional[str] = None):
    """Return a `datasets.DatasetDict` with the requested splits, validated.

    Each split comes from `data_args.<split>_file` when that is set, otherwise from
    `data_args.dataset_name`: "synthetic" for generated data, else a Hub dataset id (its
    "validation" split serves "validation"). `train_articles` / `validation_articles` then keep a
    slice "START:STOP" of the split's articles (grouped by title, in order of first appearance).
    Synthetic data: train has `synthetic_train_examples` questions from `synthetic_seed`;
    validation and test have `synthetic_eval_examples` each, from seeds derived from it
    (`SYNTHETIC_SEED_OFFSET`), so they never repeat the training questions.
    """
    from datasets import DatasetDict

    hub = None
    out = {}
    for split in splits:
        if split not in SPLITS:
            raise ValueError(f"unknown split {split!r}; expected one of {SPLITS}")
        path = getattr(data_args, f"{split}_file", None)
        if path:
            dataset = read_squad(path, data_args.version_2_with_negative,
                                 require_answers=split != "test").dataset
        elif data_args.dataset_name == "synthetic":
            dataset = _load_synthetic(data_args, split)
        elif data_args.dataset_name:
            if hub is None:
                hub = _load_hub(data_args.dataset_name, data_args.dataset_config_name, cache_dir)
            dataset = _hub_split(hub, data_args, split)
        else:
            raise InputError(f"split {split!r}", "no data source is given",
                             f"pass --{split}_file FILE or --dataset_name (e.g. rajpurkar/squad)")
        articles = getattr(data_args, f"{split}_articles", None)
        if articles:
            source = path or f"dataset {data_args.dataset_name!r}"
            dataset = select_articles(dataset, articles, f"--{split}_articles", source)
        out[split] = dataset
    return DatasetDict(out)


def squad_dev_path() -> Path:
    """Where the official SQuAD v1.1 dev set is looked for: $SQUAD_DEV, else SQUAD_DEV_DEFAULT."""
    given = os.environ.get(SQUAD_DEV_VARIABLE)
    return Path(given).expanduser() if given else SQUAD_DEV_DEFAULT


def require_squad_dev(path, option: str = "--dev", synthetic: bool = False) -> Path:
    """`path` when it is a file, else the InputError that says how to get the dev set: nothing
    stands in for it unless asked for (`synthetic`: the caller takes --dataset_name synthetic)."""
    if path is not None and Path(path).is_file():
        return Path(path)
    instead = "; or --dataset_name synthetic to time generated data instead" if synthetic else ""
    raise InputError(f"{option} {path}", "the official SQuAD v1.1 dev set is not there",
                     f"download it once (curl -LO {SQUAD_DEV_URL}, on a machine with internet) and set "
                     f"{SQUAD_DEV_VARIABLE}=/path/to/dev-v1.1.json, or pass its path ({option} PATH){instead}")


def split_source(config: dict, split: str) -> str:
    """Where load_raw_datasets takes `split` from, in words, from a run's resolved configuration
    (the arguments as a dict): the file given for the split, else the synthetic data or the Hub
    dataset, with the article slice when one was kept."""
    path = config.get(f"{split}_file")
    name = config.get("dataset_name")
    if path:
        source = str(path)
    elif name == "synthetic":
        count = config.get("synthetic_train_examples" if split == "train" else "synthetic_eval_examples")
        source = f"synthetic ({count:,} generated questions)" if count else "synthetic"
    elif name:
        config_name = config.get("dataset_config_name")
        source = f"{name}{f' ({config_name})' if config_name else ''}, split {split}"
    else:
        source = "none given"
    articles = config.get(f"{split}_articles")
    return f"{source}, articles {articles}" if articles else source


@dataclass(frozen=True)
class SquadFile:
    """A data file as read: its questions and what the file says about itself."""
    dataset: "object"            # datasets.Dataset; no `answers` column when `labelled` is False
    version: Optional[str]       # the official JSON's "version" field, if any
    version_2: bool              # SQuAD v2.0: declared "v2.0", or some question is_impossible
    labelled: bool


def read_squad(path, version_2_with_negative: Optional[bool] = None, require_answers: bool = True,
               check_answer_spans: bool = True) -> SquadFile:
    """Read and validate one data file in any accepted format (see docs/data.md).

    `version_2_with_negative` None: as the file declares itself (what the official scorers do).
    `require_answers` False: the file may be unlabelled (see docs/data.md).
    `check_answer_spans` False skips only the check that each answer sits at its answer_start:
    scoring compares answer texts, so a position that is off matters to training, not to the metric.
    """
    path = os.fspath(path)
    with _gc_paused():
        table = table_from_raw(read_raw_file(path), require_answers)
        version_2 = table.declares_v2 if version_2_with_negative is None else version_2_with_negative
        if not require_answers and not version_2 and not any(a["text"] for a in table.answers):
            table.has_answers = False  # v1.1 knows no unanswerable question: empty lists mean no labels
        validate(table, version_2, check_answer_spans)
        return SquadFile(table.to_dataset(), table.version, version_2, table.has_answers)


def select_articles(dataset, spec: str, option: str = "--train_articles", source: str = "the data"):
    """Keep the articles `spec` ("START:STOP") selects, grouped by title in order of appearance."""
    chosen_slice = parse_slice(spec, option)
    titles = dataset["title"][:]
    order = list(dict.fromkeys(titles))
    chosen = set(order[chosen_slice])
    if not chosen:
        raise InputError(f"{option} {spec!r}", f"selects none of the {len(order)} articles of "
                         f"{source}",
                         f"give a slice within 0:{len(order)}, e.g. '0:{max(1, len(order) // 2)}'")
    return dataset.select([i for i, title in enumerate(titles) if title in chosen])


def parse_slice(spec: str, option: str = "--train_articles") -> slice:
    """Parse "START:STOP" (either side may be empty, negative counts from the end)."""
    match = re.fullmatch(r"\s*([+-]?\d+)?\s*:\s*([+-]?\d+)?\s*", str(spec))
    if not match:
        raise InputError(f"{option} {spec!r}", "is not a slice START:STOP",
                         "give e.g. '0:40' (the first 40 articles), '40:' (all from the 41st) "
                         "or ':-8' (all but the last 8)")
    start, stop = (int(x) if x is not None else None for x in match.groups())
    return slice(start, stop)


@contextlib.contextmanager
def _gc_paused():
    """Building ~10^5 small objects triggers Python's cycle collector over and over; the parsed
    data has no cycles, so pausing it about halves the time to load a file."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


# ----------------------------------------------------------------------------------------------
# Generated and Hub data


def synthetic_squad(split: str, questions: int, seed: int, version_2: bool) -> dict:
    """The generated `split` as official SQuAD JSON: `questions` questions from `seed` (the
    run's --synthetic_seed) and the split's offset. The first N questions of a split are
    synthetic_squad(split, N, ...): the generator gives a smaller count the first questions of a
    larger one."""
    # Imported here, not with the package: `python -m qa.data.synthetic` would find it imported.
    from qa.data.synthetic import make_synthetic_squad

    return make_synthetic_squad(questions, seed + SYNTHETIC_SEED_OFFSET[split], version_2)


def _load_synthetic(data_args, split: str):
    n = (data_args.synthetic_train_examples if split == "train"
         else data_args.synthetic_eval_examples)
    squad = synthetic_squad(split, n, data_args.synthetic_seed, data_args.version_2_with_negative)
    seed = data_args.synthetic_seed + SYNTHETIC_SEED_OFFSET[split]
    table = table_from_nested(squad["data"], f"synthetic {split} data (seed {seed})", True)
    validate(table, data_args.version_2_with_negative)
    return table.to_dataset()


def _load_hub(name: str, config: Optional[str], cache_dir: Optional[str]):
    import datasets
    from datasets.exceptions import DatasetNotFoundError
    try:
        return datasets.load_dataset(name, config, cache_dir=cache_dir)
    except Exception as exc:
        offline = datasets.config.HF_HUB_OFFLINE
        if offline or _is_network_error(exc):
            raise _not_cached_error(name, config, cache_dir, offline) from exc
        if isinstance(exc, DatasetNotFoundError):
            raise InputError(f"Hub dataset {name!r}", "does not exist on the Hub or needs a login",
                             "check --dataset_name (e.g. rajpurkar/squad or rajpurkar/squad_v2), "
                             "or run `hf auth login` for a gated dataset") from exc
        raise


def _not_cached_error(name: str, config: Optional[str], cache_dir: Optional[str],
                      offline: bool) -> InputError:
    """Compute nodes have no internet: the dataset must be fetched on a login node first."""
    import datasets
    cache = cache_dir or datasets.config.HF_DATASETS_CACHE
    why = ("offline mode is on (HF_DATASETS_OFFLINE / HF_HUB_OFFLINE)" if offline
           else "the Hub cannot be reached")
    env = f"DATASET={name}" + (f" DATASET_CONFIG={config}" if config else "")
    not_cache_dir = (f" and without --cache_dir (it fills HF_HOME, not {cache_dir})"
                     if cache_dir else "")
    return InputError(f"Hub dataset {name!r}", f"cannot be loaded: {why} and it is not in the "
                      f"cache {cache}",
                      f"on a login node with internet run `{env} ./{SETUP_SCRIPT}` to pre-fetch it "
                      "into $HF_CACHE_DIR, then run this job with HF_HOME set to that directory "
                      f"(source the env file {SETUP_SCRIPT} writes){not_cache_dir}; or pass "
                      "--train_file / --validation_file")


def _is_network_error(exc: BaseException) -> bool:
    if isinstance(exc, (ConnectionError, TimeoutError)):
        return True
    names = " ".join(cls.__name__ for cls in type(exc).__mro__)
    return any(word in names for word in ("Connect", "Timeout", "Offline"))


def _hub_split(hub, data_args, split: str):
    name = data_args.dataset_name
    where = f"Hub dataset {name!r}, split {split!r}"
    if split not in hub:
        raise InputError(f"Hub dataset {name!r}", f"has no {split!r} split (it has: "
                         f"{', '.join(hub)})", f"pass --{split}_file FILE")
    dataset = hub[split]
    columns = {c: dataset[c][:] for c in COLUMNS if c in dataset.column_names}
    table = table_from_columns(columns, where, True, locate=lambda i: f"row {i}")
    validate(table, data_args.version_2_with_negative)
    if list(dataset.column_names) == list(COLUMNS) and dataset.features == squad_features():
        return dataset
    return table.to_dataset()
