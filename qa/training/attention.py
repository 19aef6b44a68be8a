"""PyTorch's fused attention (sdpa) with the attention mask always passed, for compiled models.

For sdpa, transformers passes no mask (None) when no token of a batch is padding; a compiled
layer traced with a mask then recompiles on the first such batch, however late it comes (2% of
SQuAD features fill 384 tokens). `sdpa_with_mask`, registered through transformers' public
AttentionInterface / AttentionMaskInterface, always builds the mask: the same attention, one
input signature. `load_model_and_tokenizer` switches a model to it when the run compiles."""
from transformers import AttentionInterface, AttentionMaskInterface
from transformers.masking_utils import sdpa_mask

SDPA_WITH_MASK = "sdpa_with_mask"


def _sdpa_mask_always(*args, **kwargs):
    kwargs["allow_is_bidirectional_skip"] = False  # no None for a batch without padding
    kwargs["allow_is_causal_skip"] = False
    return sdpa_mask(*args, **kwargs)


def register() -> str:
    """Registers `sdpa_with_mask` (idempotent); returns its name."""
    AttentionInterface.register(SDPA_WITH_MASK, AttentionInterface()["sdpa"])
    AttentionMaskInterface.register(SDPA_WITH_MASK, _sdpa_mask_always)
    return SDPA_WITH_MASK


def keep_mask_when_compiled(model):
    """Switches a model that runs sdpa to `sdpa_with_mask`; returns the implementation it runs.
    Other kernels are left alone (eager, flash and flex attention build their masks their own way)."""
    config = getattr(model, "config", None)
    if getattr(config, "_attn_implementation", None) == "sdpa":
        model.set_attn_implementation(register())
    return getattr(config, "_attn_implementation", None)
