"""benchmarks/overlap_probe.py's reading of one measured pair (old_log_prob beside the tail's decode):
what each did while the forward ran, at the two extremes and on the H100 figures kept in docs/."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "benchmarks"))

from overlap_probe import pair_paces  # noqa: E402

STEPS = 400  # 400 decode steps of 5 ms alone: 2 s of decode; a 1 s forward alone


def pair(over_ms_per_step: float, span_s: float) -> dict[str, float]:
    return {"decode_alone_ms_per_step": 5.0, "decode_ms_per_step_over_the_pair": over_ms_per_step,
            "forward_alone_s": 1.0, "forward_span_s": span_s}


def test_each_at_its_own_pace_sums_to_two_and_saves_the_whole_forward() -> None:
    paces = pair_paces(STEPS, pair(5.0, 1.0))  # the decode unslowed, the forward in its own second
    assert paces == pytest.approx({"decode_pace": 1.0, "forward_pace": 1.0, "paces_summed": 2.0, "saved_share": 1.0})


def test_one_after_the_other_sums_to_one_and_saves_nothing() -> None:
    # the forward first, the decode waiting for it: the decode's 2 s end 1 s later than alone
    paces = pair_paces(STEPS, pair(7.5, 1.0))
    assert paces == pytest.approx({"decode_pace": 0.0, "forward_pace": 1.0, "paces_summed": 1.0, "saved_share": 0.0})


def test_the_kept_h100_pairs_share_the_gpu_with_little_gain() -> None:
    """The figures docs/benchmarks.md gives: each pair's paces sum to 1.04-1.07, 4.6-9.1% of the forward
    saved, recomputed from the saved measurements."""
    kept = ROOT / "docs" / "benchmarks" / "2026-11-28" / "overlap_probe_h100"
    sums, saved = [], []
    for name in ("overlap_probe_27k.json", "overlap_probe_16k.json"):
        data = json.loads((kept / name).read_text())
        for row in data["rows"]:
            for measured in row["rounds"]:
                paces = pair_paces(row["steps"], measured)
                sums.append(paces["paces_summed"])
                saved.append(paces["saved_share"])
    assert len(sums) == 14
    assert 1.035 <= min(sums) and max(sums) <= 1.075, sums
    assert 0.045 <= min(saved) and max(saved) <= 0.095, saved
