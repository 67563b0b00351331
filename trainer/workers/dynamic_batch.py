"""Dynamic batch size: split a batch into token-budgeted micro-batches (VERL verl/utils/seqlen_balancing.py).

As VERL's use_dynamic_bsz: per rank, k = max(1, ceil(sum of sequence lengths / max_token_len)),
then the max of k over the data-parallel group (every rank must run the same number of forward and
backward passes), then the samples are split into k groups of balanced workload with the
Karmarkar-Karp largest differencing method. Outputs are put back in the original order.

Unlike VERL, every micro-batch is guaranteed to fit the budget: a KK partition of uneven lengths
can put more than max_token_len tokens in one group, and then k is raised until all groups fit.

    groups = balanced_micro_batches(lengths, max_token_len=30000, reduce_max=dist_reduce_max())
    micro = split_batch(batch, groups)
    out = restore_order(torch.cat([f(mb) for mb in micro]), groups)
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

Lengths = Sequence[int] | torch.Tensor


def _as_int_list(lengths: Lengths) -> list[int]:
    if isinstance(lengths, torch.Tensor):
        if lengths.dim() != 1:
            raise ValueError(f"lengths must be 1-D, one per sample; got shape {tuple(lengths.shape)}")
        lengths = lengths.tolist()
    out = [int(x) for x in lengths]
    for i, x in enumerate(out):
        if x < 0:
            raise ValueError(f"sample {i} has a negative length {x}")
    return out


def sequence_lengths(attention_mask: torch.Tensor) -> list[int]:
    """Tokens per sample (prompt + response, no padding) from an attention mask [B, S]."""
    return [int(x) for x in attention_mask.sum(dim=-1).tolist()]


def check_lengths(lengths: Lengths, max_token_len: int) -> None:
    """ValueError naming the first sample longer than ``max_token_len`` (no micro-batch could hold it)."""
    if max_token_len <= 0:
        raise ValueError(f"max_token_len must be positive; got {max_token_len}")
    for i, n in enumerate(_as_int_list(lengths)):
        if n > max_token_len:
            raise ValueError(
                f"sample {i} has {n} tokens, more than max_token_len={max_token_len}: "
                f"raise max_token_len (ppo_max_token_len_per_gpu) to at least {n} or shorten the sequences"
            )


def num_micro_batches(lengths: Lengths, max_token_len: int) -> int:
    """k = max(1, ceil(sum(lengths) / max_token_len)), the fewest groups the token budget allows."""
    total = sum(_as_int_list(lengths))
    return max(1, math.ceil(total / max_token_len))


# ---------------------------------------------------------------------------------------------
# Karmarkar-Karp largest differencing, k-way.
# ---------------------------------------------------------------------------------------------


@dataclass(order=True)
class _PartialPartition:
    """k sets, of which only the non-empty ones are stored, sorted by sum (largest first).

    Ordered in the heap by ``key`` = (-spread, tiebreak): heapq (a min-heap) pops the largest
    spread first, and the tiebreak keeps the result deterministic. Storing only the non-empty sets
    makes a merge cost O(p + q), not O(k): early in the run every partial partition holds one item.
    """

    key: tuple[int, int]
    sets: list[list[int]] = field(compare=False)
    sums: list[int] = field(compare=False)

    @staticmethod
    def make(sets: list[list[int]], sums: list[int], k: int, tiebreak: int) -> _PartialPartition:
        # reverse=True keeps equal sums in their order (stable), so the result is deterministic
        order = sorted(range(len(sets)), key=sums.__getitem__, reverse=True)
        sets = [sets[j] for j in order]
        sums = [sums[j] for j in order]
        smallest = sums[-1] if len(sums) == k else 0  # an empty set has sum 0
        return _PartialPartition((-(sums[0] - smallest), tiebreak), sets, sums)


def _merge(a: _PartialPartition, b: _PartialPartition, k: int) -> tuple[list[list[int]], list[int]]:
    """Pair a's j-th largest set with b's j-th smallest (a_j + b_{k-1-j}) so the differences cancel.

    With p and q non-empty sets: a_j meets a non-empty b_{k-1-j} for j >= k - q; below that a_j
    stays alone, and b's sets with index < k - p meet one of a's empty sets.
    """
    p, q = len(a.sets), len(b.sets)
    a_alone = min(p, k - q)
    sets = a.sets[:a_alone]
    sums = a.sums[:a_alone]
    for j in range(a_alone, p):
        x, y = a.sets[j], b.sets[k - 1 - j]
        # Extend the longer list with the shorter, in place (a and b are consumed): each index is
        # copied O(log n) times in all, not once per merge.
        if len(x) < len(y):
            x, y = y, x
        x.extend(y)
        sets.append(x)
        sums.append(a.sums[j] + b.sums[k - 1 - j])
    b_alone = min(q, k - p)
    sets.extend(b.sets[:b_alone])
    sums.extend(b.sums[:b_alone])
    return sets, sums


def karmarkar_karp(lengths: Lengths, k: int, equal_size: bool = False) -> list[list[int]]:
    """Split the sample indices into ``k`` groups of near-equal length sums (largest differencing).

    Start with one partial partition per sample (the sample alone in one of k sets); repeatedly take
    the two partial partitions with the largest spread (max set sum - min set sum) and merge them,
    pairing the largest set of one with the smallest of the other, so their differences cancel.
    Groups may be empty when k > number of samples. Indices within each group are ascending.

    ``equal_size`` (VERL's get_seqlen_balanced_partitions(equal_size=True), for data-parallel ranks
    that must hold as many rows each): the samples, sorted, start in runs of k, each run one partial
    partition of k one-sample sets; a merge joins every set of one with one set of the other, so all k
    groups keep the same count. Needs the count a multiple of k.
    """
    values = _as_int_list(lengths)
    if k < 1:
        raise ValueError(f"the number of groups k must be >= 1; got {k}")
    if equal_size:
        if len(values) % k:
            raise ValueError(f"{len(values)} samples do not split into {k} groups of equal size")
        ranked = sorted(range(len(values)), key=lambda i: (values[i], i))
        runs = [ranked[s : s + k] for s in range(0, len(ranked), k)]
        heap = [_PartialPartition.make([[i] for i in run], [values[i] for i in run], k, t) for t, run in enumerate(runs)]
    else:
        heap = [_PartialPartition.make([[i]], [v], k, i) for i, v in enumerate(values)]
    if not heap:
        return [[] for _ in range(k)]
    heapq.heapify(heap)
    tiebreak = len(heap)
    while len(heap) > 1:
        a = heapq.heappop(heap)
        b = heapq.heappop(heap)
        heapq.heappush(heap, _PartialPartition.make(*_merge(a, b, k), k, tiebreak))
        tiebreak += 1
    groups = [sorted(g) for g in heap[0].sets]
    return groups + [[] for _ in range(k - len(groups))]


def _group_sum(group: Sequence[int], values: Sequence[int]) -> int:
    return sum(values[i] for i in group)


def _fits(groups: Sequence[Sequence[int]], values: Sequence[int], max_token_len: int) -> bool:
    return all(_group_sum(g, values) <= max_token_len for g in groups)


def _split_to(groups: list[list[int]], values: Sequence[int], k: int) -> list[list[int]]:
    """Refine a fitting partition to exactly k groups by halving (KK 2-way) the heaviest splittable
    group; splitting never raises a group's sum, so the budget still holds. Pads with empty groups."""
    done: list[list[int]] = [g for g in groups if len(g) <= 1]
    # heap of splittable groups, heaviest first (ties by first index, for determinism)
    heap = [(-_group_sum(g, values), g[0], g) for g in groups if len(g) > 1]
    heapq.heapify(heap)
    while len(done) + len(heap) < k and heap:
        _, _, heaviest = heapq.heappop(heap)
        for half in karmarkar_karp([values[i] for i in heaviest], 2):
            g = sorted(heaviest[j] for j in half)
            if len(g) > 1:
                heapq.heappush(heap, (-_group_sum(g, values), g[0], g))
            else:
                done.append(g)
    out = done + [g for _, _, g in heap]
    return out + [[] for _ in range(k - len(out))]


def _order(groups: list[list[int]], values: Sequence[int]) -> list[list[int]]:
    """Heaviest micro-batch first (stable by first index), indices ascending inside each."""
    groups = [sorted(g) for g in groups]
    return sorted(groups, key=lambda g: (-_group_sum(g, values), g[0] if g else len(values)))


def balanced_micro_batches(
    lengths: Lengths,
    max_token_len: int,
    *,
    dp_ks: Sequence[int] | None = None,
    reduce_max: Callable[[int], int] | None = None,
) -> list[list[int]]:
    """Sample indices of each micro-batch: balanced by KK, every group within ``max_token_len``.

    1. k = num_micro_batches(lengths); while a KK split into k groups has a group over budget and
       k < n, raise k and retry (a guess, then bisection; at k = n every sample is alone, and fits
       by ``check_lengths``).
    2. K = max(k, *dp_ks, reduce_max(k)): the data-parallel group agrees on the largest count.
       ``dp_ks``: the k of every rank, gathered by the caller (each rank's k from
       ``fitting_num_micro_batches``); ``reduce_max``: a collective max, e.g. ``dist_reduce_max()``.
    3. Split into K groups by KK; should that split exceed the budget, refine the fitting k-split
       instead (halving groups never raises a sum). Groups are empty when K > n.
    """
    values = _as_int_list(lengths)
    check_lengths(values, max_token_len)
    k, groups = _fitting_partition(values, max_token_len)
    target = k
    if dp_ks:
        target = max(target, *(int(x) for x in dp_ks))
    if reduce_max is not None:
        target = max(target, int(reduce_max(target)))
    if target != k:
        wider = karmarkar_karp(values, target)
        groups = wider if _fits(wider, values, max_token_len) else _split_to(groups, values, target)
    return _order(groups, values)


def _fitting_partition(values: list[int], max_token_len: int) -> tuple[int, list[list[int]]]:
    """A small k >= num_micro_batches whose KK split fits the budget, and that split.

    Stepping k up by one can take dozens of KK runs on a big batch, so: guess, then bisect.
    KK's groups sit close to the mean total/k, the heaviest delta = max - mean above it; it fits
    once total/k + delta <= max_token_len, so guess ceil(total / (max_token_len - delta)) (at least
    k + 1, at most n). If the guess fails it becomes the new lower end; once one fits, bisect
    between the last failing and the fitting k. At k >= n every sample is alone, which always fits.
    """
    n, total = len(values), sum(values)

    def attempt(k: int) -> tuple[list[list[int]] | None, int]:
        groups = karmarkar_karp(values, k)
        heaviest = max(_group_sum(g, values) for g in groups)
        if heaviest <= max_token_len:
            return groups, heaviest
        if k >= n:  # KK pairs nothing here in practice; singletons are the sure answer
            return [[i] for i in range(n)] + [[] for _ in range(k - n)], max(values, default=0)
        return None, heaviest

    lo = num_micro_batches(values, max_token_len)
    groups, heaviest = attempt(lo)
    if groups is not None:
        return lo, groups
    # lo fails; find some hi that fits
    while True:
        delta = heaviest - total / lo
        guess = lo + 1
        if delta < max_token_len:
            guess = max(guess, math.ceil(total / (max_token_len - delta)))
        hi = min(max(n, lo + 1), guess)
        best, heaviest = attempt(hi)
        if best is not None:
            break
        lo = hi
    # bisect: lo fails, hi fits
    while hi - lo > 1:
        mid = (lo + hi) // 2
        groups, _ = attempt(mid)
        if groups is not None:
            hi, best = mid, groups
        else:
            lo = mid
    return hi, best


def fitting_num_micro_batches(lengths: Lengths, max_token_len: int) -> int:
    """The k this rank needs so that each KK group fits ``max_token_len`` (step 1 above): the number
    to share with the other data-parallel ranks before ``balanced_micro_batches(..., dp_ks=...)``."""
    values = _as_int_list(lengths)
    check_lengths(values, max_token_len)
    return _fitting_partition(values, max_token_len)[0]


def dist_reduce_max(group: Any = None) -> Callable[[int], int]:
    """A reduce_max for ``balanced_micro_batches``: all_reduce(MAX) over ``group`` when
    torch.distributed is initialised, the identity otherwise."""

    def reduce(k: int) -> int:
        import torch.distributed as dist

        if not (dist.is_available() and dist.is_initialized()):
            return k
        # NCCL only reduces device tensors; gloo takes CPU ones.
        device = (
            torch.device("cuda", torch.cuda.current_device()) if dist.get_backend(group) == "nccl" else None
        )
        t = torch.tensor([k], dtype=torch.long, device=device)
        dist.all_reduce(t, op=dist.ReduceOp.MAX, group=group)
        return int(t.item())

    return reduce


# ---------------------------------------------------------------------------------------------
# Splitting a batch and restoring the order.
# ---------------------------------------------------------------------------------------------


def split_batch(batch: Mapping[str, Any], groups: Sequence[Sequence[int]]) -> list[dict[str, Any]]:
    """One dict per micro-batch, each value indexed by the group's sample indices along dim 0.

    Tensors go through index_select; lists and tuples (and numpy arrays, by fancy indexing) are
    picked element by element. Every value must have the batch size as its first dimension.
    """
    sizes = {key: len(v) for key, v in batch.items()}
    if len(set(sizes.values())) > 1:
        raise ValueError(f"batch values disagree on the batch size: {sizes}")
    out: list[dict[str, Any]] = []
    for g in groups:
        mb: dict[str, Any] = {}
        for key, v in batch.items():
            if isinstance(v, torch.Tensor):
                mb[key] = v.index_select(0, torch.as_tensor(list(g), dtype=torch.long, device=v.device))
            elif isinstance(v, (list, tuple)):
                mb[key] = type(v)(v[i] for i in g)
            else:
                mb[key] = v[list(g)]
        out.append(mb)
    return out


def restore_order(
    outputs: torch.Tensor | Sequence[torch.Tensor], groups: Sequence[Sequence[int]]
) -> torch.Tensor:
    """Undo the grouping: ``outputs`` are the micro-batches' results concatenated along dim 0 (or the
    list of them) in group order; returns them in the original sample order."""
    if not isinstance(outputs, torch.Tensor):
        outputs = torch.cat(list(outputs), dim=0)
    order = [i for g in groups for i in g]
    if outputs.shape[0] != len(order):
        raise ValueError(f"got {outputs.shape[0]} output rows for {len(order)} grouped samples")
    if sorted(order) != list(range(len(order))):
        raise ValueError("groups must hold every sample index 0..n-1 exactly once")
    inverse = torch.empty(len(order), dtype=torch.long)
    inverse[torch.tensor(order, dtype=torch.long)] = torch.arange(len(order))
    return outputs.index_select(0, inverse.to(outputs.device))
