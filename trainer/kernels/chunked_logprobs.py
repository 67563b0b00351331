"""Chunked log-softmax with hand-written backward passes: the autograd plumbing behind
``trainer.algorithms.entropy.logprobs_from_logits`` and ``entropy_from_logits``.

With a 150k vocabulary a float32 log-softmax of 30k tokens is 18 GB. Both functions below walk the
flattened tokens in chunks of ``chunk_size`` rows, upcast one chunk at a time to float32, and keep
only per-token results. Their backward passes recompute each chunk from the saved logits, so
training does not keep the float32 chunks alive either: the only full-size tensors are the logits
and their gradient, in the logits' own dtype.

Formulas, for one token with logits l over the vocabulary and temperature tau, z = l / tau:
    lse       = log sum_v exp(z_v)
    log p(y)  = z_y - lse                                d/dl_v = (1[v = y] - p_v) / tau
    H         = -sum_v p_v log p_v = lse - sum_v p_v z_v   d/dl_v = -p_v (log p_v + H) / tau
"""

from __future__ import annotations

from collections.abc import Iterator

import torch


def compute_dtype(logits: torch.Tensor) -> torch.dtype:
    """float32 for half/bf16/float32 logits; float64 stays float64 (gradient checks)."""
    return torch.promote_types(logits.dtype, torch.float32)


def entropy_rows(z: torch.Tensor, lse: torch.Tensor) -> torch.Tensor:
    """H = lse - sum_v p_v z_v per row; p_v z_v is 0 where p_v is, even where z_v = -inf
    (a masked-out vocabulary entry)."""
    p = torch.exp(z - lse.unsqueeze(-1))
    pz = torch.where(p > 0, p * z, torch.zeros_like(p))
    return lse - pz.sum(dim=-1)


def entropy_grad_rows(log_p: torch.Tensor, p: torch.Tensor, entropy: torch.Tensor) -> torch.Tensor:
    """dH/dz_v = -p_v (log p_v + H); 0 where p_v = 0."""
    return torch.where(p > 0, -p * (log_p + entropy.unsqueeze(-1)), torch.zeros_like(p))


def _shifted(logits_chunk: torch.Tensor, dt: torch.dtype, tau: float) -> tuple[torch.Tensor, torch.Tensor]:
    """(zs, m) with zs = (l - m) / tau, m = the row max of l: softmax is shift-invariant, and with the
    max at 0 neither exp overflows nor do lse and sum p z cancel (H = lse(zs) - sum p zs, both small).
    l - m is exact in the compute dtype for the large entries that matter."""
    logits_dt = logits_chunk.to(dt)
    m = logits_dt.amax(dim=-1)
    return (logits_dt - m.unsqueeze(-1)) / tau, m


def _forward_chunks(
    logits: torch.Tensor, tau: float, chunk_size: int, shift: torch.Tensor, lse_all: torch.Tensor
) -> Iterator[tuple[int, int, torch.Tensor, torch.Tensor]]:
    """(start, end, zs, lse) of each row chunk; records each row's shift and lse for the backward."""
    for s in range(0, logits.shape[0], chunk_size):
        e = s + chunk_size
        zs, shift[s:e] = _shifted(logits[s:e], shift.dtype, tau)
        lse = torch.logsumexp(zs, dim=-1)
        lse_all[s:e] = lse
        yield s, e, zs, lse


def _backward_chunks(
    logits: torch.Tensor, shift: torch.Tensor, lse_all: torch.Tensor, tau: float, chunk_size: int
) -> Iterator[tuple[int, int, torch.Tensor]]:
    """(start, end, log p) of each row chunk, recomputed from the saved logits, shift and lse."""
    dt = lse_all.dtype
    for s in range(0, logits.shape[0], chunk_size):
        e = s + chunk_size
        zs = (logits[s:e].to(dt) - shift[s:e].unsqueeze(-1)) / tau
        yield s, e, zs - lse_all[s:e].unsqueeze(-1)


def _row_buffers(logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(out, shift, lse): one value per row each, in the compute dtype."""
    n, dt = logits.shape[0], compute_dtype(logits)
    out, shift, lse = (torch.empty(n, dtype=dt, device=logits.device) for _ in range(3))
    return out, shift, lse


class SoftmaxRowStat(torch.autograd.Function):
    """One number per row of [N, V] logits, chunked over rows: log softmax(l / tau)[label] when
    ``labels`` are given, the entropy H(softmax(l / tau)) when they are None. float32 result
    (float64 for float64 logits)."""

    @staticmethod
    def forward(  # type: ignore[override]
        ctx: torch.autograd.function.FunctionCtx,
        logits: torch.Tensor,
        labels: torch.Tensor | None,
        temperature: float,
        chunk_size: int,
    ) -> torch.Tensor:
        out, shift, lse_all = _row_buffers(logits)
        for s, e, zs, lse in _forward_chunks(logits, temperature, chunk_size, shift, lse_all):
            if labels is None:
                out[s:e] = entropy_rows(zs, lse)
            else:  # log p(y) = z_y - lse(z), both taken relative to the row max
                out[s:e] = zs.gather(-1, labels[s:e].unsqueeze(-1)).squeeze(-1) - lse
        # The entropy's gradient needs H itself; the log-prob's does not.
        ctx.save_for_backward(logits, labels, shift, lse_all, out if labels is None else None)
        ctx.temperature = temperature
        ctx.chunk_size = chunk_size
        return out

    @staticmethod
    def backward(ctx: torch.autograd.function.FunctionCtx, grad_out: torch.Tensor):  # type: ignore[override]
        logits, labels, shift, lse_all, entropy = ctx.saved_tensors
        tau = ctx.temperature
        grad = torch.empty_like(logits)
        grad_out = grad_out.to(lse_all.dtype)
        for s, e, log_p in _backward_chunks(logits, shift, lse_all, tau, ctx.chunk_size):
            p = torch.exp(log_p)
            g_n = grad_out[s:e].unsqueeze(-1)
            if labels is None:
                g = entropy_grad_rows(log_p, p, entropy[s:e]) * g_n
            else:
                g = -p * g_n  # the -p_v part, for every v
                g.scatter_add_(-1, labels[s:e].unsqueeze(-1), g_n)  # the 1[v = y] part
            grad[s:e] = (g / tau).to(grad.dtype)
        return grad, None, None, None


def chunked_token_logprobs(
    logits: torch.Tensor, labels: torch.Tensor, temperature: float, chunk_size: int
) -> torch.Tensor:
    """log softmax(logits / temperature)[label] per row: [N, V] logits, [N] int64 labels -> [N]."""
    return SoftmaxRowStat.apply(logits, labels, float(temperature), int(chunk_size))


def chunked_entropy(logits: torch.Tensor, temperature: float, chunk_size: int) -> torch.Tensor:
    """H(softmax(logits / temperature)) per row: [N, V] -> [N]."""
    return SoftmaxRowStat.apply(logits, None, float(temperature), int(chunk_size))
