"""Token log-probs and entropy from logits, chunked so that no full float32 [B, T, V] tensor exists.

With a 150k vocabulary a float32 log-softmax of 30k tokens is 18 GB. Both functions below walk the
flattened tokens in chunks of ``chunk_size`` rows, upcast one chunk at a time to float32, and keep
only per-token results. Their backward passes are written out (custom autograd functions) and
recompute each chunk from the saved logits, so training does not keep the float32 chunks alive
either: the only full-size tensors are the logits and their gradient, in the logits' own dtype.

Formulas, for one token with logits l over the vocabulary and temperature tau, z = l / tau:
    lse       = log sum_v exp(z_v)
    log p(y)  = z_y - lse                                d/dl_v = (1[v = y] - p_v) / tau
    H         = -sum_v p_v log p_v = lse - sum_v p_v z_v   d/dl_v = -p_v (log p_v + H) / tau
"""

from __future__ import annotations

import torch

from trainer.algorithms.aggregation import agg_loss

DEFAULT_CHUNK_SIZE = 512  # rows: 512 x 152k vocab x 4 bytes = 311 MB per float32 temporary


def _check(logits: torch.Tensor, temperature: float, chunk_size: int) -> None:
    if logits.dim() < 1 or logits.shape[-1] == 0:
        raise ValueError(f"logits must be [..., V] with V > 0; got shape {tuple(logits.shape)}")
    if not temperature > 0:
        raise ValueError(f"temperature must be > 0; got {temperature}")
    if chunk_size <= 0:
        raise ValueError(f"chunk_size must be positive; got {chunk_size}")


def _compute_dtype(logits: torch.Tensor) -> torch.dtype:
    """float32 for half/bf16/float32 logits; float64 stays float64 (gradient checks)."""
    return torch.promote_types(logits.dtype, torch.float32)


def _shifted(logits_chunk: torch.Tensor, dt: torch.dtype, tau: float) -> tuple[torch.Tensor, torch.Tensor]:
    """(zs, m) with zs = (l - m) / tau, m = the row max of l: softmax is shift-invariant, and with the
    max at 0 neither exp overflows nor do lse and sum p z cancel (H = lse(zs) - sum p zs, both small).
    l - m is exact in the compute dtype for the large entries that matter."""
    logits_dt = logits_chunk.to(dt)
    m = logits_dt.amax(dim=-1)
    return (logits_dt - m.unsqueeze(-1)) / tau, m


class _TokenLogProbs(torch.autograd.Function):
    """log softmax(logits / tau)[label], chunked over rows; float32 result (float64 for float64 logits)."""

    @staticmethod
    def forward(  # type: ignore[override]
        ctx: torch.autograd.function.FunctionCtx,
        logits: torch.Tensor,
        labels: torch.Tensor,
        temperature: float,
        chunk_size: int,
    ) -> torch.Tensor:
        n, dt = logits.shape[0], _compute_dtype(logits)
        out = torch.empty(n, dtype=dt, device=logits.device)
        shift = torch.empty(n, dtype=dt, device=logits.device)
        lse_all = torch.empty(n, dtype=dt, device=logits.device)
        for s in range(0, n, chunk_size):
            e = s + chunk_size
            zs, shift[s:e] = _shifted(logits[s:e], dt, temperature)
            lse = torch.logsumexp(zs, dim=-1)
            # log p(y) = z_y - lse(z), both taken relative to the row max
            out[s:e] = zs.gather(-1, labels[s:e].unsqueeze(-1)).squeeze(-1) - lse
            lse_all[s:e] = lse
        ctx.save_for_backward(logits, labels, shift, lse_all)
        ctx.temperature = temperature
        ctx.chunk_size = chunk_size
        return out

    @staticmethod
    def backward(ctx: torch.autograd.function.FunctionCtx, grad_out: torch.Tensor):  # type: ignore[override]
        logits, labels, shift, lse_all = ctx.saved_tensors
        tau, chunk_size = ctx.temperature, ctx.chunk_size
        grad = torch.empty_like(logits)
        dt = lse_all.dtype
        grad_out = grad_out.to(dt)
        for s in range(0, logits.shape[0], chunk_size):
            e = s + chunk_size
            zs = (logits[s:e].to(dt) - shift[s:e].unsqueeze(-1)) / tau
            p = torch.exp(zs - lse_all[s:e].unsqueeze(-1))
            g_n = grad_out[s:e].unsqueeze(-1)
            g = -p * g_n  # the -p_v part, for every v
            g.scatter_add_(-1, labels[s:e].unsqueeze(-1), g_n)  # the 1[v = y] part
            grad[s:e] = (g / tau).to(grad.dtype)
        return grad, None, None, None


class _Entropy(torch.autograd.Function):
    """H(softmax(logits / tau)) per row, chunked; float32 result (float64 for float64 logits)."""

    @staticmethod
    def forward(  # type: ignore[override]
        ctx: torch.autograd.function.FunctionCtx,
        logits: torch.Tensor,
        temperature: float,
        chunk_size: int,
    ) -> torch.Tensor:
        n, dt = logits.shape[0], _compute_dtype(logits)
        out = torch.empty(n, dtype=dt, device=logits.device)
        shift = torch.empty(n, dtype=dt, device=logits.device)
        lse_all = torch.empty(n, dtype=dt, device=logits.device)
        for s in range(0, n, chunk_size):
            e = s + chunk_size
            zs, shift[s:e] = _shifted(logits[s:e], dt, temperature)
            lse = torch.logsumexp(zs, dim=-1)
            p = torch.exp(zs - lse.unsqueeze(-1))
            # p_v z_v with p_v = 0 is 0 even where z_v = -inf (a masked-out vocabulary entry).
            pz = torch.where(p > 0, p * zs, torch.zeros_like(p))
            out[s:e] = lse - pz.sum(dim=-1)
            lse_all[s:e] = lse
        ctx.save_for_backward(logits, shift, lse_all, out)
        ctx.temperature = temperature
        ctx.chunk_size = chunk_size
        return out

    @staticmethod
    def backward(ctx: torch.autograd.function.FunctionCtx, grad_out: torch.Tensor):  # type: ignore[override]
        logits, shift, lse_all, entropy = ctx.saved_tensors
        tau, chunk_size = ctx.temperature, ctx.chunk_size
        grad = torch.empty_like(logits)
        dt = lse_all.dtype
        grad_out = grad_out.to(dt)
        for s in range(0, logits.shape[0], chunk_size):
            e = s + chunk_size
            zs = (logits[s:e].to(dt) - shift[s:e].unsqueeze(-1)) / tau
            log_p = zs - lse_all[s:e].unsqueeze(-1)
            p = torch.exp(log_p)
            # dH/dz_v = -p_v (log p_v + H); 0 where p_v = 0
            dh = torch.where(p > 0, -p * (log_p + entropy[s:e].unsqueeze(-1)), torch.zeros_like(p))
            grad[s:e] = (dh * grad_out[s:e].unsqueeze(-1) / tau).to(grad.dtype)
        return grad, None, None


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
    if flat_labels.numel() and (int(flat_labels.min()) < 0 or int(flat_labels.max()) >= vocab):
        raise ValueError(
            f"labels must lie in [0, {vocab}); found [{int(flat_labels.min())}, {int(flat_labels.max())}]"
        )
    out = _TokenLogProbs.apply(flat_logits, flat_labels, float(temperature), int(chunk_size))
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
    out = _Entropy.apply(logits.reshape(-1, vocab), float(temperature), int(chunk_size))
    return out.reshape(logits.shape[:-1])


def entropy_bonus(
    entropy: torch.Tensor,
    response_mask: torch.Tensor,
    entropy_coeff: float,
    loss_agg_mode: str = "token-mean",
) -> torch.Tensor:
    """entropy_coeff x agg(H) over the response: the amount to SUBTRACT from the policy loss."""
    return entropy_coeff * agg_loss(entropy, response_mask, loss_agg_mode)
