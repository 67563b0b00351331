"""Published figures recomputed from raw values: the numbers of RLinf's "Comparison with VeRL"
page (RLinf docs/source-en/rst_source/blog/compare_with_verl.rst) and RLinf's blog."""

from __future__ import annotations

import copy

import pytest

from pytest_rlbench.records.baselines import load_baseline
from pytest_rlbench.records.record import record_from_dict, record_to_dict
from pytest_rlbench.verdict.consistency import (
    CONSISTENT,
    INCONSISTENT,
    OTHER_BATCH_ONLY,
    PER_DP_ONLY,
    UNCHECKABLE,
    check_nesting,
    check_published,
    check_record,
)

VERL = load_baseline("verl-v0.5.0-1.5b")
RLINF = load_baseline("rlinf-1.5b")


def _reading(finding, label_start: str):
    return next(r for r in finding.interpretations if r.label.startswith(label_start))


def test_verl_gen_throughput_is_per_dp_rank_not_per_gpu() -> None:
    finding = check_published(VERL, "gen_throughput")
    assert finding.verdict == PER_DP_ONLY
    # 6992.96 x 260.922 s x 8 GPUs / 14254.84 tokens = 1024 responses, not the 512 of 128 per DP x 4
    assert "implies 1024.0 sequences" in finding.detail
    per_gpu = _reading(finding, "per GPU (8), 512 sequences")
    assert per_gpu.low == pytest.approx(512 * 14254.837890625 / (260.922 * 8))  # 3496.48
    assert not per_gpu.consistent
    per_dp = _reading(finding, "per DP rank (4), 512 sequences")
    assert per_dp.low == pytest.approx(6992.96, rel=1e-5) and per_dp.consistent
    assert _reading(finding, "per GPU (8), 1024 sequences").consistent


def test_verl_step_throughput_fits_about_512_sequences() -> None:
    finding = check_published(VERL, "step_throughput")
    assert finding.verdict == CONSISTENT
    # 20022.92 x 363.545 s = 7.28 M tokens, / 14254.84 = 510.6 sequences
    assert 20022.92 * 363.545 == pytest.approx(7.279e6, rel=1e-3)
    assert "implies 510.6 sequences" in finding.detail
    assert not _reading(finding, "total, 1024 sequences").consistent


def test_prev_logprob_throughput_implies_a_mean_prompt_length() -> None:
    finding = check_published(VERL, "prev_logprob_throughput")
    assert finding.verdict == CONSISTENT
    stated = finding.interpretations[0]
    assert stated.implied_prompt_mean == pytest.approx(52635.84 * 17.513 * 8 / 512 - 14254.837890625)
    assert 0 < stated.implied_prompt_mean < VERL.config.max_prompt_length
    rlinf = check_published(RLINF, "prev_logprob_throughput")
    assert rlinf.interpretations[0].implied_prompt_mean == pytest.approx(150.0, abs=0.5)


def test_rlinf_blog_gives_half_the_tables_gen_throughput() -> None:
    # The blog's per-GPU figures agree with 512 sequences over 8 GPUs; the comparison table's are twice
    # that.
    for record, blog in ((VERL, 3533.0), (RLINF, 3361.0)):
        finding = check_published(record, "gen_throughput_blog")
        assert finding.published == blog
        assert finding.verdict == CONSISTENT
        table = record.published_derived["gen_throughput"].value
        assert table / blog == pytest.approx(2.0, rel=0.02)
    assert check_published(RLINF, "gen_throughput").verdict == PER_DP_ONLY


def test_tolerance_decides_borderline_figures() -> None:
    # RLinf's gen throughput is 1.2% above the per-DP recomputation from its mean response length.
    assert check_published(RLINF, "gen_throughput", rtol=0.001).verdict == INCONSISTENT
    assert check_published(RLINF, "gen_throughput", rtol=0.02).verdict == PER_DP_ONLY


def _stated_batch_record(published: float) -> object:
    data = record_to_dict(VERL)
    data = copy.deepcopy(data)
    data["config"].update(train_batch_size=64, rollout_n=8, batch_size_per_dp=None)
    data["published_derived"] = {
        "gen": {"value": published, "unit": "per-GPU tokens/s", "phase": "gen", "label": "gen throughput"}
    }
    return record_from_dict(data)


def test_stated_batch_exact_and_wrong_figures() -> None:
    exact = 512 * 14254.837890625 / (260.922 * 8)
    assert check_published(_stated_batch_record(exact), "gen").verdict == CONSISTENT
    assert check_published(_stated_batch_record(exact * 1.10), "gen").verdict == INCONSISTENT
    # Twice the exact value is the per-DP reading of the same batch.
    assert check_published(_stated_batch_record(exact * 2), "gen").verdict == PER_DP_ONLY


def test_other_batch_verdict() -> None:
    # A total over 1024 responses (128 per GPU x 8 GPUs) fits neither 128 per DP x 4 nor a per-DP reading.
    data = copy.deepcopy(record_to_dict(VERL))
    total = 1024 * 14254.837890625 / 260.922
    data["published_derived"] = {"gen": {"value": total, "unit": "total tokens/s", "phase": "gen", "label": "gen"}}
    finding = check_published(record_from_dict(data), "gen")
    assert finding.verdict == OTHER_BATCH_ONLY
    assert [r.consistent for r in finding.interpretations] == [False, True]


def test_missing_raw_values_cannot_be_checked() -> None:
    data = copy.deepcopy(record_to_dict(VERL))
    data["tokens"]["response_length_mean"] = None
    finding = check_published(record_from_dict(data), "gen_throughput")
    assert finding.verdict == UNCHECKABLE
    assert "mean response length" in finding.detail


def test_nesting_of_spans() -> None:
    seven = load_baseline("verl-7b")
    findings = {f.figure: f for f in check_nesting(seven)}
    assert findings["nesting/step"].verdict == CONSISTENT
    assert findings["nesting/step"].interpretations[0].low == pytest.approx(
        325.086604 + 5.143515 + 21.583357 + 20.738621 + 0.465133 + 73.008971
    )
    assert findings["nesting/gen"].verdict == CONSISTENT
    data = copy.deepcopy(record_to_dict(seven))
    data["phases"]["generate_sequences"]["seconds"] = 400.0  # longer than gen itself
    broken = {f.figure: f for f in check_nesting(record_from_dict(data))}
    assert broken["nesting/gen"].verdict == INCONSISTENT


def test_check_record_covers_every_published_figure() -> None:
    findings = check_record(VERL)
    assert [f.figure for f in findings] == [*VERL.published_derived, "nesting/step"]
