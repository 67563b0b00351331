"""A rollout's raw generated tokens [B, R] to response ids and mask: ended by the first EOS
(``finalize_responses``) or cut at each row's target length (``mask_to_targets``)."""

from __future__ import annotations

from collections.abc import Sequence

import torch


def finalize_responses(
    tokens: torch.Tensor, eos_token_ids: Sequence[int], pad_token_id: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """(response_ids, response_mask) from raw generated tokens [B, R].

    The mask is 1 up to and including each row's first EOS and 0 after it; a row without EOS (it
    hit max_new_tokens) is all 1. Tokens after the first EOS become padding.
    """
    eos = torch.as_tensor(list(eos_token_ids), dtype=torch.long, device=tokens.device)
    is_eos = torch.isin(tokens, eos).long()
    eos_before = is_eos.cumsum(dim=1) - is_eos  # EOS tokens strictly before each position
    mask = (eos_before == 0).long()
    ids = tokens.masked_fill(mask == 0, pad_token_id)
    return ids, mask


def mask_to_targets(
    tokens: torch.Tensor, targets: torch.Tensor, pad_token_id: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """(response_ids, response_mask) from raw generated tokens [B, R] and targets [B]: row i keeps
    its first targets[i] tokens whatever they are (EOS included), then padding."""
    columns = torch.arange(tokens.shape[1], device=tokens.device)
    mask = (columns.unsqueeze(0) < targets.to(tokens.device).unsqueeze(1)).long()
    return tokens.masked_fill(mask == 0, pad_token_id), mask


def pad_right(t: torch.Tensor, width: int, value: float) -> torch.Tensor:
    """Right-pad or cut [B, R] to [B, width]."""
    if t.shape[1] >= width:
        return t[:, :width]
    fill = torch.full((t.shape[0], width - t.shape[1]), value, dtype=t.dtype, device=t.device)
    return torch.cat([t, fill], dim=1)
