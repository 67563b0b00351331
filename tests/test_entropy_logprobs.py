"""Chunked log-probs and entropy from logits: hand values, torch references, gradients."""

from __future__ import annotations

import math

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from trainer.algorithms.entropy import entropy_bonus, entropy_from_logits, logprobs_from_logits


def reference_logprobs(logits: torch.Tensor, labels: torch.Tensor, temperature: float) -> torch.Tensor:
    return torch.log_softmax(logits.float() / temperature, -1).gather(-1, labels.unsqueeze(-1)).squeeze(-1)


def reference_entropy(logits: torch.Tensor, temperature: float) -> torch.Tensor:
    logp = torch.log_softmax(logits.float() / temperature, -1)
    return -(logp.exp() * logp).sum(-1)


def test_by_hand() -> None:
    # logits (0, ln 3): p = (1/4, 3/4); log p = (ln 0.25, ln 0.75) = (-1.386294, -0.287682)
    # H = -(0.25 ln 0.25 + 0.75 ln 0.75) = 0.562335
    logits = torch.tensor([[[0.0, math.log(3)], [0.0, math.log(3)]]])
    labels = torch.tensor([[0, 1]])
    assert torch.allclose(
        logprobs_from_logits(logits, labels), torch.tensor([[math.log(0.25), math.log(0.75)]])
    )
    h = -(0.25 * math.log(0.25) + 0.75 * math.log(0.75))
    assert torch.allclose(entropy_from_logits(logits), torch.full((1, 2), h))
    # temperature 2 on logits (0, 2 ln 3) gives the same distribution
    assert torch.allclose(
        logprobs_from_logits(logits * 2, labels, temperature=2.0), logprobs_from_logits(logits, labels)
    )
    assert torch.allclose(entropy_from_logits(logits * 2, temperature=2.0), torch.full((1, 2), h))


@pytest.mark.parametrize("chunk_size", [1, 3, 7, 1000])
@pytest.mark.parametrize("temperature", [1.0, 0.6])
def test_matches_log_softmax_reference(chunk_size: int, temperature: float) -> None:
    g = torch.Generator().manual_seed(1)
    logits = torch.randn(3, 5, 50, generator=g) * 4
    labels = torch.randint(0, 50, (3, 5), generator=g)
    out = logprobs_from_logits(logits, labels, temperature, chunk_size=chunk_size)
    assert out.dtype == torch.float32 and out.shape == (3, 5)
    assert torch.allclose(out, reference_logprobs(logits, labels, temperature), atol=1e-5)
    ent = entropy_from_logits(logits, temperature, chunk_size=chunk_size)
    assert torch.allclose(ent, reference_entropy(logits, temperature), atol=1e-5)


def test_bf16_logits_computed_in_float32() -> None:
    g = torch.Generator().manual_seed(2)
    logits = (torch.randn(2, 4, 300, generator=g) * 3).bfloat16()
    labels = torch.randint(0, 300, (2, 4), generator=g)
    out = logprobs_from_logits(logits, labels, chunk_size=3)
    assert out.dtype == torch.float32
    # same numbers as upcasting the bf16 values first: the chunks are float32 too
    assert torch.allclose(out, reference_logprobs(logits, labels, 1.0), atol=1e-5)
    assert torch.allclose(
        entropy_from_logits(logits, chunk_size=3), reference_entropy(logits, 1.0), atol=1e-5
    )


def test_gradients_match_autograd_reference() -> None:
    g = torch.Generator().manual_seed(3)
    base = torch.randn(2, 3, 11, generator=g)
    labels = torch.randint(0, 11, (2, 3), generator=g)
    weights = torch.randn(2, 3, generator=g)
    ours = base.clone().requires_grad_(True)
    ref = base.clone().requires_grad_(True)
    (logprobs_from_logits(ours, labels, 0.7, chunk_size=2) * weights).sum().backward()
    (reference_logprobs(ref, labels, 0.7) * weights).sum().backward()
    assert torch.allclose(ours.grad, ref.grad, atol=1e-6)

    ours.grad, ref.grad = None, None
    (entropy_from_logits(ours, 0.7, chunk_size=4) * weights).sum().backward()
    (reference_entropy(ref, 0.7) * weights).sum().backward()
    assert torch.allclose(ours.grad, ref.grad, atol=1e-6)


def test_gradcheck_float64() -> None:
    g = torch.Generator().manual_seed(4)
    x = torch.randn(2, 3, 6, dtype=torch.float64, generator=g, requires_grad=True)
    labels = torch.randint(0, 6, (2, 3), generator=g)
    assert torch.autograd.gradcheck(lambda t: logprobs_from_logits(t, labels, 1.3, chunk_size=4), (x,))
    assert torch.autograd.gradcheck(lambda t: entropy_from_logits(t, 1.3, chunk_size=4), (x,))


def test_bf16_gradient_has_logits_dtype() -> None:
    logits = torch.randn(4, 9).bfloat16().requires_grad_(True)
    logprobs_from_logits(logits, torch.zeros(4, dtype=torch.long)).sum().backward()
    assert logits.grad.dtype == torch.bfloat16
    # rows of the gradient of log p(y) sum to zero: 1 - sum p
    assert torch.allclose(logits.grad.float().sum(-1), torch.zeros(4), atol=2e-2)


def test_numerically_stable_for_large_logits() -> None:
    logits = torch.tensor([[0.0, 1.0, 2.0]])
    shifted = logits + 1e4  # exp(1e4) overflows; the logsumexp form does not
    labels = torch.tensor([2])
    assert torch.allclose(logprobs_from_logits(shifted, labels), logprobs_from_logits(logits, labels))
    assert torch.allclose(entropy_from_logits(shifted), entropy_from_logits(logits))


def test_minus_inf_logits_are_zero_probability() -> None:
    # a masked-out vocabulary entry: entropy of (0, ln 3) alone, and finite gradients
    logits = torch.tensor([[0.0, math.log(3), -math.inf]], requires_grad=True)
    h = entropy_from_logits(logits)
    assert h.item() == pytest.approx(-(0.25 * math.log(0.25) + 0.75 * math.log(0.75)))
    h.sum().backward()
    assert torch.isfinite(logits.grad).all()


def test_errors() -> None:
    logits = torch.zeros(2, 5)
    with pytest.raises(ValueError, match=r"labels must lie in \[0, 5\); found \[0, 5\]"):
        logprobs_from_logits(logits, torch.tensor([0, 5]))
    with pytest.raises(ValueError, match="labels shape"):
        logprobs_from_logits(logits, torch.zeros(3, dtype=torch.long))
    with pytest.raises(ValueError, match="temperature must be > 0; got 0"):
        entropy_from_logits(logits, temperature=0)


def test_entropy_bonus() -> None:
    ent = torch.tensor([[1.0, 2.0], [3.0, 50.0]])
    mask = torch.tensor([[1, 1], [1, 0]])
    # 0.01 * (1 + 2 + 3) / 3
    assert entropy_bonus(ent, mask, 0.01).item() == pytest.approx(0.02)
    # seq-mean-token-mean: 0.01 * (1.5 + 3) / 2
    assert entropy_bonus(ent, mask, 0.01, "seq-mean-token-mean").item() == pytest.approx(0.0225)


class _Float32Sizes(TorchDispatchMode):
    """Records the element count of every float32 tensor any op produces."""

    def __init__(self) -> None:
        super().__init__()
        self.largest = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        out = func(*args, **(kwargs or {}))
        for t in out if isinstance(out, (tuple, list)) else (out,):
            if isinstance(t, torch.Tensor) and t.dtype == torch.float32:
                self.largest = max(self.largest, t.numel())
        return out


def test_never_materialises_a_full_float32_vocab_tensor() -> None:
    n_tokens, vocab, chunk = 32, 200, 4
    logits = torch.randn(4, 8, vocab).bfloat16().requires_grad_(True)
    labels = torch.randint(0, vocab, (4, 8))
    with _Float32Sizes() as seen:
        lp = logprobs_from_logits(logits, labels, temperature=0.9, chunk_size=chunk)
        h = entropy_from_logits(logits, temperature=0.9, chunk_size=chunk)
        (lp.sum() + h.sum()).backward()
    # every float32 intermediate is at most one chunk of rows wide (the reference would be 32 x 200)
    assert 0 < seen.largest <= chunk * vocab < n_tokens * vocab
    with _Float32Sizes() as seen_ref:
        reference_logprobs(logits.detach(), labels, 0.9)
    assert seen_ref.largest == n_tokens * vocab  # the probe does see a full log-softmax
