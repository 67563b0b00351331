"""The fast engine's decode step in fewer kernels: the elementwise work around its matmuls, fused.

Why: a decode step runs one token per row, so each elementwise op of a layer is a launch over a few
hundred kilobytes, and eagerly a 1.5B Qwen2 layer spends ~28 such kernels (RMSNorm's casts, the
rotary cat/neg/mul/add, two cache index_copy_, SiLU and the product, the residual adds) beside its
four matmuls; even replayed from a CUDA graph each costs microseconds. Three kernels replace them:

- ``add_rms_norm``: the residual add and the next RMSNorm (the input norm of a layer, its
  post-attention norm, the final norm) in one pass over the row;
- ``rope_and_cache_write``: RoPE on the query and key heads of the fused qkv matmul's output, the
  rotated keys and the values written into this step's cache slot, the rotated queries returned
  (with the GPU's split attention kernel the engine does this inside that kernel instead,
  ``decode_attention_with_rope``, through the same ``rope_heads``);
- ``silu_mul``: SiLU(gate) * up over the fused gate/up matmul's output.

Numerics are the eager path's (trainer/rollout/lean_decoder.py), which follows transformers
(transformers/models/qwen2/modeling_qwen2.py): every op the eager path rounds to the model's dtype
is rounded here at the same point (the sum, the normalised row before the weight, each RoPE
product, SiLU before the product), and the arithmetic between roundings is float32. RMSNorm is
Qwen2RMSNorm: ``weight * (x.float() * rsqrt(mean(x.float()^2) + eps)).to(dtype)``; RoPE is
``x * cos + rotate_half(x) * sin``. What can differ is float32 rounding inside a reduction or an
exp, so results agree with the eager ones to the model dtype's rounding. The reference for each
kernel is the eager code itself (tests/test_triton_decode_fused.py).

Only imported where Triton exists (the engine imports it on CUDA devices).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

SILU_BLOCK = 1024  # columns of the intermediate per program


@triton.jit
def _round(x, dtype: tl.constexpr):
    """Round float32 ``x`` to ``dtype`` and back: the rounding an eager op in ``dtype`` applies."""
    return x.to(dtype).to(tl.float32)


@triton.jit
def _add_rms_norm_kernel(
    h_ptr, delta_ptr, w_ptr, res_ptr, out_ptr, s_h, s_delta, s_res, s_out, n, eps,
    HAS_DELTA: tl.constexpr, BLOCK: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    inside = cols < n
    dtype: tl.constexpr = out_ptr.dtype.element_ty
    x = tl.load(h_ptr + row * s_h + cols, mask=inside, other=0.0).to(tl.float32)
    if HAS_DELTA:
        x = _round(x + tl.load(delta_ptr + row * s_delta + cols, mask=inside, other=0.0).to(tl.float32), dtype)
        tl.store(res_ptr + row * s_res + cols, x.to(dtype), mask=inside)
    rstd = tl.math.rsqrt(tl.sum(x * x, axis=0) / n + eps)
    w = tl.load(w_ptr + cols, mask=inside, other=0.0).to(tl.float32)
    tl.store(out_ptr + row * s_out + cols, (w * _round(x * rstd, dtype)).to(dtype), mask=inside)


def add_rms_norm(
    h: torch.Tensor, delta: torch.Tensor | None, weight: torch.Tensor, eps: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """h, delta [rows, n] (delta may be None), weight [n] -> (residual h + delta, RMSNorm(residual) *
    weight), both in h's dtype; with no delta the residual is h itself."""
    if h.dim() != 2 or h.stride(-1) != 1 or weight.shape != (h.shape[1],) or weight.stride(-1) != 1:
        raise ValueError(
            f"add_rms_norm needs h [rows, n] with n contiguous and weight [n]; got h {tuple(h.shape)} "
            f"strides {h.stride()}, weight {tuple(weight.shape)}"
        )
    if delta is not None and (delta.shape != h.shape or delta.stride(-1) != 1):
        raise ValueError(f"add_rms_norm: delta {tuple(delta.shape)} strides {delta.stride()} does not match h {tuple(h.shape)}")
    rows, n = h.shape
    out = torch.empty((rows, n), dtype=h.dtype, device=h.device)
    res = torch.empty_like(out) if delta is not None else h
    block = triton.next_power_of_2(n)
    _add_rms_norm_kernel[(rows,)](
        h, delta if delta is not None else h, weight, res, out,
        h.stride(0), (delta if delta is not None else h).stride(0), res.stride(0), out.stride(0), n, eps,
        HAS_DELTA=delta is not None, BLOCK=block, num_warps=max(1, min(16, block // 256)),
    )
    return res, out


@triton.jit
def rope_heads(heads_ptr, cos, sin, d, inside, D: tl.constexpr):
    """RoPE on the heads whose first elements ``heads_ptr`` points at ([R, 1], or one pointer for one
    head), over columns ``d`` [1, BLOCK] (``inside``, broadcast to [R, BLOCK], masks): x * cos +
    rotate_half(x) * sin, with cos and sin float32 [1, BLOCK] and rotate_half(x) = [-x[D/2:],
    x[:D/2]]. Each product is rounded to the heads' dtype before the sum, as the eager path rounds;
    [R, BLOCK] in that dtype. The decode attention kernel applies it too (decode_attention_with_rope),
    so both run this one definition; both compile without FMA contraction, which would join a
    product to the sum and skip its rounding."""
    dtype: tl.constexpr = heads_ptr.dtype.element_ty
    x = tl.load(heads_ptr + d, mask=inside, other=0.0).to(tl.float32)
    first_half = d < D // 2
    partner = tl.load(heads_ptr + tl.where(first_half, d + D // 2, d - D // 2), mask=inside, other=0.0).to(tl.float32)
    rotated = tl.where(first_half, -partner, partner)
    return (_round(x * cos, dtype) + _round(rotated * sin, dtype)).to(dtype)


@triton.jit
def _rope_cache_kernel(
    qkv_ptr, cos_ptr, sin_ptr, q_ptr, k_ptr, v_ptr, slot_ptr,
    s_qkv, s_cos, s_sin, s_q_b, s_q_h, s_k_b, s_k_h, s_k_s, s_v_b, s_v_h, s_v_s,
    HEADS: tl.constexpr, KV_HEADS: tl.constexpr, D: tl.constexpr, BLOCK_D: tl.constexpr,
):
    # one program per (row, head of q, k or v); qkv's row holds the q heads, then k's, then v's
    row = tl.program_id(0).to(tl.int64)
    head = tl.program_id(1)
    d = tl.arange(0, BLOCK_D)[None, :]  # [1, BLOCK_D]: one head's columns
    inside = d < D
    src = qkv_ptr + row * s_qkv + head * D
    if head >= HEADS + KV_HEADS:  # a value head: into the cache as it is
        slot = tl.load(slot_ptr).to(tl.int64)
        kv = head - HEADS - KV_HEADS
        tl.store(v_ptr + row * s_v_b + kv * s_v_h + slot * s_v_s + d, tl.load(src + d, mask=inside, other=0.0),
                 mask=inside)
    else:
        cos = tl.load(cos_ptr + row * s_cos + d, mask=inside, other=0.0).to(tl.float32)
        sin = tl.load(sin_ptr + row * s_sin + d, mask=inside, other=0.0).to(tl.float32)
        out = rope_heads(src, cos, sin, d, inside, D)
        if head < HEADS:
            tl.store(q_ptr + row * s_q_b + head * s_q_h + d, out, mask=inside)
        else:
            slot = tl.load(slot_ptr).to(tl.int64)
            tl.store(k_ptr + row * s_k_b + (head - HEADS) * s_k_h + slot * s_k_s + d, out, mask=inside)


def check_rope_inputs(
    caller: str, qkv: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, cache_k: torch.Tensor,
    cache_v: torch.Tensor, slot: torch.Tensor, heads: int,
) -> None:
    """Raise, naming ``caller``, unless the inputs are what a step's RoPE and K/V write take (see
    rope_and_cache_write; decode_attention_with_rope takes the same)."""
    b, kv_heads, _, d = cache_k.shape
    if d % 2 or qkv.shape != (b, (heads + 2 * kv_heads) * d) or cache_v.shape != cache_k.shape:
        raise ValueError(
            f"{caller}: expected qkv [{b}, {(heads + 2 * kv_heads) * d}] for {heads} query heads and "
            f"caches [b, kv heads, slots, d] with even d; got qkv {tuple(qkv.shape)}, cache_k {tuple(cache_k.shape)}, "
            f"cache_v {tuple(cache_v.shape)}"
        )
    if cos.shape != (b, d) or sin.shape != (b, d):
        raise ValueError(f"{caller}: expected cos and sin [{b}, {d}], got {tuple(cos.shape)}, {tuple(sin.shape)}")
    if any(t.stride(-1) != 1 for t in (qkv, cos, sin, cache_k, cache_v)) or slot.numel() != 1:
        raise ValueError(f"{caller} needs the last dimension of every tensor contiguous and one slot")


def rope_and_cache_write(
    qkv: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    cache_k: torch.Tensor,
    cache_v: torch.Tensor,
    slot: torch.Tensor,
    heads: int,
) -> torch.Tensor:
    """qkv [b, (heads + 2 kv heads) * d] (q, k, v heads in that order), cos, sin [b, d], one layer's
    cache_k, cache_v [b, kv heads, slots, d], slot (a one-element device integer tensor) -> the
    rotated queries [b, heads, d]; writes the rotated keys and the values at ``slot``."""
    check_rope_inputs("rope_and_cache_write", qkv, cos, sin, cache_k, cache_v, slot, heads)
    b, kv_heads, _, d = cache_k.shape
    q = torch.empty((b, heads, d), dtype=qkv.dtype, device=qkv.device)
    _rope_cache_kernel[(b, heads + 2 * kv_heads)](
        qkv, cos, sin, q, cache_k, cache_v, slot,
        qkv.stride(0), cos.stride(0), sin.stride(0), q.stride(0), q.stride(1),
        cache_k.stride(0), cache_k.stride(1), cache_k.stride(2), cache_v.stride(0), cache_v.stride(1), cache_v.stride(2),
        HEADS=heads, KV_HEADS=kv_heads, D=d, BLOCK_D=triton.next_power_of_2(d), num_warps=2,
        enable_fp_fusion=False,  # else x*cos + r*sin becomes one FMA: one rounding where the eager path has three
    )
    return q


@triton.jit
def _silu_mul_kernel(gu_ptr, out_ptr, s_gu, s_out, inter, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    inside = cols < inter
    dtype: tl.constexpr = out_ptr.dtype.element_ty
    gate = tl.load(gu_ptr + row * s_gu + cols, mask=inside, other=0.0).to(tl.float32)
    up = tl.load(gu_ptr + row * s_gu + inter + cols, mask=inside, other=0.0).to(tl.float32)
    act = _round(tl.div_rn(gate, 1.0 + tl.exp(-gate)), dtype)  # F.silu in the model's dtype, an IEEE division as torch's
    tl.store(out_ptr + row * s_out + cols, (act * up).to(dtype), mask=inside)


def silu_mul(gate_up: torch.Tensor) -> torch.Tensor:
    """gate_up [rows, 2 I] (gate's I columns, then up's) -> SiLU(gate) * up [rows, I], in its dtype."""
    if gate_up.dim() != 2 or gate_up.shape[1] % 2 or gate_up.stride(-1) != 1:
        raise ValueError(
            f"silu_mul needs gate_up [rows, 2 I] with columns contiguous; got {tuple(gate_up.shape)} strides {gate_up.stride()}"
        )
    rows, inter = gate_up.shape[0], gate_up.shape[1] // 2
    out = torch.empty((rows, inter), dtype=gate_up.dtype, device=gate_up.device)
    _silu_mul_kernel[(rows, triton.cdiv(inter, SILU_BLOCK))](
        gate_up, out, gate_up.stride(0), out.stride(0), inter, BLOCK=SILU_BLOCK, num_warps=4
    )
    return out
