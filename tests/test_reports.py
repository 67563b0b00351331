"""Report writers: terminal lines, the JSON report, the PNG chart."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import matplotlib.image
import pytest
from replay_records import replay_record

from pytest_rlbench.baselines import load_baseline
from pytest_rlbench.compare import compare, compare_all
from pytest_rlbench.consistency import check_record
from pytest_rlbench.record import RunRecord, record_from_dict
from pytest_rlbench.report_chart import OTHER, drawn_baselines, step_segments, work_label, write_chart
from pytest_rlbench.report_json import build_report, write_json_report
from pytest_rlbench.report_terminal import terminal_lines
from trainer.phases import PHASE_KEYS

RUN: dict[str, Any] = {
    "format_version": 1,
    "name": "cpu-run",
    "provenance": {"source": "pytest-rlbench run", "date": "2026-11-21"},
    "hardware": {"device": "cpu", "nodes": 1, "world_size": 2, "cpu_model": "x86_64", "cpus_per_node": 16},
    "model": {
        "name": "tiny",
        "num_layers": 2,
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_heads": 4,
        "num_kv_heads": 2,
        "head_dim": 16,
        "vocab_size": 100,
    },
    "config": {"train_batch_size": 2, "rollout_n": 2, "max_prompt_length": 8, "max_response_length": 16},
    "tokens": {"prompt_lengths": [4, 4, 4, 4], "response_lengths": [10, 12, 14, 16]},
    "phases": {
        "generate_sequences": {"seconds": [1.6, 1.7, 1.8]},
        "reshard": {"seconds": [0.1, 0.1, 0.1]},
        "gen": {"seconds": [1.8, 1.9, 2.0]},
        "reward": {"seconds": 0.05},
        "old_log_prob": {"seconds": 0.3},
        "ref": {"seconds": 0.3},
        "adv": {"seconds": 0.01},
        "update_actor": {"seconds": [0.9, 0.95, 1.0, 1.05, 1.1]},
        "step": {"seconds": [3.9, 4.0, 4.1]},
    },
}


def run_record(**phases: Any) -> RunRecord:
    data = copy.deepcopy(RUN)
    data["phases"].update(phases)
    return record_from_dict(data)


@pytest.fixture(scope="module")
def results() -> tuple[RunRecord, list, list]:
    run = run_record(update_actor={"seconds": [1.5, 1.55, 1.6, 1.65, 1.7]})
    local = run_record()
    local.name = "local-ci"
    baselines = [local, load_baseline("verl-v0.5.0-1.5b")]
    findings = [f for b in baselines for f in check_record(b)]
    return run, compare_all(run, baselines), findings


def test_terminal_summary(results) -> None:
    run, comparisons, findings = results
    lines = terminal_lines(comparisons, findings)
    text = "\n".join(lines)
    assert lines[0] == "baseline 'local-ci' (pytest-rlbench run): gate, 1 of 9 failed"  # 9 times judged, throughputs beside
    header = lines[1].split()
    assert header == ["phase", "metric", "measured", "baseline", "ratio", "tol", "verdict"]
    assert any(line.split()[:2] == ["update_actor", "seconds"] and "FAIL (slower)" in line for line in lines)
    assert "baseline 'verl-v0.5.0-1.5b' (RLinf documentation, page \"Compare with Verl\" (last updated 07/22/2025)): reference, not a gate" in lines
    assert "hardware.device: run 'cpu', baseline 'gpu'" in text
    assert "verl-v0.5.0-1.5b: gen throughput 6992.96 per-GPU tokens/s: only consistent if per-DP-rank" in text
    # one regression per measurement: the time's message carries its throughput beside it
    assert lines[-2] == "1 regression(s):"
    assert lines[-1].strip().startswith("update_actor seconds: 1.60 s vs 1.00 s in baseline 'local-ci' (ratio 1.60")
    assert "slower (p = 0.004 < 0.01, 5 vs 5 rounds); tokens/s per GPU " in lines[-1]
    assert all("\n" not in line for line in lines)


def test_terminal_summary_of_a_clean_gate() -> None:
    run = run_record()
    lines = terminal_lines([compare(run, run)])
    assert lines[0].endswith("gate, all 9 passed")
    assert not any("regression" in line for line in lines)


def test_json_report_has_every_key(results, tmp_path: Path) -> None:
    run, comparisons, findings = results
    path = write_json_report(tmp_path / "out" / "report.json", run, comparisons, findings, extra={"suite": "phases"})
    report = json.loads(path.read_text())
    assert report["format_version"] == 1 and report["passed"] is False
    assert set(report["run"]) == {"name", "provenance", "hardware", "model", "config", "tokens"}
    assert list(report["phases"]) == list(PHASE_KEYS)
    assert report["phases"]["save_checkpoint"] == {"seconds": None, "figures": {}}
    gen = report["phases"]["gen"]
    assert gen["seconds"] == {"median": 1.9, "min": 1.8, "max": 2.0, "samples": [1.8, 1.9, 2.0]}
    assert gen["figures"]["tokens_per_s_per_gpu"]["value"] == pytest.approx(52 / 1.9 / 2)
    assert report["phases"]["update_actor"]["figures"]["mfu"]["value"] is None  # a CPU run has no peak
    assert "CPU run" in report["phases"]["update_actor"]["figures"]["mfu"]["reason"]
    row = next(c for c in report["comparisons"] if c["metric"] == "timing_s/update_actor" and c["source"] == "local-ci")
    assert {"metric", "phase", "measured", "baseline", "source", "ratio", "tolerance", "verdict", "message"} <= set(row)
    assert (row["measured"], row["baseline"], row["tolerance"], row["verdict"]) == (1.6, 1.0, 0.1, "fail")
    assert [b["mode"] for b in report["baselines"]] == ["gate", "reference"]
    assert {f["figure"] for f in report["consistency"]} >= {"gen_throughput", "step_throughput", "nesting/step"}
    assert report["extra"] == {"suite": "phases"}


def test_json_report_without_baselines_passes() -> None:
    report = build_report(run_record())
    assert report["passed"] is True and report["comparisons"] == [] and report["consistency"] == []


def test_step_segments_follow_the_phase_key_order() -> None:
    seven = load_baseline("verl-7b")
    segments = step_segments(seven)
    assert [label for label, _ in segments] == [
        "generate_sequences",
        "reshard",
        "gen (rest)",
        "reward",
        "old_log_prob",
        "ref",
        "adv",
        "update_actor",
        OTHER,
    ]
    assert sum(v for _, v in segments) == pytest.approx(447.358303)  # the whole step, nothing twice
    assert dict(segments)["gen (rest)"] == pytest.approx(325.086604 - 316.959756 - 4.191206)
    assert step_segments(load_baseline("rlinf-1.5b"))[0] == ("gen", 266.083)


def test_chart_draws_only_baselines_of_the_run_model_with_their_per_gpu_work() -> None:
    rlinf, seven = load_baseline("rlinf-1.5b"), load_baseline("verl-7b")
    replay = replay_record(rlinf, world_size=1)
    drawn, left_off = drawn_baselines(replay, [seven, rlinf])
    assert drawn == [rlinf]
    assert left_off == ["verl-7b (DeepSeek-R1-Distill-Qwen-7B: another model than this run's)"]
    assert work_label(replay) == "64 seq/GPU, response 13,975 tokens"
    assert work_label(rlinf, replay) == "64 seq/GPU, response 13,975 tokens; same per-GPU work"
    tiny_drawn, _ = drawn_baselines(run_record(), [seven, rlinf])
    assert tiny_drawn == []  # a tiny CPU run is drawn alone, never beside a 1.5B or 7B step
    assert work_label(run_record(), rlinf).endswith("; other per-GPU work")


def test_chart_is_written(tmp_path: Path) -> None:
    rlinf = load_baseline("rlinf-1.5b")
    run = replay_record(rlinf, world_size=1)
    baselines = [load_baseline("verl-7b"), rlinf, load_baseline("verl-v0.5.0-1.5b")]
    path = write_chart(tmp_path / "chart.png", run, baselines)
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    assert len(data) > 20_000
    image = matplotlib.image.imread(path)
    assert image.shape[1] > 1000 and image.shape[0] > 400
    assert image[..., :3].std() > 0.05  # not a blank canvas


def test_terminal_summary_counts_inconclusive_and_not_run_apart_from_failures() -> None:
    base = run_record(update_actor={"seconds": [0.9, 1.0, 1.05, 1.1]}, ref={"seconds": 0.3})
    base.name = "local-ci"
    run = run_record(update_actor={"seconds": [1.6, 1.62, 1.64, 1.66]})
    del run.phases["ref"]
    result = compare(run, base)
    lines = terminal_lines([result])
    # 4 vs 4 rounds cannot reach p < 0.01: inconclusive, listed, and not a regression
    assert lines[0].endswith("gate, 7 of 8 passed, 1 inconclusive, 1 phase not run")
    assert any(line.split()[:2] == ["update_actor", "seconds"] and "inconclusive (too few rounds)" in line for line in lines)
    assert any(line.split()[:2] == ["ref", "seconds"] and line.rstrip().endswith("not run") for line in lines)
    assert lines[-2] == "1 inconclusive (past tolerance, too few rounds to tell; not a failure):"
    assert "5 rounds per side can" in lines[-1]
    assert not any("regression" in line for line in lines) and result.passed
