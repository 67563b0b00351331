"""The fused decode kernels (trainer/kernels/triton_decode_fused.py) against the eager ops they replace
(trainer/rollout/lean_decoder.py), one kernel at a time and as a whole decode step on a tiny model.

The kernel tests run on a GPU with Triton, or on a CPU in Triton's interpreter (Triton 3.6 needs
numpy < 2.3 there), and are skipped otherwise:
    TRITON_INTERPRET=1 python -m pytest tests/test_triton_decode_fused.py -p no:cacheprovider
The last tests run anywhere: the CPU engine keeps the eager step, and the eager step's logits are
transformers' own.
"""

from __future__ import annotations

import importlib.util
import os

import pytest
import torch
import torch.nn.functional as F

from trainer.models.presets import build_model
from trainer.rollout import FastRolloutEngine, SamplingParams
from trainer.rollout.decode_buffers import DecodeBuffers
from trainer.rollout.fast_engine import FUSED_DECODE_ENV, fused_decode_from_env
from trainer.rollout.lean_decoder import (
    LeanWeights,
    apply_rope,
    decode_logits,
    lean_shape,
    prefill_logits,
    rms_norm,
    rope_cos_sin,
)

HAS_TRITON = importlib.util.find_spec("triton") is not None
INTERPRETED = os.environ.get("TRITON_INTERPRET") == "1"
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
needs_triton = pytest.mark.skipif(
    not HAS_TRITON or (DEVICE == "cpu" and not INTERPRETED), reason="needs Triton on a GPU, or TRITON_INTERPRET=1"
)
DTYPES = [torch.float32, torch.bfloat16]
# one rounding step of the dtype: where the kernel and torch reduce or exp in another float32 order
TOLERANCE = {torch.float32: 1e-5, torch.bfloat16: 8e-3}
# Where the kernels round exactly as torch does: on a GPU. Triton 3.6's interpreter casts float32 to
# bfloat16 by truncation (triton/runtime/interpreter.py, _convert_float), so there each bf16 rounding
# may be one step low, and bf16 results are checked to two steps.
EXACT = DEVICE == "cuda"
if not EXACT:
    TOLERANCE[torch.bfloat16] = 1.6e-2


def assert_reduced_alike(got: torch.Tensor, want: torch.Tensor) -> None:
    """Close to the dtype's rounding; where rounding is exact, also equal but for the rare element
    a float32 reduction or exp in another order moves across a bf16 rounding boundary (~1e-4 of
    them: rounding at another point of the computation would move a large share)."""
    tol = TOLERANCE[got.dtype]
    torch.testing.assert_close(got, want, rtol=tol, atol=tol)
    if EXACT and got.dtype == torch.bfloat16:
        assert (got == want).float().mean() >= 0.99


def assert_rounded_alike(got: torch.Tensor, want: torch.Tensor) -> None:
    """Equal where rounding is exact; else within the dtype's tolerance."""
    if EXACT or got.dtype == torch.float32:
        assert torch.equal(got, want), (got - want).abs().max()
    else:
        tol = TOLERANCE[got.dtype]
        torch.testing.assert_close(got, want, rtol=tol, atol=tol)


def randn(*shape: int, dtype: torch.dtype, seed: int) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed)).to(DEVICE, dtype)


@needs_triton
@pytest.mark.parametrize("dtype", DTYPES, ids=["fp32", "bf16"])
@pytest.mark.parametrize("n", [37, 128])
def test_add_rms_norm_is_the_residual_add_then_rms_norm(dtype, n):
    from trainer.kernels.triton_decode_fused import add_rms_norm

    rows, eps = 5, 1e-6
    wide = randn(rows, n + 9, dtype=dtype, seed=0)
    h = wide[:, 3 : 3 + n]  # a strided view: rows n + 9 apart
    delta = randn(rows, n, dtype=dtype, seed=1) * 3
    weight = randn(n, dtype=dtype, seed=2)
    residual, normed = add_rms_norm(h, delta, weight, eps)
    assert_rounded_alike(residual, h + delta)  # one rounding of the sum, as torch's add
    assert_reduced_alike(normed, rms_norm(h + delta, weight, eps))
    same, normed = add_rms_norm(h, None, weight, eps)  # the first layer: nothing to add
    assert same is h
    assert_reduced_alike(normed, rms_norm(h, weight, eps))


@needs_triton
@pytest.mark.parametrize("dtype", DTYPES, ids=["fp32", "bf16"])
@pytest.mark.parametrize("heads, kv_heads, d", [(4, 2, 16), (3, 1, 6)])
def test_rope_and_cache_write_is_apply_rope_then_index_copy(dtype, heads, kv_heads, d):
    from trainer.kernels.triton_decode_fused import rope_and_cache_write

    rows, slots, layers = 6, 9, 2
    qkv = randn(rows, (heads + 2 * kv_heads) * d + 5, dtype=dtype, seed=0)[:, 5:]  # a strided view
    positions = torch.tensor([0, 3, 17, 400, 4095, 9], device=DEVICE)
    inv_freq = 1.0 / (10000.0 ** (torch.arange(0, d, 2).float() / d)).to(DEVICE)
    cos, sin = rope_cos_sin(positions, inv_freq, dtype)
    cache_k = randn(layers, rows + 2, kv_heads, slots, d, dtype=dtype, seed=1)
    cache_v = randn(layers, rows + 2, kv_heads, slots, d, dtype=dtype, seed=2)
    want_k, want_v = cache_k.clone(), cache_v.clone()
    slot = torch.tensor(7, device=DEVICE)
    # the eager step's ops (lean_decoder.decode_logits), on one layer of the first ``rows`` rows
    qk = apply_rope(qkv[:, : (heads + kv_heads) * d].reshape(rows, heads + kv_heads, d), cos[:, None], sin[:, None])
    want_k[1, :rows].index_copy_(2, slot.view(1), qk[:, heads:].unsqueeze(2))
    want_v[1, :rows].index_copy_(2, slot.view(1), qkv[:, (heads + kv_heads) * d :].reshape(rows, kv_heads, 1, d))
    q = rope_and_cache_write(qkv, cos, sin, cache_k[1, :rows], cache_v[1, :rows], slot, heads)
    assert_rounded_alike(q, qk[:, :heads])
    assert_rounded_alike(cache_k, want_k)  # every other slot, row and layer untouched
    assert torch.equal(cache_v, want_v)


@needs_triton
@pytest.mark.parametrize("dtype", DTYPES, ids=["fp32", "bf16"])
def test_silu_mul_is_silu_of_gate_times_up(dtype):
    from trainer.kernels.triton_decode_fused import SILU_BLOCK, silu_mul

    rows, inter = 3, SILU_BLOCK + 77  # two column blocks, the second partly masked
    gate_up = (randn(rows, 2 * inter + 4, dtype=dtype, seed=0) * 4)[:, : 2 * inter]  # a strided view
    gate, up = gate_up.chunk(2, dim=-1)
    assert_reduced_alike(silu_mul(gate_up), F.silu(gate) * up)


def decode_step_pair(dtype: torch.dtype, attention: str, steps: int = 3):
    """Logits and caches of ``steps`` decode steps of the tiny model after a prefill: eager, fused.
    ``attention``: "sdpa", "split" for the engine's GPU kernel (trainer/kernels/triton_decode_attention.py),
    or "split-rope": that kernel, and in the fused step the kernel with RoPE and the cache write in it."""
    attend = attend_with_rope = None
    if attention.startswith("split"):
        from trainer.kernels.triton_decode_attention import decode_attention as attend
    if attention == "split-rope":
        from trainer.kernels.triton_decode_attention import decode_attention_with_rope as attend_with_rope
    model = build_model("tiny", seed=0)
    with torch.no_grad():
        for p in model.parameters():  # a random model at a scale where its logits vary
            p.mul_(4.0)
    weights = LeanWeights(lean_shape(model.config), dtype, torch.device(DEVICE))
    weights.load(model)
    rows, width = 3, 8
    ids = torch.randint(3, 100, (rows, width), generator=torch.Generator().manual_seed(0)).to(DEVICE)
    mask = torch.ones(rows, width, device=DEVICE)
    mask[0, :3] = 0  # left padding
    outs = []
    for fused in (False, True):
        buf = DecodeBuffers(weights, rows, width, steps, (1,), 0)
        buf.reset(mask, torch.arange(rows, device=DEVICE), 0)
        with torch.no_grad():
            prefill_logits(weights, buf.cache_k, buf.cache_v, ids, mask)
            logits = []
            for step in range(steps):
                buf.attn_bias.index_fill_(1, buf.write_slot.view(1), 0.0)
                last = ids[:, -1 - step]  # the same tokens either way: compare the step, not sampling
                logits.append(decode_logits(weights, buf.cache_k, buf.cache_v, last, buf.positions, buf.write_slot,
                                            buf.attn_bias, buf.slots, attend, fused=fused,
                                            attend_with_rope=attend_with_rope if fused else None))
                buf.write_slot.add_(1)
                buf.positions.add_(1)
        outs.append((torch.stack(logits), buf.cache_k, buf.cache_v))
    return outs


@needs_triton
@pytest.mark.parametrize("dtype", [
    torch.float32,
    pytest.param(torch.bfloat16, marks=pytest.mark.skipif(not EXACT, reason="the interpreter truncates to bf16")),
], ids=["fp32", "bf16"])
@pytest.mark.parametrize("attention", ["sdpa", "split", "split-rope"])
def test_fused_decode_step_matches_the_eager_step(dtype, attention):
    (eager, k0, v0), (fused, k1, v1) = decode_step_pair(dtype, attention)
    assert eager.float().std() > 1.0, "the set-up should give logits that vary"
    # bf16: a one-ulp difference in a normed row moves later layers by a few ulps of the logits
    tol = 1e-4 if dtype == torch.float32 else 6e-2
    torch.testing.assert_close(fused, eager, rtol=tol, atol=tol)
    torch.testing.assert_close(k1, k0, rtol=tol, atol=tol)
    torch.testing.assert_close(v1, v0, rtol=tol, atol=tol)
    if dtype == torch.float32:  # bf16 logits may differ by a rounding step, enough to turn a near-tie
        assert torch.equal(fused.argmax(-1), eager.argmax(-1))


@pytest.mark.skipif(DEVICE != "cuda" or not HAS_TRITON, reason="the engine fuses on a GPU only")
def test_fused_engine_follows_the_eager_engine(tok, prompts, liven):
    """Through the engine as it runs: bf16, CUDA graphs, row compaction, split-cache attention and
    the Triton sampler. In bf16 a rare one-step rounding difference can turn a near-tie the other
    way and the two texts part from there, so each row is compared up to where they part: that
    prefix must hold most tokens (a wrong cache slot or stride parts every row at once), and its
    log-probs agree to bf16 logits' rounding."""
    model = liven(build_model("tiny", seed=0)).to("cuda", torch.bfloat16)
    for sampling in (SamplingParams(do_sample=False), SamplingParams()):
        fused, eager = (
            FastRolloutEngine(model, tok, fused_decode=f).generate(prompts, list(range(len(prompts))), [], 2, 200, sampling, 3)
            for f in (True, False)
        )
        width = min(fused.response_ids.shape[1], eager.response_ids.shape[1])
        same = (fused.response_ids[:, :width] == eager.response_ids[:, :width]).long().cumprod(dim=1).bool()
        assert same.float().mean() >= 0.75, same.sum(dim=1)
        torch.testing.assert_close(fused.rollout_log_probs[:, :width][same], eager.rollout_log_probs[:, :width][same],
                                   rtol=0, atol=0.1)


@pytest.mark.skipif(DEVICE != "cuda" or not HAS_TRITON, reason="the engine fuses on a GPU only")
def test_rope_inside_the_attention_kernel_changes_no_token(tok, prompts, liven):
    """The engine with RoPE and the cache write inside the attention kernel and with them a kernel of
    their own: bf16, CUDA graphs, compaction, the same rounding code, so the same tokens and
    log-probs bit for bit."""
    model = liven(build_model("tiny", seed=0)).to("cuda", torch.bfloat16)
    engines = [FastRolloutEngine(model, tok, fused_decode=True, rope_in_attention=r) for r in (True, False)]
    assert engines[0]._attend_with_rope is not None and engines[1]._attend_with_rope is None
    inside, apart = (e.generate(prompts, list(range(len(prompts))), [], 2, 200, SamplingParams(), 3) for e in engines)
    assert torch.equal(inside.response_ids, apart.response_ids)
    assert torch.equal(inside.rollout_log_probs, apart.rollout_log_probs)


# ----------------------------------------------------------------------------- anywhere
def test_fusion_switch_reads_the_environment_once():
    assert fused_decode_from_env({}) is True
    assert fused_decode_from_env({FUSED_DECODE_ENV: "0"}) is False
    with pytest.raises(ValueError, match="'0' or '1', got 'no'"):
        fused_decode_from_env({FUSED_DECODE_ENV: "no"})


def test_cpu_engine_keeps_the_eager_step(tok, monkeypatch):
    model = build_model("tiny", seed=0)
    monkeypatch.setenv(FUSED_DECODE_ENV, "1")
    assert FastRolloutEngine(model, tok).fused_decode is False
    assert FastRolloutEngine(model, tok, fused_decode=True).fused_decode is False


def test_eager_decode_step_gives_the_transformers_logits():
    """The unfused step, as the CPU runs it: each token's logits are transformers' forward's."""
    model = build_model("tiny", seed=0)
    weights = LeanWeights(lean_shape(model.config), torch.float32, torch.device("cpu"))
    weights.load(model)
    ids = torch.randint(3, 100, (2, 10), generator=torch.Generator().manual_seed(1))
    mask = torch.ones(2, 8)
    buf = DecodeBuffers(weights, 2, 8, 2, (1,), 0)
    buf.reset(mask, torch.arange(2), 0)
    with torch.no_grad():
        prefill_logits(weights, buf.cache_k, buf.cache_v, ids[:, :8], mask)
        for step in (8, 9):
            buf.attn_bias.index_fill_(1, buf.write_slot.view(1), 0.0)
            ours = decode_logits(weights, buf.cache_k, buf.cache_v, ids[:, step], buf.positions, buf.write_slot,
                                 buf.attn_bias, buf.slots)
            buf.write_slot.add_(1)
            buf.positions.add_(1)
            theirs = model(input_ids=ids[:, : step + 1]).logits[:, -1]
            torch.testing.assert_close(ours, theirs, rtol=1e-5, atol=1e-5)
