"""One verdict line per figure under 160 characters (issue 30, item 4): the verdict, the values, the
ratio against its threshold and the reason, from the comparison's fields; the evidence (p-values,
pace, clocks, CPU use, the figures beside) stays in the message, which -v and the JSON report show."""

from __future__ import annotations

import pytest

from pytest_rlbench.reports.verdict_lines import LINE_LIMIT, block_widths, short_verdict
from pytest_rlbench.verdict.derived import Figure
from pytest_rlbench.verdict.judge import Comparison, MachineEvidence, judge
from pytest_rlbench.verdict.machine_load import GpuEvidence
from pytest_rlbench.verdict.noise import DefaultTolerance
from pytest_rlbench.verdict.session_pace import SessionPace

BASELINE = "a-baseline-name-as-long-as-people-give-them"
PEERS = SessionPace("update_actor", (("gen", 1.02), ("old_log_prob", 0.98), ("ref", 1.01), ("step", 1.0)))
SLOW_PEERS = SessionPace("update_actor", (("gen", 1.5), ("old_log_prob", 1.55), ("ref", 1.6), ("step", 1.5)))


def seconds(phase: str, values: list[float]) -> Figure:
    return Figure(f"timing_s/{phase}", sorted(values)[len(values) // 2], "s", False, tuple(values))


def rounds(centre: float, n: int = 5) -> list[float]:
    return [centre * (1 + 0.002 * (i - n // 2)) for i in range(n)]  # the median is centre


def line_of(c: Comparison) -> str:
    return "  " + short_verdict(c, block_widths([c]))  # as the summary indents it


def within_limit(c: Comparison) -> str:
    line = line_of(c)
    assert len(line) <= LINE_LIMIT, f"{len(line)} characters: {line!r}\n(message: {c.message!r})"
    return line


def test_a_pass_is_one_line_with_its_ratio_under_its_threshold() -> None:
    c = judge(
        seconds("generate_sequences", rounds(1.7)),
        seconds("generate_sequences", rounds(1.69)),
        BASELINE,
        0.10,
    )
    assert c.verdict == "pass", c.message
    assert within_limit(c).split() == [
        "pass",
        "generate_sequences",
        "1.70",
        "vs",
        "1.69",
        "s",
        "1.01x",
        "<=",
        "1.10",
    ]


def test_a_cpu_failure_with_pace_contention_and_retiming_is_short_and_its_message_long() -> None:
    run, base = seconds("update_actor", rounds(1.6)), seconds("update_actor", rounds(1.0))
    contended = MachineEvidence(other_cores=1.7, steal_cores=0.05, base_other_cores=0.6)
    c = judge(run, base, BASELINE, 0.15, run_time=1.6, machine=contended, pace=PEERS)
    assert c.verdict == "fail" and "CPU contention" in c.message, c.message
    assert within_limit(c).split() == [
        "FAIL",
        "update_actor",
        "1.60",
        "vs",
        "1.00",
        "s",
        "1.60x",
        ">",
        "1.15",
        "slower,",
        "CPU",
        "contention",
    ]
    # paced by its peers, re-timed, and the CPU used beside: the message is the long evidence
    busy = MachineEvidence(other_cores=0.1, steal_cores=0.2)
    c = judge(
        run,
        base,
        BASELINE,
        0.15,
        run_time=1.6,
        machine=busy,
        pace=PEERS,
        retimed=tuple(rounds(1.61)),
        pace_again=PEERS,
    )
    assert c.verdict == "fail" and len(c.message) > 2 * LINE_LIMIT, c.message
    assert "against the session's pace too" in c.message and "re-timed" in c.message
    line = within_limit(c)
    assert line.endswith("1.60x > 1.15  slower") and "p =" not in line and "pace" not in line, line


def test_a_gpu_failure_names_its_tolerance_threshold_and_keeps_the_clocks_for_the_message() -> None:
    run, base = seconds("update_actor", rounds(3.27)), seconds("update_actor", rounds(3.04))
    gpu = GpuEvidence(sm_clock=1890, base_sm_clock=1905, power_capped=1.0)
    tolerance = DefaultTolerance(0.07, "update_actor's measured GPU default")
    c = judge(run, base, BASELINE, tolerance, run_time=3.27, device="gpu", gpu=gpu)
    assert c.verdict == "fail" and "SM clock 1890 vs 1905 MHz" in c.message, c.message
    assert within_limit(c).split()[-5:] == ["1.08x", ">", "1.07", "(measured)", "slower"]


@pytest.mark.parametrize(
    ("pace", "run_rounds", "reason"),
    [
        (SLOW_PEERS, 5, "session slower: every phase slowed alike (rerun)"),
        (None, 4, "too few rounds: 5 per side can tell"),
    ],
)
def test_an_inconclusive_verdict_is_one_line_saying_what_to_do(
    pace: SessionPace | None, run_rounds: int, reason: str
) -> None:
    run, base = (
        seconds("update_actor", rounds(1.6, run_rounds)),
        seconds("update_actor", rounds(1.0, run_rounds)),
    )
    c = judge(run, base, BASELINE, 0.15, run_time=1.6, pace=pace)
    assert c.verdict == "inconclusive", c.message
    line = within_limit(c)
    assert line.split()[:2] == ["inconclusive", "update_actor"] and line.endswith(
        f"1.60x > 1.15  {reason}"
    ), line


def test_a_throughput_is_held_below_one_and_named_by_its_figure() -> None:
    run = Figure("tokens_per_s_per_gpu/update_actor", 2797.0, "tokens/s/GPU", True, (2797.0,))
    base = Figure("tokens_per_s_per_gpu/update_actor", 3496.0, "tokens/s/GPU", True, (3496.0,))
    c = judge(run, base, BASELINE, 0.03)
    assert within_limit(c).split() == [
        "FAIL",
        "update_actor",
        "tokens/s",
        "per",
        "GPU",
        "2,797",
        "vs",
        "3,496",
        "tokens/s/GPU",
        "0.80x",
        "<",
        "0.97",
        "lower",
    ]


def test_a_ratio_at_its_threshold_reads_apart_from_it() -> None:
    c = judge(seconds("gen", [1.1004] * 5), seconds("gen", [1.0] * 5), BASELINE, 0.10)
    assert "1.100x > 1.100" not in line_of(c) and "1.1004x > 1.1000" in line_of(c), line_of(c)


def test_a_missing_figure_and_a_phase_not_run_say_so() -> None:
    base = seconds("ref", [0.5])
    missing = judge(None, base, BASELINE, 0.10)
    assert line_of(missing).split() == [
        "FAIL",
        "ref",
        "-",
        "vs",
        "0.500",
        "s",
        "missing",
        "from",
        "this",
        "run",
    ]
    not_run = judge(None, base, BASELINE, 0.10, phase_ran=False)
    assert line_of(not_run).split() == ["not", "run", "ref", "-", "vs", "0.500", "s"]
