"""Fused GPU kernels for the LM head's log-softmax: one pass over a chunk's logits each way.

The torch path of ``head_logprobs.HiddenTokenLogProbs`` upcasts each [rows, V] chunk to float32 and
runs about a dozen elementwise passes over it (forward and backward): with a 152k vocabulary that is
tens of bytes of memory traffic per logit, more than the LM-head matmuls themselves. Here:

- forward: one program per row streams the logits (any float dtype) once, keeping an online
  max / sum-exp (and, for the entropy, sum p z) per lane: log p(y), the log-sum-exp and H;
- backward: one program per row reads each logit once and writes dL/dlogit in its place (the
  chunk's logits buffer becomes its gradient, in the logits' dtype):
      dL/dl_v = (g_logp (1[v = y] - p_v) + g_H (-p_v (log p_v + H))) / tau.

A label outside [0, V) gives a NaN log-prob rather than an out-of-bounds read. Only imported where
Triton and a GPU exist.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

BLOCK = 4096
NEG_INF = float("-inf")


@triton.jit
def _head_forward_kernel(
    logits_ptr, stride_row, labels_ptr, logp_ptr, lse_ptr, entropy_ptr, vocab, inv_tau,
    WITH_ENTROPY: tl.constexpr, BLOCK_V: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    base = logits_ptr + row * stride_row
    m = tl.full([BLOCK_V], float("-inf"), tl.float32)
    s = tl.zeros([BLOCK_V], tl.float32)
    t = tl.zeros([BLOCK_V], tl.float32)
    for start in range(0, vocab, BLOCK_V):
        offs = start + tl.arange(0, BLOCK_V)
        z = tl.load(base + offs, mask=offs < vocab, other=float("-inf")).to(tl.float32) * inv_tau
        m_new = tl.maximum(m, z)
        dead = m_new == float("-inf")  # nothing finite seen in this lane yet
        alpha = tl.where(dead, 1.0, tl.exp(m - m_new))
        e = tl.where(dead, 0.0, tl.exp(z - m_new))
        s = s * alpha + e
        if WITH_ENTROPY:
            t = t * alpha + tl.where(e > 0, e * z, 0.0)
        m = m_new
    top = tl.max(m, axis=0)
    scale = tl.where(m == float("-inf"), 0.0, tl.exp(m - top))
    total = tl.sum(s * scale, axis=0)
    lse = top + tl.log(total)
    label = tl.load(labels_ptr + row)
    inside = (label >= 0) & (label < vocab)
    z_label = tl.load(base + tl.where(inside, label, 0)).to(tl.float32) * inv_tau
    logp = tl.where(inside, z_label - lse, float("nan"))
    tl.store(logp_ptr + row, logp)
    tl.store(lse_ptr + row, lse)
    if WITH_ENTROPY:
        tl.store(entropy_ptr + row, lse - tl.sum(t * scale, axis=0) / total)


@triton.jit
def _head_backward_kernel(
    logits_ptr, stride_row, labels_ptr, lse_ptr, grad_logp_ptr, entropy_ptr, grad_entropy_ptr, vocab, inv_tau,
    WITH_ENTROPY: tl.constexpr, BLOCK_V: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    base = logits_ptr + row * stride_row
    lse = tl.load(lse_ptr + row)
    g_logp = tl.load(grad_logp_ptr + row)
    label = tl.load(labels_ptr + row)
    if WITH_ENTROPY:
        h = tl.load(entropy_ptr + row)
        g_h = tl.load(grad_entropy_ptr + row)
    for start in range(0, vocab, BLOCK_V):
        offs = start + tl.arange(0, BLOCK_V)
        inside = offs < vocab
        z = tl.load(base + offs, mask=inside, other=float("-inf")).to(tl.float32) * inv_tau
        log_p = z - lse
        p = tl.exp(log_p)
        grad = tl.where(offs == label, g_logp, 0.0) - p * g_logp
        if WITH_ENTROPY:
            grad += tl.where(p > 0, -p * (log_p + h), 0.0) * g_h
        tl.store(base + offs, (grad * inv_tau).to(logits_ptr.dtype.element_ty), mask=inside)


def _check(logits: torch.Tensor) -> None:
    if logits.dim() != 2 or logits.stride(1) != 1 or not logits.is_cuda:
        raise ValueError(f"expected CUDA logits [rows, V] with unit stride in V; got {tuple(logits.shape)}, strides {logits.stride()}")


def head_forward(
    logits: torch.Tensor, labels: torch.Tensor, inv_tau: float, with_entropy: bool
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(log p(label), log-sum-exp, entropy or an empty tensor), float32 [rows] each, of logits * inv_tau."""
    _check(logits)
    rows, vocab = logits.shape
    logp = torch.empty(rows, dtype=torch.float32, device=logits.device)
    lse = torch.empty_like(logp)
    entropy = torch.empty(rows if with_entropy else 0, dtype=torch.float32, device=logits.device)
    if rows:
        _head_forward_kernel[(rows,)](
            logits, logits.stride(0), labels, logp, lse, entropy if with_entropy else logp, vocab, float(inv_tau),
            WITH_ENTROPY=with_entropy, BLOCK_V=BLOCK, num_warps=8,
        )
    return logp, lse, entropy


def head_backward_(
    logits: torch.Tensor,
    labels: torch.Tensor,
    lse: torch.Tensor,
    grad_logp: torch.Tensor,
    inv_tau: float,
    entropy: torch.Tensor | None = None,
    grad_entropy: torch.Tensor | None = None,
) -> torch.Tensor:
    """Overwrite ``logits`` with dL/dlogits for the upstream gradients; return it."""
    _check(logits)
    rows, vocab = logits.shape
    with_entropy = entropy is not None and grad_entropy is not None
    if rows:
        _head_backward_kernel[(rows,)](
            logits, logits.stride(0), labels, lse, grad_logp,
            entropy if with_entropy else lse, grad_entropy if with_entropy else lse, vocab, float(inv_tau),
            WITH_ENTROPY=with_entropy, BLOCK_V=BLOCK, num_warps=8,
        )
    return logits
