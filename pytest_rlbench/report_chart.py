"""A PNG of one step's phase breakdown: this run beside each baseline of the same model.

Only baselines of the run's model (the same architecture and dtype) are drawn: seconds of another
model's step say nothing about this one's, so those are named in a note under the chart instead. Each
bar's label gives its hardware and its per-GPU work (sequences per GPU, mean response length) and says
whether that is the run's own per-GPU work, so a replay of a baseline reads on the same scale: the
same per-GPU work, seconds per step.

Left panel: seconds per step, one stacked horizontal bar per record, phases in the order of the
phase keys (trainer.phases.PHASE_KEYS). Right panel: the same bars as fractions of the step, so runs
on different hardware can be compared by shape. Phases nested in gen (generate_sequences, reshard)
are drawn as parts of gen; time inside the step that no phase accounts for is drawn as "other".
save_checkpoint runs outside the step and is left out. Drawn on matplotlib's Agg canvas: no display needed.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from pathlib import Path

from pytest_rlbench.record import RunRecord
from pytest_rlbench.workload import model_differences, workload_matches, workload_tokens

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


def drawn_baselines(run: RunRecord, baselines: Sequence[RunRecord]) -> tuple[list[RunRecord], list[str]]:
    """(the baselines of the run's model, a note for each other one: left off the chart)."""
    drawn, notes = [], []
    for b in baselines:
        if model_differences(run.model, b.model):
            notes.append(f"{b.name} ({b.model.name}: another model than this run's)")
        else:
            drawn.append(b)
    return drawn, notes


def work_label(record: RunRecord, run: RunRecord | None = None) -> str:
    """A record's per-GPU work in a few words; beside ``run``, whether it is the run's own."""
    tokens = workload_tokens(record)
    sequences = tokens.num_sequences or (tokens.response_lengths and len(tokens.response_lengths))
    mean = tokens.response_length_mean
    if mean is None and tokens.response_lengths:
        mean = sum(tokens.response_lengths) / len(tokens.response_lengths)
    per_gpu = f"{sequences / record.hardware.world_size:g} seq/GPU" if sequences else "seq/GPU unknown"
    text = per_gpu + (f", response {mean:,.0f} tokens" if mean is not None else "")
    if run is None:
        return text
    return text + ("; same per-GPU work" if not workload_matches(run, record) else "; other per-GPU work")


def _text_colour(fill: str) -> str:
    """White on dark fills, near-black on light ones."""
    r, g, b = (int(fill[i : i + 2], 16) for i in (1, 3, 5))
    return "white" if 0.299 * r + 0.587 * g + 0.114 * b < 150 else "#1a202c"


def chart_path_for(report_path: str | Path) -> Path:
    """Where the chart goes: beside the JSON report, same name, .png."""
    return Path(report_path).with_suffix(".png")


def write_chart(path: str | Path, run: RunRecord, baselines: Sequence[RunRecord] = (), dpi: int = 120) -> Path:
    """Draw the run's and each same-model baseline's step breakdown to ``path`` (a PNG); return the path."""
    # matplotlib is imported here, not with the plugin: every pytest start would pay for it otherwise.
    # A Figure with the Agg canvas draws without pyplot, so no global backend is set for the user.
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure
    from matplotlib.patches import Patch
    from matplotlib.ticker import PercentFormatter

    path = Path(path)
    drawn, left_off = drawn_baselines(run, baselines)
    records = [run, *drawn]
    rows = [(r, step_segments(r)) for r in records]
    height = 2.2 + 0.95 * len(rows)
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
    labels = [
        f"{r.name}{'' if i else ' (this run)'}\n{_hardware_label(r)}\n{work_label(r, run if i else None)}"
        for i, (r, _) in enumerate(rows)
    ]
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
    title = f"Step phase breakdown: {run.name} and {len(drawn)} baseline(s) of the same model"
    fig.suptitle(title, x=0.01, ha="left", fontsize=12, fontweight="bold")
    note_room = 0.3 / height if left_off else 0.0  # inches for the note under the legend
    columns = min(len(handles), 10)
    fig.legend(
        handles=handles,
        loc="lower center",
        bbox_to_anchor=(0.5, note_room),
        ncol=columns,
        frameon=False,
        fontsize=9,
    )
    if left_off:
        note = "Not drawn, not comparable: " + "; ".join(left_off)
        fig.text(0.01, 0.01, note, ha="left", va="bottom", fontsize=8, color="#4a5568")
    fig.tight_layout(rect=(0, 0.6 / height + note_room, 1, 1))
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=dpi)
    return path
