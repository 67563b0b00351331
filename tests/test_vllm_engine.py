"""The vllm rollout engine (trainer/rollout/vllm_engine.py).

The engine tests need vLLM; CI installs the CPU build into a venv of its own and runs this file there
(README, "vLLM"). Without vLLM they are skipped, and the tests of what a base install does run instead.
vLLM's CPU attention refuses the tiny preset's head_dim 16, so the model here is the tiny-hd64 preset
(heads of 64). One engine serves the module (vLLM start-up takes ~10-20 s on 2 cores). The suites
with --rl-rollout vllm: tests/test_vllm_suites.py.
"""

from __future__ import annotations

import importlib.util
import subprocess
import sys
import time

import pytest
import torch
from transformers import Qwen2Config

from trainer.batch import Batch, left_pad, right_pad
from trainer.config import (
    ConfigError,
    RolloutConfig,
    TargetLengthsConfig,
    UnsupportedConfigError,
    build_config,
)
from trainer.models.presets import build_model, load_tokenizer
from trainer.rollout import RowsRequest, SamplingParams, engine_class, finalize_responses, make_engine
from trainer.rollout.vllm_engine import PROCESSED, RAW, actor_weights, check_sampling, fitting_logprobs_modes

HAVE_VLLM = importlib.util.find_spec("vllm") is not None
needs_vllm = pytest.mark.skipif(not HAVE_VLLM, reason='vLLM is not installed (pip install -e ".[vllm]", README "vLLM")')
TEMPERATURE = 0.7
MAX_NEW = 16
# |vLLM's log-prob - an fp32 transformers forward's| on the tiny model, both fp32 on CPU. Measured
# here: at most 9.5e-7 over 235 tokens (other kernels, same fp32 arithmetic); the bound leaves room for other CPUs.
LOGPROB_ATOL = 1e-4


def tiny_model(seed: int, liven) -> torch.nn.Module:
    """The preset vLLM runs on CPU (tiny-hd64: heads of 64; the tiny preset's 16 is refused)."""
    return liven(build_model("tiny-hd64", seed=seed)).eval()


@pytest.fixture(scope="module")
def vtok():
    return load_tokenizer("tiny")


@pytest.fixture(scope="module")
def vmodel(liven) -> torch.nn.Module:
    return tiny_model(0, liven)


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
    updated = tiny_model(1, liven)
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
    assert vllm_config("actor_rollout_ref.rollout.gpu_memory_utilization=0.1", "actor_rollout_ref.model.path=tiny-hd64")


@needs_vllm
def test_on_cpu_a_head_dim_vllm_refuses_is_refused_at_start_up_naming_presets_that_fit():
    """vLLM's CPU attention fails inside each worker ("Unsupported CPU attention configuration")."""
    with pytest.raises(UnsupportedConfigError, match=r"path='tiny' has head_dim 16, which vLLM's CPU attention.*64.*tiny-hd64"):
        vllm_config()


@needs_vllm
def test_a_qwen2_whose_head_dim_is_not_hidden_over_heads_is_refused(tmp_path):
    """vLLM's Qwen2 derives head_dim from hidden_size and would build another model."""
    Qwen2Config(
        vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=1, num_attention_heads=4,
        num_key_value_heads=2, head_dim=64,
    ).save_pretrained(tmp_path)
    with pytest.raises(UnsupportedConfigError, match=r"head_dim 64 x 4 heads is not hidden_size 64"):
        vllm_config(f"actor_rollout_ref.model.path={tmp_path}")


# ----------------------------------------------------------------------------- log-prob modes
@pytest.mark.parametrize(
    "sampling, modes",
    [
        (SamplingParams(temperature=0.7), (PROCESSED,)),
        (SamplingParams(), (PROCESSED, RAW)),
        (SamplingParams(top_k=5), (RAW,)),
        (SamplingParams(top_p=0.9), (RAW,)),
        (SamplingParams(temperature=0.7, top_k=5), ()),
        (SamplingParams(top_p=0.9, do_sample=False), (PROCESSED, RAW)),
        (SamplingParams(temperature=0.7, do_sample=False), ()),  # greedy log-probs are before temperature
    ],
)
def test_the_modes_whose_log_prob_is_log_softmax_of_logits_over_t(sampling, modes):
    assert fitting_logprobs_modes(sampling) == modes


def test_top_k_or_top_p_at_another_temperature_is_refused_at_start_up():
    """vLLM's log-probs there are renormalised over the kept tokens: another quantity than the trainer's."""
    expected = r"top_k / top_p / temperature with rollout.name=vllm.*use temperature 1.0, or top_k -1 and top_p 1.0"
    with pytest.raises(UnsupportedConfigError, match=expected):
        vllm_config("actor_rollout_ref.rollout.top_k=5", "actor_rollout_ref.rollout.temperature=0.7")
    with pytest.raises(UnsupportedConfigError, match=expected):
        vllm_config("actor_rollout_ref.rollout.top_p=0.9", "actor_rollout_ref.rollout.temperature=1.2")


def test_greedy_at_another_temperature_is_refused():
    with pytest.raises(ValueError, match=r"greedy decoding \(do_sample=False\) with temperature=0.7 is not supported"):
        check_sampling(SamplingParams(temperature=0.7, do_sample=False))


def test_sampling_that_needs_another_mode_than_the_engine_started_with_is_an_error():
    assert check_sampling(SamplingParams(top_k=5)) == RAW and check_sampling(SamplingParams(temperature=0.5)) == PROCESSED
    assert check_sampling(SamplingParams(), started_with=RAW) == RAW
    with pytest.raises(ValueError, match=r"started with logprobs_mode='processed_logprobs' \(fixed at start-up\).*needs raw_logprobs"):
        check_sampling(SamplingParams(top_k=5), started_with=PROCESSED)


@needs_vllm
def test_the_engine_refuses_a_request_its_logprobs_mode_does_not_fit(vengine, prompts):
    """The engine started at temperature 0.7 ("processed_logprobs"); top-k at temperature 1 needs "raw"."""
    with pytest.raises(ValueError, match="fixed at start-up"):
        generate(vengine, prompts, list(range(8)), sampling=SamplingParams(top_k=5))


# ----------------------------------------------------------------------------- weights and padding
def test_a_tied_head_is_neither_gathered_nor_sent_twice():
    """Under FSDP2 the embedding and the tied head are two sharded parameters whose gathers are two
    tensors; a copy of the head stands for that gather here. It must be left out by name."""
    model = build_model("tiny-hd64")
    model.lm_head.weight = torch.nn.Parameter(model.lm_head.weight.detach().clone())
    assert model.config.tie_word_embeddings
    sent = dict(actor_weights(model, torch.device("cpu")))
    assert "lm_head.weight" not in sent and "model.embed_tokens.weight" in sent
    expected = {n: p for n, p in model.named_parameters() if n != "lm_head.weight"}
    assert sent.keys() == expected.keys()
    model.config.tie_word_embeddings = False  # untied: the head is a weight of its own
    assert "lm_head.weight" in dict(actor_weights(model, torch.device("cpu")))


def test_right_pad_pads_values_on_the_right_with_a_mask():
    ids, mask = right_pad([[5, 6, 7], [], [8]], 0)
    assert ids.tolist() == [[5, 6, 7], [0, 0, 0], [8, 0, 0]] and mask.tolist() == [[1, 1, 1], [0, 0, 0], [1, 0, 0]]
    assert ids.dtype == mask.dtype == torch.long
    values, mask = right_pad([[-0.5], [-1.0, -2.0]], 0.0, width=3, dtype=torch.float32)
    assert values.dtype == torch.float32 and values.tolist() == [[-0.5, 0.0, 0.0], [-1.0, -2.0, 0.0]]
    assert mask.tolist() == [[1, 0, 0], [1, 1, 0]]
    with pytest.raises(ValueError, match="more than the width 1"):
        right_pad([[1, 2]], 0, width=1)


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
