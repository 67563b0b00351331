"""Which shares a replay on fewer GPUs generates (trainer/rollout/replay_shares.py): the slowest of the
run replayed, ranked by what a decode reads, the same ranking the gate's note draws
(pytest_rlbench/records/replay_draws.py)."""

from __future__ import annotations

import pytest

from pytest_rlbench.records.baselines import load_baseline
from pytest_rlbench.records.replay_draws import ReplayLayouts, group_targets
from trainer.config.schema import TargetLengthsConfig
from trainer.models.flops import DecoderArch, decode_values_read, kv_positions_read
from trainer.rollout.replay_shares import share_targets, slowest_shares, step_uids
from trainer.rollout.requests import rollout_seed

VERL = load_baseline("verl-v0.5.0-1.5b")


def test_what_a_decode_reads_counts_the_weights_per_step_and_each_rows_cache() -> None:
    arch = DecoderArch(2, 8, 16, 2, 1, 4, 10)
    # a row of prompt 3 that generates 4 tokens reads 3, 4, 5, 6 cached positions
    assert kv_positions_read([3], [4]) == 3 + 4 + 5 + 6
    weights = 2 * (3 * 8 * 16 + 8 * (8 + 4 + 4 + 8)) + 10 * 8  # layers' matrices and the LM head
    per_position = 2 * 2 * 1 * 4  # K and V, 2 layers, 1 KV head of 4
    assert decode_values_read(arch, [3, 3], [4, 2]) == 4 * weights + per_position * (18 + 3 + 4)


def verl_spec() -> tuple[TargetLengthsConfig, ReplayLayouts]:
    layouts = ReplayLayouts.of(VERL)
    prefix = "actor_rollout_ref.rollout.target_lengths"
    spec = TargetLengthsConfig(
        layouts.spec[f"{prefix}.distribution"], layouts.spec[f"{prefix}.mean"], layouts.spec[f"{prefix}.sigma"],
        slowest_of=layouts.replicas,
    )
    return spec, layouts


@pytest.mark.parametrize("gpus", [1, 2, 4])
def test_the_shares_chosen_are_the_ones_with_the_largest_decode_bound(gpus: int) -> None:
    spec, layouts = verl_spec()
    s = layouts.spec
    for step in range(10):
        seed = rollout_seed(1, step)
        bounds = layouts.shares(VERL.model, seed)
        expected = sorted(sorted(bounds, key=lambda d: -d.bound_s)[:gpus], key=lambda d: d.worker)
        chosen = slowest_shares(
            VERL.model, spec, s["actor_rollout_ref.rollout.n"], layouts.prompts_per_share, gpus,
            s["data.synthetic_prompt_length"], seed, s["data.max_response_length"],
        )
        assert chosen == [d.worker for d in expected], (step, [(d.worker, d.bound_s) for d in bounds])
    assert slowest_shares(  # step 0's slowest of the 8 (docs/benchmarks.md: share 7, 106.4 s on an H100)
        VERL.model, spec, s["actor_rollout_ref.rollout.n"], layouts.prompts_per_share, 1,
        s["data.synthetic_prompt_length"], rollout_seed(1, 0), s["data.max_response_length"],
    ) == [7]


def test_a_steps_uids_are_the_chosen_shares_prompts_one_share_per_worker() -> None:
    spec, layouts = verl_spec()
    s, per = layouts.spec, layouts.prompts_per_share
    n, prompt, cap, seed = s["actor_rollout_ref.rollout.n"], s["data.synthetic_prompt_length"], s["data.max_response_length"], rollout_seed(1, 3)
    off = TargetLengthsConfig(spec.distribution, spec.mean, spec.sigma)
    assert step_uids(VERL.model, off, n, 2 * per, 2, prompt, seed, cap) == list(range(2 * per))
    uids = step_uids(VERL.model, spec, n, 2 * per, 2, prompt, seed, cap)
    chosen = slowest_shares(VERL.model, spec, n, per, 2, prompt, seed, cap)
    assert uids == [c * per + i for c in chosen for i in range(per)]
    # the rows of worker w are those share chosen[w] has in the 8-GPU step
    for w, share in enumerate(chosen):
        mine = share_targets(spec, n, uids[w * per], per, seed, cap)
        assert mine == group_targets(s, share * per, per, seed)


def test_a_tensor_parallel_share_is_split_over_as_many_consecutive_workers() -> None:
    """VERL's 7B decoded each share of 64 rows on 2 GPUs (rollout tp 2): 4 workers generate the 2
    slowest of its 32 shares, workers 0-1 the first, 2-3 the second."""
    seven = load_baseline("verl-7b")
    layouts = ReplayLayouts.of(seven)
    s, prefix = layouts.spec, "actor_rollout_ref.rollout.target_lengths"
    spec = TargetLengthsConfig(
        s[f"{prefix}.distribution"], s[f"{prefix}.mean"], s[f"{prefix}.sigma"], slowest_of=32, gpus_per_share=2
    )
    n, prompt, cap, seed = s["actor_rollout_ref.rollout.n"], s["data.synthetic_prompt_length"], s["data.max_response_length"], rollout_seed(1, 0)
    per_share = layouts.prompts_per_share  # 4 prompts: 2 per GPU
    uids = step_uids(seven.model, spec, n, 2 * per_share, 4, prompt, seed, cap)
    bounds = layouts.shares(seven.model, seed)
    expected = sorted(d.worker for d in sorted(bounds, key=lambda d: -d.bound_s)[:2])
    assert uids == [c * per_share + i for c in expected for i in range(per_share)]
    assert expected != [0, 1]  # the first replicas are not the slowest at this seed


def test_decode_steps_are_counted_per_share_where_a_replay_split_one() -> None:
    from pytest_rlbench.records.record import TokenCounts
    from pytest_rlbench.records.replay_draws import share_decode_steps

    # 4 GPUs' rows, 2 shares of 2 GPUs: one replica decodes rows [1, 5, 2, 3] for 5 steps, the other for 9
    tok = TokenCounts(response_lengths=[1, 5, 2, 3, 9, 4, 4, 4], decode_steps=5 + 3 + 9 + 4)
    assert share_decode_steps(tok, 2).decode_steps == 5 + 9
    assert share_decode_steps(tok, 4) == tok  # one share per GPU: as recorded
    assert share_decode_steps(TokenCounts(decode_steps=7), 2).decode_steps == 7  # no lengths: unchanged
