"""Token log-probs and entropy of a softmax policy, and the entropy bonus of the actor loss.

    log p(y) = log softmax(l / tau)[y]          H = -sum_v p_v log p_v

The public functions check their arguments and hand the work to chunked autograd functions
(trainer/kernels/chunked_logprobs.py for logits, trainer/kernels/head_logprobs.py for hidden states
and an LM head), so that no full float32 [tokens, V] tensor is ever built.
"""

from __future__ import annotations

import torch

from trainer.algorithms.aggregation import agg_loss
from trainer.kernels.chunked_logprobs import chunked_entropy, chunked_token_logprobs
from trainer.kernels.head_logprobs import HiddenTokenLogProbs, resolve_head_path

DEFAULT_CHUNK_SIZE = 512  # rows: 512 x 152k vocab x 4 bytes = 311 MB per float32 temporary


def _check(logits: torch.Tensor, temperature: float, chunk_size: int) -> None:
    if logits.dim() < 1 or logits.shape[-1] == 0:
        raise ValueError(f"logits must be [..., V] with V > 0; got shape {tuple(logits.shape)}")
    if not temperature > 0:
        raise ValueError(f"temperature must be > 0; got {temperature}")
    if chunk_size <= 0:
        raise ValueError(f"chunk_size must be positive; got {chunk_size}")


def _check_labels(flat_labels: torch.Tensor, vocab: int) -> None:
    if flat_labels.numel() and (int(flat_labels.min()) < 0 or int(flat_labels.max()) >= vocab):
        raise ValueError(
            f"labels must lie in [0, {vocab}); found [{int(flat_labels.min())}, {int(flat_labels.max())}]"
        )


def logprobs_from_logits(
    logits: torch.Tensor,
    labels: torch.Tensor,
    temperature: float = 1.0,
    chunk_size: int = DEFAULT_CHUNK_SIZE,
) -> torch.Tensor:
    """log softmax(logits / temperature) gathered at ``labels``: [..., V], [...] -> float32 [...].

    Equal to ``torch.log_softmax(logits.to(dt) / temperature, -1).gather(-1, labels[..., None])``
    without building that [..., V] float32 tensor; differentiable with respect to ``logits``.
    """
    _check(logits, temperature, chunk_size)
    if labels.shape != logits.shape[:-1]:
        raise ValueError(
            f"labels shape {tuple(labels.shape)} must equal logits shape without the vocab dim "
            f"{tuple(logits.shape[:-1])}"
        )
    vocab = logits.shape[-1]
    flat_logits = logits.reshape(-1, vocab)
    flat_labels = labels.reshape(-1).long()
    _check_labels(flat_labels, vocab)
    out = chunked_token_logprobs(flat_logits, flat_labels, temperature, chunk_size)
    return out.reshape(labels.shape)


def entropy_from_logits(
    logits: torch.Tensor,
    temperature: float = 1.0,
    chunk_size: int = DEFAULT_CHUNK_SIZE,
) -> torch.Tensor:
    """Entropy H = lse(z) - sum_v softmax(z)_v z_v of z = logits / temperature: [..., V] -> float32 [...].

    Chunked over tokens; differentiable with respect to ``logits``.
    """
    _check(logits, temperature, chunk_size)
    vocab = logits.shape[-1]
    out = chunked_entropy(logits.reshape(-1, vocab), temperature, chunk_size)
    return out.reshape(logits.shape[:-1])


def entropy_bonus(
    entropy: torch.Tensor,
    response_mask: torch.Tensor,
    entropy_coeff: float,
    loss_agg_mode: str = "token-mean",
) -> torch.Tensor:
    """entropy_coeff x agg(H) over the response: the amount to SUBTRACT from the policy loss."""
    return entropy_coeff * agg_loss(entropy, response_mask, loss_agg_mode)


def logprobs_from_hidden(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    labels: torch.Tensor,
    temperature: float = 1.0,
    bias: torch.Tensor | None = None,
    with_entropy: bool = False,
    chunk_size: int | None = None,
    fused: bool | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Token log-probs (and entropy) of an LM head applied to hidden states, never building the
    full [..., V] logits: hidden [..., H], weight [V, H], labels [...] -> float32 [...] (and [...]).

    Equal to ``logprobs_from_logits(F.linear(hidden, weight, bias), labels, temperature)`` (and
    ``entropy_from_logits`` of the same logits); differentiable in hidden, weight and bias.
    ``fused`` (default: on CUDA when Triton is there) picks the GPU kernels; labels are checked
    on the host only on the torch path (the kernels turn a bad label into NaN, with no sync).
    """
    vocab = weight.shape[0]
    if weight.dim() != 2 or hidden.shape[-1] != weight.shape[1]:
        raise ValueError(
            f"hidden [..., H] and weight [V, H] must agree on H; got {tuple(hidden.shape)} and {tuple(weight.shape)}"
        )
    if labels.shape != hidden.shape[:-1]:
        raise ValueError(
            f"labels shape {tuple(labels.shape)} must equal hidden shape without H {tuple(hidden.shape[:-1])}"
        )
    fused, chunk_size = resolve_head_path(hidden, weight, chunk_size, fused)
    _check(weight, temperature, chunk_size)
    flat_h = hidden.reshape(-1, hidden.shape[-1])
    flat_labels = labels.reshape(-1).long()
    if not fused:
        _check_labels(flat_labels, vocab)
    logp, entropy = HiddenTokenLogProbs.apply(
        flat_h, weight, bias, flat_labels, float(temperature), int(chunk_size), bool(with_entropy),
        tuple(labels.shape), bool(fused),
    )
    return logp, (entropy if with_entropy else None)
