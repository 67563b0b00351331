"""Decode attention over a long KV cache at any batch size: split over the cache (flash-decoding).

Why: one decode step has one query token per row. A fused attention kernel that gives each (row, KV
head) one program, as the cuDNN/flash SDPA kernels do for a single query, runs rows x KV heads
programs: with the 1.5B architecture's 2 KV heads and few rows (the tail of a ragged batch after row
compaction) that is 2-16 programs on 132 SMs, and a step at 27k tokens of context measured 17 ms for
one row on an H100, 14 ms of it in attention, where reading that row's cache takes 0.02 ms.
Splitting each row's cache into chunks, one program per (row, KV head, chunk), then merging the
chunks' partial softmax sums, keeps every SM reading (Dao et al., "Flash-Decoding for long-context
inference", 2023).

Grouped-query attention reads each KV head once for all the query heads that share it: a program's
queries are the ``group`` query heads of its KV head (transformers' repeat_kv maps query head i to
KV head i // group), padded to 16 rows for the tensor-core dot.

``decode_attention(q, k, v, bias, attn_len)`` computes softmax(q k^T / sqrt(d) + bias) v over slots
[0, attn_len), as ``F.scaled_dot_product_attention(q, k[..., :attn_len, :], v[..., :attn_len, :],
attn_mask=bias[:, None, None, :attn_len])`` does for the fast engine's [b, KV heads, group, d]
queries. Scores and the softmax sums are float32; the probabilities are cast to V's dtype for the
second product, as flash attention does (float32 inputs multiply in full float32).

``decode_attention_with_rope`` is the same kernel fed the fused q/k/v matmul's output: it applies
RoPE to the queries and writes this step's rotated key and value into the cache slot before it
attends, which the fast engine otherwise does in a kernel of its own (``rope_and_cache_write``,
trainer/kernels/triton_decode_fused.py). Only imported where Triton exists.
"""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

from trainer.kernels import sm_count
from trainer.kernels.triton_decode_fused import check_rope_inputs, rope_heads

# Cache slots per tile: 64 where each (row, KV head) is one program, 32 where rows are few and their
# caches are split (1 and 16 rows at 27,648 slots: 7% and 3% faster than 64 on an H100;
# benchmarks/decode_kernels_tune.py, docs/benchmarks.md)
BLOCK_N_WHOLE = 64
BLOCK_N_SPLIT = 32
NUM_WARPS = 4  # the partial kernel's launch (Triton's defaults)
NUM_STAGES = 3
MIN_SLOTS_PER_SPLIT = 256  # a chunk shorter than this costs more to merge than it saves
MAX_SPLITS = 128
MERGE_BLOCK = 16  # chunks the merge kernel reads at a time


@triton.jit
def _attend_tiles(q, k_base, v_base, bias_row, lo, hi, end, d, sk_s, sv_s, scale, running_max, running_sum, acc,
                  BLOCK: tl.constexpr, PRECISION: tl.constexpr, MASKED: tl.constexpr):
    """Online softmax over the tiles of slots [lo, hi), from one cache's K and V rows at k_base,
    v_base: the running max, sum and weighted V sum, updated. MASKED: slots from ``end`` on are not
    read (their weight is 0); else every slot of every tile is read."""
    for first in range(lo, hi, BLOCK):
        n = first + tl.arange(0, BLOCK)
        if MASKED:
            inside = n < end
            k = tl.load(k_base + n[:, None] * sk_s + d[None, :], mask=inside[:, None], other=0.0)
            bias = tl.load(bias_row + n, mask=inside, other=float("-inf")).to(tl.float32)
            v = tl.load(v_base + n[:, None] * sv_s + d[None, :], mask=inside[:, None], other=0.0)
        else:
            k = tl.load(k_base + n[:, None] * sk_s + d[None, :])
            bias = tl.load(bias_row + n).to(tl.float32)
            v = tl.load(v_base + n[:, None] * sv_s + d[None, :])
        scores = tl.dot(q, tl.trans(k), input_precision=PRECISION) * scale  # [GROUP_PAD, BLOCK] float32
        scores = scores + bias[None, :]
        new_max = tl.maximum(running_max, tl.max(scores, axis=1))
        rescale = tl.exp(running_max - new_max)
        p = tl.exp(scores - new_max[:, None])
        running_sum = running_sum * rescale + tl.sum(p, axis=1)
        acc = acc * rescale[:, None] + tl.dot(p.to(v.dtype), v, input_precision=PRECISION)
        running_max = new_max
    return running_max, running_sum, acc


@triton.jit
def _rope_step(qkv_row, h, g, d, cos_row, sin_row, k_slot, v_slot, writes,
               KV_HEADS: tl.constexpr, GROUP: tl.constexpr, D: tl.constexpr):
    """This step's RoPE from the fused q/k/v matmul's output row ``qkv_row`` (the q heads, then the k
    heads, then the v heads, each D wide): the rotated queries of KV head h's group, [GROUP_PAD, D]
    (rows g >= GROUP zero), returned; where ``writes`` (the program whose chunk of slots holds this
    step's slot), head h's rotated key and its value stored at ``k_slot`` and ``v_slot`` first."""
    cos = tl.load(cos_row + d[None, :]).to(tl.float32)
    sin = tl.load(sin_row + d[None, :]).to(tl.float32)
    q = rope_heads(qkv_row + (h * GROUP + g[:, None]) * D, cos, sin, d[None, :], g[:, None] < GROUP, D)
    if writes:
        key = rope_heads(qkv_row + (KV_HEADS * GROUP + h) * D, cos, sin, d[None, :], d[None, :] < D, D)
        tl.store(k_slot + d[None, :], key)
        tl.store(v_slot + d, tl.load(qkv_row + (KV_HEADS * GROUP + KV_HEADS + h) * D + d))
    tl.debug_barrier()  # the stores are visible to every thread of the program's loads after this
    return q


# Chunk sizes and counts are plain integers to Triton, not specialised on their values (a multiple of
# 16, or 1): each new class of them compiled the kernel again in the middle of a generation (0.8 s at
# a 7B decode-group member's step 14,848 on an H200), past what the engine's warm-up had met. attn_len
# and shared_slots stay specialised (always multiples of 128 in the engine): unspecialised too, the
# step at 64 rows x 27,648 slots took 35% longer on an H200 (docs/benchmarks.md).
@triton.jit(do_not_specialize=["tiles_per_split"])
def _partial_kernel(
    q_ptr, k_ptr, v_ptr, bias_ptr, acc_ptr, max_ptr, sum_ptr, out_ptr, kv_rows_ptr, last_slot_ptr, cos_ptr, sin_ptr,
    skip_ptr, sq_b, sq_h, sq_g, sk_b, sk_h, sk_s, sv_b, sv_h, sv_s, sbias_b, so_b, so_h, so_g, s_cos, s_sin,
    attn_len, tiles_per_split, scale, shared_slots,
    KV_HEADS: tl.constexpr, GROUP: tl.constexpr, GROUP_PAD: tl.constexpr, D: tl.constexpr, BLOCK: tl.constexpr,
    PRECISION: tl.constexpr, WHOLE: tl.constexpr, HAS_LAST_SLOT: tl.constexpr, ROPE: tl.constexpr,
    HAS_SKIP: tl.constexpr,
):
    # WHOLE: one chunk per (row, KV head), so the program's sums are final: it writes the output
    # itself and there is nothing to merge. ROPE: q_ptr is the qkv matmul's output (q heads, then k's,
    # then v's, packed); the queries are rotated here, and the program whose chunk holds the write
    # slot (last_slot) rotates this step's key and writes it and the value there first.
    tl.static_assert(HAS_LAST_SLOT or not ROPE, "ROPE writes this step's K/V at last_slot")
    bh = tl.program_id(0)
    split = tl.program_id(1)
    splits = tl.num_programs(1)
    b = (bh // KV_HEADS).to(tl.int64)  # 64-bit offsets: one layer's cache may pass 2^31 elements
    h = bh % KV_HEADS
    # the row whose cache holds this row's first ``shared_slots`` slots (its prompt): rows that share a
    # prompt read the same K/V there, which their programs, running at once, find in L2
    kv_row = tl.load(kv_rows_ptr + b).to(tl.int64)
    g = tl.arange(0, GROUP_PAD)
    d = tl.arange(0, D)
    start = split * tiles_per_split * BLOCK
    end = tl.minimum(start + tiles_per_split * BLOCK, attn_len)
    last = tl.load(last_slot_ptr).to(tl.int64) if HAS_LAST_SLOT else 0
    if ROPE:  # only the program whose chunk holds the slot written now reads that slot
        q = _rope_step(q_ptr + b * sq_b, h, g, d, cos_ptr + b * s_cos, sin_ptr + b * s_sin,
                       k_ptr + b * sk_b + h * sk_h + last * sk_s, v_ptr + b * sv_b + h * sv_h + last * sv_s,
                       (last >= start) & (last < end), KV_HEADS, GROUP, D)
    else:
        q = tl.load(q_ptr + b * sq_b + h * sq_h + g[:, None] * sq_g + d[None, :], mask=g[:, None] < GROUP, other=0.0)
    if HAS_LAST_SLOT:  # no row sees a slot after the one written this step: its tiles are not read
        end = tl.minimum(end, last.to(tl.int32) + 1)
    # a finite start: a tile whose slots are all masked (-inf bias) then adds exp(-inf) = 0, never NaN
    running_max = tl.full([GROUP_PAD], -1.0e30, tl.float32)
    running_sum = tl.zeros([GROUP_PAD], tl.float32)
    if HAS_SKIP:  # a row whose attention nobody reads (an ended row): no tile is read, and its sum is 1
        skipped = tl.load(skip_ptr + b) != 0  # so that its output is 0 / 1 = 0 (a live row's 0 / 0 stays NaN)
        end = tl.where(skipped, start, end)
        running_sum = tl.where(skipped, 1.0, running_sum)
    acc = tl.zeros([GROUP_PAD, D], tl.float32)
    # The whole tiles unmasked, the prompt's from kv_row's cache and the rest from the row's own, then
    # the last, partial tile masked. Why: masking every tile by a bound read from memory (last_slot)
    # made the kernel 14% slower at 64 rows x 14,336 slots on an H100 than masking by attn_len, the
    # loop's bound the same (docs/benchmarks.md). shared_slots is whole tiles.
    whole_end = start + tl.maximum(end - start, 0) // BLOCK * BLOCK
    mid = tl.maximum(tl.minimum(whole_end, shared_slots), start)
    bias_row = bias_ptr + b * sbias_b
    shared_k, shared_v = k_ptr + kv_row * sk_b + h * sk_h, v_ptr + kv_row * sv_b + h * sv_h
    own_k, own_v = k_ptr + b * sk_b + h * sk_h, v_ptr + b * sv_b + h * sv_h
    running_max, running_sum, acc = _attend_tiles(
        q, shared_k, shared_v, bias_row, start, mid, end, d, sk_s, sv_s, scale, running_max, running_sum, acc,
        BLOCK, PRECISION, False)
    running_max, running_sum, acc = _attend_tiles(
        q, own_k, own_v, bias_row, mid, whole_end, end, d, sk_s, sv_s, scale, running_max, running_sum, acc,
        BLOCK, PRECISION, False)
    in_prompt = whole_end < shared_slots
    running_max, running_sum, acc = _attend_tiles(
        q, tl.where(in_prompt, shared_k, own_k), tl.where(in_prompt, shared_v, own_v), bias_row, whole_end, end, end, d,
        sk_s, sv_s, scale, running_max, running_sum, acc, BLOCK, PRECISION, True)
    if WHOLE:
        out = acc / running_sum[:, None]
        tl.store(out_ptr + b * so_b + h * so_h + g[:, None] * so_g + d[None, :], out.to(out_ptr.dtype.element_ty),
                 mask=g[:, None] < GROUP)
    else:
        part = bh * splits + split
        tl.store(acc_ptr + part * GROUP_PAD * D + g[:, None] * D + d[None, :], acc)
        tl.store(max_ptr + part * GROUP_PAD + g, running_max)
        tl.store(sum_ptr + part * GROUP_PAD + g, running_sum)


@triton.jit(do_not_specialize=["splits"])
def _merge_kernel(
    acc_ptr, max_ptr, sum_ptr, out_ptr, so_b, so_h, so_g, splits,
    KV_HEADS: tl.constexpr, GROUP_PAD: tl.constexpr, D: tl.constexpr, SPLIT_BLOCK: tl.constexpr,
):
    # one program per (row, KV head, query head of its group): the chunks are read SPLIT_BLOCK at a time
    bh = tl.program_id(0)
    g = tl.program_id(1)
    b = (bh // KV_HEADS).to(tl.int64)
    h = bh % KV_HEADS
    d = tl.arange(0, D)
    base = bh * splits
    overall = tl.full([SPLIT_BLOCK], -1.0e30, tl.float32)
    for first in range(0, splits, SPLIT_BLOCK):
        part = first + tl.arange(0, SPLIT_BLOCK)
        overall = tl.maximum(overall, tl.load(max_ptr + (base + part) * GROUP_PAD + g, mask=part < splits, other=-1.0e30))
    top = tl.max(overall, axis=0)
    total = tl.zeros([SPLIT_BLOCK], tl.float32)
    out = tl.zeros([SPLIT_BLOCK, D], tl.float32)
    for first in range(0, splits, SPLIT_BLOCK):
        part = first + tl.arange(0, SPLIT_BLOCK)
        inside = part < splits
        weight = tl.exp(tl.load(max_ptr + (base + part) * GROUP_PAD + g, mask=inside, other=-1.0e30) - top)
        total += weight * tl.load(sum_ptr + (base + part) * GROUP_PAD + g, mask=inside, other=0.0)
        acc = tl.load(acc_ptr + ((base + part[:, None]) * GROUP_PAD + g) * D + d[None, :], mask=inside[:, None], other=0.0)
        out += weight[:, None] * acc
    merged = tl.sum(out, axis=0) / tl.sum(total, axis=0)  # a skipped row's chunks: 0 / chunks = 0
    tl.store(out_ptr + b * so_b + h * so_h + g * so_g + d, merged.to(out_ptr.dtype.element_ty))


def default_programs(device: torch.device) -> int:
    """How many programs ``decode_attention`` aims for unless told: three for each SM."""
    return 3 * sm_count(device)


def split_count(rows: int, kv_heads: int, attn_len: int, programs: int) -> int:
    """Chunks per (row, KV head): as many as fit in ``programs`` programs in all (rounded down: the grid
    never passes the target, so no SM starts a part-filled extra round of programs), at most one per
    MIN_SLOTS_PER_SPLIT slots of ``attn_len`` and at most MAX_SPLITS; one (nothing to merge) where rows
    x KV heads are more than half of ``programs``.

    Why three programs an SM, rounded down: swept over every chunk count at 4-62 rows and 4,096-27,648
    slots on an H200 (benchmarks/decode_kernels_tune.py --split-sweep; docs/benchmarks.md), this rule
    came within 1% of the best count on average (4% at worst), where the earlier one (twice the SMs,
    rounded up: e.g. 9 chunks at 16 rows, 288 programs on 132 SMs, some SMs running two and others
    three) took 5% longer on average and up to 14%. 64 rows split in three ran 10% faster than unsplit
    at 27,648 slots. Not yet swept on an H100."""
    pairs = max(1, rows * kv_heads)
    wanted = programs // pairs
    return max(1, min(wanted, math.ceil(attn_len / MIN_SLOTS_PER_SPLIT), MAX_SPLITS))


def decode_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, bias: torch.Tensor, attn_len: int, programs: int | None = None,
    block_n: int | None = None, num_warps: int = NUM_WARPS, num_stages: int = NUM_STAGES,
    kv_rows: torch.Tensor | None = None, shared_slots: int = 0, splits: int | None = None,
    out: torch.Tensor | None = None, last_slot: torch.Tensor | None = None, skip_rows: torch.Tensor | None = None,
    merge_block: int = MERGE_BLOCK,
) -> torch.Tensor:
    """q [b, KV heads, group, d]; k, v [b, KV heads, slots, d] (d contiguous); bias [b, slots] (0 on
    visible slots, -inf elsewhere; slots contiguous) -> [b, KV heads, group, d] in q's dtype, over
    slots [0, attn_len). ``programs``: how many programs to aim for (default: three for each SM); see
    split_count for when each (row, KV head) is one program and nothing is merged. ``block_n``
    (default BLOCK_N_WHOLE or BLOCK_N_SPLIT), ``num_warps``, ``num_stages``: the partial kernel's tile
    and launch (benchmarks/decode_kernels_tune.py times the choices). ``kv_rows`` ([b] integers) and
    ``shared_slots``: slots below ``shared_slots`` (whole tiles) are read from row kv_rows[i]'s
    cache instead of row i's, for rows whose prompts are the same (the fast engine's GRPO groups).
    ``last_slot``: a device integer, the last slot any row can see (the fast engine's write slot):
    slots after it, masked by the bias anyway, are not read, so a step pays for the slots written so
    far, not for the rest of its attention bucket; the result is the same (their weights are 0).
    ``skip_rows`` ([b] bool on the device, read by the kernel): rows whose result nobody reads (the
    fast engine's ended rows, decoded until the next compaction): their programs read no slot and
    their output is 0, so an ended row costs no K/V reads; the other rows' results are unchanged.
    ``splits`` overrides split_count (benchmarks); ``out``, q's shape and dtype, receives the result.
    ``merge_block``: how many chunks the merge kernel reads at a time (a power of two; benchmarks)."""
    if q.stride(-1) != 1:
        raise ValueError("decode_attention needs the last dimension of q contiguous")
    return _attend(q, k, v, bias, attn_len, programs, block_n, num_warps, num_stages, kv_rows, shared_slots, splits,
                   out, last_slot, skip_rows, rope=None, merge_block=merge_block)


def decode_attention_with_rope(
    qkv: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, k: torch.Tensor, v: torch.Tensor, bias: torch.Tensor,
    attn_len: int, write_slot: torch.Tensor, heads: int, programs: int | None = None, block_n: int | None = None,
    num_warps: int = NUM_WARPS, num_stages: int = NUM_STAGES, kv_rows: torch.Tensor | None = None,
    shared_slots: int = 0, splits: int | None = None, skip_rows: torch.Tensor | None = None,
    merge_block: int = MERGE_BLOCK,
) -> torch.Tensor:
    """One decode step's RoPE, K/V cache write and attention in one kernel: what
    ``rope_and_cache_write`` (trainer/kernels/triton_decode_fused.py) and then ``decode_attention``
    with ``last_slot=write_slot`` compute, bit for bit in bf16 (the same rounding code), without the
    separate kernel's launch and its q round trip through memory.

    qkv [b, (heads + 2 KV heads) * d] (the fused q/k/v matmul's output: q heads, then k's, then v's),
    cos, sin [b, d], one layer's k, v caches [b, KV heads, slots, d], write_slot (a one-element device
    integer: this step's slot, the last any row sees) -> [b, KV heads, group, d]. The program whose
    chunk of slots holds the write slot rotates the key and writes it and the value there before it
    reads its tiles; no other program reads that slot. The write slot must lie in [0, attn_len), as
    the fast engine's attention length always covers it: a slot past it is in no chunk and is not
    written. The other options are decode_attention's."""
    check_rope_inputs("decode_attention_with_rope", qkv, cos, sin, k, v, write_slot, heads)
    b, kv_heads, _, d = k.shape
    if heads % kv_heads:
        raise ValueError(f"decode_attention_with_rope: {heads} query heads do not share {kv_heads} KV heads evenly")
    q = qkv[:, : heads * d].view(b, kv_heads, heads // kv_heads, d)  # the kernel finds k and v after it in the row
    return _attend(q, k, v, bias, attn_len, programs, block_n, num_warps, num_stages, kv_rows, shared_slots, splits,
                   None, write_slot, skip_rows, rope=(cos, sin), merge_block=merge_block)


def _attend(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, bias: torch.Tensor, attn_len: int, programs: int | None,
    block_n: int | None, num_warps: int, num_stages: int, kv_rows: torch.Tensor | None, shared_slots: int,
    splits: int | None, out: torch.Tensor | None, last_slot: torch.Tensor | None, skip_rows: torch.Tensor | None,
    rope: tuple[torch.Tensor, torch.Tensor] | None, merge_block: int = MERGE_BLOCK,
) -> torch.Tensor:
    """The launch behind decode_attention and decode_attention_with_rope (``rope``: cos, sin; q a view of
    qkv's query columns, its rows' k and v heads after them)."""
    b, kv_heads, group, d = q.shape
    if k.stride(-1) != 1 or v.stride(-1) != 1 or bias.stride(-1) != 1:
        raise ValueError("decode_attention needs the last dimension of k, v and bias contiguous")
    if d < 16 or d & (d - 1):
        raise ValueError(f"decode_attention needs a power-of-two head_dim >= 16, got {d}")
    if programs is None:
        programs = default_programs(q.device)
    if skip_rows is not None and tuple(skip_rows.shape) != (b,):
        raise ValueError(f"decode_attention: skip_rows must be [{b}] (one flag a row), got {tuple(skip_rows.shape)}")
    if kv_rows is None:
        if shared_slots:
            raise ValueError("decode_attention: shared_slots needs kv_rows (which row's cache each row reads)")
        kv_rows = torch.arange(b, device=q.device)  # every program reads an entry, never past the end
    if splits is None:
        splits = split_count(b, kv_heads, attn_len, programs)
    if block_n is None:
        block_n = BLOCK_N_WHOLE if splits == 1 else BLOCK_N_SPLIT
    if shared_slots % block_n:
        raise ValueError(f"decode_attention: shared_slots ({shared_slots}) must be whole tiles of {block_n} slots")
    tiles_per_split = math.ceil(math.ceil(attn_len / splits) / block_n)
    splits = math.ceil(attn_len / (tiles_per_split * block_n))  # rounding the chunk up may leave fewer
    group_pad = max(16, triton.next_power_of_2(group))
    whole = splits == 1
    parts = 1 if whole else b * kv_heads * splits  # the merge's inputs (unused when whole)
    acc = torch.empty((parts, group_pad, d), dtype=torch.float32, device=q.device)
    maxes = torch.empty((parts, group_pad), dtype=torch.float32, device=q.device)
    sums = torch.empty_like(maxes)
    if out is None:
        out = torch.empty((b, kv_heads, group, d), dtype=q.dtype, device=q.device)
    cos, sin = rope if rope is not None else (q, q)  # not read without rope
    _partial_kernel[(b * kv_heads, splits)](
        q, k, v, bias, acc, maxes, sums, out, kv_rows, kv_rows if last_slot is None else last_slot, cos, sin,
        kv_rows if skip_rows is None else skip_rows,
        q.stride(0), q.stride(1), q.stride(2), k.stride(0), k.stride(1), k.stride(2),
        v.stride(0), v.stride(1), v.stride(2), bias.stride(0), out.stride(0), out.stride(1), out.stride(2),
        cos.stride(0), sin.stride(0),
        attn_len, tiles_per_split, 1.0 / math.sqrt(d), shared_slots,
        KV_HEADS=kv_heads, GROUP=group, GROUP_PAD=group_pad, D=d, BLOCK=block_n,
        PRECISION="ieee" if q.dtype == torch.float32 else "tf32",  # no TF32 rounding of float32 inputs
        WHOLE=whole, HAS_LAST_SLOT=last_slot is not None, ROPE=rope is not None, HAS_SKIP=skip_rows is not None,
        num_warps=num_warps, num_stages=num_stages,
        # RoPE's products are rounded where the eager path rounds only without FMA contraction (as in
        # rope_and_cache_write); off for the whole kernel cost nothing measurable on an H100 (docs/benchmarks.md)
        enable_fp_fusion=False,
    )
    if not whole:
        _merge_kernel[(b * kv_heads, group)](
            acc, maxes, sums, out, out.stride(0), out.stride(1), out.stride(2), splits,
            KV_HEADS=kv_heads, GROUP_PAD=group_pad, D=d, SPLIT_BLOCK=merge_block,
        )
    return out
