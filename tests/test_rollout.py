"""The rollout engines (hf, static and fast) on the tiny preset, on CPU in fp32."""

from __future__ import annotations

import copy

import pytest
import torch
from transformers import AutoModelForCausalLM

from trainer.batch import Batch, left_pad
from trainer.config import RolloutConfig
from trainer.models.presets import build_model, preset_config
from trainer.rollout import (
    ENGINES,
    NonFiniteLogitsError,
    RolloutEngine,
    SamplingParams,
    finalize_responses,
    make_engine,
    register_engine,
)

ENGINE_NAMES = ["hf", "static", "fast"]
GREEDY = SamplingParams(do_sample=False)
EOS, PAD = 1, 0


pytestmark = pytest.mark.usefixtures("one_thread")  # see tests/conftest.py


@pytest.fixture(scope="module")
def model(liven) -> torch.nn.Module:
    return liven(build_model("tiny", seed=0))


@pytest.fixture(scope="module")
def untied_model(liven) -> torch.nn.Module:
    """Separate input and output embeddings, so a NaN input row leaves every logit alone."""
    config = preset_config("tiny")
    config.tie_word_embeddings = False
    torch.manual_seed(0)
    return liven(AutoModelForCausalLM.from_config(config))


def engine(name: str, model: torch.nn.Module, tok, micro_batch_size: int = 0, **kwargs) -> RolloutEngine:
    return make_engine(name, model, tok, RolloutConfig(name=name, micro_batch_size=micro_batch_size), **kwargs)


def response_logits(model: torch.nn.Module, batch: Batch) -> torch.Tensor:
    """Teacher-forced logits [B, R, V] that predicted each response token."""
    with torch.no_grad():
        logits = model(
            input_ids=batch.input_ids, attention_mask=batch.attention_mask, position_ids=batch.position_ids
        ).logits
    width = batch.prompt_ids.shape[1]
    return logits[:, width - 1 : width - 1 + batch.response_ids.shape[1]]


def check_masks(batch: Batch, max_new_tokens: int) -> tuple[int, int]:
    """Assert the response format row by row; return (rows ended by EOS, rows that hit the limit)."""
    ended = full = 0
    for ids, mask in zip(batch.response_ids.tolist(), batch.response_mask.tolist(), strict=True):
        length = sum(mask)
        assert mask == [1] * length + [0] * (len(mask) - length), "mask must be a prefix of ones"
        assert ids[length:] == [PAD] * (len(ids) - length), "padding after the response"
        assert EOS not in ids[: length - 1], "no EOS before the last masked token"
        if ids[length - 1] == EOS:
            ended += 1
        else:
            assert length == max_new_tokens, f"a row without EOS must run to the limit, got {length}"
            full += 1
    return ended, full


# ----------------------------------------------------------------------------- format
@pytest.mark.parametrize("name", ENGINE_NAMES)
def test_batch_rows_repeat_each_prompt_n_times(name, model, tok, prompts):
    batch = engine(name, model, tok).generate(prompts[:3], [10, 11, 12], ["5", "x", "68"], 2, 12, GREEDY, 0)
    rows = [p for p in prompts[:3] for _ in range(2)]
    expected_ids, expected_mask = left_pad(rows, PAD)
    assert torch.equal(batch.prompt_ids, expected_ids)
    assert torch.equal(batch.prompt_mask, expected_mask)
    assert batch.uids.tolist() == [10, 10, 11, 11, 12, 12]
    assert batch.ground_truths == ["5", "5", "x", "x", "68", "68"]
    assert batch.response_ids.shape == batch.response_mask.shape
    assert batch.response_ids.shape[0] == 6 and 1 <= batch.response_ids.shape[1] <= 12
    assert batch.response_ids.dtype == torch.long and batch.response_mask.dtype == torch.long
    # greedy: the n copies of a prompt get the same response
    assert torch.equal(batch.response_ids[0::2], batch.response_ids[1::2])


@pytest.mark.parametrize("name", ENGINE_NAMES)
def test_response_mask_includes_eos_and_excludes_padding(name, model, tok, prompts):
    max_new = 24
    batch = engine(name, model, tok).generate(prompts, list(range(8)), [], 3, max_new, SamplingParams(), 1)
    ended, full = check_masks(batch, max_new)
    assert ended > 0 and full > 0, f"the set-up should give both kinds of row: {ended} ended, {full} full"
    assert batch.response_ids.shape[1] == max_new  # some row hit the limit


def test_response_width_is_the_longest_response(model, tok, prompts):
    e = engine("static", model, tok)
    lengths = e.generate(prompts, list(range(8)), [], 1, 24, GREEDY, 0).response_mask.sum(dim=1).tolist()
    short = [i for i, n in enumerate(lengths) if n < 24]
    assert short, "the set-up should have a prompt whose greedy response ends early"
    alone = e.generate([prompts[short[0]]], [0], [], 1, 24, GREEDY, 0)
    assert alone.response_ids.shape[1] == lengths[short[0]]  # as wide as the response, not max_new_tokens
    assert alone.response_ids[0, -1].item() == EOS


def test_finalize_responses_by_hand():
    tokens = torch.tensor([[5, 6, EOS, 7, EOS], [5, EOS, 9, 9, 9], [5, 6, 7, 8, 9], [EOS, 3, 3, 3, 3]])
    ids, mask = finalize_responses(tokens, (EOS,), PAD)
    assert mask.tolist() == [[1, 1, 1, 0, 0], [1, 1, 0, 0, 0], [1, 1, 1, 1, 1], [1, 0, 0, 0, 0]]
    assert ids.tolist() == [[5, 6, EOS, 0, 0], [5, EOS, 0, 0, 0], [5, 6, 7, 8, 9], [EOS, 0, 0, 0, 0]]


# ----------------------------------------------------------------------------- greedy equality
@pytest.mark.parametrize("micro_batches", [(0, 0), (3, 5)])
def test_greedy_tokens_identical_in_hf_and_static(micro_batches, model, tok, prompts):
    hf_mb, static_mb = micro_batches
    a = engine("hf", model, tok, hf_mb).generate(prompts, list(range(8)), [], 1, 32, GREEDY, 0)
    b = engine("static", model, tok, static_mb).generate(prompts, list(range(8)), [], 1, 32, GREEDY, 0)
    assert torch.equal(a.response_ids, b.response_ids)
    assert torch.equal(a.response_mask, b.response_mask)
    ended, full = check_masks(a, 32)
    assert ended >= 2 and full >= 2, "the comparison should cover rows that stop early and rows that run on"


@pytest.mark.parametrize("name", ENGINE_NAMES)
def test_greedy_does_not_depend_on_the_seed(name, model, tok, prompts):
    e = engine(name, model, tok)
    assert torch.equal(
        e.generate(prompts, list(range(8)), [], 1, 16, GREEDY, 0).response_ids,
        e.generate(prompts, list(range(8)), [], 1, 16, GREEDY, 123).response_ids,
    )


# ----------------------------------------------------------------------------- seeding
@pytest.mark.parametrize("name", ENGINE_NAMES)
def test_same_seed_same_tokens_other_seed_other_tokens(name, model, tok, prompts):
    e = engine(name, model, tok)
    rng_before = torch.get_rng_state()
    a = e.generate(prompts, list(range(8)), [], 2, 16, SamplingParams(), 7)
    b = e.generate(prompts, list(range(8)), [], 2, 16, SamplingParams(), 7)
    c = e.generate(prompts, list(range(8)), [], 2, 16, SamplingParams(), 8)
    assert torch.equal(a.response_ids, b.response_ids) and torch.equal(a.response_mask, b.response_mask)
    assert not torch.equal(a.response_ids[:, :4], c.response_ids[:, :4])
    # the n samples of a prompt differ (they are not copies of one draw)
    assert not torch.equal(a.response_ids[0::2, :4], a.response_ids[1::2, :4])
    assert torch.equal(torch.get_rng_state(), rng_before), "generate must leave the global RNG alone"


@pytest.mark.parametrize("name", ENGINE_NAMES)
def test_micro_batched_sampling_is_reproducible(name, model, tok, prompts):
    e = engine(name, model, tok, micro_batch_size=4)
    a = e.generate(prompts, list(range(8)), [], 2, 16, SamplingParams(), 3)
    b = e.generate(prompts, list(range(8)), [], 2, 16, SamplingParams(), 3)
    assert torch.equal(a.response_ids, b.response_ids)
    assert a.uids.tolist() == [u for u in range(8) for _ in range(2)]
    check_masks(a, 16)


# ----------------------------------------------------------------------------- sampling controls
@pytest.mark.parametrize("name", ENGINE_NAMES)
def test_top_k_one_sampling_equals_greedy(name, model, tok, prompts):
    e = engine(name, model, tok)
    sampled = e.generate(prompts, list(range(8)), [], 2, 20, SamplingParams(temperature=1.5, top_k=1), 5)
    greedy = e.generate(prompts, list(range(8)), [], 2, 20, GREEDY, 0)
    assert torch.equal(sampled.response_ids, greedy.response_ids)


@pytest.mark.parametrize("name", ENGINE_NAMES)
def test_sampled_tokens_lie_in_the_top_k(name, model, tok, prompts):
    k = 3
    batch = engine(name, model, tok).generate(prompts, list(range(8)), [], 2, 20, SamplingParams(2.0, k), 11)
    logits = response_logits(model, batch)
    chosen = logits.gather(2, batch.response_ids[..., None])[..., 0]
    kth = torch.topk(logits, k, dim=-1).values[..., -1]
    ok = (chosen >= kth - 1e-4) | (batch.response_mask == 0)
    assert ok.all(), f"{int((~ok).sum())} sampled tokens outside the top {k}"
    # and top-k is not trivially greedy at T = 2: some tokens are not the argmax
    top1 = torch.topk(logits, 1, dim=-1).values[..., 0]
    assert ((chosen < top1 - 1e-4) & (batch.response_mask == 1)).any()


@pytest.mark.parametrize("name", ENGINE_NAMES)
def test_sampled_tokens_lie_in_the_nucleus(name, model, tok, prompts):
    p = 0.5
    batch = engine(name, model, tok).generate(prompts, list(range(8)), [], 2, 20, SamplingParams(top_p=p), 13)
    probs = torch.softmax(response_logits(model, batch), dim=-1)
    chosen = probs.gather(2, batch.response_ids[..., None])
    mass_above = torch.where(probs > chosen, probs, torch.zeros_like(probs)).sum(dim=-1)
    ok = (mass_above < p + 1e-4) | (batch.response_mask == 0)
    assert ok.all(), f"{int((~ok).sum())} sampled tokens outside the top-p={p} nucleus"


@pytest.mark.parametrize("name", ENGINE_NAMES)
def test_lower_temperature_picks_likelier_tokens(name, model, tok, prompts):
    e = engine(name, model, tok)

    def mean_logprob(temperature: float) -> float:
        batch = e.generate(prompts, list(range(8)), [], 4, 16, SamplingParams(temperature), 17)
        logp = torch.log_softmax(response_logits(model, batch), dim=-1)
        chosen = logp.gather(2, batch.response_ids[..., None])[..., 0]
        return float((chosen * batch.response_mask).sum() / batch.response_mask.sum())

    cold, warm, hot = mean_logprob(0.3), mean_logprob(1.0), mean_logprob(3.0)
    assert cold > warm > hot, (cold, warm, hot)


# ----------------------------------------------------------------------------- non-finite logits
@pytest.mark.parametrize("name", ENGINE_NAMES)
def test_nan_logits_at_the_first_step_name_the_rows(name, untied_model, tok, prompts):
    broken = copy.deepcopy(untied_model)
    q = tok.convert_tokens_to_ids("?")
    with torch.no_grad():
        broken.get_input_embeddings().weight[q] = float("nan")  # prompts 0 and 3 of these contain "?"
    chosen = [prompts[1], prompts[0], prompts[2], prompts[6]]
    assert [q in p for p in chosen] == [False, True, False, False]
    e = engine(name, broken, tok, micro_batch_size=2)
    with pytest.raises(NonFiniteLogitsError) as info:
        e.generate(chosen, [0, 1, 2, 3], [], 2, 16, SamplingParams(), 0)
    err = info.value
    assert (err.step, err.rows, err.micro_batch) == (0, [2, 3], 1)
    assert "decode step 0" in str(err) and "rows [2, 3]" in str(err) and "micro-batch 1" in str(err)


@pytest.mark.parametrize("name", ENGINE_NAMES)
def test_nan_logits_at_a_later_step_name_that_step(name, untied_model, tok, prompts):
    max_new = 24
    clean = engine("hf", untied_model, tok).generate(prompts, list(range(8)), [], 1, max_new, GREEDY, 0)
    # A token the model generates but no prompt holds: feeding it back gives NaN at the next step.
    in_prompts = {t for p in prompts for t in p}
    first_seen: dict[int, dict[int, int]] = {}
    for row, (ids, mask) in enumerate(zip(clean.response_ids.tolist(), clean.response_mask.tolist(), strict=True)):
        for step, (t, m) in enumerate(zip(ids, mask, strict=True)):
            if m and t not in in_prompts and t not in (EOS, PAD) and step + 1 < max_new:
                first_seen.setdefault(t, {}).setdefault(row, step)
    token, rows_steps = max(first_seen.items(), key=lambda kv: min(kv[1].values()))
    step = min(rows_steps.values())
    assert step >= 2, "the set-up should find a token first generated after a few steps"
    expected_rows = sorted(r for r, s in rows_steps.items() if s == step)

    broken = copy.deepcopy(untied_model)
    with torch.no_grad():
        broken.get_input_embeddings().weight[token] = float("nan")
    with pytest.raises(NonFiniteLogitsError) as info:
        engine(name, broken, tok).generate(prompts, list(range(8)), [], 1, max_new, GREEDY, 0)
    assert (info.value.step, info.value.rows, info.value.micro_batch) == (step + 1, expected_rows, 0)


@pytest.mark.parametrize("name", ENGINE_NAMES)
def test_nan_weights_everywhere_raise_before_sampling(name, model, tok, prompts):
    broken = copy.deepcopy(model)
    with torch.no_grad():
        broken.model.norm.weight[0] = float("nan")
    with pytest.raises(NonFiniteLogitsError) as info:
        engine(name, broken, tok).generate(prompts[:2], [0, 1], [], 2, 8, SamplingParams(), 0)
    assert info.value.step == 0 and info.value.rows == [0, 1, 2, 3]


# ----------------------------------------------------------------------------- model state
@pytest.mark.parametrize("name", ENGINE_NAMES)
def test_training_mode_is_restored_and_no_graph_is_built(name, tok, prompts):
    actor = build_model("tiny", seed=1)
    actor.train()
    batch = engine(name, actor, tok).generate(prompts[:2], [0, 1], [], 2, 8, SamplingParams(), 0)
    assert actor.training
    assert not batch.response_ids.requires_grad
    actor.eval()
    engine(name, actor, tok).generate(prompts[:2], [0, 1], [], 2, 8, SamplingParams(), 0)
    assert not actor.training
    # the responses feed a training forward with gradients (inference-mode tensors could not)
    loss = actor(input_ids=batch.input_ids, attention_mask=batch.attention_mask).logits.sum()
    loss.backward()


def test_sync_from_shares_or_copies_the_actor(tok, prompts):
    actor = build_model("tiny", seed=2)
    shared = engine("static", build_model("tiny", seed=3), tok)
    assert shared.sync_from(actor) == 0 and shared.model is actor

    own = engine("static", build_model("tiny", seed=3), tok, share_weights=False)
    before = own.model
    copied = own.sync_from(actor)
    unique_bytes = sum(p.numel() * p.element_size() for p in actor.parameters())  # tied counted once
    assert copied == unique_bytes
    assert own.model is before, "a copy keeps the engine's own tensors (their addresses stay put)"
    for (n1, p1), (n2, p2) in zip(own.model.state_dict().items(), actor.state_dict().items(), strict=True):
        assert n1 == n2 and torch.equal(p1, p2)
    a = own.generate(prompts, list(range(8)), [], 1, 12, GREEDY, 0)
    b = shared.generate(prompts, list(range(8)), [], 1, 12, GREEDY, 0)
    assert torch.equal(a.response_ids, b.response_ids)


def test_load_weights_rejects_mismatched_state(tok):
    e = engine("hf", build_model("tiny"), tok, share_weights=False)
    with pytest.raises(ValueError, match="missing .*model.norm.weight"):
        e.load_weights({k: v for k, v in e.model.state_dict().items() if k != "model.norm.weight"})
    state = dict(e.model.state_dict())
    state["model.norm.weight"] = torch.ones(3)
    with pytest.raises(ValueError, match=r"model.norm.weight has shape \(3,\), expected \(64,\)"):
        e.load_weights(state)


# ----------------------------------------------------------------------------- registry and inputs
def test_make_engine_by_name_and_unknown_names(model, tok):
    assert type(engine("hf", model, tok)).name == "hf"
    assert type(engine("static", model, tok)).name == "static"
    with pytest.raises(ValueError, match="unknown rollout engine 'sglang'; valid names: hf, static, fast, vllm"):
        make_engine("sglang", model, tok)
    with pytest.raises(ValueError, match="already registered"):
        register_engine("hf", ENGINES["static"])


def test_sampling_params_from_config_and_validation():
    cfg = RolloutConfig(temperature=0.7, top_k=20, top_p=0.9, do_sample=True)
    assert SamplingParams.from_config(cfg) == SamplingParams(0.7, 20, 0.9, True)
    assert SamplingParams(top_k=-1).top_k_or_zero == 0
    with pytest.raises(ValueError, match="temperature must be > 0"):
        SamplingParams(temperature=0.0)
    with pytest.raises(ValueError, match="top_p"):
        SamplingParams(top_p=0.0)


@pytest.mark.parametrize(
    "args, message",
    [
        (dict(uids=[0]), r"one uid per prompt \(2\), got 1"),
        (dict(ground_truths=["a"]), r"one ground truth per prompt \(2\) or none, got 1"),
        (dict(n=0), r"n \(responses per prompt\) must be >= 1, got 0"),
        (dict(max_new_tokens=0), "max_new_tokens must be >= 1, got 0"),
        (dict(prompts=[[5], []]), r"empty prompts at indices \[1\]"),
        (dict(max_new_tokens=5000), "exceeds the model's max_position_embeddings"),
    ],
)
def test_generate_rejects_bad_inputs(args, message, model, tok):
    call = dict(prompts=[[5, 6], [7]], uids=[0, 1], ground_truths=[], n=1, max_new_tokens=4) | args
    with pytest.raises(ValueError, match=message):
        engine("static", model, tok).generate(
            call["prompts"], call["uids"], call["ground_truths"], call["n"], call["max_new_tokens"], GREEDY, 0
        )
