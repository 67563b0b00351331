"""The decode step's MLP (gate/up, SiLU times up, down) in fewer launches than the engine's four: the
kernels that benchmarks/decode_mlp_probe.py times against the engine's path.

Why (issue 31): at 4-64 rows the 1.5B's MLP takes about 31 microseconds a layer on an H200 in four
kernels (cuBLAS's gate/up, the engine's SiLU kernel, cuBLAS's split-K down and its reduction), where
reading its 82.6 MB of weights at the bandwidth takes 17. Each small kernel pays its launch and its
first loads' latency; fusing them pays it once.

The weights are in the engine's CUDA layout (trainer/rollout/lean_decoder.py, LeanWeights): gate/up
stored [hidden, 2 I] (gate's I columns, then up's), down stored [I, hidden]; any strides work.

Roundings are the engine's: gate and up are each rounded to the model's dtype (cuBLAS's output),
SiLU of the rounded gate is rounded, times up rounded again (trainer/kernels/triton_decode_fused.py,
silu_mul), and down's float32 sum is rounded once. What differs from cuBLAS is only the order of the
float32 additions inside each sum.

- ``gate_up_silu``: gate/up and SiLU in one kernel, one program per chunk of intermediate columns;
  its output [rows, I] feeds any down matmul.
- ``down_tiles``: down as one program per tile of output columns over all of I (no split, no
  reduction kernel).
- ``mlp_atomic``: both in one kernel: a program multiplies its own chunk of the intermediate by
  down's rows for that chunk and adds the [rows, hidden] product into a float32 buffer with atomics;
  a second, small kernel rounds the buffer and zeroes it. The atomics' order varies from run to run,
  so its bits do too (for timing only).
- ``mlp_barrier``: both in one kernel with a barrier across the grid between them: every program
  writes its chunk of the intermediate, waits until all have, then computes a tile of down's output
  over all of I. Deterministic; it needs every program resident at once, so the grid is at most the
  GPU's SMs (each program loops over its chunks).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
import triton
import triton.language as tl


def reference_intermediate(x: torch.Tensor, gate_up: torch.Tensor) -> torch.Tensor:
    """SiLU(gate) * up in float64, rounded to x's dtype where the engine rounds (gate, up, SiLU, the product)."""
    dtype = x.dtype
    gate, up = (x.double() @ gate_up.double().T).to(dtype).chunk(2, dim=-1)
    act = F.silu(gate.double()).to(dtype)
    return (act.double() * up.double()).to(dtype)


def reference_mlp(x: torch.Tensor, gate_up: torch.Tensor, down: torch.Tensor) -> torch.Tensor:
    """The MLP in float64, rounded to x's dtype where the engine rounds (reference_intermediate, then down)."""
    return (reference_intermediate(x, gate_up).double() @ down.double().T).to(x.dtype)


@triton.jit
def _round(x, dtype: tl.constexpr):
    return x.to(dtype).to(tl.float32)


@triton.jit
def _gate_up_chunk(x_ptr, wgu_ptr, chunk, M, H, INTER, s_xm, s_wk, s_wn,
                   BLOCK_M: tl.constexpr, BLOCK_C: tl.constexpr, BLOCK_K: tl.constexpr, UPCAST: tl.constexpr):
    """SiLU(x @ gate[:, cols]) * (x @ up[:, cols]) for one chunk of BLOCK_C intermediate columns,
    rounded as the engine rounds: [BLOCK_M, BLOCK_C] float32 holding model-dtype values."""
    dtype: tl.constexpr = x_ptr.dtype.element_ty
    rows = tl.arange(0, BLOCK_M)  # [BM]
    cols = chunk * BLOCK_C + tl.arange(0, BLOCK_C)  # [BC]
    ks = tl.arange(0, BLOCK_K)  # [BK]
    row_in, col_in = rows < M, cols < INTER
    acc_gate = tl.zeros([BLOCK_M, BLOCK_C], tl.float32)
    acc_up = tl.zeros([BLOCK_M, BLOCK_C], tl.float32)
    for k0 in range(0, H, BLOCK_K):
        k = k0 + ks
        k_in = k < H
        x = tl.load(x_ptr + rows[:, None] * s_xm + k[None, :], mask=row_in[:, None] & k_in[None, :], other=0.0)  # [BM, BK]
        w_at = wgu_ptr + k[:, None] * s_wk + cols[None, :] * s_wn  # [BK, BC]
        w_in = k_in[:, None] & col_in[None, :]
        gate = tl.load(w_at, mask=w_in, other=0.0)
        up = tl.load(w_at + INTER * s_wn, mask=w_in, other=0.0)
        # UPCAST: float32 products in IEEE, for Triton's interpreter (it multiplies bf16 tiles wrongly; their
        # float32 products are exact) and for float32 inputs (tl.dot would round them to TF32)
        if UPCAST:
            x, gate, up = x.to(tl.float32), gate.to(tl.float32), up.to(tl.float32)
            acc_gate += tl.dot(x, gate, input_precision="ieee")
            acc_up += tl.dot(x, up, input_precision="ieee")
        else:
            acc_gate += tl.dot(x, gate)
            acc_up += tl.dot(x, up)
    gate = _round(acc_gate, dtype)
    act = _round(tl.div_rn(gate, 1.0 + tl.exp(-gate)), dtype)  # F.silu in the model's dtype
    return _round(act * _round(acc_up, dtype), dtype)


@triton.jit
def _gate_up_silu_kernel(x_ptr, wgu_ptr, out_ptr, M, H, INTER, s_xm, s_wk, s_wn, s_om,
                         BLOCK_M: tl.constexpr, BLOCK_C: tl.constexpr, BLOCK_K: tl.constexpr, UPCAST: tl.constexpr):
    chunk = tl.program_id(0)
    inter = _gate_up_chunk(x_ptr, wgu_ptr, chunk, M, H, INTER, s_xm, s_wk, s_wn, BLOCK_M, BLOCK_C, BLOCK_K, UPCAST)
    rows = tl.arange(0, BLOCK_M)
    cols = chunk * BLOCK_C + tl.arange(0, BLOCK_C)
    tl.store(out_ptr + rows[:, None] * s_om + cols[None, :], inter.to(out_ptr.dtype.element_ty),
             mask=(rows[:, None] < M) & (cols[None, :] < INTER))


@triton.jit
def _down_tile(inter_ptr, wd_ptr, out_ptr, tile, M, H, INTER, s_im, s_wk, s_wn, s_om,
               BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, UPCAST: tl.constexpr,
               COHERENT: tl.constexpr):
    """out[:, tile's columns] = inter @ down[:, those columns], the float32 sum over all of I rounded once.
    COHERENT: inter was written by other programs of this launch; read it past the SM's L1."""
    rows = tl.arange(0, BLOCK_M)
    ns = tile * BLOCK_N + tl.arange(0, BLOCK_N)
    ks = tl.arange(0, BLOCK_K)
    row_in, n_in = rows < M, ns < H
    acc = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
    for k0 in range(0, INTER, BLOCK_K):
        k = k0 + ks
        k_in = k < INTER
        w = tl.load(wd_ptr + k[:, None] * s_wk + ns[None, :] * s_wn, mask=k_in[:, None] & n_in[None, :], other=0.0)
        if COHERENT:
            a = tl.load(inter_ptr + rows[:, None] * s_im + k[None, :], mask=row_in[:, None] & k_in[None, :], other=0.0,
                        cache_modifier=".cg")
        else:
            a = tl.load(inter_ptr + rows[:, None] * s_im + k[None, :], mask=row_in[:, None] & k_in[None, :], other=0.0)
        if UPCAST:
            acc += tl.dot(a.to(tl.float32), w.to(tl.float32), input_precision="ieee")
        else:
            acc += tl.dot(a, w)
    tl.store(out_ptr + rows[:, None] * s_om + ns[None, :], acc.to(out_ptr.dtype.element_ty),
             mask=row_in[:, None] & n_in[None, :])


@triton.jit
def _down_tiles_kernel(inter_ptr, wd_ptr, out_ptr, M, H, INTER, s_im, s_wk, s_wn, s_om,
                       BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, UPCAST: tl.constexpr):
    _down_tile(inter_ptr, wd_ptr, out_ptr, tl.program_id(0), M, H, INTER, s_im, s_wk, s_wn, s_om,
               BLOCK_M, BLOCK_N, BLOCK_K, UPCAST, False)


@triton.jit
def _mlp_atomic_kernel(x_ptr, wgu_ptr, wd_ptr, acc_ptr, M, H, INTER, s_xm, s_gk, s_gn, s_dk, s_dn,
                       BLOCK_M: tl.constexpr, BLOCK_C: tl.constexpr, BLOCK_K: tl.constexpr, BLOCK_N: tl.constexpr,
                       UPCAST: tl.constexpr):
    chunk = tl.program_id(0)
    inter = _gate_up_chunk(x_ptr, wgu_ptr, chunk, M, H, INTER, s_xm, s_gk, s_gn, BLOCK_M, BLOCK_C, BLOCK_K, UPCAST)
    inter = inter.to(wd_ptr.dtype.element_ty)  # [BM, BC], exact: the values are the dtype's
    if UPCAST:
        inter = inter.to(tl.float32)
    rows = tl.arange(0, BLOCK_M)
    cs = chunk * BLOCK_C + tl.arange(0, BLOCK_C)
    c_in = cs < INTER
    for n0 in range(0, H, BLOCK_N):
        ns = n0 + tl.arange(0, BLOCK_N)
        n_in = ns < H
        w = tl.load(wd_ptr + cs[:, None] * s_dk + ns[None, :] * s_dn, mask=c_in[:, None] & n_in[None, :], other=0.0)  # [BC, BN]
        if UPCAST:
            part = tl.dot(inter, w.to(tl.float32), input_precision="ieee")  # [BM, BN] float32
        else:
            part = tl.dot(inter, w)  # [BM, BN] float32
        tl.atomic_add(acc_ptr + rows[:, None] * H + ns[None, :], part, mask=(rows[:, None] < M) & n_in[None, :], sem="relaxed")


@triton.jit
def _round_and_zero_kernel(acc_ptr, out_ptr, n, BLOCK: tl.constexpr):
    at = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    inside = at < n
    tl.store(out_ptr + at, tl.load(acc_ptr + at, mask=inside).to(out_ptr.dtype.element_ty), mask=inside)
    tl.store(acc_ptr + at, tl.zeros([BLOCK], tl.float32), mask=inside)


@triton.jit
def _mlp_barrier_kernel(x_ptr, wgu_ptr, wd_ptr, inter_ptr, out_ptr, sync_ptr, M, H, INTER, s_xm, s_gk, s_gn, s_dk, s_dn,
                        s_im, s_om, chunks, tiles,
                        BLOCK_M: tl.constexpr, BLOCK_C: tl.constexpr, BLOCK_K: tl.constexpr, BLOCK_N: tl.constexpr,
                        BLOCK_KD: tl.constexpr, UPCAST: tl.constexpr):
    pid = tl.program_id(0)
    programs = tl.num_programs(0)
    rows = tl.arange(0, BLOCK_M)
    for chunk in range(pid, chunks, programs):
        inter = _gate_up_chunk(x_ptr, wgu_ptr, chunk, M, H, INTER, s_xm, s_gk, s_gn, BLOCK_M, BLOCK_C, BLOCK_K, UPCAST)
        cols = chunk * BLOCK_C + tl.arange(0, BLOCK_C)
        tl.store(inter_ptr + rows[:, None] * s_im + cols[None, :], inter.to(inter_ptr.dtype.element_ty),
                 mask=(rows[:, None] < M) & (cols[None, :] < INTER))
    # the grid's barrier: every program's stores, then one release-add each; wait for all of them
    tl.debug_barrier()
    tl.atomic_add(sync_ptr, 1, sem="release")
    arrived = tl.atomic_add(sync_ptr, 0, sem="acquire")
    while arrived < programs:
        arrived = tl.atomic_add(sync_ptr, 0, sem="acquire")
    tl.debug_barrier()
    for tile in range(pid, tiles, programs):
        _down_tile(inter_ptr, wd_ptr, out_ptr, tile, M, H, INTER, s_im, s_dk, s_dn, s_om, BLOCK_M, BLOCK_N, BLOCK_KD,
                   UPCAST, True)
    # the last program past the barrier resets the counters for the next launch
    left = tl.atomic_add(sync_ptr + 1, 1, sem="acq_rel")
    if left == programs - 1:
        tl.atomic_xchg(sync_ptr, 0)
        tl.atomic_xchg(sync_ptr + 1, 0)


def _rows_block(rows: int) -> int:
    if rows > 128:
        raise ValueError(f"decode_mlp: at most 128 rows, got {rows}")
    return max(16, triton.next_power_of_2(rows))


def _rows_input(name: str, t: torch.Tensor) -> None:
    """The kernels read rows' columns at unit stride."""
    if t.dim() != 2 or t.stride(1) != 1:
        raise ValueError(f"decode_mlp: {name} must be [rows, features] with unit stride along features; "
                         f"got {tuple(t.shape)} strides {t.stride()}")


def _upcast(t: torch.Tensor, interpreted: bool) -> bool:
    """Whether the kernels multiply in float32 IEEE (see _gate_up_chunk): interpreted bf16, or float32."""
    return t.dtype == torch.float32 or interpreted


def gate_up_silu(x: torch.Tensor, gate_up: torch.Tensor, block_c: int = 64, block_k: int = 128, num_warps: int = 4,
                 num_stages: int = 3, interpreted: bool = False) -> torch.Tensor:
    """x [rows, hidden], gate_up [2 I, hidden] (any strides) -> SiLU(gate) * up [rows, I] in x's dtype."""
    _rows_input("x", x)
    rows, hidden = x.shape
    inter = gate_up.shape[0] // 2
    out = torch.empty((rows, inter), dtype=x.dtype, device=x.device)
    options = {} if interpreted else dict(num_warps=num_warps, num_stages=num_stages)
    _gate_up_silu_kernel[(triton.cdiv(inter, block_c),)](
        x, gate_up, out, rows, hidden, inter, x.stride(0), gate_up.stride(1), gate_up.stride(0), out.stride(0),
        BLOCK_M=_rows_block(rows), BLOCK_C=block_c, BLOCK_K=block_k, UPCAST=_upcast(x, interpreted),
        **options,
    )
    return out


def down_tiles(inter: torch.Tensor, down: torch.Tensor, block_n: int = 32, block_k: int = 256, num_warps: int = 4,
               num_stages: int = 3, interpreted: bool = False) -> torch.Tensor:
    """inter [rows, I], down [hidden, I] (any strides) -> inter @ down^T [rows, hidden]."""
    _rows_input("inter", inter)
    rows, inter_size = inter.shape
    hidden = down.shape[0]
    out = torch.empty((rows, hidden), dtype=inter.dtype, device=inter.device)
    options = {} if interpreted else dict(num_warps=num_warps, num_stages=num_stages)
    _down_tiles_kernel[(triton.cdiv(hidden, block_n),)](
        inter, down, out, rows, hidden, inter_size, inter.stride(0), down.stride(1), down.stride(0), out.stride(0),
        BLOCK_M=_rows_block(rows), BLOCK_N=block_n, BLOCK_K=block_k, UPCAST=_upcast(inter, interpreted),
        **options,
    )
    return out


def mlp_atomic(x: torch.Tensor, gate_up: torch.Tensor, down: torch.Tensor, acc: torch.Tensor, block_c: int = 64,
               block_k: int = 128, block_n: int = 128, num_warps: int = 4, num_stages: int = 3,
               interpreted: bool = False) -> torch.Tensor:
    """The MLP [rows, hidden] -> [rows, hidden] through float32 atomics into ``acc`` ([rows * hidden]
    float32, zero on entry and on return)."""
    _rows_input("x", x)
    rows, hidden = x.shape
    inter = gate_up.shape[0] // 2
    options = {} if interpreted else dict(num_warps=num_warps, num_stages=num_stages)
    _mlp_atomic_kernel[(triton.cdiv(inter, block_c),)](
        x, gate_up, down, acc, rows, hidden, inter, x.stride(0), gate_up.stride(1), gate_up.stride(0),
        down.stride(1), down.stride(0),
        BLOCK_M=_rows_block(rows), BLOCK_C=block_c, BLOCK_K=block_k, BLOCK_N=block_n,
        UPCAST=_upcast(x, interpreted), **options,
    )
    out = torch.empty((rows, hidden), dtype=x.dtype, device=x.device)
    _round_and_zero_kernel[(triton.cdiv(rows * hidden, 1024),)](acc, out, rows * hidden, BLOCK=1024)
    return out


def mlp_barrier(x: torch.Tensor, gate_up: torch.Tensor, down: torch.Tensor, inter: torch.Tensor, sync: torch.Tensor,
                programs: int, block_c: int = 64, block_k: int = 128, block_n: int = 32, block_kd: int = 256,
                num_warps: int = 4, num_stages: int = 3) -> torch.Tensor:
    """The MLP in one launch of ``programs`` programs (at most the SMs: all must be resident) with a
    barrier across them; ``inter`` [rows, I] scratch, ``sync`` two int32 counters, zero (and zero again
    on return). GPU only: Triton's interpreter runs programs one by one and would wait forever."""
    from trainer.kernels import sm_count

    _rows_input("x", x)
    _rows_input("inter", inter)
    if not 1 <= programs <= sm_count(x.device):
        raise ValueError(f"mlp_barrier: {programs} programs; between 1 and the GPU's {sm_count(x.device)} SMs, "
                         "so that all are resident at once (more would wait at the barrier forever)")
    rows, hidden = x.shape
    inter_size = gate_up.shape[0] // 2
    out = torch.empty((rows, hidden), dtype=x.dtype, device=x.device)
    _mlp_barrier_kernel[(programs,)](
        x, gate_up, down, inter, out, sync, rows, hidden, inter_size, x.stride(0), gate_up.stride(1),
        gate_up.stride(0), down.stride(1), down.stride(0), inter.stride(0), out.stride(0),
        triton.cdiv(inter_size, block_c), triton.cdiv(hidden, block_n),
        BLOCK_M=_rows_block(rows), BLOCK_C=block_c, BLOCK_K=block_k, BLOCK_N=block_n, BLOCK_KD=block_kd,
        UPCAST=_upcast(x, False), num_warps=num_warps, num_stages=num_stages,
    )
    return out
