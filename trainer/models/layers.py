"""The repeated decoder blocks of a transformers causal LM: what FSDP2 shards one by one
(trainer/workers/fsdp.py) and what gradient checkpointing recomputes (trainer/models/checkpointing.py)."""

from __future__ import annotations

from torch import nn


def decoder_layers(lm: nn.Module) -> list[nn.Module]:
    """The transformer blocks, in order: the modules of the classes HF lists in _no_split_modules."""
    names = set(getattr(lm, "_no_split_modules", None) or ())
    layers = [m for m in lm.modules() if type(m).__name__ in names]
    if not layers:
        raise ValueError(
            f"{type(lm).__name__}: found no decoder layers (expected modules of the classes in "
            f"_no_split_modules, {sorted(names) or 'none listed'})"
        )
    return layers
