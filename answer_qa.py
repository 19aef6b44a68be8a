#!/usr/bin/env python
"""Ask a trained model questions: its answer, where the answer is in the context, and a score.

    bert-squad-answer MODEL_DIR --question Q [--question Q2 ...] --context C [--top_k K]
    bert-squad-answer MODEL_DIR --file questions.jsonl [--top_k K]
    python -m answer_qa ...                                    (the same command)

MODEL_DIR is the output_dir of a finished training run (run_qa.py --do_train). --file takes the data
files run_qa.py reads (official SQuAD JSON, JSON Lines, ...; labelled or not). Each question gets one
JSON line on stdout: {"id", "question", "answer", "start", "end", "score"}, where start and end are
the answer's character offsets in its context (end excluded) and score its probability among the
n-best candidates; with --top_k K > 1, "answers" lists the K best candidates in the same form. A
SQuAD v2.0 model may find no answer: "answer" is "", start and end null.

From Python (a notebook, a script):

    from answer_qa import Answerer
    qa = Answerer("runs/smoke")                  # loads the model once (on a GPU when there is one)
    qa("Who wrote it?", context)                 # -> {"answer": ..., "start": ..., "end": ..., "score": ...}
    qa.answer_many(questions, contexts)          # or qa.answer_file("questions.jsonl"): lists of those

The questions go through what `run_qa.py --do_predict` runs, with the settings the model was trained
with (MODEL_DIR/environment.json): the project's data checks (qa.data), windows (utils_qa),
batches (the run's collator and evaluation batch size, in its precision) and post-processing
(utils_qa). So the answers are those --do_predict writes, a context longer than one window
and a batch of questions included. This module is its own entry point: training never imports it.
"""
import argparse
import json
import logging
import sys
from dataclasses import fields
from pathlib import Path

from qa.arguments import DataArguments, ModelArguments
from qa.training.checkpoints import COMPLETE_MARKER, checkpoints
from qa.errors import InputError, command
from qa.io import read_json

logger = logging.getLogger("answer_qa")
FIX = "give the output_dir of a finished training run (run_qa.py --do_train), e.g. runs/smoke"


def check_model_dir(path) -> Path:
    """`path` as a folder that holds a trained model, or the one-line InputError saying what it is
    instead: missing, a file, a training checkpoint, the folder of a run that has not finished."""
    folder = Path(path).expanduser()
    if not folder.exists():
        raise InputError(str(path), "model folder does not exist", FIX)
    if not folder.is_dir():
        raise InputError(str(path), "is a file, not a model folder", FIX)
    if (folder / COMPLETE_MARKER).exists() or any(p == folder for _, p in checkpoints(folder.parent)):
        raise InputError(str(path), "is a training checkpoint (what a run resumes from), not a run's final model",
                         f"give the run's output_dir, {folder.parent}, once its training has finished")
    if not (folder / "config.json").is_file():
        saved = checkpoints(folder)
        why = f"; it has checkpoints up to {saved[-1][1].name}: its training has not finished" if saved else ""
        raise InputError(str(path), f"holds no model (no config.json){why}",
                         FIX + ("; finish the run by running it again (it resumes)" if saved else ""))
    return folder


def check_top_k(top_k: int) -> None:
    if top_k < 1:
        raise InputError(f"top_k={top_k}", "must be at least 1", "ask for 1 answer or more")


def trained_settings(folder: Path) -> dict:
    """The configuration the model was trained with (its run's environment.json), or {} (the
    defaults of qa.arguments, with a warning) for a model folder made elsewhere."""
    record = folder / "environment.json"
    if not record.is_file():
        logger.warning("%s has no environment.json: answering with the default settings (windows of %d tokens, "
                       "SQuAD v1.1)", folder, DataArguments.max_seq_length)
        return {}
    return read_json(record).get("config") or {}


class Answerer:
    """A trained model ready to answer: `Answerer(model_dir)(question, context)`."""

    def __init__(self, model_dir, device=None, batch_size=None):
        import torch

        from utils_qa import check_tokenizer
        from qa.model import check_model_and_tokenizer, load_model_and_tokenizer
        from utils_qa import PostProcessing

        folder = check_model_dir(model_dir)
        model, self.tokenizer = load_model_and_tokenizer(ModelArguments(model_name_or_path=str(folder)),
                                                         work_dir=folder, training=False, require_head=True)
        config = trained_settings(folder)
        self.data_args = args = DataArguments(**{f.name: config[f.name] for f in fields(DataArguments)
                                                 if f.name in config})
        check_tokenizer(self.tokenizer, args.max_seq_length, args.doc_stride, args.max_query_length)
        check_model_and_tokenizer(model, self.tokenizer, args)
        self.device = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
        self.model = model.to(self.device).eval()
        self.batch_size = batch_size or config.get("per_device_eval_batch_size", 8)
        # The run's mixed precision, as the Trainer's prediction applied it (autocast).
        self.autocast = torch.bfloat16 if config.get("bf16") else torch.float16 if config.get("fp16") else None
        self.post_processing = PostProcessing.from_args(args)

    def __call__(self, question: str, context: str, top_k: int = 1) -> dict:
        return self.answer_many([question], [context], top_k)[0]

    def answer_many(self, questions, contexts, top_k: int = 1) -> list:
        """One result per question; `contexts`: one per question, or a single one for all."""
        from qa.data.table import table_from_columns, validate

        questions = list(questions)
        contexts = [contexts] * len(questions) if isinstance(contexts, str) else list(contexts)
        if len(contexts) != len(questions):
            raise InputError("questions and contexts", f"{len(questions)} questions but {len(contexts)} contexts",
                             "give one context per question, or a single context for all")
        columns = {"id": [f"q{i + 1}" for i in range(len(questions))], "question": questions, "context": contexts}
        table = table_from_columns(columns, "the questions given", False, locate=lambda i: f"question {i + 1}")
        validate(table, self.data_args.version_2_with_negative)
        return self.answer_examples(table.to_dataset(), top_k)

    def answer_file(self, path, top_k: int = 1) -> list:
        """Every question of a data file run_qa.py reads (--test_file: labelled or not)."""
        from qa.data.sources import read_squad

        return self.answer_examples(read_squad(path, self.data_args.version_2_with_negative,
                                               require_answers=False).dataset, top_k)

    def answer_examples(self, examples, top_k: int = 1) -> list:
        """Questions as the data readers return them (id, question, context): one result each."""
        from utils_qa import prepare_validation_features

        check_top_k(top_k)
        args = self.data_args
        columns = examples.to_dict()
        features = prepare_validation_features(columns, self.tokenizer, args.max_seq_length, args.doc_stride,
                                               args.max_query_length, args.pad_to_max_length, with_labels=False)
        start, end = self._logits(features)
        _, nbest, null_odds = self.post_processing(columns, features, start, end)
        threshold = self.post_processing.null_score_diff_threshold
        results = []
        for qid, question in zip(columns["id"], columns["question"]):
            # The prediction is the best non-null candidate, or (v2) the null one when it wins.
            no_answer = null_odds is not None and null_odds[qid] > threshold
            best = next((e for e in nbest[qid] if (e["answer_start"] is None) == no_answer), nbest[qid][0])
            result = {"id": qid, "question": question, **_answer(best)}
            if top_k > 1:
                result["answers"] = [_answer(e) for e in nbest[qid][:top_k]]
            results.append(result)
        return results

    def _logits(self, features):
        """(start, end) logits of every feature, (n_features, longest) arrays: the batches the
        run's prediction makes (its collator, its evaluation batch size), in order."""
        import numpy as np
        import torch
        from transformers import default_data_collator

        from qa.data.collate import BucketPaddingCollator

        args = self.data_args
        collate = default_data_collator if args.pad_to_max_length else BucketPaddingCollator(
            self.tokenizer, args.max_seq_length, args.pad_to_multiple_of, args.length_buckets)
        inputs = [k for k in ("input_ids", "token_type_ids", "attention_mask") if k in features]
        rows = [{k: features[k][i] for k in inputs} for i in range(len(features["input_ids"]))]
        out = {"start": [], "end": []}
        for i in range(0, len(rows), self.batch_size):
            batch = {k: v.to(self.device) for k, v in collate(rows[i:i + self.batch_size]).items()}
            with torch.inference_mode(), torch.autocast(self.device.type, dtype=self.autocast,
                                                        enabled=self.autocast is not None):
                logits = self.model(**batch)
            out["start"].append(logits.start_logits.float().cpu().numpy())
            out["end"].append(logits.end_logits.float().cpu().numpy())
        width = max((a.shape[1] for a in out["start"]), default=0)
        padded = []
        for parts in out.values():  # to one width, as the Trainer gathers them (post-processing reads
            array = np.full((len(rows), width), -100.0, dtype=np.float32)  # only each feature's own tokens)
            at = 0
            for part in parts:
                array[at:at + len(part), :part.shape[1]] = part
                at += len(part)
            padded.append(array)
        return padded


def _answer(entry: dict) -> dict:
    """An n-best entry of utils_qa.rank_answers as the answer to show."""
    return {"answer": entry["text"], "start": entry["answer_start"], "end": entry["answer_end"],
            "score": entry["probability"]}


class _Parser(argparse.ArgumentParser):
    def error(self, message):  # the project's one-line error instead of argparse's usage block
        raise InputError("bert-squad-answer", message, "run `bert-squad-answer --help`")


@command
def main(argv=None) -> int:
    parser = _Parser(prog="bert-squad-answer", description=__doc__.split("\n\n")[0],
                     epilog="MODEL_DIR: the output_dir of a finished training run (run_qa.py --do_train).")
    parser.add_argument("model_dir", metavar="MODEL_DIR")
    parser.add_argument("--question", action="append", help="a question (repeat for several about one context)")
    parser.add_argument("--context", help="the text the answers come from")
    parser.add_argument("--file", help="a data file of questions with their contexts (SQuAD JSON, JSON Lines, ...)")
    parser.add_argument("--top_k", type=int, default=1, help="also list the K best answers [1]")
    parser.add_argument("--device", help="cuda, cpu, ... [cuda when there is a GPU]")
    args = parser.parse_args(sys.argv[1:] if argv is None else argv)
    if bool(args.file) == bool(args.question or args.context):
        raise InputError("bert-squad-answer", "give either --question (one or more) with --context, or --file",
                         "e.g. bert-squad-answer runs/smoke --question 'Who wrote it?' --context '...'")
    if args.question and not args.context or args.context and not args.question:
        raise InputError("bert-squad-answer", "--question and --context go together", "give both")
    check_top_k(args.top_k)  # before the model is loaded: seconds
    from transformers.utils import logging as transformers_logging

    logging.basicConfig(format="%(name)s: %(message)s", level=logging.WARNING)
    transformers_logging.disable_progress_bar()  # a bar of the weights loading, on a terminal or in a log
    answerer = Answerer(args.model_dir, device=args.device)
    results = (answerer.answer_file(args.file, args.top_k) if args.file else
               answerer.answer_many(args.question, args.context, args.top_k))
    for result in results:
        print(json.dumps(result, ensure_ascii=False))
    return 0


if __name__ == "__main__":
    sys.exit(main())
