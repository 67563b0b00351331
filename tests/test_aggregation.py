"""Loss aggregation and masked statistics, against hand-computed values."""

from __future__ import annotations

import math

import pytest
import torch

from trainer.algorithms.aggregation import (
    LOSS_AGG_MODES,
    agg_loss,
    masked_mean,
    masked_var,
    masked_whiten,
)

LOSS = torch.tensor([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]])
MASK = torch.tensor([[1, 1, 0], [1, 0, 0]])


@pytest.mark.parametrize(
    ("mode", "expected"),
    [
        # (1 + 2 + 4) / 3 tokens
        ("token-mean", 7 / 3),
        # sequence sums 3 and 4, mean over 2 sequences
        ("seq-mean-token-sum", 3.5),
        # sequence means 3/2 and 4/1, mean over 2 sequences: (1.5 + 4) / 2
        ("seq-mean-token-mean", 2.75),
        # Dr.GRPO: mean of the sequence sums 3 and 4, divided by T = 3 (the old sum gave 7 / 3)
        ("seq-mean-token-sum-norm", 3.5 / 3),
    ],
)
def test_modes_by_hand(mode: str, expected: float) -> None:
    assert agg_loss(LOSS, MASK, mode).item() == pytest.approx(expected)


def test_sum_norm_uses_the_given_max_response_length() -> None:
    # mean(3, 4) / 7
    assert agg_loss(LOSS, MASK, "seq-mean-token-sum-norm", max_response_length=7).item() == pytest.approx(0.5)


def test_sum_norm_is_a_mean_over_the_non_empty_sequences() -> None:
    # Dr.GRPO's 1/G sum_i 1/L_max sum_t l_it: doubling the batch with copies leaves it unchanged,
    # and an empty response is not one of the G.
    loss = torch.tensor([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0], [7.0, 8.0, 9.0]])
    mask = torch.tensor([[1, 1, 0], [0, 0, 0], [1, 1, 1]])
    # sequence sums 3 and 24 (the empty one left out): (3 + 24) / 2 / 4
    assert agg_loss(loss, mask, "seq-mean-token-sum-norm", 4).item() == pytest.approx(27 / 2 / 4)
    doubled = agg_loss(torch.cat([loss, loss]), torch.cat([mask, mask]), "seq-mean-token-sum-norm", 4)
    assert doubled.item() == pytest.approx(27 / 2 / 4)


def test_bool_and_float_masks_agree() -> None:
    for mode in LOSS_AGG_MODES:
        a = agg_loss(LOSS, MASK.bool(), mode)
        b = agg_loss(LOSS, MASK.float(), mode)
        assert torch.equal(a, b), mode


def test_empty_response_has_no_weight_in_seq_means() -> None:
    mask = torch.tensor([[1, 1, 0], [0, 0, 0]])
    # only sequence 0 counts: tokens 1, 2
    assert agg_loss(LOSS, mask, "token-mean").item() == pytest.approx(1.5)
    assert agg_loss(LOSS, mask, "seq-mean-token-mean").item() == pytest.approx(1.5)
    assert agg_loss(LOSS, mask, "seq-mean-token-sum").item() == pytest.approx(3.0)
    # one non-empty sequence, sum 3, divided by T = 3
    assert agg_loss(LOSS, mask, "seq-mean-token-sum-norm").item() == pytest.approx(1.0)


@pytest.mark.parametrize("mode", list(LOSS_AGG_MODES))
def test_all_masked_out_is_zero_not_nan(mode: str) -> None:
    loss = LOSS.clone().requires_grad_(True)
    out = agg_loss(loss, torch.zeros_like(MASK), mode)
    assert out.item() == 0.0
    out.backward()
    assert torch.isfinite(loss.grad).all()
    assert (loss.grad == 0).all()


def test_masked_positions_get_no_gradient() -> None:
    loss = LOSS.clone().requires_grad_(True)
    agg_loss(loss, MASK, "token-mean").backward()
    # d/dl_it of sum(m l)/3 = m_it / 3
    assert torch.allclose(loss.grad, MASK.float() / 3)


def test_unknown_mode_lists_valid_ones() -> None:
    with pytest.raises(ValueError, match="token-mean.*seq-mean-token-sum-norm"):
        LOSS_AGG_MODES["seq-mean"]
    with pytest.raises(ValueError, match="unknown loss_agg_mode 'mean'"):
        agg_loss(LOSS, MASK, "mean")


def test_mask_shape_mismatch_is_an_error() -> None:
    with pytest.raises(ValueError, match=r"mask shape \(2, 2\) does not match values shape \(2, 3\)"):
        masked_mean(LOSS, torch.ones(2, 2))


def test_masked_mean_var_whiten_by_hand() -> None:
    values = torch.tensor([1.0, 2.0, 3.0, 100.0])
    mask = torch.tensor([1, 1, 1, 0])
    # mean of 1, 2, 3 = 2; unbiased var = (1 + 0 + 1) / (3 - 1) = 1; biased = 2/3
    assert masked_mean(values, mask).item() == pytest.approx(2.0)
    assert masked_var(values, mask).item() == pytest.approx(1.0)
    assert masked_var(values, mask, unbiased=False).item() == pytest.approx(2 / 3)
    w = masked_whiten(values, mask)
    scale = 1 / math.sqrt(1 + 1e-8)
    assert torch.allclose(w, torch.tensor([-1.0, 0.0, 1.0, 98.0]) * scale)
    # shift_mean=False keeps the mean: (x - 2) / 1 + 2
    assert torch.allclose(masked_whiten(values, mask, shift_mean=False)[:3], torch.tensor([1.0, 2.0, 3.0]))


def test_masked_mean_along_a_dim() -> None:
    # row 0: (1 + 2) / 2; row 1: 4 / 1
    assert torch.allclose(masked_mean(LOSS, MASK, dim=-1), torch.tensor([1.5, 4.0]))


def test_degenerate_masks_do_not_raise() -> None:
    v = torch.tensor([5.0, 7.0])
    assert masked_var(v, torch.tensor([1, 0])).item() == 0.0  # one entry: no spread
    assert masked_var(v, torch.tensor([0, 0])).item() == 0.0
    assert torch.isfinite(masked_whiten(v, torch.tensor([0, 0]))).all()
