"""Keyed sampling on GPU in one pass over the logits: the exponential race of ``sampling.sample_keyed``.

``sample_keyed`` builds [B, V] float32 probabilities and [B, V] keyed Exp(1) noise through a dozen
int64 tensor operations: at a 152k vocabulary and batch 128 that is several GB of memory traffic per
decode step. Here the logits are streamed once: each program takes one chunk of a row's vocabulary,
hashes each (row key, step, token) to its uniform exactly as ``sampling.keyed_exponential`` does (the
same 32-bit integer mixing, here in uint32 arithmetic, which wraps as the int64 version's masks do,
and ``sampling.hash_to_uniform``), and keeps the running argmax of z / T - log(E), which is the
argmax of softmax(z / T) / E; a second, small kernel combines a row's chunks. One program per row
(as this kernel first was) left most of the GPU idle: 128 rows took 0.15 ms per decode step on an
H100, about ten times the time to read their logits; chunks give about four programs per SM. The
sampled token does not depend on the chunk count (every score is computed alike); the fused log-prob
sums its chunks in another order, so its last bits may change with the batch size and the GPU.

The logs are libdevice's correctly rounded ones, not the approximate ``lg2.approx`` that ``tl.log``
may lower to: E = -log(u) for u near 1 is a difference of nearly equal numbers, and an approximate
log there turned tail tokens into winners often enough to move the mean log-prob of the sampled tokens by -0.25 nats on the 1.5B architecture. The same pass keeps
a running log-sum-exp of z / T, so the sampled token's log-prob (``sampling.token_log_probs``) costs
no second read of the logits, and flags rows whose softmax is no distribution (a NaN or +inf logit,
or every logit -inf).

The seed and the step are read from device tensors, so a CUDA graph that captured this kernel
samples a new draw at every replay. Only imported where Triton and a GPU exist.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from triton.language.extra import libdevice

from trainer.kernels import sm_count
from trainer.rollout.sampling import UNIFORM_BITS

BLOCK = 2048


@triton.jit
def _mix32(h):
    # lowbias32 on uint32 values, as sampling.mix32 (whose int64 products are masked to 32 bits)
    h = h ^ (h >> 16)
    h = h * 0x7FEB352D
    h = h ^ (h >> 15)
    h = h * 0x846CA68B
    return h ^ (h >> 16)


@triton.jit
def _keyed_race_kernel(
    logits_ptr,
    stride_row,
    keys_ptr,
    step_ptr,
    seed_ptr,
    part_score_ptr,
    part_token_ptr,
    part_max_ptr,
    part_sum_ptr,
    part_bad_ptr,
    vocab,
    chunk,
    inv_temperature,
    BLOCK_V: tl.constexpr,
    SHIFT: tl.constexpr,
    WRITE_LOG_PROBS: tl.constexpr,
):
    # one program per (row, chunk of ``chunk`` tokens): its best score and token, its log-sum-exp
    # (max and sum), its non-finite flag, for _combine_kernel
    row = tl.program_id(0)
    part = row * tl.num_programs(1) + tl.program_id(1)
    key = tl.load(keys_ptr + row).to(tl.int64)
    step = tl.load(step_ptr).to(tl.int64)
    seed = tl.load(seed_ptr).to(tl.int64)
    # as sampling.keyed_exponential: row_hash, then the step mixed in
    h_row = _mix32(((key * 0x9E3779B1 + (seed & 0xFFFFFFFF)) & 0xFFFFFFFF).to(tl.uint32))
    h_row = _mix32(h_row ^ ((step * 0x85EBCA6B + 0x165667B1) & 0xFFFFFFFF).to(tl.uint32))
    best = tl.full([BLOCK_V], float("-inf"), tl.float32)
    best_idx = tl.full([BLOCK_V], 0, tl.int32)
    lane_max = tl.full([BLOCK_V], float("-inf"), tl.float32)  # of z / T, NaN left out, per lane
    lane_sum = tl.zeros([BLOCK_V], tl.float32)  # sum of exp(z / T - lane_max): the running log-sum-exp
    bad = tl.full([BLOCK_V], 0, tl.int32)
    base = logits_ptr + row.to(tl.int64) * stride_row
    first = tl.program_id(1) * chunk
    end = tl.minimum(first + chunk, vocab)
    for start in range(first, end, BLOCK_V):
        offs = start + tl.arange(0, BLOCK_V)
        inside = offs < end
        z = tl.load(base + offs, mask=inside, other=float("-inf")).to(tl.float32)
        h = _mix32(h_row + offs.to(tl.uint32) * 0x27D4EB2F)
        u = ((h >> SHIFT).to(tl.float32) + 0.5) * (1.0 / (1 << (32 - SHIFT)))  # sampling.hash_to_uniform
        zt = z * inv_temperature
        score = zt - libdevice.log(-libdevice.log(u))
        is_nan = z != z
        bad = bad | (is_nan | (z == float("inf"))).to(tl.int32)
        score = tl.where(is_nan, float("-inf"), score)
        take = score > best
        best = tl.where(take, score, best)
        best_idx = tl.where(take, offs, best_idx)
        zt_finite = tl.where(is_nan, float("-inf"), zt)
        new_max = tl.maximum(lane_max, zt_finite)
        if WRITE_LOG_PROBS:
            live = new_max != float("-inf")  # a lane that has seen only -inf keeps a zero sum
            safe = tl.where(live, new_max, 0.0)
            lane_sum = tl.where(live, lane_sum * tl.exp(lane_max - safe) + tl.exp(zt_finite - safe), 0.0)
        lane_max = new_max
    top = tl.max(best, axis=0)
    # the smallest token id among ties, as torch.argmax takes the first
    tl.store(part_score_ptr + part, top)
    tl.store(part_token_ptr + part, tl.min(tl.where(best == top, best_idx, vocab), axis=0))
    tl.store(part_bad_ptr + part, tl.max(bad, axis=0))
    m = tl.max(lane_max, axis=0)
    tl.store(part_max_ptr + part, m)
    if WRITE_LOG_PROBS:
        m_safe = tl.where(m == float("-inf"), 0.0, m)
        tl.store(part_sum_ptr + part, tl.sum(tl.where(lane_max == float("-inf"), 0.0, lane_sum * tl.exp(lane_max - m_safe)), axis=0))


@triton.jit
def _combine_kernel(
    logits_ptr,
    stride_row,
    part_score_ptr,
    part_token_ptr,
    part_max_ptr,
    part_sum_ptr,
    part_bad_ptr,
    tokens_ptr,
    bad_ptr,
    log_probs_ptr,
    vocab,
    parts,
    inv_temperature,
    PARTS_PAD: tl.constexpr,
    WRITE_LOG_PROBS: tl.constexpr,
):
    # one program per row: the winner over its chunks (the smallest token id among tied scores), its
    # flags, and the sampled token's log-prob from the chunks' log-sum-exps
    row = tl.program_id(0)
    p = tl.arange(0, PARTS_PAD)
    inside = p < parts
    at = row * parts + p
    score = tl.load(part_score_ptr + at, mask=inside, other=float("-inf"))
    top = tl.max(score, axis=0)
    token = tl.min(tl.where(inside & (score == top), tl.load(part_token_ptr + at, mask=inside, other=vocab), vocab), axis=0)
    token = tl.where(token == vocab, 0, token)  # a row of -inf only: any id, it is flagged bad
    maxes = tl.load(part_max_ptr + at, mask=inside, other=float("-inf"))
    m = tl.max(maxes, axis=0)
    bad = tl.max(tl.load(part_bad_ptr + at, mask=inside, other=0), axis=0) > 0
    tl.store(tokens_ptr + row, token.to(tl.int64))
    tl.store(bad_ptr + row, bad | (m == float("-inf")))
    if WRITE_LOG_PROBS:
        m_safe = tl.where(m == float("-inf"), 0.0, m)
        sums = tl.load(part_sum_ptr + at, mask=inside, other=0.0)
        total = tl.sum(tl.where(maxes == float("-inf"), 0.0, sums * tl.exp(maxes - m_safe)), axis=0)
        picked = tl.load(logits_ptr + row.to(tl.int64) * stride_row + token).to(tl.float32) * inv_temperature
        tl.store(log_probs_ptr + row, picked - (m_safe + libdevice.log(total)))


def race_chunks(rows: int, vocab: int, programs: int) -> int:
    """Chunks per row: enough for about ``programs`` programs in all, each at least one block."""
    return max(1, min(triton.cdiv(programs, max(1, rows)), triton.cdiv(vocab, BLOCK)))


def keyed_race(
    logits: torch.Tensor,
    row_keys: torch.Tensor,
    step: torch.Tensor,
    seed: torch.Tensor,
    inv_temperature: float,
    tokens_out: torch.Tensor,
    bad_out: torch.Tensor,
    log_probs_out: torch.Tensor | None = None,
    programs: int | None = None,
) -> None:
    """tokens_out[b] = argmax_v softmax(logits[b] * inv_temperature)_v / E[b, v] with E keyed by
    (seed, row_keys[b], step, v); bad_out[b] = the row's softmax is not a distribution;
    log_probs_out[b] (float32, when given) = log softmax(logits[b] * inv_temperature) at tokens_out[b].

    logits [B, V] (any float dtype, unit stride in V), row_keys [B] int64, step and seed 0-d int64,
    tokens_out [B] int64, bad_out [B] bool: all on one CUDA device. No host synchronisation.
    ``programs``: how many (row, chunk) programs to aim for (default: four per SM).
    """
    if logits.stride(-1) != 1:
        raise ValueError(f"keyed_race: logits must be contiguous in the vocabulary dim; strides {logits.stride()}")
    b, vocab = logits.shape
    if programs is None:
        programs = 4 * sm_count(logits.device)
    chunks = race_chunks(b, vocab, programs)
    chunk = triton.cdiv(triton.cdiv(vocab, chunks), BLOCK) * BLOCK
    chunks = triton.cdiv(vocab, chunk)  # rounding the chunk up may leave fewer
    part_score = torch.empty((b, chunks), dtype=torch.float32, device=logits.device)
    part_max, part_sum = torch.empty_like(part_score), torch.empty_like(part_score)
    part_token = torch.empty((b, chunks), dtype=torch.int32, device=logits.device)
    part_bad = torch.empty_like(part_token)
    write = log_probs_out is not None
    _keyed_race_kernel[(b, chunks)](
        logits, logits.stride(0), row_keys, step, seed, part_score, part_token, part_max, part_sum, part_bad,
        vocab, chunk, float(inv_temperature), BLOCK_V=BLOCK, SHIFT=32 - UNIFORM_BITS, WRITE_LOG_PROBS=write,
        num_warps=8,
    )
    _combine_kernel[(b,)](
        logits, logits.stride(0), part_score, part_token, part_max, part_sum, part_bad, tokens_out, bad_out,
        log_probs_out if write else part_score, vocab, chunks, float(inv_temperature),
        PARTS_PAD=max(2, triton.next_power_of_2(chunks)), WRITE_LOG_PROBS=write,
    )
