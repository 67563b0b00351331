"""One verdict as one short line, from a comparison's fields: what a user acts on, under ``LINE_LIMIT``.

    pass          gen           1.90 vs 1.89 s    1.01x <= 1.15
    inconclusive  ref           0.520 vs 0.400 s  1.30x > 1.15   session slower: every phase slowed alike (rerun)
    FAIL          update_actor  0.100 vs 0.050 s  1.99x > 1.15   slower, CPU contention

The verdict, what was judged, the two values, the ratio against the threshold it was held to
(1 + tolerance for a time, 1 - tolerance for a throughput) and the reason in a few words. The
evidence behind it (the rank test's p, the session's pace, clocks, CPU use, the figures listed
beside) stays in the comparison's message (``verdict.judge``), which ``-v`` and the JSON report show
whole; only contention is named here, since it says to rerun on a quiet machine.
"""

from __future__ import annotations

from collections.abc import Sequence

from pytest_rlbench.records.metrics import (
    FAMILIES,
    PANEL,
    PANEL_FIGURES,
    STEP_METRICS,
    TIMING,
    family_of,
    format_value,
    metric_label,
)
from pytest_rlbench.verdict.compare import Comparison
from pytest_rlbench.verdict.judge import ALPHA
from pytest_rlbench.verdict.rank_test import rounds_needed

LINE_LIMIT = 160  # a verdict line's most characters (issue 30, item 4)

VERDICT_WORDS = {"fail": "FAIL", "pass": "pass", "inconclusive": "inconclusive", "not run": "not run"}
BESIDE = "beside"  # a row listed beside the gated figure of its phase, with no verdict of its own

# The judge's reasons in a few words: what to do where there is something to do.
REASON_WORDS = {
    "within tolerance": "",
    "too few rounds": f"too few rounds: {rounds_needed(ALPHA)} per side can tell",
    "session slower": "session slower: every phase slowed alike (rerun)",
    "not reproduced": "not reproduced when timed again",
    "GPU clocks": "GPU clocks: the SM clock ran lower",
    "same work": "same counted work: the machine ran slower",
    "more work": "more work: it dispatched more (counted)",
    "missing": "missing from this run",
    "not run": "",  # the verdict says it
}
# How the judge's message names contention (``judge.MachineEvidence``, ``judge.against_gpu``).
CONTENTION = ("CPU contention", "GPU contention")


def higher_is_better(c: Comparison) -> bool | None:
    """The figure's direction, from its family or its step or panel figure; else from a reason that
    names it; None where neither tells."""
    family = family_of(c.metric)
    if family in FAMILIES:
        return FAMILIES[family].higher_is_better
    if c.metric in STEP_METRICS:
        return STEP_METRICS[c.metric][1]
    if family == PANEL and (figure := c.metric.rpartition("/")[2]) in PANEL_FIGURES:
        return PANEL_FIGURES[figure][1]
    return {"lower": True, "slower": False, "higher": False}.get(c.reason)


def label(c: Comparison) -> str:
    """A phase's time by its phase alone (its values say seconds); any other figure by its name."""
    return c.phase if family_of(c.metric) == TIMING and c.phase else metric_label(c.metric)


def values(c: Comparison) -> str:
    """ "3.27 vs 3.04 s": the unit once where both sides have it; "-" for a side without a value."""
    if c.unit == "fraction" or c.measured is None:
        return f"{format_value(c.measured, c.unit)} vs {format_value(c.baseline, c.unit)}"
    return f"{format_value(c.measured, '')} vs {format_value(c.baseline, c.unit)}"


def _apart(ratio: float, bound: float) -> tuple[str, str]:
    """The two numbers with as many decimals as it takes for them to read apart (up to four)."""
    for digits in (2, 3, 4):
        a, b = f"{ratio:.{digits}f}", f"{bound:.{digits}f}"
        if a != b:
            break
    return a, b


def against_threshold(c: Comparison) -> str:
    """ "1.08x > 1.07": the ratio against the threshold it was held to; the ratio alone for a row
    with no verdict; "" without a ratio."""
    if c.ratio is None:
        return ""
    if c.verdict not in ("pass", "fail", "inconclusive"):
        return f"{c.ratio:.2f}x"
    higher = higher_is_better(c)
    if higher is None:
        return f"{c.ratio:.2f}x, tolerance {c.tolerance:.2f}"
    bound = 1 - c.tolerance if higher else 1 + c.tolerance
    ratio, threshold = _apart(c.ratio, bound)
    past = c.ratio < bound if higher else c.ratio > bound
    sign = ("<" if higher else ">") if past else (">=" if higher else "<=")
    measured = " (measured)" if "measured" in c.tolerance_source else ""  # a phase's own GPU tolerance
    return f"{ratio}x {sign} {threshold}{measured}"


def reason(c: Comparison) -> str:
    """The reason in a few words, naming contention where the verdict was given beside it."""
    if c.verdict == "reference":
        return ""
    words = REASON_WORDS.get(c.reason, c.reason)
    contention = next((name for name in CONTENTION if name in c.message), None)
    return f"{words}, {contention}" if contention and words else words or (contention or "")


def verdict_word(c: Comparison) -> str:
    return VERDICT_WORDS.get(c.verdict, BESIDE if c.reason == "reference" else c.verdict)


def short_verdict(c: Comparison, widths: Sequence[int] = (), word: bool = True) -> str:
    """One comparison as one line; ``widths`` pads its columns (verdict, label, values, ratio against
    threshold) to align a block's lines; ``word`` False leaves the verdict out (a failed gate test
    says it already)."""
    cells = [verdict_word(c)] if word else []
    cells += [label(c), values(c), against_threshold(c)]
    padded = [cell.ljust(width) for cell, width in zip(cells, widths, strict=False)] + cells[len(widths) :]
    return "  ".join(cell for cell in [*padded, reason(c)] if cell.strip()).rstrip()


def block_widths(comparisons: Sequence[Comparison]) -> tuple[int, ...]:
    """The widths that align the columns of ``comparisons``' lines."""
    columns = [verdict_word, label, values, against_threshold]
    return tuple(max((len(column(c)) for c in comparisons), default=0) for column in columns)
