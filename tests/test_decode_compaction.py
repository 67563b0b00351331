"""The fast engine's row compaction (trainer/rollout/decode_buffers.py): once at most half the decoded
slots still run, the running rows and their caches move to the front and only those slots decode.

On CPU the step runs eagerly, so compacted and uncompacted decoding must give the same tokens and
log-probs, row for row, whatever slot a row moved to.
"""

from __future__ import annotations

import pytest
import torch

from trainer.config import RolloutConfig
from trainer.config.schema import TargetLengthsConfig
from trainer.models.presets import build_model
from trainer.rollout import FastRolloutEngine, SamplingParams
from trainer.rollout.decode_buffers import DecodeBuffers, compacted_size, shared_prompt_rows
from trainer.rollout.lean_decoder import LeanWeights, lean_shape
from trainer.rollout.target_lengths import draw_targets

N = 4  # responses per prompt
CAP = 40
SEED = 11
SPREAD = TargetLengthsConfig(distribution="lognormal", mean=12.0, sigma=1.0)

pytestmark = pytest.mark.usefixtures("one_thread")  # see tests/conftest.py


@pytest.fixture(scope="module")
def model(liven) -> torch.nn.Module:
    return liven(build_model("tiny", seed=0))


def test_compacted_size_halves_at_least_or_keeps_the_slots():
    assert compacted_size(running=32, size=32) == 32
    assert compacted_size(running=17, size=32) == 32  # 32 slots for 17 rows: not worth it
    assert compacted_size(running=16, size=32) == 16
    assert compacted_size(running=5, size=32) == 8
    assert compacted_size(running=1, size=32) == 1
    assert compacted_size(running=3, size=5) == 5  # 4 slots would not halve 5
    assert compacted_size(running=2, size=5) == 2
    assert compacted_size(running=0, size=8) == 8


def decode(
    model, tok, prompts, compact: bool, sampling: SamplingParams, targets=SPREAD, check_every: int = 2, cap: int = CAP
):
    config = RolloutConfig(name="fast", target_lengths=targets)
    engine = FastRolloutEngine(model, tok, config, check_every=check_every, compact_rows=compact)
    batch = engine.generate(prompts, list(range(len(prompts))), [], N, cap, sampling, SEED)
    return engine, batch


@pytest.mark.parametrize("sampling", [SamplingParams(), SamplingParams(do_sample=False)], ids=["sampled", "greedy"])
def test_compaction_gives_the_uncompacted_tokens_and_log_probs(model, tok, prompts, sampling):
    plain_engine, plain = decode(model, tok, prompts, compact=False, sampling=sampling)
    engine, compacted = decode(model, tok, prompts, compact=True, sampling=sampling)
    assert plain_engine._buffers.live == N * len(prompts)
    assert engine._buffers.live < N * len(prompts) // 2, "the ragged targets should have compacted the slots"
    assert torch.equal(compacted.response_ids, plain.response_ids)
    assert torch.equal(compacted.response_mask, plain.response_mask)
    torch.testing.assert_close(compacted.rollout_log_probs, plain.rollout_log_probs, rtol=0, atol=1e-5)
    expected = draw_targets("lognormal", 12.0, 1.0, torch.arange(N * len(prompts)), SEED, CAP)
    assert compacted.response_mask.sum(dim=1).tolist() == expected.tolist()


def test_compaction_stops_rows_that_end_with_eos(model, tok, prompts):
    """Without targets rows end at EOS only (at 120 tokens, 18 of the 32 rows here): the slots still
    shrink, and the tokens do not change."""
    plain_run = decode(model, tok, prompts, False, SamplingParams(), targets=TargetLengthsConfig(), cap=120)
    engine, compacted = decode(model, tok, prompts, True, SamplingParams(), targets=TargetLengthsConfig(), cap=120)
    plain = plain_run[1]
    lengths = plain.response_mask.sum(dim=1)
    assert lengths.min() < lengths.max(), "the set-up should give responses of different lengths"
    assert torch.equal(compacted.response_ids, plain.response_ids)
    assert engine._buffers.live < engine._buffers.batch, "rows ending at EOS should have compacted the slots"


def test_rows_with_the_same_prompt_and_padding_share_the_first_ones_cache():
    ids = torch.tensor([[0, 5, 6], [0, 5, 6], [7, 8, 9], [0, 5, 6], [7, 8, 9], [5, 5, 6]])
    mask = (ids != 0).long()
    assert shared_prompt_rows(ids, mask).tolist() == [0, 0, 2, 0, 2, 5]
    mask[3, 0] = 1  # the same tokens with other padding: a prompt of its own
    assert shared_prompt_rows(ids, mask).tolist() == [0, 0, 2, 3, 2, 5]


def test_compact_moves_running_rows_and_their_cache_to_the_front(model):
    weights = LeanWeights(lean_shape(model.config), torch.float32, torch.device("cpu"))
    buf = DecodeBuffers(weights, batch=6, prompt_width=4, max_new=8, stop_ids=(1,), pad_id=0)
    buf.reset(torch.ones(6, 4), torch.arange(100, 106), seed=0, prompt_rows=torch.tensor([0, 0, 0, 3, 3, 3]))
    assert buf.prompt_rows.tolist() == [0, 0, 0, 3, 3, 3]
    for row in range(6):
        buf.cache_k[:, row] = row
        buf.cache_v[:, row] = -row
    buf.finished.copy_(torch.tensor([True, False, True, True, False, True]))
    view = buf.compact(2, written_slots=5)
    assert view.batch == 2 and buf.live == 2
    assert view.rows.tolist() == [1, 4] and view.row_keys.tolist() == [101, 104]
    assert view.finished.tolist() == [False, False]
    assert buf.finished.all() == torch.tensor(False) and buf.finished[2:].all()
    assert (view.cache_k[:, 0, :, :5] == 1).all() and (view.cache_v[:, 1, :, :5] == -4).all()
    # rows 1 and 4 now hold their own prompts (row 0, which held row 1's, was dropped)
    assert view.prompt_rows.tolist() == [0, 1]
    view.last.fill_(7)  # a view: writes reach the buffers
    assert buf.last[:2].tolist() == [7, 7]


@pytest.mark.skipif(not torch.cuda.is_available(), reason="the attention kernel that skips ended rows runs on a GPU")
def test_skipping_ended_rows_in_attention_changes_no_token(tok, prompts, liven):
    """Between compactions the GPU attention kernel reads no K/V for rows that ended (skip_rows): the
    running rows' attention is bit for bit the same, so every token and log-prob is too."""
    model = liven(build_model("tiny", seed=0)).to("cuda", torch.bfloat16)
    runs = []
    for skip in (False, True):
        config = RolloutConfig(name="fast", target_lengths=SPREAD)
        engine = FastRolloutEngine(model, tok, config, check_every=8, skip_ended_rows=skip)
        assert engine._attend_with_rope is not None, "the tiny model should take the split attention kernel"
        runs.append(engine.generate(prompts, list(range(len(prompts))), [], N, CAP, SamplingParams(), SEED))
    read, skipped = runs
    lengths = read.response_mask.sum(dim=1)
    assert lengths.min() + 8 < lengths.max(), "rows should end between checks, and stay decoded until one"
    assert torch.equal(skipped.response_ids, read.response_ids)
    assert torch.equal(skipped.response_mask, read.response_mask)
    mask = read.response_mask.bool()
    assert torch.equal(skipped.rollout_log_probs[mask], read.rollout_log_probs[mask])


@pytest.mark.skipif(not torch.cuda.is_available(), reason="the split attention kernel and CUDA graphs run on a GPU")
def test_attention_chunks_are_chosen_for_the_rows_still_running(tok, prompts, liven):
    """Ended rows read nothing, so the attention's chunks per row are counted for the rows running at
    the last check, not for the slots decoded: some captured step must split more than the slots'
    own count would, and the first steps (every row running) must not."""
    from trainer.kernels.triton_decode_attention import split_count

    model = liven(build_model("tiny", seed=0)).to("cuda", torch.bfloat16)
    config = RolloutConfig(name="fast", target_lengths=TargetLengthsConfig(distribution="lognormal", mean=300.0, sigma=1.0))
    engine = FastRolloutEngine(model, tok, config, check_every=8)
    # 192 programs: 64 slots take one chunk a row, 33-48 rows running take two. (The GPU's own target,
    # three programs an SM, already splits 64 rows in three, and these short caches cap every row at
    # one chunk per 256 slots, so at the default the two counts would mostly meet.)
    engine._attention_programs = 192
    n = 8  # 64 rows
    engine.generate(prompts, list(range(len(prompts))), [], n, 1500, SamplingParams(), SEED)
    programs, kv_heads = engine._attention_programs, engine.shape.num_kv_heads
    by_slots = {key: split_count(key[0], kv_heads, key[1], programs) for key in engine._graphs}
    assert any(splits > by_slots[key] for key, splits in ((k, k[2]) for k in engine._graphs)), sorted(engine._graphs)
    full = [key for key in engine._graphs if key[0] == n * len(prompts)]
    assert full and full[0][2] == by_slots[full[0]], sorted(engine._graphs)
