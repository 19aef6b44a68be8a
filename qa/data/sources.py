"""Where each split comes from (data files, the Hub or the generator), each a validated table (qa/data/table.py)."""
import gc
import os
import re
from dataclasses import dataclass
from typing import Optional, Sequence

from qa.errors import InputError
from qa.data.synthetic import synthetic_squad
from qa.data.table import read_table, squad_features, table_from_columns, table_from_nested, validate

SPLITS = ("train", "validation", "test")
SETUP_SCRIPT = "setup_bert.sh"


def load_raw_datasets(data_args, splits: Sequence[str] = SPLITS, cache_dir: Optional[str] = None):
    from datasets import DatasetDict

    hub, out = None, {}
    for split in splits:
        if path := getattr(data_args, f"{split}_file", None):
            dataset = read_squad(path, data_args.version_2_with_negative, require_answers=split != "test").dataset
        elif data_args.dataset_name == "synthetic":
            dataset = _load_synthetic(data_args, split)
        elif data_args.dataset_name:
            hub = hub or _load_hub(data_args.dataset_name, data_args.dataset_config_name, cache_dir)
            dataset = _hub_split(hub, data_args, split)
        else:
            raise InputError(f"split {split!r}", "no data source is given",
                             f"pass --{split}_file FILE or --dataset_name (e.g. rajpurkar/squad)")
        if articles := getattr(data_args, f"{split}_articles", None):
            source = path or f"dataset {data_args.dataset_name!r}"
            dataset = select_articles(dataset, articles, f"--{split}_articles", source)
        out[split] = dataset
    return DatasetDict(out)


def split_source(config: dict, split: str) -> str:
    """Where load_raw_datasets takes `split` from, in words, from a run's configuration as a dict."""
    path, name = config.get(f"{split}_file"), config.get("dataset_name")
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
    dataset: "object"       # datasets.Dataset; no `answers` column when the file has no labels
    version: Optional[str]  # the official JSON's "version" field, if any
    version_2: bool         # SQuAD v2.0: declared "v2.0", or some question is_impossible


def read_squad(path, version_2_with_negative: Optional[bool] = None, require_answers: bool = True,
               check_answer_spans: bool = True) -> SquadFile:
    """One data file, validated (docs/data.md). `version_2_with_negative` None: as the file declares, as the
    official scorers read it. `check_answer_spans` False: scoring compares texts; an answer_start off matters to
    training only."""
    gc_was_enabled = gc.isenabled()
    gc.disable()  # ~10^5 small objects without cycles: the cycle collector would run over and over
    try:
        table = read_table(os.fspath(path), require_answers)
        version_2 = table.declares_v2 if version_2_with_negative is None else version_2_with_negative
        if not require_answers and not version_2 and not any(a["text"] for a in table.answers):
            table.has_answers = False  # v1.1 knows no unanswerable question: empty lists mean no labels
        validate(table, version_2, check_answer_spans)
        return SquadFile(table.to_dataset(), table.version, version_2)
    finally:
        if gc_was_enabled:
            gc.enable()


def select_articles(dataset, spec: str, option: str = "--train_articles", source: str = "the data"):
    titles = dataset["title"][:]
    order = list(dict.fromkeys(titles))
    if not (chosen := set(order[parse_slice(spec, option)])):
        raise InputError(f"{option} {spec!r}", f"selects none of the {len(order)} articles of {source}",
                         f"give a slice within 0:{len(order)}, e.g. '0:{max(1, len(order) // 2)}'")
    return dataset.select([i for i, title in enumerate(titles) if title in chosen])


def parse_slice(spec: str, option: str = "--train_articles") -> slice:
    if not (match := re.fullmatch(r"\s*([+-]?\d+)?\s*:\s*([+-]?\d+)?\s*", str(spec))):
        raise InputError(f"{option} {spec!r}", "is not a slice START:STOP", "give e.g. '0:40' (the first 40 "
                         "articles), '40:' (all from the 41st) or ':-8' (all but the last 8)")
    return slice(*(None if x is None else int(x) for x in match.groups()))


def _load_synthetic(data_args, split: str):
    n = data_args.synthetic_train_examples if split == "train" else data_args.synthetic_eval_examples
    squad = synthetic_squad(split, n, data_args.synthetic_seed, data_args.version_2_with_negative)
    table = table_from_nested(squad["data"], f"--synthetic_seed {data_args.synthetic_seed}, {split} split", True)
    validate(table, data_args.version_2_with_negative)
    return table.to_dataset()


def _load_hub(name: str, config: Optional[str], cache_dir: Optional[str]):
    import datasets
    from datasets.exceptions import DatasetNotFoundError
    try:
        return datasets.load_dataset(name, config, cache_dir=cache_dir)
    except Exception as exc:
        offline = datasets.config.HF_HUB_OFFLINE
        network = any(word in cls.__name__ for cls in type(exc).__mro__ for word in ("Connect", "Timeout", "Offline"))
        if not (offline or network):
            if isinstance(exc, DatasetNotFoundError):
                raise InputError(f"Hub dataset {name!r}", "does not exist on the Hub or needs a login",
                                 "check --dataset_name (e.g. rajpurkar/squad or rajpurkar/squad_v2), "
                                 "or run `hf auth login` for a gated dataset") from exc
            raise
        # Compute nodes have no internet: the dataset must be fetched on a login node first.
        why = "offline mode is on (HF_*_OFFLINE)" if offline else "the Hub cannot be reached"
        env = f"DATASET={name}" + (f" DATASET_CONFIG={config}" if config else "")
        raise InputError(f"Hub dataset {name!r}", f"cannot be loaded: {why}, and the cache "
                         f"{cache_dir or datasets.config.HF_DATASETS_CACHE} lacks it", f"fetch it on a login node "
                         f"(`{env} ./{SETUP_SCRIPT}`), source the env file it writes"
                         f"{' and drop --cache_dir' if cache_dir else ''}; or pass --train_file / --validation_file"
                         ) from exc


def _hub_split(hub, data_args, split: str):
    name = data_args.dataset_name
    if split not in hub:
        raise InputError(f"Hub dataset {name!r}", f"has no {split!r} split (it has: {', '.join(hub)})",
                         f"pass --{split}_file FILE")
    dataset = hub[split]
    features = squad_features()
    columns = {c: dataset[c][:] for c in features if c in dataset.column_names}
    table = table_from_columns(columns, f"Hub dataset {name!r}, split {split!r}", True, locate=lambda i: f"row {i}")
    validate(table, data_args.version_2_with_negative)
    return dataset if list(dataset.features.items()) == list(features.items()) else table.to_dataset()
