"""Sequence packing (actor_rollout_ref.model.use_remove_padding): the rows' real tokens end to end,
attention kept within each row. The packed forward must give the padded forward's log-probs,
entropies and gradients; the packed model's ordinary calls (the hf engine generates with it) stay
SDPA's. On a GPU the same holds for the variable-length flash kernel in bf16."""

from __future__ import annotations

import copy
import functools
import itertools

import pytest
import torch
import torch.nn.functional as F

from trainer.batch import PACK_MIN_PADDING, left_pad, pack_rows, packing_pays, right_pad
from trainer.models.checkpointing import enable_gradient_checkpointing
from trainer.models.packed_attention import (
    ALONE,
    ALONE_UNPADDED,
    FLASH,
    LONG_ALONE_SHORT_TOGETHER,
    PACKED_ATTENTION,
    ROW_BOUNDS,
    ROW_BUCKET,
    ROWS_ALONE_MIN,
    _long_alone_short_together,
    _rows_alone_causal,
    attention_path,
    bucketed_width,
    build_row_plans,
    packed_attention,
    rows_attend_alone,
)
from trainer.models.presets import build_model
from trainer.workers.fsdp import PolicyModel

PROMPTS = [[5, 6, 7], [8, 9, 10, 11, 12], [3], [40, 41]]
RESPONSES = [[20, 21, 22, 23], [24], [25, 26, 27, 28, 29, 30], []]  # ragged, one row with no response


def ragged_batch(device: str = "cpu") -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """(input ids [B, P + R], attention mask, response ids [B, R], response mask) in the batch layout."""
    prompt_ids, prompt_mask = left_pad(PROMPTS, 0)
    response_ids, response_mask = right_pad(RESPONSES, 0)
    ids = torch.cat([prompt_ids, response_ids], dim=1)
    mask = torch.cat([prompt_mask, response_mask], dim=1)
    return ids.to(device), mask.to(device), response_ids.to(device), response_mask.to(device)


def test_pack_rows_lays_the_real_tokens_end_to_end():
    ids, mask, _, _ = ragged_batch()
    lengths = [len(p) + len(r) for p, r in zip(PROMPTS, RESPONSES, strict=True)]
    assert mask.sum(dim=1).tolist() == lengths
    rows = pack_rows(ids, mask, lengths)
    assert rows.ids.tolist() == [[t for p, r in zip(PROMPTS, RESPONSES, strict=True) for t in p + r]]
    assert rows.positions.tolist() == [[i for n in lengths for i in range(n)]]
    assert rows.cu_seqlens.dtype == torch.int32
    assert rows.cu_seqlens.tolist() == rows.bounds == [0, 7, 13, 20, 22]
    assert rows.max_len == max(lengths)


def test_packing_pays_only_where_padding_adds_enough_work():
    _, mask, _, _ = ragged_batch()  # rows of 7, 6, 7 and 2 tokens: padded to 7, 28 for 22
    lengths = mask.sum(dim=1).tolist()
    assert PACK_MIN_PADDING == 0.2 and packing_pays(lengths)
    assert not packing_pays(lengths, min_padding=0.3)
    assert not packing_pays([5, 5, 5])  # equal rows: nothing to gain


def test_rows_of_one_length_take_the_padded_path():
    """Where packing does not pay, the packed model runs the padded forward: the same figures, bit for bit."""
    ids = torch.randint(5, 60, (3, 9), generator=torch.Generator().manual_seed(2))
    mask = torch.ones_like(ids)
    with torch.no_grad():
        want, _ = PolicyModel(build_model("tiny", seed=0).eval())(ids, mask, ids[:, -4:])
        got, _ = PolicyModel(build_model("tiny", seed=0).eval(), packed=True)(ids, mask, ids[:, -4:])
    torch.testing.assert_close(got, want, rtol=0, atol=0)


def forward_and_grads(packed: bool, checkpointing: bool = False, dtype=torch.float32, device: str = "cpu"):
    """Log-probs and entropy [B, R] on the ragged batch, and the gradients of a weighted sum of them."""
    lm = build_model("tiny", dtype, device=device, seed=0).train()
    if checkpointing:
        enable_gradient_checkpointing(lm)
    ids, mask, response, response_mask = ragged_batch(device)
    logp, entropy = PolicyModel(lm, packed=packed)(ids, mask, response, temperature=0.7, with_entropy=True)
    weights = torch.randn(response.shape, generator=torch.Generator().manual_seed(1)).to(device)
    ((logp * weights + 0.1 * entropy) * response_mask).sum().backward()
    keep = response_mask.bool()
    return logp[keep].detach().float(), entropy[keep].detach().float(), {n: p.grad.float() for n, p in lm.named_parameters()}


@pytest.mark.parametrize("checkpointing", [False, True], ids=["plain", "gradient-checkpointing"])
def test_the_packed_forward_gives_the_padded_forwards_log_probs_and_gradients(checkpointing):
    logp, entropy, grads = forward_and_grads(packed=True, checkpointing=checkpointing)
    logp_ref, entropy_ref, grads_ref = forward_and_grads(packed=False)
    torch.testing.assert_close(logp, logp_ref, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(entropy, entropy_ref, rtol=1e-5, atol=1e-5)
    for name, grad in grads.items():
        assert grad.abs().sum() > 0, name
        torch.testing.assert_close(grad, grads_ref[name], rtol=1e-4, atol=1e-6, msg=name)


def test_a_packed_row_does_not_see_the_row_before_it():
    """Changing row 0's tokens leaves row 1's log-probs as they were (attention stays in the row)."""
    ids, mask, response, response_mask = ragged_batch()
    policy = PolicyModel(build_model("tiny", seed=0).eval(), packed=True)
    with torch.no_grad():
        before, _ = policy(ids, mask, response)
        changed = ids.clone()
        changed[0] = torch.where(mask[0].bool(), (changed[0] + 1) % 50 + 1, changed[0])
        after, _ = policy(changed, mask, response)
    torch.testing.assert_close(after[1:], before[1:], rtol=0, atol=1e-6)
    assert not torch.allclose(after[0] * response_mask[0], before[0] * response_mask[0])


def test_the_packed_models_ordinary_calls_are_sdpas():
    """The hf engine generates with the actor's module: a left-padded call without packing bounds
    gives the logits of the same model on SDPA."""
    plain = build_model("tiny", seed=0).eval()
    packed = copy.deepcopy(plain)
    PolicyModel(packed, packed=True)
    assert packed.config._attn_implementation == PACKED_ATTENTION
    ids, mask, _, _ = ragged_batch()
    with torch.no_grad():
        want = plain(input_ids=ids, attention_mask=mask).logits
        got = packed(input_ids=ids, attention_mask=mask).logits
    keep = mask.bool()
    torch.testing.assert_close(got[keep], want[keep], rtol=0, atol=0)


def test_a_model_without_layer_types_is_refused_naming_the_key():
    lm = build_model("tiny", seed=0)
    del lm.config.layer_types
    with pytest.raises(ValueError, match="use_remove_padding=True.*layer_types"):
        PolicyModel(lm, packed=True)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="the variable-length flash kernel needs CUDA")
def test_on_cuda_the_varlen_kernel_gives_the_padded_forwards_figures_in_bf16():
    logp, entropy, grads = forward_and_grads(packed=True, dtype=torch.bfloat16, device="cuda")
    logp_ref, entropy_ref, grads_ref = forward_and_grads(packed=False, dtype=torch.bfloat16, device="cuda")
    torch.testing.assert_close(logp, logp_ref, rtol=0.02, atol=0.05)
    torch.testing.assert_close(entropy, entropy_ref, rtol=0.02, atol=0.05)
    for name, grad in grads.items():
        scale = grads_ref[name].abs().max().clamp(min=1e-6)
        assert (grad - grads_ref[name]).abs().max() / scale < 0.05, name


def test_long_rows_attend_alone_only_on_a_gpu():
    assert rows_attend_alone([ROWS_ALONE_MIN, 30000], on_cuda=True)
    assert not rows_attend_alone([ROWS_ALONE_MIN - 1, 30000], on_cuda=True)
    # the way each micro-batch attends: one short row no longer takes a long one to the flash kernel
    assert attention_path([ROWS_ALONE_MIN, 30000], on_cuda=True) == ALONE
    assert attention_path([ROWS_ALONE_MIN - 1, 30000], on_cuda=True) == LONG_ALONE_SHORT_TOGETHER
    assert attention_path([ROWS_ALONE_MIN - 1, 300], on_cuda=True) == FLASH
    assert attention_path([ROWS_ALONE_MIN - 1, 30000], on_cuda=False) == ALONE_UNPADDED
    assert not rows_attend_alone([30000], on_cuda=False)
    assert not rows_attend_alone([], on_cuda=True)
    assert [bucketed_width(n, 512) for n in (1, 512, 513, 27796)] == [512, 512, 1024, 28160]


def causal_per_row(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, bounds: list[int], scale: float) -> torch.Tensor:
    """The reference: causal SDPA on each row's slice, written into its place ([T, H, D] in and out)."""
    out = torch.empty_like(q)
    for start, end in zip(bounds[:-1], bounds[1:], strict=True):
        rows = [t[start:end].transpose(0, 1) for t in (q, k, v)]  # each [heads, n, D]
        out[start:end] = F.scaled_dot_product_attention(*rows, is_causal=True, scale=scale, enable_gqa=True).transpose(0, 1)
    return out


def assert_attends_as_each_row_alone(attend, lengths: list[int], seed: int) -> None:
    """``attend(q, k, v, bounds, scale)`` on packed rows of these lengths gives causal_per_row's outputs
    and q, k, v gradients (float64; grouped K/V heads as the 1.5B's, 6 query heads to 2)."""
    bounds = [0, *itertools.accumulate(lengths)]
    gen = torch.Generator().manual_seed(seed)
    qkv = [torch.randn(bounds[-1], h, 8, generator=gen, dtype=torch.float64) for h in (6, 2, 2)]
    grad_out = torch.randn(bounds[-1], 6, 8, generator=gen, dtype=torch.float64)
    results = []
    for each in (attend, causal_per_row):
        leaves = [t.clone().requires_grad_() for t in qkv]
        out = each(*leaves, bounds, 0.3)
        out.backward(grad_out)
        results.append([out.detach(), *(t.grad for t in leaves)])
    for name, got, want in zip(["output", "dq", "dk", "dv"], *results, strict=True):
        torch.testing.assert_close(got, want, rtol=0, atol=1e-12, msg=name)


@pytest.mark.parametrize("bucket", [1, 16, 64])
def test_a_row_padded_at_its_end_attends_as_the_row_alone(bucket):
    """_rows_alone_causal pads each row to a multiple of ``bucket`` after its last token: its outputs
    and the gradients of q, k and v are those of causal attention on the row alone (float64; grouped
    K/V heads as the 1.5B's, 6 query heads to 2)."""
    assert_attends_as_each_row_alone(functools.partial(_rows_alone_causal, bucket=bucket), [37, 5, 64, 1], seed=3)


def test_long_rows_attend_alone_and_short_ones_together_each_in_its_place(monkeypatch):
    """A micro-batch of long and short rows: each long row alone, the short ones in one call of the
    group kernel (a spy here, running the reference), and every row's outputs and q, k, v gradients
    those of causal attention on the row alone (float64), a row of no tokens included."""
    monkeypatch.setattr("trainer.models.packed_attention.ROWS_ALONE_MIN", 32)  # the rows' scale here
    groups = []

    def together(q, k, v, group_bounds, scale):
        groups.append((q.shape[0], group_bounds))
        return causal_per_row(q, k, v, group_bounds, scale)

    attend = functools.partial(_long_alone_short_together, together=together)
    assert_attends_as_each_row_alone(attend, [37, 5, 0, 64, 1, 40], seed=4)
    assert groups == [(6, [0, 5, 6])]  # the rows of 5 and 1 tokens, once, end to end


def test_the_decoder_hands_the_host_bounds_to_the_attention():
    """The packed forward passes the rows' bounds as a host list (no device read in each layer), and
    they are cu_seqlens' values."""
    from transformers import AttentionInterface

    seen = []

    def spy(module, query, key, value, attention_mask, **kwargs):
        seen.append((kwargs.get(ROW_BOUNDS), kwargs["cu_seq_lens_q"].tolist()))
        return packed_attention(module, query, key, value, attention_mask, **kwargs)

    lm = build_model("tiny", seed=0).eval()
    policy = PolicyModel(lm, packed=True)
    ids, mask, response, _ = ragged_batch()
    AttentionInterface.register(PACKED_ATTENTION, spy)
    try:
        with torch.no_grad():
            policy(ids, mask, response)
    finally:
        AttentionInterface.register(PACKED_ATTENTION, packed_attention)
    assert len(seen) == lm.config.num_hidden_layers
    assert all(host == device == [0, 7, 13, 20, 22] for host, device in seen)


def test_row_plans_are_built_for_every_width_a_long_row_can_take():
    """build_row_plans runs the lone-row attention at each multiple of ROW_BUCKET from ROWS_ALONE_MIN to
    the longest row's width (on the CPU here: SDPA's own kernels, no plans; the widths are what count)."""
    config = build_model("tiny", seed=0).config
    longest = ROWS_ALONE_MIN + ROW_BUCKET + 1
    assert build_row_plans(config, torch.device("cpu"), torch.float32, longest) == 3
    assert build_row_plans(config, torch.device("cpu"), torch.float32, ROWS_ALONE_MIN) == 1
    assert build_row_plans(config, torch.device("cpu"), torch.float32, ROWS_ALONE_MIN - 1) == 0


@pytest.mark.skipif(not torch.cuda.is_available(), reason="rows attend alone on CUDA only")
@pytest.mark.parametrize("response_lengths", [(6197, 6698), (6197, 1500, 6698)], ids=["all-long", "one-short"])
def test_on_cuda_long_rows_attending_alone_give_the_padded_forwards_figures_in_bf16(response_lengths):
    """Rows of 6,200 and 6,700 tokens take the lone-row path (widths 6,656 and 7,168), beside a row of
    1,500 in the flash kernel in the second case: the log-probs and gradients are the padded
    forward's, within bf16's rounding."""
    gen = torch.Generator().manual_seed(5)
    prompts = [[5, 6, 7], [8, 9], [10, 11]][: len(response_lengths)]
    responses = [torch.randint(3, 60, (n,), generator=gen).tolist() for n in response_lengths]

    def run(packed: bool):
        lm = build_model("tiny-hd64", torch.bfloat16, device="cuda", seed=0).train()
        prompt_ids, prompt_mask = left_pad(prompts, 0)
        response_ids, response_mask = right_pad(responses, 0)
        ids = torch.cat([prompt_ids, response_ids], dim=1).cuda()
        mask = torch.cat([prompt_mask, response_mask], dim=1).cuda()
        lengths = mask.sum(dim=1).tolist()
        assert attention_path(lengths, on_cuda=True) == (LONG_ALONE_SHORT_TOGETHER if min(lengths) < ROWS_ALONE_MIN else ALONE)
        logp, _ = PolicyModel(lm, packed=packed)(ids, mask, response_ids.cuda())
        keep = response_mask.cuda().bool()
        (logp * keep).sum().backward()
        return logp[keep].detach().float(), {n: p.grad.float() for n, p in lm.named_parameters()}

    logp, grads = run(packed=True)
    logp_ref, grads_ref = run(packed=False)
    torch.testing.assert_close(logp, logp_ref, rtol=0.02, atol=0.05)
    for name, grad in grads.items():
        scale = grads_ref[name].abs().max().clamp(min=1e-6)
        assert (grad - grads_ref[name]).abs().max() / scale < 0.05, name
