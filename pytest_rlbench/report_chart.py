"""A PNG of one step's phase breakdown: this run beside each baseline.

Left panel: seconds per step, one stacked horizontal bar per record, phases in the order of the phase
keys (trainer.phases.PHASE_KEYS). Right panel: the same bars as fractions of the step, so a CPU run and an 8 x H100 run can be compared
by shape. Phases nested in gen (generate_sequences, reshard) are drawn as parts of gen; time inside
the step that no phase accounts for is drawn as "other". save_checkpoint runs outside the step and is
left out. Drawn on matplotlib's Agg canvas: no display needed.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from pathlib import Path

from pytest_rlbench.record import RunRecord

GEN_PARTS: tuple[str, ...] = ("generate_sequences", "reshard")
TOP_LEVEL: tuple[str, ...] = ("reward", "old_log_prob", "ref", "adv", "update_actor")
OTHER = "other"
GEN_REST = "gen (rest)"

# Generation in blues, log-probs in greens, the update in orange: families read at a glance.
COLOURS: dict[str, str] = {
    "generate_sequences": "#2b6cb0",
    "reshard": "#90cdf4",
    "gen": "#4299e1",
    GEN_REST: "#bee3f8",
    "reward": "#805ad5",
    "old_log_prob": "#2f855a",
    "ref": "#68d391",
    "adv": "#a0aec0",
    "update_actor": "#dd6b20",
    OTHER: "#e2e8f0",
}


def _median(record: RunRecord, key: str) -> float | None:
    phase = record.phases.get(key)
    return statistics.median(phase.seconds) if phase is not None else None


def step_segments(record: RunRecord) -> list[tuple[str, float]]:
    """(label, seconds) of one step's parts, in the phase keys' order; only parts that were timed."""
    out: list[tuple[str, float]] = []
    parts = [(k, v) for k in GEN_PARTS if (v := _median(record, k)) is not None]
    gen = _median(record, "gen")
    out += parts
    if gen is not None:
        rest = gen - sum(v for _, v in parts)
        if not parts:
            out.append(("gen", gen))
        elif rest > 0:
            out.append((GEN_REST, rest))
    out += [(k, v) for k in TOP_LEVEL if (v := _median(record, k)) is not None]
    step = _median(record, "step")
    if step is not None and step > sum(v for _, v in out):
        out.append((OTHER, step - sum(v for _, v in out)))
    return out


def _hardware_label(record: RunRecord) -> str:
    hw = record.hardware
    nodes = f"{hw.nodes} node{'s' if hw.nodes != 1 else ''}"
    if hw.device == "cpu":
        return f"CPU, {nodes}, {hw.world_size} rank(s)"
    model = hw.gpu_model.removeprefix("NVIDIA ") if hw.gpu_model else "GPUs (model unknown)"
    return f"{nodes} x {hw.gpus_per_node} {model}"


def _text_colour(fill: str) -> str:
    """White on dark fills, near-black on light ones."""
    r, g, b = (int(fill[i : i + 2], 16) for i in (1, 3, 5))
    return "white" if 0.299 * r + 0.587 * g + 0.114 * b < 150 else "#1a202c"


def chart_path_for(report_path: str | Path) -> Path:
    """Where the chart goes: beside the JSON report, same name, .png."""
    return Path(report_path).with_suffix(".png")


def write_chart(path: str | Path, run: RunRecord, baselines: Sequence[RunRecord] = (), dpi: int = 120) -> Path:
    """Draw the run and each baseline's step breakdown to ``path`` (a PNG) and return the path."""
    # matplotlib is imported here, not with the plugin: every pytest start would pay for it otherwise.
    # A Figure with the Agg canvas draws without pyplot, so no global backend is set for the user.
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure
    from matplotlib.patches import Patch
    from matplotlib.ticker import PercentFormatter

    path = Path(path)
    records = [run, *baselines]
    rows = [(r, step_segments(r)) for r in records]
    height = 1.9 + 0.75 * len(rows)
    widest = max((sum(v for _, v in s) for _, s in rows), default=0.0) or 1.0
    fig = Figure(figsize=(13, height))
    FigureCanvasAgg(fig)
    ax_abs, ax_rel = fig.subplots(1, 2, sharey=True, gridspec_kw={"width_ratios": [3, 2]})
    used: set[str] = set()
    for y, (_, segments) in enumerate(rows):
        total = sum(v for _, v in segments)
        left = 0.0
        for label, seconds in segments:
            colour = COLOURS[label]
            hatch = "//" if label == OTHER else None
            ink = _text_colour(colour)
            ax_abs.barh(y, seconds, left=left, color=colour, edgecolor="white", linewidth=0.8, hatch=hatch)
            if seconds >= 0.09 * widest:  # label only the segments wide enough to hold it
                ax_abs.text(left + seconds / 2, y, f"{seconds:,.0f} s" if seconds >= 10 else f"{seconds:.2g} s", ha="center", va="center", fontsize=8, color=ink)
            share = seconds / total if total else 0.0
            ax_rel.barh(y, share, left=left / total if total else 0.0, color=colour, edgecolor="white", linewidth=0.8, hatch=hatch)
            if share >= 0.07:
                ax_rel.text((left + seconds / 2) / total, y, f"{share:.0%}", ha="center", va="center", fontsize=8, color=ink)
            left += seconds
            used.add(label)
        note = f"{total:,.1f} s" if segments else "no step phases timed"
        ax_abs.text(total, y, f"  {note}", va="center", fontsize=9, color="#2d3748")
    labels = [f"{r.name}{' (this run)' if i == 0 else ''}\n{_hardware_label(r)}" for i, (r, _) in enumerate(rows)]
    ax_abs.set_yticks(range(len(rows)), labels, fontsize=9)
    ax_abs.get_yticklabels()[0].set_fontweight("bold")
    ax_abs.invert_yaxis()  # this run on top
    ax_abs.set_xlabel("seconds per step")
    ax_abs.set_xlim(0, widest * 1.18)
    ax_rel.set_xlabel("share of the step")
    ax_rel.set_xlim(0, 1)
    ax_rel.xaxis.set_major_formatter(PercentFormatter(1.0))
    for ax in (ax_abs, ax_rel):
        ax.spines[["top", "right"]].set_visible(False)
        ax.grid(axis="x", color="#edf2f7", linewidth=0.8)
        ax.set_axisbelow(True)
    ax_abs.set_title("Time per step, by phase", loc="left", fontsize=11)
    ax_rel.set_title("Same, as fractions of the step", loc="left", fontsize=11)
    handles = [Patch(facecolor=COLOURS[k], hatch="//" if k == OTHER else None, label=k) for k in COLOURS if k in used]
    fig.suptitle(f"Step phase breakdown: {run.name} and {len(baselines)} baseline(s)", x=0.01, ha="left", fontsize=12, fontweight="bold")
    fig.legend(handles=handles, loc="lower center", ncol=min(len(handles), 10), frameon=False, fontsize=9)
    fig.tight_layout(rect=(0, 0.45 / height, 1, 1))
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=dpi)
    return path
