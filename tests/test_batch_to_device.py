"""Batch.to_device: the same tensors as Batch.to, and on a GPU a copy that does not wait for the GPU."""

from __future__ import annotations

import time

import pytest
import torch

from trainer.batch import Batch
from trainer.workers.actor import trim_padding

CUDA = torch.cuda.is_available()


def _batch() -> Batch:
    """A micro-batch as the actor makes one: padding columns trimmed, so its 2-D tensors are strided
    views of the whole batch's."""
    g = torch.Generator().manual_seed(0)
    prompt_mask = torch.ones(4, 6, dtype=torch.long)
    prompt_mask[:, :2] = 0  # two columns of left padding in every row
    response_mask = torch.ones(4, 5, dtype=torch.long)
    response_mask[:, 3:] = 0  # two of right padding
    batch = trim_padding(Batch(
        prompt_ids=torch.randint(0, 100, (4, 6), generator=g),
        prompt_mask=prompt_mask,
        response_ids=torch.randint(0, 100, (4, 5), generator=g),
        response_mask=response_mask,
        uids=torch.arange(4),
        ground_truths=["a", "b", "c", "d"],
        old_log_probs=torch.randn(4, 5, generator=g),
    ))
    assert not batch.prompt_ids.is_contiguous() and batch.response_ids.shape == (4, 3)
    return batch


def test_to_device_on_the_cpu_is_to() -> None:
    batch = _batch()
    moved = batch.to_device(torch.device("cpu"))
    for name, tensor in batch.tensors().items():
        assert torch.equal(getattr(moved, name), tensor), name
    assert moved.ground_truths == batch.ground_truths
    assert moved.ref_log_probs is None


@pytest.mark.skipif(not CUDA, reason="pinned, asynchronous copies need a GPU")
def test_to_device_queues_behind_the_gpu_without_waiting() -> None:
    device = torch.device("cuda", torch.cuda.current_device())
    batch = _batch()
    torch.cuda.synchronize()
    torch.cuda._sleep(2_000_000_000)  # a kernel that keeps the stream busy for about a second
    start = time.perf_counter()
    moved = batch.to_device(device)
    queued_s = time.perf_counter() - start
    torch.cuda.synchronize()
    waited_s = time.perf_counter() - start
    # A synchronising copy returns only after the sleep; this one well before it ends.
    assert queued_s < waited_s / 4, (queued_s, waited_s)
    for name, tensor in batch.tensors().items():
        assert getattr(moved, name).device == device, name
        assert torch.equal(getattr(moved, name).cpu(), tensor), name
