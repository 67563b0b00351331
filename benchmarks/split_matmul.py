"""A split-K Triton matmul for the decode step's small matmuls: tried against cuBLAS, and slower.

The idea (issue 15): at decode a layer's matmul is ``x [rows, K] @ W^T`` with rows <= 128, so its
cost is reading W once, and cuBLAS tiles the output: a 1.5B Qwen2's fused q/k/v output of 128 x
2,048 is a dozen tiles for 132 SMs, and on an H100 the q/k/v and o matmuls read their weights at
0.85-1.1 TB/s of 3.35. Here each program reads one [BLOCK_K x BLOCK_N] strip of W per step over
its share of K (``split`` shares), each share's float32 partial sum goes to a workspace, and a
second kernel adds the shares in a fixed order (no atomics: the result repeats bit for bit), adds
the bias and rounds once to the output dtype, as cuBLAS's epilogue does.

What was measured (``python3 benchmarks/decode_kernels_tune.py OUT.json --shapes --matmul-rows
--split-matmul-rows 128 64``, one H100, 2026-11-26; docs/benchmarks.md): over 8 tiles and up to 8
splits, the best configuration of this kernel was slower than cuBLAS for every matmul of the 1.5B
model at 128 rows, and at 64 rows faster only for down_proj (0.391 ms against 0.418 over 28 layers).
Each of these small matmuls takes 5-8 microseconds whatever the tiling: launch and the first loads'
latency, not the tiling, bound them. The engine therefore keeps cuBLAS; this kernel stays here for the
tune script, to re-measure on other GPUs and models.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch
import triton
import triton.language as tl

REDUCE_BLOCK = 1024  # output columns per program of the reduction


@dataclass(frozen=True)
class SplitPlan:
    """One launch of ``split_matmul``: the tile and how many shares K is cut into."""

    block_m: int
    block_n: int
    block_k: int
    split: int
    num_warps: int = 4
    num_stages: int = 4

    def programs(self, rows: int, n: int) -> int:
        return triton.cdiv(rows, self.block_m) * triton.cdiv(n, self.block_n) * self.split


@triton.jit
def _split_matmul_kernel(
    x_ptr, w_ptr, part_ptr, out_ptr, bias_ptr,
    M, N, K, k_share, s_xm, s_xk, s_wn, s_wk, s_ps, s_pm, s_om,
    HAS_BIAS: tl.constexpr, DIRECT: tl.constexpr, PRECISION: tl.constexpr, UPCAST: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
):
    # program (n tile, K share, m tile): sum over its share of K of x[m, k] * w[n, k]
    pid_n = tl.program_id(0)
    share = tl.program_id(1)
    pid_m = tl.program_id(2)
    rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)  # [BM]
    cols = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)  # [BN]
    ks = tl.arange(0, BLOCK_K)  # [BK]
    k_lo = share * k_share
    k_hi = tl.minimum(k_lo + k_share, K)
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)  # [BM, BN]
    for k0 in range(k_lo, k_hi, BLOCK_K):
        k = k0 + ks
        x = tl.load(x_ptr + rows[:, None] * s_xm + k[None, :] * s_xk,
                    mask=(rows[:, None] < M) & (k[None, :] < k_hi), other=0.0)  # [BM, BK]
        w = tl.load(w_ptr + k[:, None] * s_wk + cols[None, :] * s_wn,
                    mask=(k[:, None] < k_hi) & (cols[None, :] < N), other=0.0)  # [BK, BN]
        if UPCAST:  # Triton's interpreter multiplies bf16 tiles wrongly; their float32 products are exact
            x, w = x.to(tl.float32), w.to(tl.float32)
        acc += tl.dot(x, w, input_precision=PRECISION)
    inside = (rows[:, None] < M) & (cols[None, :] < N)
    if DIRECT:  # one share: the epilogue here
        if HAS_BIAS:
            acc += tl.load(bias_ptr + cols, mask=cols < N, other=0.0).to(tl.float32)[None, :]
        tl.store(out_ptr + rows[:, None] * s_om + cols[None, :], acc.to(out_ptr.dtype.element_ty), mask=inside)
    else:
        tl.store(part_ptr + share * s_ps + rows[:, None] * s_pm + cols[None, :], acc, mask=inside)


@triton.jit
def _sum_shares_kernel(part_ptr, out_ptr, bias_ptr, N, s_ps, s_pm, s_om,
                       SPLIT: tl.constexpr, HAS_BIAS: tl.constexpr, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    inside = cols < N
    acc = tl.zeros((BLOCK,), dtype=tl.float32)
    for share in tl.static_range(SPLIT):  # a fixed order: the same sum every run
        acc += tl.load(part_ptr + share * s_ps + row * s_pm + cols, mask=inside, other=0.0)
    if HAS_BIAS:
        acc += tl.load(bias_ptr + cols, mask=inside, other=0.0).to(tl.float32)
    tl.store(out_ptr + row * s_om + cols, acc.to(out_ptr.dtype.element_ty), mask=inside)


def split_matmul(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, plan: SplitPlan) -> torch.Tensor:
    """F.linear(x, weight, bias) for x [rows, K] and weight [N, K] (any strides) as ``plan`` says."""
    if x.dim() != 2 or weight.dim() != 2 or x.shape[1] != weight.shape[1]:
        raise ValueError(f"split_matmul needs x [rows, K] and weight [N, K]; got {tuple(x.shape)} and {tuple(weight.shape)}")
    if bias is not None and (bias.shape != (weight.shape[0],) or bias.stride(0) != 1):
        raise ValueError(f"split_matmul: bias {tuple(bias.shape)} does not match {weight.shape[0]} outputs")
    rows, k = x.shape
    n = weight.shape[0]
    out = torch.empty((rows, n), dtype=x.dtype, device=x.device)
    share = triton.cdiv(triton.cdiv(k, plan.split), plan.block_k) * plan.block_k  # whole K tiles per share
    split = triton.cdiv(k, share)  # shares that hold any of K
    direct = split == 1
    interpreted = os.environ.get("TRITON_INTERPRET") == "1"
    part = out if direct else torch.empty((split, rows, n), dtype=torch.float32, device=x.device)
    grid = (triton.cdiv(n, plan.block_n), split, triton.cdiv(rows, plan.block_m))
    _split_matmul_kernel[grid](
        x, weight, part, out, bias if bias is not None else out,
        rows, n, k, share, x.stride(0), x.stride(1), weight.stride(0), weight.stride(1),
        0 if direct else part.stride(0), 0 if direct else part.stride(1), out.stride(0),
        HAS_BIAS=bias is not None, DIRECT=direct,
        PRECISION="ieee" if x.dtype == torch.float32 or interpreted else "tf32",  # no TF32 rounding of float32
        UPCAST=interpreted and x.dtype != torch.float32,
        BLOCK_M=plan.block_m, BLOCK_N=plan.block_n, BLOCK_K=plan.block_k,
        num_warps=plan.num_warps, num_stages=plan.num_stages,
    )
    if not direct:
        _sum_shares_kernel[(rows, triton.cdiv(n, REDUCE_BLOCK))](
            part, out, bias if bias is not None else out, n, part.stride(0), part.stride(1), out.stride(0),
            SPLIT=split, HAS_BIAS=bias is not None, BLOCK=REDUCE_BLOCK, num_warps=4,
        )
    return out
