"""The vllm rollout engine (trainer/rollout/vllm_engine.py).

The engine tests need vLLM; CI installs the CPU build into a venv of its own and runs this file there
(README, "vLLM"). Without vLLM they are skipped, and the tests of what a base install does run instead.
vLLM's CPU attention refuses the tiny preset's head_dim 16, so the model here is a tiny Qwen2 with
head_dim 64. One engine serves the module (vLLM start-up takes ~10-20 s on 2 cores).
"""

from __future__ import annotations

import importlib.util
import subprocess
import sys
import time

import pytest
import torch
from transformers import AutoModelForCausalLM, Qwen2Config

from trainer.batch import Batch, left_pad
from trainer.config import (
    ConfigError,
    RolloutConfig,
    TargetLengthsConfig,
    UnsupportedConfigError,
    build_config,
)
from trainer.models.presets import load_tokenizer
from trainer.rollout import RowsRequest, SamplingParams, engine_class, finalize_responses, make_engine

HAVE_VLLM = importlib.util.find_spec("vllm") is not None
needs_vllm = pytest.mark.skipif(not HAVE_VLLM, reason='vLLM is not installed (pip install -e ".[vllm]", README "vLLM")')
TEMPERATURE = 0.7
MAX_NEW = 16
# |vLLM's log-prob - an fp32 transformers forward's| on the tiny model, both fp32 on CPU. Measured
# here: at most 9.5e-7 over 235 tokens (other kernels, same fp32 arithmetic); the bound leaves room for other CPUs.
LOGPROB_ATOL = 1e-4


def tiny_config(tok) -> Qwen2Config:
    """A tiny Qwen2 that vLLM's CPU attention accepts: head_dim 64 (the tiny preset's 16 is refused)."""
    return Qwen2Config(
        vocab_size=128,
        hidden_size=128,
        intermediate_size=256,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=64,
        max_position_embeddings=512,
        tie_word_embeddings=True,
        rope_theta=10000.0,
        rms_norm_eps=1e-6,
        bos_token_id=None,
        eos_token_id=tok.eos_token_id,
        pad_token_id=tok.pad_token_id,
    )


def tiny_model(tok, seed: int, liven) -> torch.nn.Module:
    torch.manual_seed(seed)
    return liven(AutoModelForCausalLM.from_config(tiny_config(tok), dtype=torch.float32)).eval()


@pytest.fixture(scope="module")
def vtok():
    return load_tokenizer("tiny")


@pytest.fixture(scope="module")
def vmodel(vtok, liven) -> torch.nn.Module:
    return tiny_model(vtok, 0, liven)


@pytest.fixture(scope="module")
def vengine(vmodel, vtok):
    """One vLLM engine for the module (start-up is the slow part), holding ``vmodel``'s weights."""
    started = time.perf_counter()
    engine = make_engine("vllm", vmodel, vtok, RolloutConfig(name="vllm", temperature=TEMPERATURE, gpu_memory_utilization=0.1))
    engine.sync_from(vmodel)
    print(f"vLLM engine start-up: {time.perf_counter() - started:.1f} s")
    yield engine
    engine.sync_from(vmodel)


def generate(engine, prompts, uids, n=2, seed=3, sampling=None) -> Batch:
    return engine.generate(prompts, uids, [], n, MAX_NEW, sampling or SamplingParams(temperature=TEMPERATURE), seed)


def request_for(prompts: list[list[int]], n: int, pad: int, seed: int) -> RowsRequest:
    rows = [p for p in prompts for _ in range(n)]
    ids, mask = left_pad(rows, pad)
    return RowsRequest(
        prompt_ids=ids,
        prompt_mask=mask,
        row_keys=torch.arange(len(rows)),
        max_new_tokens=MAX_NEW,
        sampling=SamplingParams(temperature=TEMPERATURE),
        seed=seed,
        generator=None,
        micro_batch=0,
        row_offset=0,
        n=n,
    )


def generated_mask(tokens: torch.Tensor, tok) -> torch.Tensor:
    """1 on the tokens vLLM generated: up to and including EOS (the rest is padding)."""
    return finalize_responses(tokens, [tok.eos_token_id], tok.pad_token_id)[1]


def forward_log_probs(model, request: RowsRequest, tokens: torch.Tensor) -> torch.Tensor:
    """log softmax(logits / T) of each generated token, from one fp32 transformers forward [b, T]."""
    ids = torch.cat([request.prompt_ids, tokens], dim=1)
    mask = torch.cat([request.prompt_mask, torch.ones_like(tokens)], dim=1)
    positions = (mask.cumsum(dim=1) - 1).clamp(min=0)
    with torch.no_grad():
        logits = model(input_ids=ids, attention_mask=mask, position_ids=positions).logits.float()
    width = request.prompt_ids.shape[1]
    scores = torch.log_softmax(logits[:, width - 1 : -1] / TEMPERATURE, dim=-1)
    return scores.gather(-1, tokens.unsqueeze(-1)).squeeze(-1)


# ----------------------------------------------------------------------------- with vLLM
@needs_vllm
def test_rows_have_the_other_engines_format(vengine, vtok, prompts):
    batch = generate(vengine, prompts, list(range(8)), n=3)
    hf = generate(make_engine("hf", vengine.model, vtok), prompts, list(range(8)), n=3)
    assert torch.equal(batch.prompt_ids, hf.prompt_ids) and torch.equal(batch.prompt_mask, hf.prompt_mask)
    assert batch.uids.tolist() == hf.uids.tolist()
    assert batch.response_ids.dtype == batch.response_mask.dtype == torch.long
    assert batch.response_ids.shape == batch.response_mask.shape and batch.response_ids.shape[0] == 24
    eos, pad = vtok.eos_token_id, vtok.pad_token_id
    ended = 0
    for ids, mask in zip(batch.response_ids.tolist(), batch.response_mask.tolist(), strict=True):
        length = sum(mask)
        assert mask == [1] * length + [0] * (len(mask) - length)
        assert ids[length:] == [pad] * (len(ids) - length)
        assert eos not in ids[: length - 1]
        ended += ids[length - 1] == eos
        assert ids[length - 1] == eos or length == MAX_NEW
    assert 0 < ended < 24, f"the set-up should give rows ended by EOS and rows at the limit, got {ended} ended"
    assert batch.response_ids.shape[1] == MAX_NEW


@needs_vllm
def test_target_lengths_and_ignore_eos_fix_each_rows_length(vengine, prompts):
    vengine.target_lengths = TargetLengthsConfig(distribution="lognormal", mean=8.0, sigma=0.6)
    try:
        batch = generate(vengine, prompts, list(range(8)))
        expected = vengine.row_targets(torch.arange(16), 3, MAX_NEW)
    finally:
        vengine.target_lengths = None
    assert len(set(expected.tolist())) > 1, "the set-up should draw different lengths"
    assert batch.response_mask.sum(dim=1).tolist() == expected.tolist()
    vengine.ignore_eos = True
    try:
        batch = generate(vengine, prompts, list(range(8)))
    finally:
        vengine.ignore_eos = False
    assert batch.response_mask.sum(dim=1).tolist() == [MAX_NEW] * 16


@needs_vllm
def test_responses_do_not_depend_on_how_rows_are_split(vengine, prompts):
    whole = generate(vengine, prompts, list(range(8)))
    parts = [generate(vengine, prompts[i : i + 3], list(range(i, min(i + 3, 8)))) for i in (0, 3, 6)]
    width = whole.response_ids.shape[1]
    split = torch.cat([torch.nn.functional.pad(p.response_ids, (0, width - p.response_ids.shape[1])) for p in parts])
    assert torch.equal(split, whole.response_ids)
    assert not torch.equal(whole.response_ids, generate(vengine, prompts, list(range(8)), seed=4).response_ids)
    # the two rows of one prompt get different seeds, hence different responses
    assert not torch.equal(whole.response_ids[0::2], whole.response_ids[1::2])


@needs_vllm
def test_a_batch_over_one_steps_token_budget_is_sampled(vengine, vtok):
    """More prompt tokens than one vLLM step takes (4096 on CPU): a prompt's prefill could be split
    over steps, which failed with per-row seeds on CPU ("CPU Generator does not use offset")."""
    long_prompts = [vtok.encode("Compute 17*4 please, then add 9. " * 4)[:120] for _ in range(20)]
    batch = generate(vengine, long_prompts, list(range(20)), n=2)
    assert batch.response_ids.shape[0] == 40 and int(batch.response_mask.sum(dim=1).min()) >= 1


@needs_vllm
def test_log_probs_match_an_fp32_forward_of_the_same_weights(vengine, vmodel, vtok, prompts):
    request = request_for(prompts, 2, vtok.pad_token_id, seed=5)
    rows = vengine._generate_rows(request)
    assert rows.tokens.shape == rows.log_probs.shape and rows.log_probs.dtype == torch.float32
    assert vengine.logprobs_mode == "processed_logprobs"  # no top-k/top-p: log softmax(logits / T) exactly
    expected = forward_log_probs(vmodel, request, rows.tokens)
    valid = generated_mask(rows.tokens, vtok).bool()
    error = (rows.log_probs - expected).abs()[valid]
    print(f"vLLM vs fp32 forward log-probs: max |diff| {error.max().item():.2e} over {int(valid.sum())} tokens")
    assert error.max().item() < LOGPROB_ATOL
    assert (rows.log_probs[valid] < 0).all()


@needs_vllm
def test_reshard_makes_the_engine_sample_from_the_new_weights(vengine, vmodel, vtok, prompts, liven):
    before = generate(vengine, prompts, list(range(8)))
    updated = tiny_model(vtok, 1, liven)
    copied = vengine.sync_from(updated)
    assert copied == sum(p.numel() * p.element_size() for p in updated.parameters())
    after = generate(vengine, prompts, list(range(8)))
    assert not torch.equal(before.response_ids, after.response_ids)
    request = request_for(prompts[:4], 1, vtok.pad_token_id, seed=6)
    rows = vengine._generate_rows(request)
    valid = generated_mask(rows.tokens, vtok).bool()
    new_error = (rows.log_probs - forward_log_probs(updated, request, rows.tokens)).abs()[valid].max().item()
    old_error = (rows.log_probs - forward_log_probs(vmodel, request, rows.tokens)).abs()[valid].max().item()
    assert new_error < LOGPROB_ATOL < old_error
    vengine.sync_from(vmodel)
    assert torch.equal(generate(vengine, prompts, list(range(8))).response_ids, before.response_ids)


# ----------------------------------------------------------------------------- start-up checks
def vllm_config(*overrides: str):
    """A validated config with the vllm rollout and ``overrides`` (build_config validates)."""
    return build_config(["actor_rollout_ref.rollout.name=vllm", *overrides])


def test_more_than_one_engine_per_worker_is_refused_at_validation():
    with pytest.raises(UnsupportedConfigError, match="tensor_model_parallel_size=2 is not supported yet"):
        vllm_config("actor_rollout_ref.rollout.tensor_model_parallel_size=2")
    with pytest.raises(ConfigError, match=r"gpu_memory_utilization must be in \(0, 1\].*got 1.5"):
        vllm_config("actor_rollout_ref.rollout.gpu_memory_utilization=1.5")


@needs_vllm
def test_with_vllm_installed_the_vllm_config_is_valid():
    assert vllm_config("actor_rollout_ref.rollout.gpu_memory_utilization=0.1")


@pytest.mark.skipif(HAVE_VLLM, reason="tests the base install, without vLLM")
def test_without_vllm_choosing_it_names_the_extra(vmodel, vtok):
    with pytest.raises(UnsupportedConfigError, match=r'needs vLLM, which is not installed.*pip install -e "\.\[vllm\]"'):
        vllm_config()
    with pytest.raises(ImportError, match=r'pip install -e "\.\[vllm\]"'):
        make_engine("vllm", vmodel, vtok)


def test_the_base_install_does_not_import_vllm():
    code = "import sys, trainer.rollout as r; r.engine_class('vllm'); r.engine_names(); print('vllm' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "False"
    assert engine_class("vllm").name == "vllm"
