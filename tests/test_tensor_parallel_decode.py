"""Tensor-parallel decoding (rollout.tensor_model_parallel_size): two real processes of a gloo group,
each holding half of every layer's heads and MLP width, decode both workers' prompts together and
each keeps its own rows; the rows must be the ones one process decodes alone with the whole model.

The split changes only the order in which o's and down's sums are added (each GPU's partial sum, then
the all-reduce), so in float32 the logits agree to rounding and the tokens are the same.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch
from test_fsdp_gloo import _rendezvous_port, run_two_ranks

from trainer.batch import Batch, left_pad
from trainer.config import Config, ConfigError, RolloutConfig, build_config
from trainer.config.schema import TargetLengthsConfig
from trainer.models.presets import build_model, load_tokenizer
from trainer.rollout import SamplingParams, make_engine
from trainer.rollout.fast_engine import warm_up_targets
from trainer.rollout.lean_decoder import lean_shape
from trainer.rollout.tensor_parallel import (
    REDUCE_ENV,
    decode_group_size,
    decode_groups,
    join_decode_group,
    local_part,
    own_rows,
    reduce_from_env,
    row_starts,
)
from trainer.workers.distributed import DataParallel

pytestmark = pytest.mark.usefixtures("one_thread")  # see tests/conftest.py

N = 2  # responses per prompt
MAX_NEW = 24
SEED = 5
# conftest's rollout texts (the spawned ranks import this module, not conftest): with the livened tiny
# model their responses end at different steps
TEXTS = ["What is 2+3?", "Hi", "Compute 17*4 please", "x", "Solve: 9-4", "abc", "The answer is", "1+1="]
# the sampled case also reports entropies (SamplingParams.report_entropy): they travel with their rows
SAMPLINGS = {"greedy": SamplingParams(do_sample=False), "sampled": SamplingParams(temperature=0.9, report_entropy=True)}
# the engine's settings each way: plain; drawn target lengths (the replays' ragged rows, which end
# rows mid-way and compact); micro-batches of 3 rows over the group's 16
ROLLOUTS = {
    "plain": RolloutConfig(name="fast"),
    "targets": RolloutConfig(name="fast", target_lengths=TargetLengthsConfig(distribution="lognormal", mean=12, sigma=0.6)),
    "micro": RolloutConfig(name="fast", micro_batch_size=3),
}
CASES = [(rollout, sampling) for rollout in ROLLOUTS for sampling in SAMPLINGS]


# ----------------------------------------------------------------------------- the split itself
def test_each_rank_holds_its_slice_of_the_split_matrices_and_all_of_the_rest():
    q = torch.arange(8 * 3).reshape(8, 3)
    assert torch.equal(local_part("model.layers.0.self_attn.q_proj.weight", q, 1, 2), q[4:])
    o = torch.arange(3 * 8).reshape(3, 8)
    assert torch.equal(local_part("model.layers.3.self_attn.o_proj.weight", o, 0, 2), o[:, :4])
    assert torch.equal(local_part("model.layers.3.mlp.down_proj.weight", o, 1, 2), o[:, 4:])
    assert torch.equal(local_part("model.layers.3.self_attn.k_proj.bias", torch.arange(6), 1, 2), torch.arange(3, 6))
    norm = torch.arange(5)
    assert local_part("model.layers.0.input_layernorm.weight", norm, 1, 2) is norm
    assert local_part("lm_head.weight", o, 1, 2) is o


def test_decode_groups_are_consecutive_workers_and_must_divide_them():
    assert decode_groups(4, 2) == [[0, 1], [2, 3]]
    assert decode_groups(4, 4) == [[0, 1, 2, 3]]
    with pytest.raises(ValueError, match="tensor_model_parallel_size=3 must be >= 1 and divide the 4 worker"):
        decode_groups(4, 3)


def test_a_shape_that_does_not_split_names_the_key_and_the_counts(tok):
    shape = lean_shape(build_model("tiny", seed=0).config)  # 4 heads, 2 KV heads, MLP 192
    half = shape.sharded(2)
    assert (half.num_heads, half.num_kv_heads, half.intermediate, half.hidden) == (2, 1, 96, shape.hidden)
    with pytest.raises(ValueError, match=r"tensor_model_parallel_size=4: the model's 2 key/value heads do not split"):
        shape.sharded(4)


def test_own_rows_trims_to_the_members_own_widths():
    ids, mask = left_pad([[7, 8, 9], [5], [6, 6]], 0)  # widths 3, 1, 2
    batch = Batch(
        prompt_ids=ids, prompt_mask=mask,
        response_ids=torch.tensor([[1, 2, 3], [4, 0, 0], [5, 6, 0]]),
        response_mask=torch.tensor([[1, 1, 1], [1, 0, 0], [1, 1, 0]]),
        uids=torch.tensor([0, 1, 2]), ground_truths=["a", "b", "c"],
        rollout_log_probs=torch.tensor([[-1.0, -2.0, -3.0], [-4.0, 0, 0], [-5.0, -6.0, 0]]),
        rollout_entropies=torch.tensor([[1.0, 2.0, 3.0], [4.0, 0, 0], [5.0, 6.0, 0]]),
    )
    mine = own_rows(batch, 1, 2)
    assert mine.prompt_ids.tolist() == [[0, 5], [6, 6]]
    assert mine.response_ids.tolist() == [[4, 0], [5, 6]]
    assert mine.rollout_log_probs.tolist() == [[-4.0, 0.0], [-5.0, -6.0]]
    assert mine.rollout_entropies.tolist() == [[4.0, 0.0], [5.0, 6.0]]
    assert mine.ground_truths == ["b", "c"] and mine.uids.tolist() == [1, 2]
    assert row_starts([3, 1, 2], 2) == [0, 6, 8]


def test_config_takes_the_size_with_the_fast_engine_only():
    def cfg(*overrides: str) -> Config:
        return build_config(["trainer.n_gpus_per_node=2", *overrides])

    assert decode_group_size(cfg("actor_rollout_ref.rollout.name=fast", "actor_rollout_ref.rollout.tensor_model_parallel_size=2")) == 2
    assert decode_group_size(cfg("actor_rollout_ref.rollout.name=hf", "actor_rollout_ref.rollout.tensor_model_parallel_size=2")) == 1
    from trainer.config.validation import settings_without_effect, validate

    with pytest.raises(ConfigError, match="tensor_model_parallel_size=4 must be >= 1 and divide the 2 worker"):
        validate(cfg("actor_rollout_ref.rollout.name=fast", "actor_rollout_ref.rollout.tensor_model_parallel_size=4"))
    hf = cfg("actor_rollout_ref.rollout.name=hf", "actor_rollout_ref.rollout.tensor_model_parallel_size=2")
    assert any("tensor_model_parallel_size=2 has no effect here" in line for line in settings_without_effect(hf))
    fast = cfg("actor_rollout_ref.rollout.name=fast", "actor_rollout_ref.rollout.tensor_model_parallel_size=2")
    assert not any("tensor_model_parallel_size" in line for line in settings_without_effect(fast))


# ----------------------------------------------------------------------------- two real processes
def _prompts() -> list[list[list[int]]]:
    """Each rank's prompts: different counts and lengths, so the group's batch pads both."""
    tok = load_tokenizer("tiny")
    return [[tok.encode(t) for t in TEXTS[:5]], [tok.encode(t) for t in TEXTS[5:]]]


def _livened_model(path: Path) -> torch.nn.Module:
    """The tiny model, scaled so that its greedy text varies and sometimes ends (conftest's liven)."""
    model = build_model("tiny", seed=0)
    model.load_state_dict(torch.load(path, weights_only=True))
    return model


def _decode(engine, prompts: list[list[int]], first_uid: int, sampling: SamplingParams) -> Batch:
    uids = list(range(first_uid, first_uid + len(prompts)))
    return engine.generate(prompts, uids, [f"gt{u}" for u in uids], N, MAX_NEW, sampling, SEED)


def _rank_main(rank: int, out_dir: str) -> None:
    torch.set_num_threads(1)
    dp = DataParallel(rank, 2, torch.device("cpu"))
    port, rendezvous = _rendezvous_port(rank, out_dir)
    dp.init("127.0.0.1", port, "gloo", rendezvous=rendezvous)
    group = join_decode_group(rank, 2, 2)
    model = _livened_model(Path(out_dir) / "model.pt")
    mine = _prompts()[rank]
    first_uid = 0 if rank == 0 else len(_prompts()[0])
    results = {}
    for rollout, config in ROLLOUTS.items():
        engine = make_engine("fast", model, load_tokenizer("tiny"), config, tensor_parallel=group)
        # as a GPU worker's set-up does: the group's warm-up call together (its collectives in step), which
        # must leave nothing that changes the rows compared with one process's below
        assert engine.warm_up(4, N, 8, MAX_NEW, SamplingParams()) > 0
        assert engine.stats["warm_up_tokens"] == min(max(warm_up_targets(2 * 4 * N, engine.check_every)), MAX_NEW)
        for name, sampling in SAMPLINGS.items():
            results[(rollout, name)] = _decode(engine, mine, first_uid, sampling)
    held = engine.weights.qkv.shape, engine.weights.down.shape, engine.weights.lm_head.shape
    torch.save({"batches": results, "held": held}, os.path.join(out_dir, f"rank{rank}.pt"))
    dp.shutdown()


@pytest.fixture(scope="module")
def two_rank_results(tmp_path_factory, liven) -> tuple[list[dict], dict[str, list[Batch]]]:
    out = tmp_path_factory.mktemp("tp_decode")
    model = liven(build_model("tiny", seed=0))
    torch.save(model.state_dict(), out / "model.pt")
    run_two_ranks(_rank_main, out)
    ranks = [torch.load(out / f"rank{r}.pt", weights_only=False) for r in range(2)]
    # one process, the whole model, each rank's prompts decoded as that rank would alone
    whole = _livened_model(out / "model.pt")
    parts = _prompts()
    starts = [0, len(parts[0])]
    reference = {}
    for rollout, config in ROLLOUTS.items():
        alone = make_engine("fast", whole, load_tokenizer("tiny"), config)
        for name, sampling in SAMPLINGS.items():
            reference[(rollout, name)] = [_decode(alone, parts[r], starts[r], sampling) for r in range(2)]
    return ranks, reference


@pytest.mark.parametrize("case", CASES, ids=[f"{r}-{s}" for r, s in CASES])
def test_each_rank_gets_its_own_rows_as_one_process_decodes_them(case, two_rank_results):
    ranks, reference = two_rank_results
    for rank in range(2):
        got, want = ranks[rank]["batches"][case], reference[case][rank]
        assert got.uids.tolist() == want.uids.tolist()
        assert got.ground_truths == want.ground_truths
        assert torch.equal(got.prompt_ids, want.prompt_ids), (rank, got.prompt_ids, want.prompt_ids)
        assert torch.equal(got.response_ids, want.response_ids), (rank, got.response_ids, want.response_ids)
        assert torch.equal(got.response_mask, want.response_mask)
        # the partial sums are added in another order: float32 rounding, no more
        torch.testing.assert_close(got.rollout_log_probs, want.rollout_log_probs, rtol=0, atol=1e-4)
        if case[1] == "sampled":
            torch.testing.assert_close(got.rollout_entropies, want.rollout_entropies, rtol=0, atol=1e-4)
        else:
            assert got.rollout_entropies is None and want.rollout_entropies is None
    lengths = torch.cat([reference[case][r].response_mask.sum(dim=1) for r in range(2)])
    assert lengths.min() < lengths.max(), "the set-up should give responses of different lengths"


def test_each_rank_holds_half_of_the_layers_and_the_whole_head(two_rank_results):
    ranks, _ = two_rank_results
    whole = lean_shape(build_model("tiny", seed=0).config)
    qkv, down, head = ranks[0]["held"]
    # qkv rows: half the query heads and half the KV heads (x2 for K and V); down: half the MLP width
    assert qkv[-2:] == (whole.q_size // 2 + whole.kv_size, whole.hidden)
    assert down[-2:] == (whole.hidden, whole.intermediate // 2)
    assert head == (whole.vocab, whole.hidden)


# ----------------------------------------------------------------------------- the one-shot sums
def test_the_reduce_setting_defaults_to_nccl_and_names_what_is_valid(monkeypatch):
    assert reduce_from_env({}) == "nccl"
    assert reduce_from_env({REDUCE_ENV: "one_shot"}) == "one_shot"
    with pytest.raises(ValueError, match=f"{REDUCE_ENV} must be one of nccl, one_shot, got 'oneshot'"):
        reduce_from_env({REDUCE_ENV: "oneshot"})
    # a bad value fails the config's validation, before any worker or engine starts
    overrides = ["trainer.n_gpus_per_node=2", "actor_rollout_ref.rollout.name=fast",
                 "actor_rollout_ref.rollout.tensor_model_parallel_size=2"]
    build_config(overrides)
    monkeypatch.setenv(REDUCE_ENV, "oneshot")
    with pytest.raises(ConfigError, match=f"{REDUCE_ENV} must be one of"):
        build_config(overrides)


def _one_shot_rank(rank: int, out_dir: str) -> None:
    """One of two GPUs: NCCL's and the one-shot kernel's sums of the same values, eager and in a graph,
    and the fast engine's tokens with either, greedy and sampled."""
    device = torch.device("cuda", rank)
    dp = DataParallel(rank, 2, device)
    port, rendezvous = _rendezvous_port(rank, out_dir)
    dp.init("127.0.0.1", port, "nccl", rendezvous=rendezvous)
    group = join_decode_group(rank, 2, 2)
    one_shot = group.with_one_shot(device, torch.bfloat16)
    x = torch.randn(64, 1536, device=device, dtype=torch.bfloat16, generator=torch.Generator(device).manual_seed(rank))
    by_nccl = group.all_reduce(x.clone())
    eager = one_shot.all_reduce(x)
    static = torch.zeros_like(x)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = one_shot.all_reduce(static)
    static.copy_(x)
    graph.replay()
    big = torch.ones(4 << 20, device=device, dtype=torch.bfloat16)  # past the buffer: NCCL, in place
    model = _livened_model(Path(out_dir) / "model.pt").to(device, torch.bfloat16)
    tokens = {}
    for name, tp in (("nccl", group), ("one_shot", one_shot)):
        engine = make_engine("fast", model, load_tokenizer("tiny"), ROLLOUTS["targets"], tensor_parallel=tp)
        for kind, sampling in SAMPLINGS.items():
            batch = _decode(engine, _prompts()[rank], 0 if rank == 0 else 5, sampling)
            tokens[(name, kind)] = (batch.response_ids.cpu(), batch.rollout_log_probs.cpu())
        engine.release()
    torch.cuda.synchronize()
    torch.save({"nccl": by_nccl.cpu(), "eager": eager.cpu(), "graph": captured.cpu(),
                "big": one_shot.all_reduce(big) is big and bool((big == 2).all()), "tokens": tokens},
               os.path.join(out_dir, f"rank{rank}.pt"))
    dp.shutdown()


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="the one-shot sums need two GPUs of one host")
def test_one_shot_sums_give_nccls_bits_and_the_same_tokens(tmp_path, liven):
    torch.save(liven(build_model("tiny", seed=0)).state_dict(), tmp_path / "model.pt")
    run_two_ranks(_one_shot_rank, tmp_path)
    for rank in range(2):
        got = torch.load(tmp_path / f"rank{rank}.pt", weights_only=False)
        assert torch.equal(got["eager"], got["nccl"]), (got["eager"] - got["nccl"]).abs().max()
        assert torch.equal(got["graph"], got["nccl"]), (got["graph"] - got["nccl"]).abs().max()
        assert got["big"], "a sum past the one-shot buffer should go through NCCL, in place"
        for kind in SAMPLINGS:
            (ids, log_probs), (want_ids, want_log_probs) = got["tokens"][("one_shot", kind)], got["tokens"][("nccl", kind)]
            assert torch.equal(ids, want_ids), (rank, kind)
            assert torch.equal(log_probs, want_log_probs), (rank, kind, (log_probs - want_log_probs).abs().max())
