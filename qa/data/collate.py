"""Batches without compute on padding: each batch padded to the smallest of a few lengths that holds it (what that
saves on SQuAD: docs/benchmarks.md, "The fast path"). A few lengths bound the distinct shapes `torch.compile` sees,
and multiples of 8 suit tensor cores."""
import numpy as np
import pyarrow.compute as pc

LENGTH_COLUMN = "length"


def feature_lengths(features) -> np.ndarray:
    """Each feature's token count, from the Arrow list offsets of input_ids (no Python loop)."""
    return pc.list_value_length(features.with_format("arrow")["input_ids"]).to_numpy().astype(np.int32)


def add_length_column(features):
    """`features` with each feature's token count, so a length-grouped sampler need not read every row."""
    return features.add_column(LENGTH_COLUMN, feature_lengths(features))


class BucketPaddingCollator:
    """Pads each batch to the smallest of `length_buckets` (checked by qa.arguments) that holds it, else to a multiple
    of `pad_to_multiple_of` up to `max_seq_length`. On the right whatever the tokenizer's side: labels and offsets
    count tokens from the left, as in utils_qa.py. Columns other than token ids and integer labels are dropped."""

    def __init__(self, tokenizer, max_seq_length: int, pad_to_multiple_of: int = 8, length_buckets=None, rows=None):
        """`rows`: training batches (those with start_positions) of fewer rows are filled up to it with rows the loss
        ignores (start and end at the width, BERT's ignore index), each attending to its first token only."""
        self.pad_values = {"input_ids": tokenizer.pad_token_id or 0, "token_type_ids": tokenizer.pad_token_type_id}
        self.max_seq_length = max_seq_length
        self.multiple = pad_to_multiple_of
        self.buckets = length_buckets or ()
        self.rows = rows

    def target_length(self, longest: int) -> int:
        rounded = -(-longest // self.multiple) * self.multiple
        return min((b for b in self.buckets if b >= longest), default=max(longest, min(rounded, self.max_seq_length)))

    def __call__(self, features):
        import torch

        length = self.target_length(max(len(f["input_ids"]) for f in features))
        if self.rows and "start_positions" in features[0] and len(features) < self.rows:
            filler = {"input_ids": [self.pad_values["input_ids"]], "token_type_ids": [0], "attention_mask": [1],
                      "start_positions": length, "end_positions": length}
            row = {k: filler.get(k, v) for k, v in features[0].items()}
            features = [*features, *[row] * (self.rows - len(features))]
        batch = {}
        for key, value in features[0].items():
            if isinstance(value, (list, tuple, np.ndarray)) and isinstance(value[0], (int, np.integer)):
                out = np.full((len(features), length), self.pad_values.get(key, 0), dtype=np.int64)
                for i, f in enumerate(features):
                    out[i, :len(f[key])] = f[key]
                batch[key] = torch.from_numpy(out)
            elif isinstance(value, (int, np.integer)) and key != LENGTH_COLUMN:  # bool too
                batch[key] = torch.tensor([f[key] for f in features], dtype=torch.long)
        return batch
