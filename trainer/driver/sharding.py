"""How the driver splits a batch over the data-parallel workers. Pure index arithmetic."""

from __future__ import annotations

from collections.abc import Sequence


def even_split(n: int, parts: int) -> list[list[int]]:
    """Contiguous, as-even-as-possible slices of range(n): the first n % parts slices get one more."""
    if parts < 1:
        raise ValueError(f"parts must be at least 1, got {parts}")
    base, extra = divmod(n, parts)
    out, start = [], 0
    for i in range(parts):
        size = base + (1 if i < extra else 0)
        out.append(list(range(start, start + size)))
        start += size
    return out


def mini_batch_shards(n: int, mini_batch_rows: int, world_size: int) -> list[list[int]]:
    """Rows each worker updates on, laid out so that worker r's k-th block is its part of mini-batch k.

    Global mini-batch k is rows [k m, (k+1) m); each is cut into world_size equal parts, so the union
    of every worker's k-th block is exactly mini-batch k, however many workers there are.
    """
    if n % mini_batch_rows:
        raise ValueError(f"{n} rows do not split into mini-batches of {mini_batch_rows}")
    if mini_batch_rows % world_size:
        raise ValueError(f"a mini-batch of {mini_batch_rows} rows does not split over {world_size} workers")
    per_worker = mini_batch_rows // world_size
    shards: list[list[int]] = [[] for _ in range(world_size)]
    for start in range(0, n, mini_batch_rows):
        for r in range(world_size):
            first = start + r * per_worker
            shards[r].extend(range(first, first + per_worker))
    return shards


def balanced_mini_batch_shards(lengths: Sequence[int], mini_batch_rows: int, world_size: int) -> list[list[int]]:
    """``mini_batch_shards`` with each global mini-batch's rows dealt out by length (VERL's
    ``trainer.balance_batch``): worker r's k-th block is still its part of mini-batch k, and every part
    has the same number of rows, but the parts hold near-equal token sums (equal-size Karmarkar-Karp).

    Every forward and backward of FSDP over several workers is a collective, so each phase takes as
    long as its heaviest worker; balancing evens out the workers' work without changing what any
    optimizer step sees: mini-batch k keeps exactly its rows, and the loss is normalised over the
    whole mini-batch (trainer.workers.actor.loss_normaliser), wherever its rows are. Unlike VERL's,
    which reorders the whole step's rows and so regroups the mini-batches, this keeps them as they are.
    """
    # imported here: dynamic_batch imports torch, and this module does not
    from trainer.workers.dynamic_batch import karmarkar_karp

    n = len(lengths)
    plain = mini_batch_shards(n, mini_batch_rows, world_size)  # validates the sizes
    if world_size == 1:
        return plain
    shards: list[list[int]] = [[] for _ in range(world_size)]
    for start in range(0, n, mini_batch_rows):
        rows = range(start, start + mini_batch_rows)
        parts = karmarkar_karp([lengths[i] for i in rows], world_size, equal_size=True)
        for shard, part in zip(shards, parts, strict=True):
            shard.extend(rows[j] for j in part)
    return shards
