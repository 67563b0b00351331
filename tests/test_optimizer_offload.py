"""optimizer_offload (VERL's fsdp_config key): AdamW's moments wait on the host between update_actor
calls and stay on the GPU through every optimizer step of one call (trainer.workers.fsdp
.optimizer_state_on). The copies need a GPU; without one only the no-offload path runs here."""

from __future__ import annotations

import copy

import pytest
import torch

from trainer.workers.fsdp import optimizer_state_on, reserve_pinned_moments

needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="host-GPU copies need a CUDA GPU")


def _model(device: str) -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.Tanh(), torch.nn.Linear(32, 4)).to(device)


def _moment_devices(optimizer: torch.optim.Optimizer) -> set[str]:
    return {v.device.type for s in optimizer.state.values() for k, v in s.items() if k != "step"}


def _update(model: torch.nn.Module, optimizer: torch.optim.Optimizer, steps: int, seed: int) -> list[set[str]]:
    """``steps`` optimizer steps on fixed inputs; where the moments were after each."""
    gen = torch.Generator().manual_seed(seed)
    seen = []
    for _ in range(steps):
        x = torch.randn(8, 16, generator=gen).to(next(model.parameters()).device)
        model(x).square().mean().backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        seen.append(_moment_devices(optimizer))
    return seen


def test_without_offload_the_moments_stay_where_the_step_made_them():
    model = _model("cpu")
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    with optimizer_state_on(optimizer, torch.device("cpu"), offload=False):
        _update(model, optimizer, 2, seed=1)
    assert _moment_devices(optimizer) == {"cpu"}
    assert len(optimizer.state) == 4, "AdamW made no state: the update did not run"


@needs_cuda
def test_moments_stay_on_the_gpu_for_a_whole_call_and_wait_on_the_host_between_calls():
    device = torch.device("cuda")
    model = _model("cuda")
    reference = copy.deepcopy(model)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    kept = torch.optim.AdamW(reference.parameters(), lr=1e-2)
    for call in range(3):
        with optimizer_state_on(optimizer, device, offload=True):
            inside = _update(model, optimizer, 4, seed=call)
        _update(reference, kept, 4, seed=call)
        # per call, not per step: after each of the call's steps the moments are still on the GPU
        assert inside == [{"cuda"}] * 4, f"call {call}: moments after each step were on {inside}"
        assert _moment_devices(optimizer) == {"cpu"}, f"call {call}: moments left on {_moment_devices(optimizer)}"
    # the round trips lose nothing: the same weights as an optimizer that never moved its moments
    for (name, a), b in zip(model.named_parameters(), reference.parameters(), strict=True):
        assert torch.equal(a, b), f"{name}: differs by up to {(a - b).abs().max().item():.3e} after the round trips"


@needs_cuda
def test_moments_go_back_to_the_host_when_the_update_raises():
    device = torch.device("cuda")
    model = _model("cuda")
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    with optimizer_state_on(optimizer, device, offload=True):
        _update(model, optimizer, 1, seed=0)
    with pytest.raises(RuntimeError, match="a worker failed"):
        with optimizer_state_on(optimizer, device, offload=True):
            assert _moment_devices(optimizer) == {"cuda"}
            raise RuntimeError("a worker failed mid-update")
    assert _moment_devices(optimizer) == {"cpu"}


def _host_allocations() -> int:
    read = getattr(torch.cuda, "host_memory_stats", None)
    if read is None:
        pytest.skip("this torch keeps no statistics of its pinned host pool (torch.cuda.host_memory_stats)")
    return int(read().get("num_host_alloc", 0))


def _empty_host_pool() -> bool:
    """Return the pool's free pinned blocks to CUDA where this torch can (torch.accelerator.empty_host_cache),
    so blocks an earlier test left cannot stand in for a reservation; whether it could."""
    empty = getattr(getattr(torch, "accelerator", None), "empty_host_cache", None)
    if empty is not None:
        empty()
    return empty is not None


@needs_cuda
def test_moments_reserved_at_set_up_need_no_new_pinned_memory_in_the_first_call():
    # Pinning host memory is slow (30.8 s for the 7B's moments on one H200): set-up reserves it, so the
    # first update_actor's copy out takes blocks from the pool instead of pinning more. Sizes no other
    # test pins (8 and 16 MiB blocks), and the pool emptied first where torch can.
    device = torch.device("cuda")
    emptied = _empty_host_pool()
    control = torch.nn.Linear(1000, 1537, bias=False).to(device)
    unreserved = torch.optim.AdamW(control.parameters(), lr=1e-2)
    before = _host_allocations()
    with optimizer_state_on(unreserved, device, offload=True):
        _step(control, unreserved)
    assert _host_allocations() > before, "without a reservation the copy out should pin new memory"

    model = torch.nn.Linear(1000, 3001, bias=False).to(device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    before = _host_allocations()
    reserved = reserve_pinned_moments(optimizer)
    moments = 2 * model.weight.numel() * model.weight.element_size()
    assert reserved >= moments, f"the pool grew by {reserved} bytes for {moments} bytes of moments"
    if emptied:
        assert _host_allocations() == before + 2, "the reservation should pin one block per moment"
    before = _host_allocations()
    with optimizer_state_on(optimizer, device, offload=True):
        _step(model, optimizer)
    assert _moment_devices(optimizer) == {"cpu"}
    assert _host_allocations() == before, f"the first call pinned {_host_allocations() - before} new blocks"


def _step(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> None:
    model(torch.ones(2, model.in_features, device="cuda")).square().mean().backward()
    optimizer.step()


@needs_cuda
def test_a_workers_first_update_pins_nothing_when_its_ref_waits_on_the_host(monkeypatch):
    # An offloaded ref model pins its shards, of the moments' very sizes: set-up must reserve after it,
    # or the ref keeps half the reserved blocks and the first copy out pins them again.
    from trainer.config import build_config
    from trainer.workers import fsdp as fsdp_module
    from trainer.workers.train_worker import TrainWorker

    _empty_host_pool()
    cfg = build_config([
        "trainer.device=cuda", "actor_rollout_ref.model.path=tiny", "data.train_batch_size=2",
        "actor_rollout_ref.rollout.n=2", "actor_rollout_ref.actor.ppo_mini_batch_size=2", "data.max_response_length=8",
        "actor_rollout_ref.actor.use_kl_loss=True", "actor_rollout_ref.actor.fsdp_config.optimizer_offload=True",
        "actor_rollout_ref.ref.fsdp_config.param_offload=True",
    ])
    worker = TrainWorker(cfg, rank=0, world_size=1)
    try:
        info = worker.setup(*worker.address())
        assert info["pinned_moment_bytes"] > 0
        batch = worker.generate([[5, 6, 7], [8, 9]], [0, 1], ["", ""], seed=0)
        batch.old_log_probs = worker.compute_old_log_prob(batch)
        batch.ref_log_probs = worker.compute_ref_log_prob(batch)
        batch.advantages = torch.ones_like(batch.old_log_probs)
        pinned_by_copies_out = []
        move = fsdp_module.move_optimizer_state

        def watched(optimizer, device):
            before = _host_allocations()
            move(optimizer, device)
            if device.type == "cpu":
                pinned_by_copies_out.append(_host_allocations() - before)

        monkeypatch.setattr(fsdp_module, "move_optimizer_state", watched)
        worker.update_actor(batch, 1)
    finally:
        worker.shutdown()
    assert pinned_by_copies_out == [0], f"the first update's copy out pinned {pinned_by_copies_out} new blocks"


def test_nothing_is_reserved_without_cuda(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    optimizer = torch.optim.AdamW(_model("cpu").parameters(), lr=1e-2)
    assert reserve_pinned_moments(optimizer) == 0
