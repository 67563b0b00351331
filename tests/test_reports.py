"""Report writers: terminal lines and the JSON report (the PNG chart: test_chart.py)."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest
from shared_parts import CPU_HARDWARE, tiny_record

from pytest_rlbench.records.baselines import load_baseline
from pytest_rlbench.records.files import dumps_report
from pytest_rlbench.records.record import RunRecord, record_from_dict
from pytest_rlbench.reports.json_report import build_report
from pytest_rlbench.reports.terminal import finding_lines, terminal_lines
from pytest_rlbench.verdict.compare import compare, compare_all
from pytest_rlbench.verdict.consistency import check_record
from trainer.phases import PHASE_KEYS

RUN: dict[str, Any] = tiny_record(
    "cpu-run",
    CPU_HARDWARE,
    phases={
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
)


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
    assert (
        lines[0] == "baseline 'local-ci' (pytest-rlbench run): gate, 1 of 9 failed"
    )  # 9 times judged, throughputs beside
    # one short line per judged figure: verdict, values, ratio against its threshold, reason
    verdicts = lines[1:10]
    assert [line.split()[1] for line in verdicts] == [p for p in PHASE_KEYS if p in RUN["phases"]]
    assert "  FAIL  update_actor        1.60 vs 1.00 s    1.60x > 1.10   slower" in verdicts, verdicts
    assert "  pass  gen                 1.90 vs 1.90 s    1.00x <= 1.10" in verdicts, verdicts
    assert "tokens/s" not in "\n".join(verdicts)  # listed beside its time: with -v
    # a reference is one line naming the kinds of difference; its figures and the list only with -v
    assert (
        "reference 'verl-v0.5.0-1.5b': differs in hardware, work per step and model "
        "(-v shows its figures and 9 differences)"
    ) in lines
    assert "hardware.device: run 'cpu', baseline 'gpu'" not in text and "286.00" not in text
    # the published figures' consistency concerns the baselines, not the run: only with -v
    assert "consistency" not in text and "data-parallel ranks" not in text
    verbose = "\n".join(terminal_lines(comparisons, findings, verbose=True))
    assert (
        "verl-v0.5.0-1.5b: the published gen throughput, 6,992.96 per-GPU tokens/s, fits its times and "
        "token counts only when divided by the 4 data-parallel ranks instead of the GPUs"
    ) in verbose
    # the evidence (rank test, pace, figures beside) is in -v and the JSON report; the last line says so
    assert lines[-1] == (
        "1 regression(s): the whole verdicts (p-values, pace, clocks, CPU use) with -v "
        "and in a JSON report with --rl-report PATH"
    )
    assert "p = " not in text and "pace" not in text.replace("(p-values, pace,", "")
    assert terminal_lines(comparisons, findings, report="out/r.json")[-1].endswith(
        " and in the JSON report out/r.json"
    )
    assert all("\n" not in line for line in lines)


def test_verbose_puts_each_verdicts_whole_message_under_its_line(results) -> None:
    _, comparisons, _ = results
    lines = terminal_lines(comparisons, verbose=True)
    at = next(i for i, line in enumerate(lines) if line.split()[:2] == ["FAIL", "update_actor"])
    # one regression per measurement: the time's message carries its throughput beside it
    message = lines[at + 1]
    assert message.startswith(
        "      update_actor seconds: 1.60 s vs 1.00 s in baseline 'local-ci' (ratio 1.60"
    )
    assert "slower (p = 0.004 < 0.01, 5 vs 5 rounds); against the session's pace too" in message
    assert "; tokens/s per GPU " in message
    # the figures listed beside the judged ones, and no line saying where the details are: they are here
    assert any(line.split()[:3] == ["beside", "gen", "tokens/s"] for line in lines), lines
    assert not any("the whole verdicts" in line for line in lines)


def _reference_block(lines: list[str], name: str) -> list[str]:
    start = next(i for i, line in enumerate(lines) if line.startswith(f"baseline '{name}'"))
    end = next((i for i in range(start + 1, len(lines)) if not lines[i].startswith("  ")), len(lines))
    return lines[start:end]


def _rows(block: list[str], header: list[str]) -> dict[tuple[str, ...], list[str]]:
    """The table rows after ``header`` in a reference block, keyed by (phase, first word of figure)."""
    at = next(i for i, line in enumerate(block) if line.split() == header)
    return {tuple(line.split()[:2]): line.split() for line in block[at + 1 :]}


def test_a_reference_of_another_model_shows_its_figures_alone_with_v(results) -> None:
    _, comparisons, findings = results
    block = _reference_block(terminal_lines(comparisons, findings, verbose=True), "verl-v0.5.0-1.5b")
    # a 1.5B on H100s beside a tiny random CPU model would read as a speed-up: its figures stand alone
    assert "  its figures (another model: not comparable with this run's):" in block
    rows = _rows(block, ["phase", "figure", "baseline"])
    # phase, figure ("MFU" or "ms per 1k tokens per device"), the baseline's value: no column of this run's
    assert all(len(cells) == (3 if cells[1] == "MFU" else 8) for cells in rows.values()), rows
    assert rows[("gen", "ms")][-1] == "286.00"  # VERL's 3,496 tokens/s/GPU as ms per 1k tokens per device
    assert rows[("update_actor", "MFU")][-1] == "23.0%"


def test_a_reference_of_the_same_model_sets_what_carries_across_work_beside_this_run() -> None:
    run = run_record()
    other = record_from_dict({**copy.deepcopy(RUN), "name": "bigger-batch"})
    other.config.train_batch_size = 4  # the same model and machine, other work: a reference
    block = _reference_block(terminal_lines([compare(run, other)], verbose=True), "bigger-batch")
    rows = _rows(block, ["phase", "figure", "(carries", "across", "work)", "this", "run", "baseline"])
    # gen: 1.9 s for 52 response tokens on 2 workers: 73,077 ms per 1k tokens per worker; no ratio
    assert rows[("gen", "ms")][-2:] == ["73,077", "73,077"]
    assert all(len(cells) == (4 if cells[1] == "MFU" else 9) for cells in rows.values()), (
        rows
    )  # no ratio column


def test_verbose_lists_every_difference_of_a_reference(results) -> None:
    _, comparisons, _ = results
    block = _reference_block(terminal_lines(comparisons, verbose=True), "verl-v0.5.0-1.5b")
    assert block[1] == "  it differs in:"
    assert "    - hardware.device: run 'cpu', baseline 'gpu'" in block
    assert "    - config.max_response_length: run 16, baseline 27648" in block


def test_each_baseline_is_labelled_by_its_own_source_and_no_seed_is_named() -> None:
    rlinf, verl = load_baseline("rlinf-1.5b"), load_baseline("verl-v0.5.0-1.5b")
    lines = terminal_lines(compare_all(run_record(), [rlinf, verl]), verbose=True)
    headings = [line for line in lines if line.startswith("baseline ")]
    assert headings[0].startswith("baseline 'rlinf-1.5b' (RLinf's own run,")
    assert headings[1].startswith("baseline 'verl-v0.5.0-1.5b' (VERL v0.5.0's run,")
    assert not any("Compare with Verl" in line for line in headings)
    readable = [
        Path(__file__).parents[1] / "README.md",
        *(Path(__file__).parents[1] / "baselines").glob("*.json"),
    ]
    for path in readable:
        assert "seed" not in path.read_text().lower().replace("seeded", ""), path


def test_each_consistency_finding_reads_as_one_sentence(results) -> None:
    _, _, findings = results
    assert finding_lines(findings) == []  # about the baselines' published figures: only with -v
    lines = finding_lines(findings, verbose=True)
    sentences = [line.strip() for line in lines[1:] if not line.startswith("      (")]
    assert len(sentences) == len(findings)
    for sentence in sentences:
        assert sentence.endswith(".") and ". " not in sentence, sentence
    nesting = next(s for s in sentences if s.startswith("local-ci: step"))
    assert nesting == "local-ci: step (4 s) covers the phases timed inside it (3.56 s)."
    # only the findings of the baselines this run was compared with
    assert not any("local-ci" in line for line in finding_lines(findings, True, ["verl-v0.5.0-1.5b"]))


def test_terminal_summary_of_a_clean_gate() -> None:
    run = run_record()
    lines = terminal_lines([compare(run, run)])
    assert lines[0].endswith("gate, all 9 passed")
    assert not any("regression" in line for line in lines)


def test_json_report_has_every_key(results, tmp_path: Path) -> None:
    run, comparisons, findings = results
    report = json.loads(dumps_report(build_report(run, comparisons, findings, extra={"suite": "phases"})))
    assert report["format_version"] == 1 and report["passed"] is False
    assert set(report["run"]) == {"name", "provenance", "hardware", "model", "config", "tokens"}
    assert list(report["phases"]) == list(PHASE_KEYS)
    assert report["phases"]["save_checkpoint"] == {"seconds": None, "figures": {}}
    gen = report["phases"]["gen"]
    assert gen["seconds"] == {"median": 1.9, "min": 1.8, "max": 2.0, "samples": [1.8, 1.9, 2.0]}
    assert gen["figures"]["tokens_per_s_per_gpu"]["value"] == pytest.approx(52 / 1.9 / 2)
    assert report["phases"]["update_actor"]["figures"]["mfu"]["value"] is None  # a CPU run has no peak
    assert "CPU run" in report["phases"]["update_actor"]["figures"]["mfu"]["reason"]
    row = next(
        c
        for c in report["comparisons"]
        if c["metric"] == "timing_s/update_actor" and c["source"] == "local-ci"
    )
    assert {
        "metric",
        "phase",
        "measured",
        "baseline",
        "source",
        "ratio",
        "tolerance",
        "verdict",
        "message",
    } <= set(row)
    assert (row["measured"], row["baseline"], row["tolerance"], row["verdict"]) == (1.6, 1.0, 0.1, "fail")
    assert [b["mode"] for b in report["baselines"]] == ["gate", "reference"]
    assert {f["figure"] for f in report["consistency"]} >= {
        "gen_throughput",
        "step_throughput",
        "nesting/step",
    }
    assert report["extra"] == {"suite": "phases"}


def test_json_report_without_baselines_passes() -> None:
    report = build_report(run_record())
    assert report["passed"] is True and report["comparisons"] == [] and report["consistency"] == []


def test_json_report_says_which_phases_were_timed_inside_the_step() -> None:
    report = build_report(run_record(ref={"seconds": [0.2, 0.21], "inside_step": True}))
    assert report["phases"]["ref"]["inside_step"] is True
    assert [k for k, row in report["phases"].items() if "inside_step" in row] == ["ref"]


def test_a_disagreement_reads_as_one_sentence_saying_what_disagrees() -> None:
    record = run_record(step={"seconds": [1.0]})  # shorter than the phases timed inside it
    lines = finding_lines(check_record(record), verbose=True)
    assert next(line for line in lines if "inside step" in line) == (
        "  cpu-run: the phases timed inside step add up to 3.56 s, more than step itself (1 s), "
        "so they overlap or come from different steps."
    )


def test_terminal_summary_counts_inconclusive_and_not_run_apart_from_failures() -> None:
    base = run_record(update_actor={"seconds": [0.9, 1.0, 1.05, 1.1]}, ref={"seconds": 0.3})
    base.name = "local-ci"
    run = run_record(update_actor={"seconds": [1.6, 1.62, 1.64, 1.66]})
    del run.phases["ref"]
    result = compare(run, base)
    lines = terminal_lines([result])
    # 4 vs 4 rounds cannot reach p < 0.01: inconclusive, listed, and not a regression
    assert lines[0].endswith("gate, 7 of 8 passed, 1 inconclusive, 1 phase not run")
    unsure = next(line for line in lines if line.split()[:2] == ["inconclusive", "update_actor"])
    assert " ".join(unsure.split()).endswith("1.59x > 1.10 too few rounds: 5 per side can tell"), unsure
    assert [line.split() for line in lines if "ref" in line.split()] == [
        ["not", "run", "ref", "-", "vs", "0.300", "s"]
    ]
    assert lines[-1].startswith("1 inconclusive (not a failure): the whole verdicts ")
    assert not any("regression" in line for line in lines) and result.passed
