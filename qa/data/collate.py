"""Batches without compute on padding: dynamic padding to a small set of lengths.

The reference pads every feature to max_seq_length (384): on SQuAD v1.1 more than half of
those tokens are padding (mean 176 real tokens). Padding each batch only to its longest
feature saves that compute only if the features of a batch have similar lengths, which
length-grouped sampling (`train_sampling_strategy="group_by_length"`) provides; on the dev
set's length distribution, batches of 48 then hold 96% real tokens with lengths rounded up
to a multiple of 8, 90% with multiples of 32, 83% with multiples of 64, against 48% for
random batches and 46% for padding to 384.

Rounding the padded length up (to a multiple, or to the next of a few explicit buckets)
bounds the number of distinct shapes, which matters for `torch.compile` with static graphs
(one compilation per shape) and for tensor cores (multiples of 8).
"""
import numpy as np
import pyarrow.compute as pc

LENGTH_COLUMN = "length"
# Token-level columns and their padding value (None: the tokenizer's pad token id).
PADDED_COLUMNS = {"input_ids": None, "token_type_ids": "type", "attention_mask": 0, "special_tokens_mask": 1}


def feature_lengths(features) -> np.ndarray:
    """Each feature's token count, from the Arrow list offsets of input_ids (no Python loop)."""
    column = features.with_format("arrow")["input_ids"].combine_chunks()
    return pc.list_value_length(column).to_numpy().astype(np.int32)


def add_length_column(features, name: str = LENGTH_COLUMN):
    """`features` with a column of each feature's token count (feature_lengths), so a
    length-grouped sampler need not read every row."""
    if name in features.column_names:
        return features
    return features.add_column(name, feature_lengths(features))


class BucketPaddingCollator:
    """Pads each batch to the smallest bucket length that holds its longest feature.

    Buckets: the explicit `length_buckets` if given, else the multiples of
    `pad_to_multiple_of`; never beyond `max_seq_length` (unless a feature is longer). Token
    columns are padded on the right with the tokenizer's pad ids, whatever its padding side:
    start/end positions (stacked as they are, like any integer or float scalar column) and the
    evaluation features' offsets count tokens from the left, so padding on the left would move
    the tokens away from their labels and their offsets (see qa/data/features.py, which pads on the
    right for the same reason). The `length` column and any other column that is not a number
    or a list of numbers is dropped.
    """

    def __init__(self, tokenizer, max_seq_length: int, pad_to_multiple_of: int = 8, length_buckets=None):
        if pad_to_multiple_of is None or pad_to_multiple_of < 1:
            pad_to_multiple_of = 1
        self.pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
        self.type_pad_id = getattr(tokenizer, "pad_token_type_id", 0) or 0
        self.max_seq_length = max_seq_length
        self.multiple = pad_to_multiple_of
        self.buckets = sorted(set(int(b) for b in length_buckets)) if length_buckets else None

    def target_length(self, longest: int) -> int:
        if self.buckets:
            for b in self.buckets:
                if b >= longest:
                    return b
        rounded = -(-longest // self.multiple) * self.multiple
        return max(longest, min(rounded, self.max_seq_length))

    def _pad_value(self, key):
        kind = PADDED_COLUMNS.get(key, 0)
        return self.pad_id if kind is None else self.type_pad_id if kind == "type" else kind

    def __call__(self, features):
        import torch

        first = features[0]
        longest = max(len(f["input_ids"]) for f in features)
        length = self.target_length(longest)
        batch = {}
        for key, value in first.items():
            if key == LENGTH_COLUMN:
                continue
            if isinstance(value, (list, tuple, np.ndarray)) and (len(value) == 0 or isinstance(
                    value[0], (int, np.integer))):
                out = np.full((len(features), length), self._pad_value(key), dtype=np.int64)
                for i, f in enumerate(features):
                    row = f[key]
                    out[i, :len(row)] = row
                batch[key] = torch.from_numpy(out)
            elif isinstance(value, (bool, int, np.integer)):
                batch[key] = torch.tensor([f[key] for f in features], dtype=torch.long)
            elif isinstance(value, (float, np.floating)):
                batch[key] = torch.tensor([f[key] for f in features], dtype=torch.float)
        return batch
