"""FSDP2 on CPU with two real processes of a gloo group (no Ray; tests/test_fsdp.py has whole steps).

Log-probs and one PPO update over shards of unequal size, where one worker runs out of micro-batches
first and must run dummy passes to keep FSDP's collectives in step, equal the single-process result
on the whole batch. This module stays light to import: the spawned workers import it.

How the two processes end. ``destroy_process_group`` does not end a group that FSDP2 has used:
FSDP's DeviceMesh holds it, and DTensor's sharding caches hold the mesh, so gloo's threads (its
socket loop and work threads) and rank 0's TCPStore server thread run until the process ends. A
spawned process that returns ends through the interpreter: seconds of finalization, then C++'s
static destructors, while those threads still serve the sockets, and the two ranks end within
milliseconds of each other (they run in lockstep up to the last collective), so each one's exit
lands while the other tears itself down. That window is where the SIGABRT that CI saw twice on
rank 0 (the only process with the store's thread) after every result was written most likely came
from: no core was kept, and it did not come back here in about 85 runs, under load and with one
rank's exit timed into the other's C++ destructors. So each rank leaves in step
(``DataParallel.shutdown``'s barrier: no rank tears down while another still runs a collective) and
then ends with ``os._exit``: no finalization and no destructor runs beside the group's threads.
Each rank's stderr (and faulthandler's stacks, should one die of a signal) goes to a file that the
parent shows when a rank fails.
"""

from __future__ import annotations

import faulthandler
import os
import sys
import time
import traceback
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
import torch.multiprocessing as mp
from adam_steps import adam_moments, assert_same_adam_steps
from op_counts import OpCounter

from trainer.batch import Batch, left_justify, left_pad
from trainer.config import ActorConfig
from trainer.models.checkpointing import ATTENTION_OPS, MATMUL_OPS, enable_gradient_checkpointing
from trainer.models.presets import build_model
from trainer.workers.actor import UpdateSettings, compute_log_probs, micro_batch_groups, update_policy
from trainer.workers.distributed import DataParallel, Rendezvous
from trainer.workers.fsdp import PolicyModel, full_model_state, resolve_strategy, shard_model

ROWS_PER_RANK = ([0, 1, 2, 3, 4], [5, 6, 7])  # unequal on purpose
LR = 1e-2  # AdamW's
# (micro-batch size, dynamic bsz, token budget, gradient checkpointing policy on the sharded model or
# None, loss_agg_mode): 3 vs 2 fixed groups; by token budget 4 vs 3 + 1 empty; fixed again with
# checkpointed layers, fully and selectively recomputed; fixed with Dr.GRPO's aggregation (its loss
# weights count sequences, not tokens); packed rows (use_remove_padding) by token budget with full
# checkpointing, against the padded single-process step; the MLP blocks alone checkpointed; and only
# the first layer checkpointed ("POLICY/LAYERS": gradient_checkpointing_layers); and the sequences' mean
# of each one's token mean (seq-mean-token-mean), whose weights differ between the ranks' rows.
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
    (2, False, 0, None, "seq-mean-token-mean"),
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


def run_shard(
    model: torch.nn.Module, batch: Batch, cfg: ActorConfig, dp: DataParallel
) -> tuple[torch.Tensor, dict, dict]:
    """Log-probs and one update: (log-probs, metrics, AdamW's whole moments by parameter name; under
    FSDP gathering them is a collective, which every rank runs here)."""
    optimizer = torch.optim.AdamW(model.parameters(), lr=LR)
    logp = compute_log_probs(model, batch, 1.0, cfg.ppo_micro_batch_size_per_gpu, cfg.use_dynamic_bsz,
                             cfg.ppo_max_token_len_per_gpu, dp, torch.device("cpu"))
    batch.old_log_probs = logp - 0.05 * batch.response_mask  # a ratio away from 1, so clipping can act
    settings = UpdateSettings(temperature=1.0, max_response_length=6, n_mini_batches=1, device=torch.device("cpu"))
    metrics = update_policy(model, optimizer, batch, cfg, settings, dp)
    return logp, metrics, adam_moments(model, optimizer)


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


def _stderr_file(out_dir: str, rank: int) -> str:
    return os.path.join(out_dir, f"rank{rank}.stderr")


def _as_rank(rank: int, fn: Callable[..., None], out_dir: str, *args) -> None:
    """Run ``fn(rank, out_dir, *args)`` as one rank of a two-process group and end the process with
    ``os._exit``: 0 once ``fn`` returned (it has left the group), 1 with the traceback in the rank's
    stderr file if it raised. The module docstring says why not through the interpreter; after a
    failure it also keeps the other rank from waiting out the group's timeout in a collective: it
    sees this one's connections close and fails too."""
    log = open(_stderr_file(out_dir, rank), "w")  # noqa: SIM115 (open until os._exit)
    os.dup2(log.fileno(), 2)  # C++'s messages (gloo, c10d, std::terminate's) as well as Python's
    faulthandler.enable(file=log, all_threads=True)  # the stacks, should the rank die of a signal
    code = 0
    try:
        fn(rank, out_dir, *args)
    except BaseException:
        traceback.print_exc()
        code = 1
    sys.stdout.flush()
    sys.stderr.flush()
    log.flush()
    os._exit(code)


def run_two_ranks(fn: Callable[..., None], out_dir: Path, *args) -> None:
    """Two spawned processes, each ``_as_rank(rank, fn, out_dir, *args)``; a rank that fails (exit
    code or signal) fails the caller, with both ranks' stderr."""
    try:
        mp.start_processes(_as_rank, args=(fn, str(out_dir), *args), nprocs=2, start_method="spawn")
    except (mp.ProcessExitedException, mp.ProcessRaisedException) as exc:
        logs = []
        for rank in range(2):
            path = Path(_stderr_file(str(out_dir), rank))
            text = path.read_text(errors="replace")[-6000:] if path.exists() else "(no stderr file)"
            logs.append(f"--- rank {rank} stderr (last 6000 characters) ---\n{text}")
        raise AssertionError(f"the two-process group failed: {exc}\n" + "\n".join(logs)) from None


def _rank_main(rank: int, out_dir: str) -> None:
    """One worker of a two-process gloo group: every setting in turn, results saved per setting."""
    torch.set_num_threads(1)
    dp = DataParallel(rank, 2, torch.device("cpu"))
    port, rendezvous = _rendezvous_port(rank, out_dir)
    dp.init("127.0.0.1", port, "gloo", rendezvous=rendezvous)
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
            logp, metrics, moments = run_shard(policy, shard, cfg, dp)
        state = full_model_state(policy.lm)
        attention, matmuls = ops.total(ATTENTION_OPS), ops.total(MATMUL_OPS)
        torch.save({"logp": logp, "metrics": metrics, "state": state, "moments": moments, "groups": groups,
                    "attention": attention, "matmuls": matmuls, "packed_calls": len(packed_calls)},
                   os.path.join(out_dir, f"setting{setting}_rank{rank}.pt"))
    # in step with the other rank (a barrier), then the group, then rank 0's rendezvous socket; not
    # after a failure, where the other rank may be inside a collective that this one never joins
    dp.shutdown()


@pytest.fixture(scope="module")
def two_process_results(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("fsdp_gloo")
    run_two_ranks(_rank_main, out)
    return out


LATE_S = 1.5  # how much later than the other the late rank comes to leave the group


def _leave_late(rank: int, out_dir: str, late_rank: int) -> None:
    """A small group that has run DTensor collectives (FSDP2's kind: their mesh keeps the group past
    destroy_process_group), left with ``late_rank`` coming LATE_S late: each rank records when it
    began and ended DataParallel.shutdown, and an atexit hook records an exit through the interpreter."""
    import atexit

    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Shard, distribute_tensor

    torch.set_num_threads(1)
    dp = DataParallel(rank, 2, torch.device("cpu"))
    port, rendezvous = _rendezvous_port(rank, out_dir)
    dp.init("127.0.0.1", port, "gloo", rendezvous=rendezvous)
    mesh = init_device_mesh("cpu", (2,))
    whole = distribute_tensor(torch.arange(8.0).view(4, 2), mesh, [Shard(0)]).full_tensor()
    assert float(whole.sum()) == 28.0, whole
    atexit.register(Path(out_dir, f"rank{rank}.interpreter_exit").touch)
    if rank == late_rank:
        time.sleep(LATE_S)
    began = time.time()
    dp.shutdown()
    Path(out_dir, f"rank{rank}.times").write_text(f"{began} {time.time()}")


@pytest.mark.parametrize("late_rank", [0, 1], ids=["store-owner-late", "other-rank-late"])
def test_each_rank_leaves_the_group_in_step_and_ends_without_the_interpreters_exit(tmp_path, late_rank):
    # Both ranks end with exit code 0 (run_two_ranks fails on a signal or an error, with both stderrs).
    run_two_ranks(_leave_late, tmp_path, late_rank)
    began, ended = {}, {}
    for rank in range(2):
        began[rank], ended[rank] = map(float, (tmp_path / f"rank{rank}.times").read_text().split())
    early = 1 - late_rank
    # the barrier: the early rank cannot be done with the group before the late one has come to leave it
    assert ended[early] >= began[late_rank], (
        f"rank {early} left the group {began[late_rank] - ended[early]:.3f} s before rank {late_rank} came to leave it"
    )
    exited = [rank for rank in range(2) if (tmp_path / f"rank{rank}.interpreter_exit").exists()]
    assert not exited, (
        f"rank(s) {exited} ended through the interpreter's exit, whose finalization and C++ destructors run "
        "beside the group's threads (the module docstring)"
    )


@pytest.mark.parametrize(
    "setting", range(len(SETTINGS)),
    ids=["fixed", "dynamic", "checkpointed", "sum-norm", "save-attention", "save-matmuls", "packed", "mlp",
         "first-layer", "seq-mean"],
)
def test_fsdp_shards_of_unequal_size_take_the_single_process_step(two_process_results, setting):
    cfg = actor_config(*SETTINGS[setting][:5])
    single = PolicyModel(build_model("tiny", seed=0))
    logp_ref, metrics_ref, moments_ref = run_shard(single, toy_batch(), cfg, DataParallel())
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
    # The same gradients (AdamW's first moments), and the same weights but for the step difference those
    # explain: where a gradient is ~0 its rounding noise, which the summation order (shards, micro-batches,
    # packed rows) and the host's SIMD width decide, decides Adam's step too (tests/adam_steps.py).
    expected = single.lm.state_dict()
    assert_same_adam_steps(ranks[0]["state"], expected, ranks[0]["moments"], moments_ref, lr=LR, label="rank 0")
    assert_same_adam_steps(ranks[1]["state"], expected, ranks[1]["moments"], moments_ref, lr=LR, label="rank 1")
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
