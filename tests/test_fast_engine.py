"""The fast rollout engine: its lean forward, decode buffers and sampling against the other engines.

On CPU the engine runs its decode step eagerly and samples through ``sampling.sample_keyed``, so its
tokens must equal the static engine's exactly (same keyed noise) and, greedy, the hf engine's too.
The CUDA-graph and Triton paths are checked on a GPU only (skipped here with the reason).
"""

from __future__ import annotations

import pytest
import torch
from transformers import LlamaConfig, Qwen3Config

from trainer.config import RolloutConfig
from trainer.models.presets import build_model
from trainer.rollout import FastRolloutEngine, SamplingParams, make_engine
from trainer.rollout.decode_buffers import compacted_size
from trainer.rollout.fast_engine import DecodeBuffers, warm_up_targets
from trainer.rollout.lean_decoder import LeanWeights, lean_shape, prefill_logits
from trainer.rollout.sampling import keyed_exponential, sample_keyed, token_log_probs

EOS = 1
CUDA = torch.cuda.is_available()
needs_cuda = pytest.mark.skipif(not CUDA, reason="CUDA graphs and the Triton sampler need a GPU")


pytestmark = pytest.mark.usefixtures("one_thread")  # see tests/conftest.py


@pytest.fixture(scope="module")
def model(liven) -> torch.nn.Module:
    return liven(build_model("tiny", seed=0))


def run(name: str, model, tok, prompts, sampling: SamplingParams, max_new: int = 24, seed: int = 3, **cfg):
    engine = make_engine(name, model, tok, RolloutConfig(name=name, **cfg))
    return engine.generate(prompts, list(range(len(prompts))), [], 2, max_new, sampling, seed)


SAMPLINGS = [
    SamplingParams(do_sample=False),
    SamplingParams(),
    SamplingParams(temperature=0.7, top_k=12),
    SamplingParams(temperature=1.3, top_p=0.85),
]


@pytest.mark.parametrize("sampling", SAMPLINGS, ids=["greedy", "plain", "top_k", "top_p"])
@pytest.mark.parametrize("micro", [0, 5])
def test_tokens_equal_the_static_engines(sampling, micro, model, tok, prompts):
    static = run("static", model, tok, prompts, sampling, micro_batch_size=micro)
    fast = run("fast", model, tok, prompts, sampling, micro_batch_size=micro)
    assert torch.equal(fast.response_ids, static.response_ids)
    assert torch.equal(fast.response_mask, static.response_mask)
    lengths = fast.response_mask.sum(dim=1)
    assert lengths.min() < lengths.max(), "the set-up should give responses of different lengths"


def test_greedy_tokens_equal_transformers_generate(model, tok, prompts):
    greedy = SamplingParams(do_sample=False)
    assert torch.equal(run("fast", model, tok, prompts, greedy).response_ids, run("hf", model, tok, prompts, greedy).response_ids)


def test_prefill_logits_equal_the_transformers_forward(model, tok, prompts):
    from trainer.batch import left_pad, position_ids_from_mask

    ids, mask = left_pad(prompts, 0)
    weights = LeanWeights(lean_shape(model.config), torch.float32, torch.device("cpu"))
    weights.load(model)
    buf = DecodeBuffers(weights, ids.shape[0], ids.shape[1], 4, (EOS,), 0)
    with torch.no_grad():
        ours = prefill_logits(weights, buf.cache_k, buf.cache_v, ids, mask)
        theirs = model(input_ids=ids, attention_mask=mask, position_ids=position_ids_from_mask(mask)).logits[:, -1]
    torch.testing.assert_close(ours, theirs, rtol=1e-5, atol=1e-5)


def test_each_prompt_is_prefilled_once_and_every_row_of_it_holds_its_cache(model, tok, prompts, monkeypatch):
    import trainer.rollout.fast_engine as fast_engine
    from trainer.batch import left_pad

    prefilled = []

    def counting_prefill(weights, cache_k, cache_v, ids, mask, into=None, reduce=None):
        prefilled.append(ids.shape[0])
        return prefill_logits(weights, cache_k, cache_v, ids, mask, into, reduce)

    monkeypatch.setattr(fast_engine, "prefill_logits", counting_prefill)
    monkeypatch.setattr(fast_engine, "PREFILL_TOKENS", 256)  # two prompts a chunk: four chunks
    engine = FastRolloutEngine(model, tok, compact_rows=False)  # the rows stay in their slots
    n = 3
    engine.generate(prompts, list(range(len(prompts))), [], n, 4, SamplingParams(), 3)
    assert prefilled == [2, 2, 2, 2], f"{n} rows per prompt should share one prefill, got {prefilled}"
    buf = engine._buffers
    width = buf.prompt_width
    # each row's prompt slots hold its own prompt's K/V: what a prefill of every row computes
    ids, mask = left_pad([p for p in prompts for _ in range(n)], 0, width)
    k, v = torch.zeros_like(buf.cache_k[:, :, :, :width]), torch.zeros_like(buf.cache_v[:, :, :, :width])
    with torch.no_grad():
        prefill_logits(engine.weights, k, v, ids, mask)
    visible = mask.bool()[None, :, None, :, None]  # padding slots are masked out of attention anyway
    torch.testing.assert_close(buf.cache_k[:, :, :, :width] * visible, k * visible, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(buf.cache_v[:, :, :, :width] * visible, v * visible, rtol=1e-5, atol=1e-5)
    for first in range(0, len(prompts) * n, n):  # and bit for bit the same in every row of a group
        for row in range(first + 1, first + n):
            assert torch.equal(buf.cache_k[:, row, :, :width], buf.cache_k[:, first, :, :width])
            assert torch.equal(buf.cache_v[:, row, :, :width], buf.cache_v[:, first, :, :width])


@pytest.mark.parametrize("name", ["hf", "static", "fast"])
def test_ignore_eos_runs_every_row_to_the_limit(name, model, tok, prompts):
    max_new = 24
    sampling = SamplingParams()
    stopped = run(name, model, tok, prompts, sampling, max_new)
    assert int(stopped.response_mask.sum(dim=1).min()) < max_new, "without ignore_eos some rows should end early"
    batch = run(name, model, tok, prompts, sampling, max_new, ignore_eos=True)
    assert batch.response_ids.shape == (2 * len(prompts), max_new)
    assert batch.response_mask.sum(dim=1).tolist() == [max_new] * (2 * len(prompts))
    # an EOS was sampled and decoding went on past it
    assert any(EOS in row[:-1] for row in batch.response_ids.tolist())


def test_reshard_copies_new_weights_and_reuses_buffers(tok, prompts, liven):
    actor = liven(build_model("tiny", seed=0))
    engine = make_engine("fast", actor, tok, RolloutConfig(name="fast"))
    greedy = SamplingParams(do_sample=False)
    first = engine.generate(prompts, list(range(8)), [], 1, 12, greedy, 0)
    buffers = engine._buffers
    other = liven(build_model("tiny", seed=7))
    copied = engine.sync_from(other)
    n_params = sum(p.numel() for p in other.parameters())
    assert copied == n_params * 4  # every float32 parameter once (the tied head is the embedding)
    second = engine.generate(prompts, list(range(8)), [], 1, 12, greedy, 0)
    assert engine._buffers is buffers, "the same shape must reuse the KV cache and state"
    expected = make_engine("static", other, tok, RolloutConfig(name="static")).generate(prompts, list(range(8)), [], 1, 12, greedy, 0)
    assert torch.equal(second.response_ids, expected.response_ids)
    assert not torch.equal(first.response_ids, second.response_ids)
    engine.generate(prompts[:3], list(range(3)), [], 1, 12, greedy, 0)
    assert engine._buffers is not buffers, "a new batch shape needs new buffers"


def test_free_cache_engine_releases_the_cache(model, tok, prompts):
    engine = make_engine("fast", model, tok, RolloutConfig(name="fast", free_cache_engine=True))
    engine.generate(prompts, list(range(8)), [], 1, 6, SamplingParams(), 0)
    assert engine._buffers is None


def test_warm_up_targets_halve_the_running_rows_at_every_check():
    assert warm_up_targets(4, 32) == [96, 64, 32, 32]
    assert warm_up_targets(1, 8) == [8]
    for rows in (2, 3, 5, 48, 64, 256):
        targets = warm_up_targets(rows, 32)
        levels = (rows - 1).bit_length()
        running = [sum(t > 32 * check for t in targets) for check in range(1, levels + 2)]
        # the upper half of 2**L rows ends first; one row is left at the last check, none after it
        assert running == [min(rows, 1 << (levels - j)) for j in range(1, levels + 1)] + [0], (rows, running)
        sizes, size = [rows], rows
        for alive in running[:-1]:
            size = min(size, compacted_size(alive, size))
            sizes.append(size)
        assert sizes[-1] == 1 and sizes == sorted(sizes, reverse=True), (rows, sizes)
    with pytest.raises(ValueError, match="rows and check_every"):
        warm_up_targets(0, 32)


@pytest.mark.parametrize("free_cache", [True, False])
def test_warm_up_decodes_and_leaves_nothing_that_changes_a_generate(free_cache, model, tok, prompts, tmp_path, monkeypatch):
    """A worker warms its engine at set-up; the step's generate must give what a cold engine gives."""
    cfg = RolloutConfig(name="fast", free_cache_engine=free_cache)
    cold = make_engine("fast", model, tok, cfg).generate(prompts, list(range(8)), [], 2, 20, SamplingParams(), 5)
    monkeypatch.setenv("RLBENCH_DECODE_TRACE", str(tmp_path))  # a trace names the step's calls, not the warm-up's
    engine = make_engine("fast", model, tok, cfg)
    seconds = engine.warm_up(4, 2, 12, 20, SamplingParams())
    # 8 rows, the longest target 4 checks of 32 steps, cut to max_new_tokens: it decoded to the limit
    assert engine.stats["warm_up_tokens"] == min(max(warm_up_targets(8, engine.check_every)), 20) == 20
    assert seconds > 0 and engine._buffers is None and not engine._graphs and not engine._warmed
    assert not list(tmp_path.iterdir())
    warm = engine.generate(prompts, list(range(8)), [], 2, 20, SamplingParams(), 5)
    assert torch.equal(warm.response_ids, cold.response_ids)
    assert torch.equal(warm.rollout_log_probs, cold.rollout_log_probs)
    assert len([line for f in tmp_path.iterdir() for line in f.read_text().splitlines()]) == 1


def test_attention_buckets_cover_every_written_slot(model):
    weights = LeanWeights(lean_shape(model.config), torch.float32, torch.device("cpu"))
    buf = DecodeBuffers(weights, batch=2, prompt_width=128, max_new=300, stop_ids=(EOS,), pad_id=0)
    assert buf.slots == 512  # 428 rounded up to 128
    for i in range(1, 300):
        n = buf.attn_len(i, 128)
        assert n % 128 == 0 or n == buf.slots
        assert 128 + i <= n <= buf.slots  # the slot written at step i (128 + i - 1) is inside


def test_unsupported_architectures_are_named():
    qwen3 = Qwen3Config(hidden_size=64, intermediate_size=128, num_hidden_layers=1, num_attention_heads=4,
                        num_key_value_heads=2, vocab_size=128)
    with pytest.raises(ValueError, match="model_type 'qwen3' is not supported"):
        lean_shape(qwen3)
    scaled = LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=1, num_attention_heads=4,
                         num_key_value_heads=2, vocab_size=128,
                         rope_scaling={"rope_type": "linear", "factor": 2.0})
    with pytest.raises(ValueError, match="rope_type 'linear' is not supported"):
        lean_shape(scaled)


def test_llama_without_biases_matches_transformers(tok, prompts):
    from transformers import AutoModelForCausalLM

    config = LlamaConfig(hidden_size=64, intermediate_size=160, num_hidden_layers=2, num_attention_heads=4,
                         num_key_value_heads=2, vocab_size=128, max_position_embeddings=512,
                         eos_token_id=EOS, pad_token_id=0, tie_word_embeddings=False)
    torch.manual_seed(1)
    llama = AutoModelForCausalLM.from_config(config)
    with torch.no_grad():
        for p in llama.parameters():
            if p.dim() == 2:
                p.mul_(4.0)
    greedy = SamplingParams(do_sample=False)
    assert torch.equal(run("fast", llama, tok, prompts, greedy).response_ids, run("hf", llama, tok, prompts, greedy).response_ids)


# ----------------------------------------------------------------------------- GPU only
@needs_cuda
def test_graph_replay_gives_the_eager_tokens(tok, prompts, liven):
    model = liven(build_model("tiny", seed=0)).to("cuda", torch.bfloat16)
    greedy = SamplingParams(do_sample=False)
    graphs = run("fast", model, tok, prompts, greedy, max_new=200)
    eager = run("fast", model, tok, prompts, greedy, max_new=200, enforce_eager=True)
    assert torch.equal(graphs.response_ids, eager.response_ids)
    sampled = [run("fast", model, tok, prompts, SamplingParams(), max_new=200, enforce_eager=e) for e in (False, True)]
    assert torch.equal(sampled[0].response_ids, sampled[1].response_ids)


@needs_cuda
def test_graph_captured_decode_passes_the_sampler_check_and_reporting_entropies_changes_no_token(tok, prompts):
    # The Triton race in CUDA graphs, bf16, rows of ragged lengths compacted part-way: the sampler draws
    # from the distribution whose log-probs and entropies it reports, and the audit's extra pass over the
    # logits leaves the tokens as they were.
    from trainer.config.schema import TargetLengthsConfig
    from trainer.rollout.sampling_audit import fp32_reference, reference_figures, sampler_check

    model = build_model("tiny", seed=0)
    with torch.no_grad():  # the tied head x4: about 2.8 nats a step (tests/test_rollout_fidelity.py's lively)
        model.get_input_embeddings().weight.mul_(4.0)
    model = model.to("cuda", torch.bfloat16).eval()
    lengths = TargetLengthsConfig(distribution="lognormal", mean=100.0, sigma=1.0)
    engine = make_engine("fast", model, tok, RolloutConfig(name="fast", ignore_eos=True, target_lengths=lengths))
    plain = engine.generate(prompts, list(range(8)), [], 16, 200, SamplingParams(), seed=4)
    audited = engine.generate(prompts, list(range(8)), [], 16, 200, SamplingParams(report_entropy=True), seed=4)
    assert engine._race is not None and engine.use_cuda_graphs
    assert torch.equal(plain.response_ids, audited.response_ids)
    check = sampler_check(audited.to("cpu"), SamplingParams(report_entropy=True))
    assert check.tokens > 5_000 and 1.0 < check.mean_entropy < 4.0, check.describe()
    assert check.passed, check.describe("sampler check")
    # Token by token, each reported entropy is the fp32 judge's at that token, to bf16's rounding of
    # the logits: a figure stored one step or one row off would differ by the entropies' own spread.
    _, judged = reference_figures(fp32_reference(model), audited, 1.0)
    mask = audited.response_mask.bool().cpu()
    reported = audited.rollout_entropies.cpu()
    off = (reported - judged)[mask].abs()
    shifted = (reported[:, 1:] - judged[:, :-1])[mask[:, 1:] & mask[:, :-1]].abs()
    rolled = (reported - judged.roll(1, dims=0))[mask & mask.roll(1, dims=0)].abs()
    figures = (f"|reported - judged| median {off.median():.4f}, max {off.max():.4f} nats; one step off: "
               f"max {shifted.max():.4f}; one row off: median {rolled.median():.4f}")
    # (one H200: median 0.0089, max 0.0235; one step off, a median of only 0.018, as a tiny random
    # model's entropies change slowly along a row, but at least 1.33 at a row's first steps; one row
    # off, median 0.49)
    assert off.median() < 0.02 and off.max() < 0.1, figures
    assert shifted.max() > 4 * off.max() and rolled.median() > 10 * off.median(), figures


@needs_cuda
@pytest.mark.parametrize("programs", [None, 1, 200, 10_000])  # default; one chunk a row; 4; the most (75)
def test_triton_race_draws_what_sample_keyed_draws(programs):
    from trainer.kernels.triton_sampling import keyed_race

    torch.manual_seed(0)
    logits = torch.randn(64, 151936, device="cuda") * 3
    keys = torch.arange(64, device="cuda") * 7 + 3
    step, seed = torch.tensor(5, device="cuda"), torch.tensor(1234, device="cuda")
    tokens = torch.empty(64, dtype=torch.long, device="cuda")
    bad = torch.empty(64, dtype=torch.bool, device="cuda")
    log_probs = torch.empty(64, dtype=torch.float32, device="cuda")
    keyed_race(logits, keys, step, seed, 1.0 / 0.8, tokens, bad, log_probs, programs=programs)
    expected = sample_keyed(logits / 0.8, keys, step, seed)
    # the same noise; only last-bit differences of log in the race could ever split a near tie
    assert (tokens == expected).float().mean() >= 0.98
    assert not bad.any()
    torch.testing.assert_close(log_probs, token_log_probs(logits, tokens, 0.8), rtol=0, atol=1e-4)
    # the noise really is keyed_exponential's: with flat logits the race picks its argmin, in whichever
    # chunk it lies (5,000 tokens: up to 3 chunks of 2,048)
    flat = torch.zeros(4, 5000, device="cuda")
    keyed_race(flat, keys[:4], step, seed, 1.0, tokens[:4], bad[:4], programs=programs)
    assert torch.equal(tokens[:4], keyed_exponential(keys[:4], step, 5000, seed).argmin(dim=-1))
    # the token drawn does not depend on the chunk count
    one_chunk = torch.empty_like(tokens)
    keyed_race(logits, keys, step, seed, 1.0 / 0.8, one_chunk, bad, programs=1)
    keyed_race(logits, keys, step, seed, 1.0 / 0.8, tokens, bad, programs=programs)
    assert torch.equal(tokens, one_chunk)
    logits[3, 17] = float("nan")
    logits[9] = float("-inf")
    keyed_race(logits, keys, step, seed, 1.0, tokens, bad, programs=programs)
    assert torch.nonzero(bad).flatten().tolist() == [3, 9]


@needs_cuda
def test_triton_race_samples_the_softmax_at_a_152k_vocabulary():
    """The mean log-prob of the drawn tokens is minus the entropy (within 4 standard errors), and the
    kernel's fused log-probs are token_log_probs'. With tl.log's approximate log in E = -log(u) the
    tail tokens won too often: the gap was about -0.25 nats."""
    from trainer.kernels.triton_sampling import keyed_race

    rows, vocab, temperature = 128, 151936, 0.9
    logits = torch.randn(rows, vocab, generator=torch.Generator().manual_seed(1)) * 2.5
    logits[:, :40] += 11.0  # a realistic head: most mass on a few tokens, a long tail (2.3 nats)
    logits = logits.cuda()
    log_p = (logits / temperature).log_softmax(-1)
    entropy = -(log_p.exp() * log_p).sum(-1)  # [rows]
    keys = torch.arange(rows, device="cuda")
    seed = torch.tensor(99, device="cuda")
    tokens = torch.empty(rows, dtype=torch.long, device="cuda")
    bad = torch.empty(rows, dtype=torch.bool, device="cuda")
    fused = torch.empty(rows, dtype=torch.float32, device="cuda")
    gaps = []
    for step in range(64):
        keyed_race(logits, keys, torch.tensor(step, device="cuda"), seed, 1.0 / temperature, tokens, bad, fused)
        picked = log_p.gather(-1, tokens.view(-1, 1)).squeeze(-1)
        assert torch.allclose(fused, token_log_probs(logits, tokens, temperature), atol=1e-4)
        gaps.append(picked + entropy)
    gap = torch.cat(gaps).double()
    standard_error = gap.std() / gap.numel() ** 0.5
    assert abs(gap.mean()) < 4 * standard_error, (gap.mean().item(), standard_error.item())
    assert 1.0 < entropy.mean() < 4.0


@needs_cuda
def test_non_finite_logits_raise_on_gpu_with_graphs(tok, prompts, liven):
    from trainer.rollout import NonFiniteLogitsError

    model = liven(build_model("tiny", seed=0)).to("cuda", torch.bfloat16)
    with torch.no_grad():
        model.model.layers[0].mlp.down_proj.weight.fill_(float("nan"))
    with pytest.raises(NonFiniteLogitsError, match="fast rollout: non-finite logits"):
        run("fast", model, tok, prompts, SamplingParams(), max_new=64)


def test_engine_is_registered_under_its_name(model, tok):
    assert isinstance(make_engine("fast", model, tok), FastRolloutEngine)
