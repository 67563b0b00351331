"""Recompute a source's published derived figures from its raw values, and say where they disagree.

A published throughput divides some token count by some time and some number of devices; the source
seldom says which. For each figure under ``published_derived`` this module recomputes it under every
plausible reading and reports which readings agree:

- sequences per step: train_batch_size x rollout_n when stated (or a recorded count); otherwise, for a
  source that only states "batch size per DP" b, both b x DP ranks and b x GPUs;
- divisor: "per-GPU" figures by the GPUs (as labelled) and, for the stated batch, by the data-parallel
  ranks; "total" figures by 1;
- tokens: as VERL counts them (response tokens for gen, prompt + response otherwise). When the mean
  prompt length is unknown, the recomputed value is a range: from prompt length 0 up to
  max_prompt_length, and the finding gives the mean prompt length the published value implies.

A reading agrees when the published value lies within ``rtol`` (relative) of its range; published
figures are rounded means over steps, so exact agreement is not expected. The verdict is
"consistent" when the figure's own label agrees, "only consistent if per-DP-rank" when only the per-DP
reading of the stated batch agrees, "only consistent with another batch" when only another batch does,
else "inconsistent". Each record's times are also checked for nesting: phases inside a span
(step, gen) cannot add up to more than the span.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass

from pytest_rlbench.records.metrics import PROMPT_AND_RESPONSE, TOKEN_BASIS
from pytest_rlbench.records.record import PER_GPU_TOKENS_PER_S, PublishedFigure, RunRecord
from pytest_rlbench.verdict.derived import num_sequences
from trainer.phases import SPANS

CONSISTENT = "consistent"
INCONSISTENT = "inconsistent"
PER_DP_ONLY = "only consistent if per-DP-rank"
OTHER_BATCH_ONLY = "only consistent with another batch"
UNCHECKABLE = "cannot check"

DEFAULT_RTOL = 0.02

# Spans and the phases timed directly inside them: trainer.phases.SPANS.


@dataclass(frozen=True)
class Interpretation:
    """One reading of a published figure and the value the raw numbers give under it."""

    label: str  # e.g. "per GPU (8), 512 sequences"
    sequences: int | None
    divisor: int
    low: float  # recomputed with the fewest tokens the raw values allow
    high: float | None  # with the most; None: no upper bound
    consistent: bool
    implied_prompt_mean: float | None = None  # mean prompt length the published value implies

    @property
    def recomputed(self) -> float:
        return self.low if self.high is None or self.high == self.low else (self.low + self.high) / 2


@dataclass(frozen=True)
class Finding:
    """The check of one published figure (or of one span's nesting) of one record."""

    record: str
    figure: str  # published_derived key, or "nesting/<span>"
    label: str
    published: float
    unit: str
    verdict: str
    interpretations: tuple[Interpretation, ...]
    detail: str

    @property
    def ok(self) -> bool:
        return self.verdict == CONSISTENT


def _agrees(published: float, low: float, high: float | None, rtol: float) -> bool:
    return published >= low * (1 - rtol) and (high is None or published <= high * (1 + rtol))


def _candidate_batches(record: RunRecord) -> list[tuple[int, str]]:
    """Sequences per step that the record allows, the stated one first."""
    n = num_sequences(record.tokens, record.config)
    if n.value is not None:
        return [(int(n.value), n.note)]
    per_dp, dp = record.config.batch_size_per_dp, record.config.parallelism.get("dp")
    if per_dp is None:
        return []
    world = record.hardware.world_size
    out = [(per_dp * dp, f"{per_dp} per DP x {dp} DP ranks")] if dp else []
    if per_dp * world not in [b for b, _ in out]:
        out.append((per_dp * world, f"{per_dp} per GPU x {world} GPUs"))
    return out


def _divisors(record: RunRecord, unit: str) -> list[tuple[int, str]]:
    """How the figure may have been divided, its own label first."""
    if unit != PER_GPU_TOKENS_PER_S:
        return [(1, "total")]
    world, dp = record.hardware.world_size, record.config.parallelism.get("dp")
    out = [(world, f"per GPU ({world})")]
    if dp and dp != world:
        out.append((dp, f"per DP rank ({dp})"))
    return out


def _interpret(
    record: RunRecord, fig: PublishedFigure, seconds: float, batch: tuple[int, str], div: tuple[int, str], rtol: float
) -> Interpretation:
    sequences, divisor = batch[0], div[0]
    response = record.tokens.response_length_mean or 0.0
    scale = sequences / (seconds * divisor)
    label = f"{div[1]}, {sequences} sequences"
    prompt_known = record.tokens.prompt_length_mean
    if TOKEN_BASIS[fig.phase] != PROMPT_AND_RESPONSE:
        low = high = response * scale
        implied = None
    elif prompt_known is not None:
        low = high = (prompt_known + response) * scale
        implied = None
    else:
        low = response * scale
        top = record.config.max_prompt_length
        high = (top + response) * scale if top is not None else None
        implied = fig.value / scale - response
    return Interpretation(label, sequences, divisor, low, high, _agrees(fig.value, low, high, rtol), implied)


def _verdict(readings: list[Interpretation], dp: int | None) -> str:
    if not readings:
        return UNCHECKABLE
    stated = readings[0]
    if stated.consistent:
        return CONSISTENT
    same_batch = [r for r in readings if r.sequences == stated.sequences]
    if any(r.consistent and r.divisor == dp for r in same_batch):
        return PER_DP_ONLY
    return OTHER_BATCH_ONLY if any(r.consistent for r in readings) else INCONSISTENT


def _fmt_reading(r: Interpretation) -> str:
    value = f"{r.low:.2f}" if r.high == r.low else f"{r.low:.2f}..{'inf' if r.high is None else f'{r.high:.2f}'}"
    implied = f" (implies mean prompt {r.implied_prompt_mean:.1f} tokens)" if r.implied_prompt_mean is not None else ""
    return f"{r.label}: {value}{implied}{' [agrees]' if r.consistent else ''}"


def check_published(record: RunRecord, key: str, rtol: float = DEFAULT_RTOL) -> Finding:
    """Recompute one published figure of ``record`` under every plausible reading."""
    fig = record.published_derived[key]
    label = f"{fig.label} ({fig.source})" if fig.source else fig.label
    phase = record.phases.get(fig.phase)
    batches = _candidate_batches(record)
    missing = [
        what
        for what, absent in (
            (f"{fig.phase} seconds", phase is None),
            ("mean response length", record.tokens.response_length_mean is None),
            ("sequences per step", not batches),
        )
        if absent
    ]
    if missing:
        detail = f"missing raw values: {', '.join(missing)}"
        return Finding(record.name, key, label, fig.value, fig.unit, UNCHECKABLE, (), detail)
    seconds = statistics.median(phase.seconds)
    divisors = _divisors(record, fig.unit)
    # The figure's own divisor over every candidate batch; the per-DP reading over the stated batch only.
    pairs = [(b, divisors[0]) for b in batches] + [(batches[0], d) for d in divisors[1:]]
    readings = [_interpret(record, fig, seconds, b, d, rtol) for b, d in pairs]
    verdict = _verdict(readings, record.config.parallelism.get("dp"))
    # Sequences the figure implies if every token it counts were a response token.
    implied_n = fig.value * seconds * readings[0].divisor / record.tokens.response_length_mean
    detail = f"implies {implied_n:.1f} sequences at the mean response length; " + "; ".join(
        _fmt_reading(r) for r in readings
    )
    return Finding(record.name, key, label, fig.value, fig.unit, verdict, tuple(readings), detail)


def check_nesting(record: RunRecord, rtol: float = DEFAULT_RTOL) -> list[Finding]:
    """Phases timed inside a span must not add up to more than the span (within ``rtol``)."""
    out = []
    for span, inner in SPANS.items():
        present = [p for p in inner if p in record.phases]
        if span not in record.phases or not present:
            continue
        total = sum(statistics.median(record.phases[p].seconds) for p in present)
        measured = statistics.median(record.phases[span].seconds)
        ok = measured >= total * (1 - rtol)
        reading = Interpretation(f"sum of {' + '.join(present)}", None, 1, total, None, ok)
        detail = f"{span} {measured:.3f} s, phases inside it {total:.3f} s ({measured - total:+.3f} s not in a phase)"
        verdict = CONSISTENT if ok else INCONSISTENT
        out.append(Finding(record.name, f"nesting/{span}", f"{span} spans its phases", measured, "s", verdict, (reading,), detail))
    return out


def check_record(record: RunRecord, rtol: float = DEFAULT_RTOL) -> list[Finding]:
    """Every check for one record: its published figures, then the nesting of its times."""
    return [check_published(record, key, rtol) for key in record.published_derived] + check_nesting(record, rtol)


# --- Findings in words: one sentence each, for the terminal report. --------------------------------


def _amount(r: Interpretation) -> str:
    if r.high is None:
        return f"at least {r.low:,.0f}"
    return f"{r.low:,.0f}" if r.high == r.low else f"between {r.low:,.0f} and {r.high:,.0f}"


def _nesting_sentence(f: Finding) -> str:
    span = f.figure.partition("/")[2]
    inside = f.interpretations[0].low if f.interpretations else 0.0
    if f.ok:
        return f"{f.record}: {span} ({f.published:.3g} s) covers the phases timed inside it ({inside:.3g} s)."
    return (
        f"{f.record}: the phases timed inside {span} add up to {inside:.3g} s, more than {span} itself "
        f"({f.published:.3g} s), so they overlap or come from different steps."
    )


def finding_sentence(f: Finding) -> str:
    """One finding as one sentence: what was published, and which reading of the raw values it fits."""
    if f.figure.startswith("nesting/"):
        return _nesting_sentence(f)
    figure = f"{f.record}: the published {f.label}, {f.published:,.2f} {f.unit},"
    if f.verdict == UNCHECKABLE:
        return f"{f.record}: the published {f.label} cannot be checked ({f.detail})."
    stated = f.interpretations[0]
    if f.verdict == CONSISTENT:
        return f"{figure} agrees with the times and token counts published beside it."
    as_labelled = f"read as labelled ({stated.label}), they give {_amount(stated)}"
    agreeing = [r for r in f.interpretations if r.consistent]
    per_dp = [r for r in agreeing if r.sequences == stated.sequences and r.divisor != stated.divisor]
    if f.verdict == PER_DP_ONLY and per_dp:
        return (
            f"{figure} fits its times and token counts only when divided by the {per_dp[0].divisor} "
            f"data-parallel ranks instead of the GPUs; {as_labelled}."
        )
    other_batch = [r for r in agreeing if r.sequences != stated.sequences]
    if f.verdict == OTHER_BATCH_ONLY and other_batch:
        return (
            f"{figure} fits its times and token counts only with {other_batch[0].sequences} sequences per "
            f"step, not the {stated.sequences} stated; {as_labelled}."
        )
    return f"{figure} fits no reading of its times and token counts; {as_labelled}."
