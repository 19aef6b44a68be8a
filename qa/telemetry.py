"""Throughput figures that account for padding: samples (features) and real tokens."""
import numpy as np
import pyarrow.compute as pc


def token_stats(features) -> dict:
    """Real (non-padding) tokens per feature, from the attention masks, without a Python loop."""
    column = features.data.table.column("attention_mask") if features._indices is None \
        else features.flatten_indices().data.table.column("attention_mask")
    column = column.combine_chunks()
    lengths = pc.list_value_length(column).to_numpy()
    offsets = column.offsets.to_numpy()
    values = column.values.to_numpy(zero_copy_only=False).astype(np.int64)
    real = np.add.reduceat(values, offsets[:-1]) if len(lengths) else np.zeros(0, np.int64)
    n = max(len(lengths), 1)
    return {
        "features": int(len(lengths)),
        "real_tokens": int(real.sum()),
        "padded_tokens": int(lengths.sum()),
        "mean_real_tokens": float(real.sum() / n),
        "padding_fraction": float(1 - real.sum() / max(lengths.sum(), 1)),
    }


def train_throughput(metrics: dict, stats: dict, num_examples: int) -> dict:
    """Adds what the Trainer leaves out: its samples/s counts features (windows), not
    questions, and says nothing about how many of the tokens it processed were padding."""
    per_s = metrics.get("train_samples_per_second", 0.0)
    return {
        "train_examples": num_examples,
        "train_features": stats["features"],
        "train_mean_real_tokens": round(stats["mean_real_tokens"], 2),
        "train_padding_fraction": round(stats["padding_fraction"], 4),
        "train_real_tokens_per_second": round(per_s * stats["mean_real_tokens"], 1),
    }
