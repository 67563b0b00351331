"""The split-cache decode attention kernel (trainer/kernels/triton_decode_attention.py) against
``F.scaled_dot_product_attention`` with the fast engine's masks: left padding, unwritten slots, one
row or many, one chunk or many.

Runs on a GPU (skipped elsewhere). On a CPU machine the same check runs in Triton's interpreter
(Triton 3.6 needs numpy < 2.3 there):
    TRITON_INTERPRET=1 python -c "import torch, tests.test_triton_decode_attention as t; t.check('cpu', torch.float32, programs=16)"
and the kernel with RoPE and the cache write in it (decode_attention_with_rope):
    TRITON_INTERPRET=1 python -c "import torch, tests.test_triton_decode_attention as t; t.check_with_rope('cpu', torch.float32)"
"""

from __future__ import annotations

import importlib.util

import pytest
import torch
import torch.nn.functional as F

HAS_TRITON = importlib.util.find_spec("triton") is not None
CUDA = torch.cuda.is_available()


def case(
    rows: int, kv_heads: int, group: int, d: int, slots: int, attn_len: int, dtype, device, seed: int = 0, pad: int = 40
):
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(rows, kv_heads, group, d, generator=gen).to(device, dtype)
    k = torch.randn(rows, kv_heads, slots, d, generator=gen).to(device, dtype)
    v = torch.randn(rows, kv_heads, slots, d, generator=gen).to(device, dtype)
    bias = torch.full((rows, slots), float("-inf"))
    for r in range(rows):
        first = max(0, pad - 40) + (7 * r) % 40  # left padding: slots before ``first`` are never visible
        bias[r, first:attn_len] = 0.0
    return q, k, v, bias.to(device, dtype)


def reference(q, k, v, bias, attn_len):
    out = F.scaled_dot_product_attention(
        q.float(), k[:, :, :attn_len].float(), v[:, :, :attn_len].float(), attn_mask=bias[:, None, None, :attn_len].float()
    )
    return out


def check(device: str, dtype, programs=None) -> None:
    from trainer.kernels.triton_decode_attention import decode_attention, split_count

    # 132 SMs x 3: the chunks fit the programs rounded down, capped by the slots and MAX_SPLITS
    assert split_count(rows=1, kv_heads=2, attn_len=27648, programs=396) == 108  # 256 slots a chunk at least
    assert split_count(rows=1, kv_heads=2, attn_len=65536, programs=396) == 128  # MAX_SPLITS
    assert split_count(rows=16, kv_heads=2, attn_len=27648, programs=396) == 12  # 384 programs; 13 would be 416, past 396
    assert split_count(rows=56, kv_heads=2, attn_len=27648, programs=396) == 3  # 336: 448 would pass 396
    assert split_count(rows=64, kv_heads=2, attn_len=27648, programs=396) == 3
    assert split_count(rows=64, kv_heads=2, attn_len=512, programs=396) == 2  # slots cap it
    assert split_count(rows=128, kv_heads=2, attn_len=27648, programs=396) == 1  # rows enough: unsplit
    tol = 2e-2 if dtype == torch.bfloat16 else 1e-4
    for rows, kv_heads, group, d, slots, attn_len in [
        (1, 2, 6, 64, 1024, 700),   # one row: many chunks
        (3, 2, 7, 32, 512, 512),    # a group of 7 (the 7B's), every slot visible
        (5, 1, 4, 16, 384, 130),    # attention ending inside a tile
    ]:
        q, k, v, bias = case(rows, kv_heads, group, d, slots, attn_len, dtype, device)
        got = decode_attention(q, k, v, bias, attn_len, programs=programs)
        assert got.shape == q.shape and got.dtype == dtype
        torch.testing.assert_close(got.float(), reference(q, k, v, bias, attn_len), rtol=tol, atol=tol)
    # long left padding: whole chunks of a row are masked (weight 0 in the merge, never NaN)
    q, k, v, bias = case(2, 2, 6, 64, 1024, 1024, dtype, device, seed=2, pad=600)
    got = decode_attention(q, k, v, bias, 1024, programs=programs)
    torch.testing.assert_close(got.float(), reference(q, k, v, bias, 1024), rtol=tol, atol=tol)
    # strided views, as the engine passes them: one layer of a [layers, batch, heads, slots, d] cache
    q, k, v, bias = case(4, 2, 6, 64, 512, 300, dtype, device, seed=1)
    cache_k = torch.stack([k, k]).contiguous()[1, :3]
    cache_v = torch.stack([v, v]).contiguous()[1, :3]
    got = decode_attention(q[:3], cache_k, cache_v, bias[:3], 300, programs=programs)
    torch.testing.assert_close(got.float(), reference(q[:3], k[:3], v[:3], bias[:3], 300), rtol=tol, atol=tol)
    # rows of one prompt read its slots from one row's cache (kv_rows), whole or split
    q, k, v, bias = case(6, 2, 6, 64, 512, 400, dtype, device, seed=4, pad=40)
    bias[:, :128] = bias[0, :128]  # the same prompt padding in every row of the group
    kv_rows = torch.tensor([0, 0, 0, 3, 3, 3], device=device)
    shared_k, shared_v = k.clone(), v.clone()
    for row, source in enumerate(kv_rows.tolist()):
        shared_k[row, :, :128], shared_v[row, :, :128] = k[source, :, :128], v[source, :, :128]
    want = reference(q, shared_k, shared_v, bias, 400)
    for progs, splits in ((programs, None), (4, None), (4, 3)):  # 3 chunks: the first holds prompt and own slots
        got = decode_attention(q, k, v, bias, 400, programs=progs, kv_rows=kv_rows, shared_slots=128, splits=splits)
        torch.testing.assert_close(got.float(), want, rtol=tol, atol=tol)
    assert not torch.allclose(reference(q, k, v, bias, 400), want, rtol=tol, atol=tol)  # the test can tell
    # rows x KV heads past the programs aimed for: one chunk each, written whole with no merge;
    # a group of 7 (the padded query rows must not be stored), other tiles and launches
    q, k, v, bias = case(24, 2, 7, 64, 640, 600, dtype, device, seed=3)
    assert split_count(rows=24, kv_heads=2, attn_len=600, programs=16) == 1
    for block_n, num_warps, num_stages in [(64, 4, 3), (32, 4, 2), (128, 8, 3)]:
        guarded = torch.full((25, 2, 7, 64), 7.0, dtype=dtype, device=device)  # row 24: a guard after the output
        got = decode_attention(q, k, v, bias, 600, programs=16, block_n=block_n, num_warps=num_warps,
                               num_stages=num_stages, out=guarded[:24])
        torch.testing.assert_close(got.float(), reference(q, k, v, bias, 600), rtol=tol, atol=tol)
        assert (guarded[24] == 7.0).all()  # the padded query rows (7 of 16) were not stored
    # a forced split count (benchmarks) gives the same figures
    got = decode_attention(q, k, v, bias, 600, splits=3)
    torch.testing.assert_close(got.float(), reference(q, k, v, bias, 600), rtol=tol, atol=tol)
    with pytest.raises(ValueError, match="shared_slots needs kv_rows"):
        decode_attention(q, k, v, bias, 600, shared_slots=128)
    # last_slot: slots after it are never read (NaN there would poison any tile that read them), whole
    # and split, with the attention bucket (attn_len) well past it and ending inside a tile
    q, k, v, bias = case(24, 2, 6, 64, 640, 437, dtype, device, seed=5)
    want = reference(q, k, v, bias, 437)
    k[:, :, 437:], v[:, :, 437:] = float("nan"), float("nan")
    last = torch.tensor(436, device=device)
    for progs, splits in ((16, None), (16, 3), (programs, None)):
        got = decode_attention(q, k, v, bias, 640, programs=progs, splits=splits, last_slot=last)
        torch.testing.assert_close(got.float(), want, rtol=tol, atol=tol)
    assert decode_attention(q, k, v, bias, 640, programs=16).isnan().any()  # without it they are read
    # skip_rows: an ended row reads no slot (its cache all NaN here) and gives 0; the others' results
    # are bit for bit those without skipping, whole and split
    q, k, v, bias = case(24, 2, 6, 64, 640, 437, dtype, device, seed=6)
    skip = torch.zeros(24, dtype=torch.bool, device=device)
    skip[[0, 5, 6, 23]] = True
    for progs, splits in ((16, None), (16, 3), (programs, None)):
        want = decode_attention(q, k, v, bias, 437, programs=progs, splits=splits)
        ended_k, ended_v = k.clone(), v.clone()
        ended_k[skip], ended_v[skip] = float("nan"), float("nan")
        got = decode_attention(q, ended_k, ended_v, bias, 437, programs=progs, splits=splits, skip_rows=skip)
        assert torch.equal(got[~skip], want[~skip]), (progs, splits, (got[~skip] - want[~skip]).abs().max())
        assert (got[skip] == 0).all(), (progs, splits, got[skip].abs().max())
    with pytest.raises(ValueError, match="skip_rows"):
        decode_attention(q, k, v, bias, 437, skip_rows=skip[:3])
    # a running row that sees no slot still gives NaN (0 / 0), the non-finite signal the engine checks
    blind = bias.clone()
    blind[1] = float("-inf")
    for progs, splits in ((16, None), (16, 3)):
        got = decode_attention(q, k, v, blind, 437, programs=progs, splits=splits, skip_rows=skip)
        assert got[1].isnan().all() and not got[2].isnan().any() and (got[skip] == 0).all(), (progs, splits)


def check_with_rope(device: str, dtype) -> None:
    """decode_attention_with_rope against its two steps, rope_and_cache_write then decode_attention
    (the fast engine's kernels before they were one): the same caches and output, bit for bit (both
    compile without FMA contraction, which moved RoPE's roundings). Every slot from the write slot on
    starts as NaN, so a kernel that read the write slot before writing it, or any slot after it,
    would give NaN; the slot sits inside a chunk and at a chunk's first slot, whole and split."""
    from trainer.kernels.triton_decode_attention import decode_attention, decode_attention_with_rope
    from trainer.kernels.triton_decode_fused import rope_and_cache_write

    rows, kv_heads, group, d, slots, attn_len = 6, 2, 6, 64, 512, 384
    heads = kv_heads * group
    kv_rows = torch.tensor([0, 0, 0, 3, 3, 3], device=device)  # two prompts of three rows, 128 shared slots
    for slot in (300, 256):
        _, k, v, bias = case(rows, kv_heads, group, d, slots, slot + 1, dtype, device, seed=slot)
        k[:, :, slot:], v[:, :, slot:] = float("nan"), float("nan")
        gen = torch.Generator().manual_seed(slot)
        qkv = torch.randn(rows, (heads + 2 * kv_heads) * d, generator=gen).to(device, dtype)
        angles = torch.rand(rows, d // 2, generator=gen) * 6.28
        cos, sin = (f(torch.cat([angles, angles], dim=1)).to(device, dtype) for f in (torch.cos, torch.sin))
        write = torch.tensor(slot, device=device)
        for splits in (None, 2, 3):  # whole (12 programs of 16); slot 256 opens the third of 3 chunks
            k1, v1, k2, v2 = k.clone(), v.clone(), k.clone(), v.clone()
            q = rope_and_cache_write(qkv, cos, sin, k1, v1, write, heads).view(rows, kv_heads, group, d)
            want = decode_attention(q, k1, v1, bias, attn_len, programs=16, kv_rows=kv_rows, shared_slots=128,
                                    splits=splits, last_slot=write)
            got = decode_attention_with_rope(qkv, cos, sin, k2, v2, bias, attn_len, write, heads, programs=16,
                                             kv_rows=kv_rows, shared_slots=128, splits=splits)
            assert not got.isnan().any(), (slot, splits)
            assert torch.equal(got, want), (slot, splits)
            # an ended row (skip_rows) still has this step's K/V written, reads nothing and gives 0
            skip = torch.tensor([False, True, False, False, False, True], device=device)
            k3, v3 = k.clone(), v.clone()
            skipped = decode_attention_with_rope(qkv, cos, sin, k3, v3, bias, attn_len, write, heads, programs=16,
                                                 kv_rows=kv_rows, shared_slots=128, splits=splits, skip_rows=skip)
            assert torch.equal(skipped[~skip], want[~skip]) and (skipped[skip] == 0).all(), (slot, splits)
            assert torch.equal(k3.nan_to_num(), k2.nan_to_num()) and torch.equal(v3.nan_to_num(), v2.nan_to_num())
            for new, old in ((k2, k1), (v2, v1)):  # the slot written, and no other
                assert torch.equal(new.isnan(), old.isnan()) and torch.equal(new.nan_to_num(), old.nan_to_num())
    with pytest.raises(ValueError, match="expected qkv"):
        decode_attention_with_rope(qkv[:, :-1], cos, sin, k, v, bias, attn_len, write, heads)


@pytest.mark.skipif(not (CUDA and HAS_TRITON), reason="needs a GPU with Triton")
def test_rope_and_cache_write_inside_the_kernel_on_gpu():
    check_with_rope("cuda", torch.bfloat16)
    check_with_rope("cuda", torch.float32)


@pytest.mark.skipif(not (CUDA and HAS_TRITON), reason="needs a GPU with Triton")
def test_matches_sdpa_on_gpu_in_bf16():
    check("cuda", torch.bfloat16)
    check("cuda", torch.float32)
