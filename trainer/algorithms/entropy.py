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


# ----------------------------------------------------------------------------- from hidden states
LOGITS_CHUNK_BYTES = 512 * 2**20  # one float32 [rows, V] temporary of the torch path
FUSED_CHUNK_BYTES = 2**30  # one [rows, V] logits buffer (model dtype) of the fused GPU path


def head_chunk_rows(vocab: int, budget_bytes: int = LOGITS_CHUNK_BYTES, element_size: int = 4) -> int:
    """Rows per chunk so that one [rows, vocab] tensor of ``element_size`` bytes stays within ``budget_bytes``."""
    return max(1, budget_bytes // (element_size * vocab))


def _fused_available(hidden: torch.Tensor, weight: torch.Tensor) -> bool:
    """The Triton kernels serve CUDA tensors of half, bf16 or float32 (float64 stays on the torch path)."""
    if not (hidden.is_cuda and weight.dtype in (torch.float16, torch.bfloat16, torch.float32)):
        return False
    try:
        import trainer.kernels.triton_logprobs  # noqa: F401
    except ImportError:
        return False
    return True


def _head_logits(hidden: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, tau: float) -> torch.Tensor:
    """z = (h W^T + b) / tau in float32 (float64 for float64 weights): the matmul in the weights' dtype,
    as the model's own lm_head computes logits, the scaling and everything after in float32."""
    z = torch.nn.functional.linear(hidden, weight, bias).to(_compute_dtype(weight))
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
        # dH/dz_v = -p_v (log p_v + H); 0 where p_v = 0
        dh = torch.where(p > 0, -p * (log_p + entropy.unsqueeze(-1)), torch.zeros_like(p))
        g.add_(dh * grad_entropy.to(dt).unsqueeze(-1))
    if tau != 1.0:
        g.div_(tau)
    return g.to(weight.dtype)


class _HiddenTokenLogProbs(torch.autograd.Function):
    """log softmax((h W^T + b) / tau)[label] (and the entropy) per token, in row chunks.

    Neither the logits nor their gradient ever exist for more than ``chunk_size`` tokens at once:
    the forward keeps only the per-token log-sum-exp; the backward recomputes each chunk's logits,
    turns them into dL/dz, and multiplies straight into dL/dh and dL/dW (accumulated in the
    weights' dtype by addmm, whose products accumulate in float32). On a GPU the softmax part of
    each chunk is one fused kernel each way (trainer/kernels/triton_logprobs.py).
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
        n, dt = hidden.shape[0], (torch.float32 if fused else _compute_dtype(weight))
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
                # H = lse - sum_v p_v z_v; p_v z_v is 0 where p_v is (z_v = -inf included)
                p = torch.exp(z - lse.unsqueeze(-1))
                entropy[s:e] = lse - torch.where(p > 0, p * z, torch.zeros_like(p)).sum(dim=-1)
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
    fused = _fused_available(hidden, weight) if fused is None else fused
    if chunk_size is None:
        chunk_size = (
            head_chunk_rows(vocab, FUSED_CHUNK_BYTES, weight.element_size()) if fused else head_chunk_rows(vocab)
        )
    _check(weight, temperature, chunk_size)
    flat_h = hidden.reshape(-1, hidden.shape[-1])
    flat_labels = labels.reshape(-1).long()
    if not fused and flat_labels.numel() and (int(flat_labels.min()) < 0 or int(flat_labels.max()) >= vocab):
        raise ValueError(
            f"labels must lie in [0, {vocab}); found [{int(flat_labels.min())}, {int(flat_labels.max())}]"
        )
    logp, entropy = _HiddenTokenLogProbs.apply(
        flat_h, weight, bias, flat_labels, float(temperature), int(chunk_size), bool(with_entropy),
        tuple(labels.shape), bool(fused),
    )
    return logp, (entropy if with_entropy else None)
