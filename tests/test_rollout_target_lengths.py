"""rollout.target_lengths: per-row response lengths drawn from (seed, row key), and every engine
(hf, static, fast) stopping each row exactly at its target, EOS or not."""

from __future__ import annotations

import json
import math

import pytest
import torch

from trainer.config import RolloutConfig
from trainer.config.schema import TargetLengthsConfig
from trainer.models.presets import build_model
from trainer.rollout import SamplingParams, make_engine
from trainer.rollout.decode_trace import TRACE_ENV
from trainer.rollout.target_lengths import (
    DISTRIBUTIONS,
    draw_targets,
    keyed_normals,
    lognormal_mu,
    truncated_lognormal_mean,
)

ENGINE_NAMES = ["hf", "static", "fast"]
EOS, PAD = 1, 0
N = 2  # responses per prompt
CAP = 24
SEED = 5
LOGNORMAL = TargetLengthsConfig(distribution="lognormal", mean=12.0, sigma=0.8)

pytestmark = pytest.mark.usefixtures("one_thread")  # see tests/conftest.py


@pytest.fixture(scope="module")
def model(liven) -> torch.nn.Module:
    return liven(build_model("tiny", seed=0))


def engine(name: str, model, tok, targets: TargetLengthsConfig = LOGNORMAL, micro_batch_size: int = 0):
    config = RolloutConfig(name=name, micro_batch_size=micro_batch_size, target_lengths=targets)
    return make_engine(name, model, tok, config)


def row_keys(uids: list[int]) -> torch.Tensor:
    """The engines' row keys: u * n + j for response j of prompt uid u."""
    return torch.tensor([u * N + j for u in uids for j in range(N)])


def expected_targets(uids: list[int], spec: TargetLengthsConfig = LOGNORMAL, seed: int = SEED) -> list[int]:
    return draw_targets(spec.distribution, spec.mean, spec.sigma, row_keys(uids), seed, CAP).tolist()


# ----------------------------------------------------------------------------- the draw
def test_targets_are_reproducible_and_depend_on_the_seed():
    keys = torch.arange(64)
    first = draw_targets("lognormal", 12.0, 0.8, keys, SEED, CAP)
    assert torch.equal(first, draw_targets("lognormal", 12.0, 0.8, keys.clone(), SEED, CAP))
    assert not torch.equal(first, draw_targets("lognormal", 12.0, 0.8, keys, SEED + 1, CAP))
    assert first.dtype == torch.long and int(first.min()) >= 1 and int(first.max()) <= CAP


def test_a_rows_target_does_not_depend_on_how_rows_are_split():
    keys = torch.arange(100, 164)
    whole = draw_targets("lognormal", 12.0, 0.8, keys, SEED, CAP)
    parts = [draw_targets("lognormal", 12.0, 0.8, part, SEED, CAP) for part in keys.split([5, 27, 32])]
    assert torch.equal(torch.cat(parts), whole)
    order = torch.randperm(64, generator=torch.Generator().manual_seed(0))
    assert torch.equal(draw_targets("lognormal", 12.0, 0.8, keys[order], SEED, CAP), whole[order])


def test_keyed_normals_are_standard_normal():
    z = keyed_normals(torch.arange(200_000), seed=11)
    assert abs(float(z.mean())) < 4 / math.sqrt(len(z))
    assert abs(float(z.std()) - 1.0) < 0.01


def test_constant_gives_every_row_the_rounded_mean():
    keys = torch.arange(40)
    assert draw_targets("constant", 7.5, 0.6, keys, SEED, CAP).tolist() == [8] * 40  # half up
    assert draw_targets("constant", 7.4, 0.6, keys, SEED, CAP).tolist() == [7] * 40
    assert draw_targets("constant", 0.2, 0.6, keys, SEED, CAP).tolist() == [1] * 40  # at least one token


def test_none_draws_nothing_and_unknown_names_are_refused():
    assert DISTRIBUTIONS.names() == ("none", "constant", "lognormal")
    assert draw_targets("none", 0.0, 0.6, torch.arange(4), SEED, CAP) is None
    with pytest.raises(ValueError, match="unknown target-length distribution 'uniform'; valid names: none, constant"):
        draw_targets("uniform", 5.0, 0.6, torch.arange(4), SEED, CAP)


def test_truncated_lognormal_mean_matches_a_large_independent_sample():
    # the closed form, against exp(mu + sigma z) from torch's own seeded normal stream
    mu, sigma, cap = 6.5, 0.9, 2500.0
    z = torch.randn(2_000_000, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    x = torch.exp(mu + sigma * z)
    assert truncated_lognormal_mean(mu, sigma, cap) == pytest.approx(float(x.clamp(max=cap).mean()), rel=2e-3)
    assert lognormal_mu(truncated_lognormal_mean(mu, sigma, cap), sigma, cap) == pytest.approx(mu, abs=1e-9)


@pytest.mark.parametrize(("mean", "sigma", "cap"), [(14254.8, 0.6, 27648), (300.0, 1.0, 512), (50.0, 0.3, 4096)])
def test_lognormal_draws_have_the_asked_mean_after_the_cap(mean, sigma, cap):
    # A source publishes the mean of lengths that were all at most the cap: the draw matches that mean.
    rows = 100_000
    lengths = draw_targets("lognormal", mean, sigma, torch.arange(rows) * 7 + 3, 1234, cap).double()
    standard_error = float(lengths.std()) / math.sqrt(rows)
    assert abs(float(lengths.mean()) - mean) < 4 * standard_error + 0.5  # 0.5: rounding to tokens
    assert int(lengths.max()) <= cap
    untruncated = math.exp(lognormal_mu(mean, sigma, cap) + sigma * sigma / 2)
    if untruncated > 1.01 * mean:  # the cap holds the truncated mass
        assert float((lengths == cap).double().mean()) > 0.01


# ----------------------------------------------------------------------------- the engines
@pytest.mark.parametrize("name", ENGINE_NAMES)
def test_every_engine_stops_each_row_exactly_at_its_target(name, model, tok, prompts):
    uids = list(range(len(prompts)))
    batch = engine(name, model, tok).generate(prompts, uids, [], N, CAP, SamplingParams(), SEED)
    targets = expected_targets(uids)
    assert len(set(targets)) > 3, "the draw should give ragged lengths"
    lengths = batch.response_mask.sum(dim=1).tolist()
    assert lengths == targets
    assert batch.response_ids.shape[1] == max(targets)
    for ids, mask, target in zip(batch.response_ids.tolist(), batch.response_mask.tolist(), targets, strict=True):
        assert mask == [1] * target + [0] * (len(mask) - target)
        assert ids[target:] == [PAD] * (len(ids) - target)


@pytest.mark.parametrize("name", ENGINE_NAMES)
def test_an_eos_before_the_target_does_not_end_the_row(name, model, tok, prompts):
    uids = list(range(len(prompts)))
    free = make_engine(name, model, tok, RolloutConfig(name=name)).generate(
        prompts, uids, [], N, CAP, SamplingParams(), SEED
    )
    free_lengths = free.response_mask.sum(dim=1).tolist()
    target = 20
    early = [i for i, length in enumerate(free_lengths) if length < target]
    assert early, "the lively model should end some rows at an EOS before the target"
    spec = TargetLengthsConfig(distribution="constant", mean=float(target))
    batch = engine(name, model, tok, spec).generate(prompts, uids, [], N, CAP, SamplingParams(), SEED)
    assert batch.response_mask.sum(dim=1).tolist() == [target] * len(free_lengths)
    for i in early:  # the same tokens up to the EOS, and the row went on past it
        length = free_lengths[i]
        assert batch.response_ids[i, :length].tolist() == free.response_ids[i, :length].tolist()
        assert batch.response_ids[i, length - 1] == EOS


@pytest.mark.parametrize("name", ["static", "fast"])
def test_keyed_engines_give_the_same_rows_however_the_batch_is_split(name, model, tok, prompts):
    uids = list(range(len(prompts)))
    whole = engine(name, model, tok).generate(prompts, uids, [], N, CAP, SamplingParams(), SEED)
    micro = engine(name, model, tok, micro_batch_size=3).generate(prompts, uids, [], N, CAP, SamplingParams(), SEED)
    assert torch.equal(micro.response_mask, whole.response_mask)
    assert torch.equal(micro.response_ids, whole.response_ids)
    # two "workers", each with its own prompts and their global uids
    halves = [
        engine(name, model, tok).generate(prompts[part], uids[part], [], N, CAP, SamplingParams(), SEED)
        for part in (slice(0, 3), slice(3, None))
    ]
    lengths = torch.cat([h.response_mask.sum(dim=1) for h in halves])
    assert lengths.tolist() == whole.response_mask.sum(dim=1).tolist() == expected_targets(uids)


def test_hf_lengths_do_not_depend_on_the_micro_batches(model, tok, prompts):
    uids = list(range(len(prompts)))
    for micro in (0, 3, 5):
        batch = engine("hf", model, tok, micro_batch_size=micro).generate(prompts, uids, [], N, CAP, SamplingParams(), SEED)
        assert batch.response_mask.sum(dim=1).tolist() == expected_targets(uids)


@pytest.mark.parametrize("name", ENGINE_NAMES)
def test_constant_targets_give_equal_lengths_below_the_cap(name, model, tok, prompts):
    spec = TargetLengthsConfig(distribution="constant", mean=9.0)
    batch = engine(name, model, tok, spec).generate(prompts, list(range(8)), [], N, CAP, SamplingParams(), SEED)
    assert batch.response_mask.sum(dim=1).tolist() == [9] * (N * len(prompts))
    assert batch.response_ids.shape[1] == 9


@pytest.mark.parametrize("name", ["hf", "static"])
def test_decoding_stops_at_the_longest_target(name, model, tok, prompts):
    """The model runs one forward per generated token up to the longest target, not to the cap."""
    spec = TargetLengthsConfig(distribution="constant", mean=5.0)
    calls = []
    handle = model.register_forward_hook(lambda *_: calls.append(1))
    try:
        engine(name, model, tok, spec).generate(prompts[:2], [0, 1], [], N, CAP, SamplingParams(), SEED)
    finally:
        handle.remove()
    assert len(calls) == 5  # the prefill gives token 0, then four decode steps


def test_fast_engine_decodes_to_the_longest_target_and_keeps_its_buffers(model, tok, prompts):
    spec = TargetLengthsConfig(distribution="constant", mean=5.0)
    fast = engine("fast", model, tok, spec)
    steps = []
    decode_step = fast._decode_step
    fast._decode_step = lambda *args: (steps.append(1), decode_step(*args))[1]
    fast.generate(prompts[:2], [0, 1], [], N, CAP, SamplingParams(), SEED)
    assert len(steps) == 4
    buffers = fast._buffers
    assert buffers is not None and buffers.max_new == CAP  # the buffers (and graphs) keep the cap's shape
    assert buffers.finished.all() and buffers.targets.tolist() == [5] * (2 * N)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graphs need a GPU")
def test_graph_replay_stops_rows_at_their_targets_and_reuses_the_graphs(tok, prompts, liven):
    model = liven(build_model("tiny", seed=0)).to("cuda", torch.bfloat16)
    spec = TargetLengthsConfig(distribution="lognormal", mean=80.0, sigma=0.8)
    uids = list(range(len(prompts)))
    cap = 200

    def run(seed: int, eager: bool):
        config = RolloutConfig(name="fast", target_lengths=spec, enforce_eager=eager)
        fast = make_engine("fast", model, tok, config)
        return fast, fast.generate(prompts, uids, [], N, cap, SamplingParams(), seed)

    fast, graphs = run(SEED, eager=False)
    captured = dict(fast._graphs)
    assert captured, "the fast engine should have captured its decode step"
    expected = draw_targets("lognormal", 80.0, 0.8, row_keys(uids), SEED, cap).tolist()
    assert graphs.response_mask.sum(dim=1).tolist() == expected
    _, eager = run(SEED, eager=True)
    assert torch.equal(graphs.response_ids, eager.response_ids)
    again = fast.generate(prompts, uids, [], N, cap, SamplingParams(), SEED + 1)  # other targets
    # the graphs are kept; other targets may compact at other steps and so meet new (slots, bucket) keys
    assert all(fast._graphs[key] is graph for key, graph in captured.items())
    other = draw_targets("lognormal", 80.0, 0.8, row_keys(uids), SEED + 1, cap).tolist()
    assert again.response_mask.sum(dim=1).tolist() == other
    seen = dict(fast._graphs)
    repeat = fast.generate(prompts, uids, [], N, cap, SamplingParams(), SEED + 1)  # the same path again
    assert fast._graphs == seen, "a repeated call should replay its graphs, not capture new ones"
    assert torch.equal(repeat.response_ids, again.response_ids)


def test_a_decode_trace_records_each_stretch_of_rows_alive(tok, prompts, model, tmp_path, monkeypatch):
    # RLBENCH_DECODE_TRACE: one JSON line per generate call, for benchmarks/ragged_decode.py
    monkeypatch.setenv(TRACE_ENV, str(tmp_path))
    fast = make_engine("fast", model, tok, RolloutConfig(name="fast", target_lengths=LOGNORMAL), check_every=4)
    uids = list(range(len(prompts)))
    out = fast.generate(prompts, uids, [], N, CAP, SamplingParams(), SEED)
    (path,) = tmp_path.glob("decode-*.jsonl")
    (line,) = path.read_text().splitlines()
    trace = json.loads(line)
    targets = expected_targets(uids)
    assert trace["targets"] == targets == out.response_mask.sum(dim=1).tolist()
    assert trace["rows"] == len(targets)
    stretches = trace["stretches"]
    # contiguous from decode step 1 to the last token, checked every 4 steps
    assert stretches[0]["first"] == 1 and stretches[-1]["last"] == max(targets) - 1
    assert all(b["first"] == a["last"] + 1 for a, b in zip(stretches, stretches[1:], strict=False))
    assert all(s["first"] == 1 or s["first"] % 4 == 0 for s in stretches)
    # rows alive at a stretch's start: those whose target is past it (a row ends at its target)
    assert [s["running"] for s in stretches[1:]] == [sum(t > s["first"] for t in targets) for s in stretches[1:]]
    assert all(s["slots"] >= s["running"] and s["seconds"] >= 0 for s in stretches)
    shape = fast.shape  # the bytes a step reads: what the architecture fixes (fp32 on CPU: 4 bytes)
    assert trace["kv_bytes_per_token"] == 2 * shape.num_layers * shape.num_kv_heads * shape.head_dim * 4
    per_layer = shape.hidden * (shape.q_size + 2 * shape.kv_size) + shape.hidden * shape.q_size
    per_layer += 3 * shape.hidden * shape.intermediate + 2 * shape.hidden
    qkv_bias = shape.num_layers * (shape.q_size + 2 * shape.kv_size) if shape.qkv_bias else 0
    expected = 4 * (shape.num_layers * per_layer + shape.vocab * shape.hidden + shape.hidden + qkv_bias)
    assert trace["weight_bytes"] == expected
