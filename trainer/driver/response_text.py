"""The responses' text, as the reward reads it: each row's response tokens (its mask's positions),
decoded without special tokens.

Why not ``tokenizer.batch_decode``: transformers first checks every token id of the batch in Python
(``to_py_obj``), which at the 1.5B replay's size (256 responses of ~14k tokens) took 80% of the reward
phase, about 1 s on the driver per step, growing with the GPUs (docs/benchmarks.md). A fast tokenizer's
own decoder (the Rust ``tokenizers`` one, ``backend_tokenizer``) is what ``batch_decode`` calls for each
row in the end, so it is called directly, one row at a time (a batched call would start the library's
thread pool in the driver, which then warns in every process the driver forks). Where transformers
would post-process the text (``clean_up_tokenization_spaces``), or the tokenizer has no Rust decoder,
``batch_decode`` runs as before.
"""

from __future__ import annotations

from typing import Any

import torch


def response_token_lists(response_ids: torch.Tensor, response_mask: torch.Tensor) -> list[list[int]]:
    """Each row's response tokens where the mask is 1: ``[B, T]`` ids and mask -> B lists."""
    return [ids[mask.bool()].tolist() for ids, mask in zip(response_ids, response_mask, strict=True)]


def decodes_directly(tokenizer: Any) -> bool:
    """Whether ``tokenizer.batch_decode(rows, skip_special_tokens=True)`` is, row by row, exactly its
    Rust decoder's ``decode``: a fast tokenizer that post-processes nothing."""
    return getattr(tokenizer, "backend_tokenizer", None) is not None and not getattr(
        tokenizer, "clean_up_tokenization_spaces", False
    )


def decode_rows(tokenizer: Any, rows: list[list[int]]) -> list[str]:
    """``tokenizer.batch_decode(rows, skip_special_tokens=True)``, without its per-token Python checks."""
    if not decodes_directly(tokenizer):
        return tokenizer.batch_decode(rows, skip_special_tokens=True)
    decoder = tokenizer.backend_tokenizer
    return [decoder.decode(row, skip_special_tokens=True) for row in rows]


def response_texts(tokenizer: Any, response_ids: torch.Tensor, response_mask: torch.Tensor) -> list[str]:
    """The text of each row's response: ``[B, T]`` ids and mask -> B strings."""
    return decode_rows(tokenizer, response_token_lists(response_ids, response_mask))
