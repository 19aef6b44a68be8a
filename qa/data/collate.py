"""Batches without compute on padding: each batch padded to the smallest of a few lengths that holds it. Padding
every feature to max_seq_length (384) makes more than half of SQuAD v1.1's tokens padding; with length-grouped
sampling (`train_sampling_strategy="group_by_length"`) batches of 48 padded to a multiple of 8 hold 96% real
tokens. A few lengths bound the distinct shapes `torch.compile` sees, and multiples of 8 suit tensor cores."""
import numpy as np
import pyarrow.compute as pc

LENGTH_COLUMN = "length"


def feature_lengths(features) -> np.ndarray:
    """Each feature's token count, from the Arrow list offsets of input_ids (no Python loop)."""
    return pc.list_value_length(features.with_format("arrow")["input_ids"]).to_numpy().astype(np.int32)


def add_length_column(features):
    """`features` with each feature's token count, so a length-grouped sampler need not read every row."""
    if LENGTH_COLUMN in features.column_names:
        return features
    return features.add_column(LENGTH_COLUMN, feature_lengths(features))


class BucketPaddingCollator:
    """Pads each batch to the smallest bucket that holds its longest feature: `length_buckets` if given,
    else the multiples of `pad_to_multiple_of`, never beyond `max_seq_length` (unless a feature is).
    Token columns are padded on the right whatever the tokenizer's side (labels and offsets count
    tokens from the left, as in utils_qa.py); scalar columns are stacked; the rest is dropped.
    """

    def __init__(self, tokenizer, max_seq_length: int, pad_to_multiple_of: int = 8, length_buckets=None):
        self.pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
        self.type_pad_id = getattr(tokenizer, "pad_token_type_id", 0) or 0
        self.max_seq_length = max_seq_length
        self.multiple = max(1, pad_to_multiple_of or 1)
        self.buckets = sorted(set(int(b) for b in length_buckets)) if length_buckets else None

    def target_length(self, longest: int) -> int:
        if self.buckets:
            for b in self.buckets:
                if b >= longest:
                    return b
        rounded = -(-longest // self.multiple) * self.multiple
        return max(longest, min(rounded, self.max_seq_length))

    def _pad_value(self, key):
        return {"input_ids": self.pad_id, "token_type_ids": self.type_pad_id, "special_tokens_mask": 1}.get(key, 0)

    def __call__(self, features):
        import torch

        length = self.target_length(max(len(f["input_ids"]) for f in features))
        batch = {}
        for key, value in features[0].items():
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
