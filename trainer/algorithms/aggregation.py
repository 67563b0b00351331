"""Masked statistics and loss aggregation.

Every loss in the trainer is first a per-token matrix ``loss_mat`` [B, T]; ``response_mask`` [B, T]
marks the response tokens (prompt and padding out, the closing EOS in). ``agg_loss`` turns the
matrix into a scalar in one of the four modes of VERL's ``agg_loss`` (verl/trainer/ppo/core_algos.py),
chosen by name from ``LOSS_AGG_MODES`` (the one list of valid modes; config validation reads it).
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from trainer.registry import Registry

# A count below this is treated as "no tokens": the masked sum is then 0 and so is the mean.
_TINY = 1e-8


def _as_weights(mask: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """The mask as weights in ``like``'s dtype (bool and int masks are common)."""
    if mask.shape != like.shape:
        raise ValueError(f"mask shape {tuple(mask.shape)} does not match values shape {tuple(like.shape)}")
    return mask.to(like.dtype)


def masked_sum(values: torch.Tensor, mask: torch.Tensor, dim: int | None = None) -> torch.Tensor:
    """sum(values * mask) over ``dim`` (all dims if None)."""
    w = _as_weights(mask, values)
    return (values * w).sum() if dim is None else (values * w).sum(dim=dim)


def masked_mean(values: torch.Tensor, mask: torch.Tensor, dim: int | None = None) -> torch.Tensor:
    """sum(values * mask) / sum(mask); 0 where the mask is empty (never NaN)."""
    w = _as_weights(mask, values)
    total = (values * w).sum() if dim is None else (values * w).sum(dim=dim)
    count = w.sum() if dim is None else w.sum(dim=dim)
    # With an empty mask the numerator is 0 too, so clamping the count gives 0, not 0/0.
    return total / count.clamp_min(_TINY)


def masked_var(values: torch.Tensor, mask: torch.Tensor, unbiased: bool = True) -> torch.Tensor:
    """Variance of the masked entries (all dims), with Bessel's correction n/(n-1) when ``unbiased``.

    VERL raises when fewer than two entries are masked in; we return the biased variance there
    (0 for a single entry, 0 for none) so that a batch of empty responses cannot crash a step.
    """
    w = _as_weights(mask, values)
    mu = masked_mean(values, w)
    var = masked_mean((values - mu) ** 2, w)
    n = w.sum()
    if unbiased and n > 1:
        var = var * n / (n - 1)
    return var


def masked_whiten(values: torch.Tensor, mask: torch.Tensor, shift_mean: bool = True) -> torch.Tensor:
    """(values - mean) / sqrt(var + 1e-8) over the masked entries (unbiased var, as VERL).

    With ``shift_mean=False`` the mean is added back (scale only). Entries outside the mask are
    transformed too; callers multiply by the mask when they need zeros there.
    """
    mu = masked_mean(values, mask)
    var = masked_var(values, mask, unbiased=True)
    whitened = (values - mu) * torch.rsqrt(var + 1e-8)
    if not shift_mean:
        whitened = whitened + mu
    return whitened


# ---------------------------------------------------------------------------------------------
# Loss aggregation modes. Each takes (loss_mat [B, T], mask [B, T], norm_len) -> scalar.
# ---------------------------------------------------------------------------------------------

AggFn = Callable[[torch.Tensor, torch.Tensor, int], torch.Tensor]
LOSS_AGG_MODES: Registry[AggFn] = Registry("loss_agg_mode")


def _seq_mean(seq_values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Mean over the sequences that have at least one token in the mask.

    An empty response carries no loss and no weight; VERL divides by zero for it in
    seq-mean-token-mean (NaN), which a single empty sample should not be able to cause.
    """
    has_tokens = (mask.sum(dim=-1) > 0).to(seq_values.dtype)
    return masked_mean(seq_values, has_tokens)


@LOSS_AGG_MODES.register("token-mean")
def token_mean(loss_mat: torch.Tensor, mask: torch.Tensor, norm_len: int) -> torch.Tensor:
    """L = sum_{i,t} m_it l_it / sum_{i,t} m_it  (every token weighs the same; DAPO)."""
    return masked_mean(loss_mat, mask)


@LOSS_AGG_MODES.register("seq-mean-token-sum")
def seq_mean_token_sum(loss_mat: torch.Tensor, mask: torch.Tensor, norm_len: int) -> torch.Tensor:
    """L = mean_i sum_t m_it l_it."""
    seq_losses = masked_sum(loss_mat, mask, dim=-1)
    return _seq_mean(seq_losses, mask)


@LOSS_AGG_MODES.register("seq-mean-token-mean")
def seq_mean_token_mean(loss_mat: torch.Tensor, mask: torch.Tensor, norm_len: int) -> torch.Tensor:
    """L = mean_i (sum_t m_it l_it / sum_t m_it)  (every sequence weighs the same; original GRPO)."""
    seq_losses = masked_mean(loss_mat, mask, dim=-1)
    return _seq_mean(seq_losses, mask)


@LOSS_AGG_MODES.register("seq-mean-token-sum-norm")
def seq_mean_token_sum_norm(loss_mat: torch.Tensor, mask: torch.Tensor, norm_len: int) -> torch.Tensor:
    """L = mean_i (sum_t m_it l_it) / norm_len, norm_len = the max response length (Dr.GRPO's constant).

    Dr.GRPO (Liu et al. 2025, "Understanding R1-Zero-Like Training"): 1/G sum_i 1/L_max sum_t,
    the mean over sequences of each sequence's token sum, divided by a constant that should stay
    fixed through training (defaults to T, the padded response length). Sequences with no response
    token are left out of the mean, as in the other seq-mean modes.
    """
    seq_losses = masked_sum(loss_mat, mask, dim=-1)
    return _seq_mean(seq_losses, mask) / norm_len


def agg_loss(
    loss_mat: torch.Tensor,
    mask: torch.Tensor,
    mode: str = "token-mean",
    max_response_length: int | None = None,
) -> torch.Tensor:
    """Aggregate a per-token loss [B, T] under ``mask`` [B, T] into a scalar.

    ``max_response_length`` is the divisor of "seq-mean-token-sum-norm" (default: T).
    """
    if loss_mat.dim() != 2:
        raise ValueError(f"loss_mat must be [B, T]; got shape {tuple(loss_mat.shape)}")
    norm_len = loss_mat.shape[-1] if max_response_length is None else max_response_length
    if norm_len <= 0:
        raise ValueError(f"max_response_length must be positive; got {norm_len}")
    return LOSS_AGG_MODES[mode](loss_mat, mask, norm_len)
