"""FSDP2 on CPU with two real processes of a gloo group (no Ray; tests/test_fsdp.py has whole steps).

Log-probs and one PPO update over shards of unequal size, where one worker runs out of micro-batches
first and must run dummy passes to keep FSDP's collectives in step, equal the single-process result
on the whole batch. This module stays light to import: the spawned workers import it.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest
import torch
import torch.multiprocessing as mp
from op_counts import OpCounter

from trainer.batch import Batch, left_justify, left_pad
from trainer.config import ActorConfig
from trainer.models.checkpointing import ATTENTION_OPS, MATMUL_OPS, enable_gradient_checkpointing
from trainer.models.presets import build_model
from trainer.workers.actor import UpdateSettings, compute_log_probs, micro_batch_groups, update_policy
from trainer.workers.distributed import DataParallel, Rendezvous
from trainer.workers.fsdp import PolicyModel, full_model_state, resolve_strategy, shard_model

ROWS_PER_RANK = ([0, 1, 2, 3, 4], [5, 6, 7])  # unequal on purpose
# (micro-batch size, dynamic bsz, token budget, gradient checkpointing policy on the sharded model or
# None, loss_agg_mode): 3 vs 2 fixed groups; by token budget 4 vs 3 + 1 empty; fixed again with
# checkpointed layers, fully and selectively recomputed; fixed with Dr.GRPO's aggregation (its loss
# weights count sequences, not tokens); packed rows (use_remove_padding) by token budget with full
# checkpointing, against the padded single-process step; the MLP blocks alone checkpointed; and only
# the first layer checkpointed ("POLICY/LAYERS": gradient_checkpointing_layers).
SETTINGS = [
    (2, False, 0, None, "token-mean"),
    (2, True, 13, None, "token-mean"),
    (2, False, 0, "full", "token-mean"),
    (2, False, 0, None, "seq-mean-token-sum-norm"),
    (2, False, 0, "save_attention", "token-mean"),
    (2, False, 0, "save_matmuls", "token-mean"),
    (2, True, 13, "full", "token-mean", "packed"),
    (2, False, 0, "mlp", "token-mean"),
    (2, False, 0, "full/1", "token-mean"),
]


def checkpointing(spec: str) -> tuple[str, int | None]:
    """'POLICY' or 'POLICY/LAYERS' -> (policy, layers or None)."""
    policy, _, layers = spec.partition("/")
    return policy, int(layers) if layers else None


def toy_batch() -> Batch:
    g = torch.Generator().manual_seed(0)
    prompts = [torch.randint(5, 100, (int(n),), generator=g).tolist() for n in (4, 7, 3, 6, 5, 2, 7, 4)]
    prompt_ids, prompt_mask = left_pad(prompts, 0)
    response_ids = torch.randint(5, 100, (8, 6), generator=g)
    lengths = torch.tensor([6, 3, 5, 6, 1, 4, 6, 2])
    response_mask = (torch.arange(6)[None, :] < lengths[:, None]).long()
    return Batch(
        prompt_ids=prompt_ids,
        prompt_mask=prompt_mask,
        response_ids=response_ids * response_mask,
        response_mask=response_mask,
        uids=torch.arange(8) // 2,
        advantages=torch.randn(8, 6, generator=g) * response_mask,
    )


def actor_config(
    micro: int, dynamic: bool, budget: int, checkpointing: str | None = None, loss_agg_mode: str = "token-mean"
) -> ActorConfig:
    return ActorConfig(
        ppo_micro_batch_size_per_gpu=micro, use_dynamic_bsz=dynamic, ppo_max_token_len_per_gpu=budget or 16384,
        grad_clip=0.05,  # small, so that clipping (a global norm over shards) is part of the check
        loss_agg_mode=loss_agg_mode,
    )


def run_shard(model: torch.nn.Module, batch: Batch, cfg: ActorConfig, dp: DataParallel) -> tuple[torch.Tensor, dict]:
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    logp = compute_log_probs(model, batch, 1.0, cfg.ppo_micro_batch_size_per_gpu, cfg.use_dynamic_bsz,
                             cfg.ppo_max_token_len_per_gpu, dp, torch.device("cpu"))
    batch.old_log_probs = logp - 0.05 * batch.response_mask  # a ratio away from 1, so clipping can act
    settings = UpdateSettings(temperature=1.0, max_response_length=6, n_mini_batches=1, device=torch.device("cpu"))
    metrics = update_policy(model, optimizer, batch, cfg, settings, dp)
    return logp, metrics


def count_calls(obj: object, method: str) -> list[int]:
    """Wrap ``obj.method`` so each call appends to the returned list."""
    calls: list[int] = []
    original = getattr(obj, method)

    def counted(*args, **kwargs):
        calls.append(1)
        return original(*args, **kwargs)

    setattr(obj, method, counted)
    return calls


def _rendezvous_port(rank: int, out_dir: str) -> tuple[int, Rendezvous | None]:
    """Rank 0 binds the store's socket on a free port and publishes the port in a file, which rank 1
    waits for: a port chosen by the parent and bound later by rank 0 could be taken in between."""
    path = os.path.join(out_dir, "port")
    if rank == 0:
        rendezvous = Rendezvous("127.0.0.1")
        with open(path + ".tmp", "w") as f:
            f.write(str(rendezvous.port))
        os.replace(path + ".tmp", path)  # rank 1 never reads a half-written file
        return rendezvous.port, rendezvous
    deadline = time.monotonic() + 300
    while not os.path.exists(path):
        if time.monotonic() > deadline:
            raise TimeoutError(f"rank 1: rank 0 did not publish its rendezvous port in {path}")
        time.sleep(0.05)
    with open(path) as f:
        return int(f.read()), None


def _rank_main(rank: int, out_dir: str) -> None:
    """One worker of a two-process gloo group: every setting in turn, results saved per setting."""
    torch.set_num_threads(1)
    dp = DataParallel(rank, 2, torch.device("cpu"))
    port, rendezvous = _rendezvous_port(rank, out_dir)
    dp.init("127.0.0.1", port, "gloo", rendezvous=rendezvous)
    try:
        for setting, values in enumerate(SETTINGS):
            cfg = actor_config(*values[:5])
            lm = build_model("tiny", seed=0)
            if values[3] is not None:
                enable_gradient_checkpointing(lm, *checkpointing(values[3]))
            packed = "packed" in values
            # every micro-batch packed, however little padding it has (the trainer packs only where it pays)
            policy = shard_model(PolicyModel(lm, packed=packed, pack_min_padding=0.0), torch.device("cpu"), 2)
            packed_calls = count_calls(policy, "_packed_hidden")
            shard = toy_batch().select(ROWS_PER_RANK[rank])
            groups = micro_batch_groups(shard, cfg.ppo_micro_batch_size_per_gpu, cfg.use_dynamic_bsz,
                                        cfg.ppo_max_token_len_per_gpu, dp, lockstep=True)
            with OpCounter() as ops:  # the attention kernels that ran: log-probs, update and its recompute
                logp, metrics = run_shard(policy, shard, cfg, dp)
            state = full_model_state(policy.lm)
            attention, matmuls = ops.total(ATTENTION_OPS), ops.total(MATMUL_OPS)
            torch.save({"logp": logp, "metrics": metrics, "state": state, "groups": groups, "attention": attention,
                        "matmuls": matmuls, "packed_calls": len(packed_calls)},
                       os.path.join(out_dir, f"setting{setting}_rank{rank}.pt"))
    finally:
        dp.shutdown()  # the group, then rank 0's rendezvous socket


@pytest.fixture(scope="module")
def two_process_results(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("fsdp_gloo")
    mp.start_processes(_rank_main, args=(str(out),), nprocs=2, start_method="spawn")
    return out


@pytest.mark.parametrize(
    "setting", range(len(SETTINGS)),
    ids=["fixed", "dynamic", "checkpointed", "sum-norm", "save-attention", "save-matmuls", "packed", "mlp",
         "first-layer"],
)
def test_fsdp_shards_of_unequal_size_take_the_single_process_step(two_process_results, setting):
    cfg = actor_config(*SETTINGS[setting][:5])
    single = PolicyModel(build_model("tiny", seed=0))
    logp_ref, metrics_ref = run_shard(single, toy_batch(), cfg, DataParallel())
    ranks = [torch.load(two_process_results / f"setting{setting}_rank{r}.pt") for r in range(2)]
    counts = [len(r["groups"]) for r in ranks]
    assert counts[0] == counts[1] and any(not g for r in ranks for g in r["groups"]), (
        f"the set-up should leave a worker with empty (dummy) micro-batches: {[r['groups'] for r in ranks]}"
    )
    mask = toy_batch().response_mask  # padding columns differ with the micro-batching: compare tokens
    torch.testing.assert_close(torch.cat([ranks[0]["logp"], ranks[1]["logp"]]) * mask, logp_ref * mask, rtol=1e-5, atol=1e-6)
    for key in ("actor/pg_loss", "actor/grad_norm"):
        assert ranks[0]["metrics"][key] == pytest.approx(metrics_ref[key], rel=1e-4), key
    assert metrics_ref["actor/grad_norm"] > cfg.grad_clip, "clipping should act"
    # Adam's first step moves every weight by about lr = 1e-2; summation order (shards, micro-batches)
    # moves the result by a few 1e-6 where gradients are near 0: 2e-5 is far below any real difference.
    expected = single.lm.state_dict()
    for name, value in ranks[0]["state"].items():
        torch.testing.assert_close(value, expected[name], rtol=1e-4, atol=2e-5, msg=name)
    torch.testing.assert_close(ranks[1]["state"]["model.norm.weight"], expected["model.norm.weight"])
    # under FSDP2 too, full checkpointing runs each checkpointed layer's attention again in the backward
    # and a selective policy does not (same micro-batches as the "fixed" setting, which has no checkpointing)
    if "packed" in SETTINGS[setting]:  # every forward (log-probs, update, dummies) ran packed
        assert all(r["packed_calls"] >= len(r["groups"]) for r in ranks), [r["packed_calls"] for r in ranks]
        return  # packed rows on CPU: one attention call per row, not per layer and micro-batch
    assert all(r["packed_calls"] == 0 for r in ranks)
    if SETTINGS[setting][3] is None:
        return
    policy, layers = checkpointing(SETTINGS[setting][3])
    layers = layers or single.lm.config.num_hidden_layers
    plain = [torch.load(two_process_results / f"setting0_rank{r}.pt") for r in range(2)]
    recomputed = [r["attention"] - p["attention"] for r, p in zip(ranks, plain, strict=True)]
    assert recomputed == ([layers * len(r["groups"]) for r in ranks] if policy == "full" else [0, 0]), policy
    if policy in ("full", "mlp"):  # their recompute runs matmuls again (the MLP's, at least) on every rank
        assert all(r["matmuls"] > p["matmuls"] for r, p in zip(ranks, plain, strict=True)), policy


def test_strategy_resolution():
    assert resolve_strategy("auto", "cuda") == "fsdp2"
    assert resolve_strategy("auto", "cpu") == "dp"
    assert resolve_strategy("fsdp2", "cpu") == "fsdp2"
    with pytest.raises(ValueError, match="expected one of auto, fsdp2, dp; found 'megatron'"):
        resolve_strategy("megatron", "cpu")


def test_policy_log_probs_equal_the_models_own_logits():
    model = build_model("tiny", seed=0)
    batch = toy_batch()
    with torch.no_grad():
        logp, entropy = PolicyModel(model)(batch.input_ids, batch.attention_mask, batch.response_ids,
                                           temperature=0.7, with_entropy=True)
        logits = model(input_ids=batch.input_ids, attention_mask=batch.attention_mask,
                       position_ids=batch.position_ids).logits[:, -7:-1] / 0.7
    expected = torch.log_softmax(logits, -1).gather(-1, batch.response_ids.unsqueeze(-1)).squeeze(-1)
    # on response tokens only: PolicyModel runs the rows left-justified without a mask (trainer.batch.
    # left_justify), so what it gives at response padding is not the masked forward's (and never used)
    real = batch.response_mask.bool()
    torch.testing.assert_close(logp[real], expected[real], rtol=1e-5, atol=1e-5)
    expected_entropy = -(logits.softmax(-1) * logits.log_softmax(-1)).sum(-1)
    torch.testing.assert_close(entropy[real], expected_entropy[real], rtol=1e-5, atol=1e-5)


def test_left_justify_moves_each_rows_real_tokens_to_the_front():
    ids = torch.tensor([[0, 0, 7, 8, 9, 0], [5, 6, 7, 8, 0, 0], [0, 3, 4, 5, 6, 7]])
    mask = (ids != 0).long()
    moved, pads = left_justify(ids, mask)
    assert pads.tolist() == [2, 0, 1]
    assert moved[0, :3].tolist() == [7, 8, 9] and moved[1, :4].tolist() == [5, 6, 7, 8]
    assert moved[2, :5].tolist() == [3, 4, 5, 6, 7]
    assert moved.shape == ids.shape
