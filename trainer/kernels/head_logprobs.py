"""The LM head's token log-probs (and entropy) from hidden states, in row chunks: the autograd
plumbing behind ``trainer.algorithms.entropy.logprobs_from_hidden``.

Neither the logits nor their gradient ever exist for more than ``chunk_size`` tokens at once: the
forward keeps only the per-token log-sum-exp; the backward recomputes each chunk's logits, turns
them into dL/dz, and multiplies straight into dL/dh and dL/dW. Each chunk's softmax runs either in
torch (any device and dtype) or, on a GPU, as one fused Triton kernel each way
(trainer/kernels/triton_logprobs.py). The formulas are those of trainer/kernels/chunked_logprobs.py.
"""

from __future__ import annotations

import torch

from trainer.kernels.chunked_logprobs import compute_dtype, entropy_grad_rows, entropy_rows

LOGITS_CHUNK_BYTES = 512 * 2**20  # one float32 [rows, V] temporary of the torch path
FUSED_CHUNK_BYTES = 2**30  # one [rows, V] logits buffer (model dtype) of the fused GPU path


def head_chunk_rows(vocab: int, budget_bytes: int = LOGITS_CHUNK_BYTES, element_size: int = 4) -> int:
    """Rows per chunk so that one [rows, vocab] tensor of ``element_size`` bytes stays within ``budget_bytes``."""
    return max(1, budget_bytes // (element_size * vocab))


def fused_available(hidden: torch.Tensor, weight: torch.Tensor) -> bool:
    """The Triton kernels serve CUDA tensors of half, bf16 or float32 (float64 stays on the torch path)."""
    if not (hidden.is_cuda and weight.dtype in (torch.float16, torch.bfloat16, torch.float32)):
        return False
    try:
        import trainer.kernels.triton_logprobs  # noqa: F401
    except ImportError:
        return False
    return True


def resolve_head_path(
    hidden: torch.Tensor, weight: torch.Tensor, chunk_size: int | None, fused: bool | None
) -> tuple[bool, int]:
    """(fused, chunk_size): the fused kernels where available unless told, and a chunk of rows whose
    [rows, V] buffer fits that path's byte budget unless a chunk size is given."""
    fused = fused_available(hidden, weight) if fused is None else fused
    if chunk_size is None:
        vocab = weight.shape[0]
        chunk_size = (
            head_chunk_rows(vocab, FUSED_CHUNK_BYTES, weight.element_size()) if fused else head_chunk_rows(vocab)
        )
    return fused, chunk_size


def _head_logits(hidden: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, tau: float) -> torch.Tensor:
    """z = (h W^T + b) / tau in float32 (float64 for float64 weights): the matmul in the weights' dtype,
    as the model's own lm_head computes logits, the scaling and everything after in float32."""
    z = torch.nn.functional.linear(hidden, weight, bias).to(compute_dtype(weight))
    if tau != 1.0:
        z.div_(tau)
    return z


def _head_grad_torch(
    hidden: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, labels: torch.Tensor, lse: torch.Tensor,
    tau: float, grad_logp: torch.Tensor | None, entropy: torch.Tensor | None, grad_entropy: torch.Tensor | None,
) -> torch.Tensor:
    """dL/dlogits of one chunk, in the weights' dtype (the torch path, any device and dtype)."""
    dt = lse.dtype
    log_p = _head_logits(hidden, weight, bias, tau).sub_(lse.unsqueeze(-1))
    p = torch.exp(log_p)
    g = torch.zeros_like(p)
    if grad_logp is not None:
        g_n = grad_logp.to(dt).unsqueeze(-1)
        g.add_(-p * g_n)  # d log p_y / dz_v = 1[v = y] - p_v
        g.scatter_add_(-1, labels.unsqueeze(-1), g_n)
    if entropy is not None and grad_entropy is not None:
        g.add_(entropy_grad_rows(log_p, p, entropy) * grad_entropy.to(dt).unsqueeze(-1))
    if tau != 1.0:
        g.div_(tau)
    return g.to(weight.dtype)


class HiddenTokenLogProbs(torch.autograd.Function):
    """log softmax((h W^T + b) / tau)[label] (and the entropy) per token of [N, H] hidden states.

    dL/dh and dL/dW are accumulated chunk by chunk in the weights' dtype by addmm, whose products
    accumulate in float32.
    """

    @staticmethod
    def forward(  # type: ignore[override]
        ctx: torch.autograd.function.FunctionCtx,
        hidden: torch.Tensor,
        weight: torch.Tensor,
        bias: torch.Tensor | None,
        labels: torch.Tensor,
        temperature: float,
        chunk_size: int,
        with_entropy: bool,
        out_shape: tuple[int, ...],
        fused: bool,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        n, dt = hidden.shape[0], (torch.float32 if fused else compute_dtype(weight))
        logp = torch.empty(n, dtype=dt, device=hidden.device)
        entropy = torch.empty(n if with_entropy else 0, dtype=dt, device=hidden.device)
        lse_all = torch.empty(n, dtype=dt, device=hidden.device)
        for s in range(0, n, chunk_size):
            e = min(s + chunk_size, n)
            if fused:
                from trainer.kernels.triton_logprobs import head_forward

                logits = torch.nn.functional.linear(hidden[s:e], weight, bias)
                logp[s:e], lse_all[s:e], ent = head_forward(logits, labels[s:e], 1.0 / temperature, with_entropy)
                if with_entropy:
                    entropy[s:e] = ent
                continue
            z = _head_logits(hidden[s:e], weight, bias, temperature)
            lse = torch.logsumexp(z, dim=-1)
            logp[s:e] = z.gather(-1, labels[s:e].unsqueeze(-1)).squeeze(-1) - lse
            lse_all[s:e] = lse
            if with_entropy:
                entropy[s:e] = entropy_rows(z, lse)
        ctx.save_for_backward(hidden, weight, bias, labels, lse_all, entropy)
        ctx.temperature = temperature
        ctx.chunk_size = chunk_size
        ctx.with_entropy = with_entropy
        ctx.fused = fused
        # Outputs in the caller's shape as tensors of their own, not views of the flat results:
        # FSDP2 warns when a wrapped module returns a view (an in-place op on it would skip its hook).
        entropy_out = entropy.view(out_shape).clone() if with_entropy else entropy.clone()
        return logp.view(out_shape).clone(), entropy_out

    @staticmethod
    def backward(  # type: ignore[override]
        ctx: torch.autograd.function.FunctionCtx, grad_logp: torch.Tensor | None, grad_entropy: torch.Tensor | None
    ):
        hidden, weight, bias, labels, lse_all, entropy = ctx.saved_tensors
        tau, chunk_size = ctx.temperature, ctx.chunk_size
        n = hidden.shape[0]
        need_h, need_w = ctx.needs_input_grad[0], ctx.needs_input_grad[1]
        need_b = bias is not None and ctx.needs_input_grad[2]
        grad_h = torch.empty_like(hidden) if need_h else None
        grad_w = torch.zeros_like(weight) if need_w else None
        grad_b = torch.zeros(bias.shape, dtype=lse_all.dtype, device=bias.device) if need_b else None
        use_entropy = ctx.with_entropy and grad_entropy is not None
        grad_logp = grad_logp.reshape(-1) if grad_logp is not None else None
        grad_entropy = grad_entropy.reshape(-1) if use_entropy else None
        for s in range(0, n, chunk_size):
            e = min(s + chunk_size, n)
            ent = entropy[s:e] if use_entropy else None
            g_ent = grad_entropy[s:e] if use_entropy else None
            if ctx.fused:
                from trainer.kernels.triton_logprobs import head_backward_

                g_lp = grad_logp[s:e] if grad_logp is not None else torch.zeros(e - s, device=hidden.device)
                logits = torch.nn.functional.linear(hidden[s:e], weight, bias)
                g = head_backward_(logits, labels[s:e], lse_all[s:e], g_lp.float().contiguous(), 1.0 / tau,
                                   ent, g_ent.float().contiguous() if g_ent is not None else None)
            else:
                g = _head_grad_torch(hidden[s:e], weight, bias, labels[s:e], lse_all[s:e], tau,
                                     grad_logp[s:e] if grad_logp is not None else None, ent, g_ent)
            if need_h:
                grad_h[s:e] = (g @ weight).to(hidden.dtype)
            if need_w:
                grad_w.addmm_(g.transpose(0, 1), hidden[s:e].to(weight.dtype))
            if need_b:
                grad_b += g.sum(dim=0, dtype=grad_b.dtype)
        grad_b = grad_b.to(bias.dtype) if grad_b is not None else None
        return grad_h, grad_w, grad_b, None, None, None, None, None, None
