"""Which rows a replay on fewer GPUs than the run it replays generates: that run's slowest GPUs' shares.

A run on M GPUs splits each step's prompts evenly, one share of P prompts per GPU, and its generation
lasts as long as its slowest GPU's share. With rollout.target_lengths a row's target length depends
only on (the step's rollout seed, the row's key u * n + j over the prompt uid u; target_lengths.py), so
the whole step of that M-GPU run can be drawn here: share s holds the prompts of uids s P .. s P + P - 1.

A replay on W < M GPUs whose workers took shares 0 .. W-1 would wait only for the slowest of those, and
its per-GPU generation would read faster than the same engine doing the M-GPU run's step. With
``target_lengths.slowest_of = M`` the W workers generate instead the W shares with the most values
to read (``trainer.models.flops.decode_values_read``: the weights once per decode step of the longest
row, each row's cached K/V at each of its steps; the lower bound of a bandwidth-bound decode), so the
replay's slowest GPU does what the M-GPU run's slowest did.

Where the run replayed decoded each share on several GPUs together (a tensor-parallel rollout of size
t: M replicas of t GPUs, a share per replica), ``gpus_per_share = t``: the W workers generate the W / t
slowest shares, each split over t consecutive workers, so every worker still holds one GPU's rows.
"""

from __future__ import annotations

import torch

from trainer.config.schema import TargetLengthsConfig
from trainer.models.flops import DecoderArch, decode_values_read
from trainer.rollout.target_lengths import draw_targets


def share_targets(spec: TargetLengthsConfig, n: int, first_uid: int, prompts: int, seed: int, cap: int) -> list[int]:
    """The target lengths of the rows of ``prompts`` prompts from uid ``first_uid`` on (n rows each)."""
    keys = torch.tensor([u * n + j for u in range(first_uid, first_uid + prompts) for j in range(n)])
    targets = draw_targets(spec.distribution, spec.mean, spec.sigma, keys, seed, cap)
    if targets is None:
        raise ValueError("rollout.target_lengths.distribution is 'none': rows have no drawn lengths to share out")
    return targets.tolist()


def slowest_shares(
    arch: DecoderArch, spec: TargetLengthsConfig, n: int, prompts_per_share: int, wanted: int,
    prompt_length: int, seed: int, cap: int,
) -> list[int]:
    """The ``wanted`` of ``spec.slowest_of`` shares that read the most at the step of ``seed``, in
    share order (ties to the lower share)."""
    reads = [
        decode_values_read(arch, [prompt_length] * (prompts_per_share * n),
                           share_targets(spec, n, s * prompts_per_share, prompts_per_share, seed, cap))
        for s in range(spec.slowest_of)
    ]
    return heaviest(reads, wanted)


def heaviest(reads: list[float], wanted: int) -> list[int]:
    """The indices of the ``wanted`` largest ``reads``, in index order (ties to the lower index)."""
    ranked = sorted(range(len(reads)), key=lambda s: (-reads[s], s))
    return sorted(ranked[:wanted])


def step_uids(
    arch: DecoderArch, spec: TargetLengthsConfig, n: int, prompts: int, workers: int, prompt_length: int,
    seed: int, cap: int,
) -> list[int]:
    """The uid of each of a step's ``prompts`` prompts, split evenly over ``workers`` by the driver:
    0 .. prompts-1, or, with ``spec.slowest_of`` set, the uids of the slowest shares, each split over
    ``spec.gpus_per_share`` consecutive workers (as its GPUs decoded it together in the run replayed)."""
    if not spec.slowest_of:
        return list(range(prompts))
    shares = workers // spec.gpus_per_share
    per_share = prompts // shares
    chosen = slowest_shares(arch, spec, n, per_share, shares, prompt_length, seed, cap)
    return [s * per_share + i for s in chosen for i in range(per_share)]
