"""How the driver splits a batch over the data-parallel workers. Pure index arithmetic."""

from __future__ import annotations


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
