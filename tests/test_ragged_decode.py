"""benchmarks/ragged_decode.py: the bandwidth bound of a traced decode, by rows alive (numbers by hand)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))

from ragged_decode import alive_at, analyse, outlier_excess, table  # noqa: E402

# 3 rows of targets 2, 3 and 6 tokens: decode steps 1-5 (token 0 is the prefill's). Weights 100 bytes,
# 10 bytes per cached token, prompts of 4 slots; a bandwidth of 10 bytes/s makes seconds easy.
TRACE = {
    "rows": 3,
    "prompt_slots": 4,
    "weight_bytes": 100,
    "kv_bytes_per_token": 10,
    "targets": [2, 3, 6],
    "stretches": [
        {"first": 1, "last": 3, "running": 3, "slots": 3, "seconds": 60.0},
        {"first": 4, "last": 5, "running": 1, "slots": 1, "seconds": 40.0},
    ],
}


def test_rows_alive_at_a_step_are_those_whose_target_is_past_it() -> None:
    assert [alive_at(TRACE["targets"], s) for s in range(1, 7)] == [3, 2, 1, 1, 1, 0]


def test_the_bound_reads_the_weights_once_a_step_and_each_live_rows_cache() -> None:
    result = analyse(TRACE, bandwidth=10.0)
    # step i: 100 + alive x (4 + i) x 10 bytes -> 1: 100+150, 2: 100+120, 3: 100+70, 4: 100+80, 5: 100+90
    per_step = [250, 220, 170, 180, 190]
    assert result["bound_s"] == pytest.approx(sum(per_step) / 10)
    assert result["bound_weights_s"] == pytest.approx(5 * 100 / 10)
    # over the slots decoded: 3 slots in steps 1-3, 1 in 4-5 -> 100 + 3 x (4 + i) x 10 for i = 1..3
    assert result["bound_decoded_slots_s"] == pytest.approx((250 + 280 + 310 + 180 + 190) / 10)
    assert result["measured_s"] == 100.0 and result["decode_steps"] == 5 and result["longest_target"] == 6
    assert result["by_rows_alive"]["4"]["bound_s"] == pytest.approx(sum(per_step[:3]) / 10)  # 3 rows: bucket 4
    assert result["by_rows_alive"]["1"]["steps"] == 2
    assert (result["tail_steps"], result["tail_s"]) == (5, 100.0)  # every stretch had 8 rows or fewer
    lines = table(result)
    assert lines[0].startswith("3 rows, 5 decode steps, longest target 6: decode 100.0 s, bound 101.0 s")
    assert lines[0].endswith("121.0 s if every slot decoded read its K/V (ended rows skip theirs)")


def test_stretches_past_twice_their_slot_counts_pace_are_counted_with_their_excess() -> None:
    # a graph capture: one stretch of 4 steps at 8 s a step where the others of 4 slots take 1 s a step
    stretches = [
        {"first": 1 + 4 * i, "last": 4 + 4 * i, "running": 4, "slots": 4, "seconds": s}
        for i, s in enumerate([4.0, 32.0, 4.0, 4.4])
    ] + [{"first": 17, "last": 20, "running": 1, "slots": 1, "seconds": 2.0}]
    count, excess = outlier_excess(stretches)
    assert (count, excess) == (1, pytest.approx(32.0 - 4 * 1.05))  # the median of 1, 8, 1, 1.1 s a step
