"""The report's chart (pytest_rlbench.reports.chart), read back from its Figure: which bars stand beside
which, their values against the summary's, the axis, the labels, and the legend and note inside it."""

from __future__ import annotations

import copy
import dataclasses
from pathlib import Path
from typing import Any

import matplotlib.image
import pytest
from replay_records import replay_record
from shared_parts import CPU_HARDWARE, tiny_record

from pytest_rlbench.records.baselines import load_baseline
from pytest_rlbench.records.record import Metric, RunRecord, TokenCounts, record_from_dict
from pytest_rlbench.reports.chart import (
    MEASURED_STEP,
    OTHER,
    PHASES_APART,
    REFERENCE_ALPHA,
    WHOLE_STEP,
    _hardware_label,
    breakdown_segments,
    draw_chart,
    drawn_baselines,
    failed_label,
    failure_reasons,
    median_step_round,
    nothing_to_draw,
    step_segments,
    summary_seconds,
    work_label,
    write_chart,
)
from pytest_rlbench.verdict.compare import compare_all
from trainer.phases import PHASE_KEYS

# A run of the bundled trainer on CPU, its phases timed apart (the numbers of the issue's gated run:
# the phases timed apart add up to more than one measured step).
RUN: dict[str, Any] = tiny_record(
    "cpu-run",
    CPU_HARDWARE,
    provenance={"source": "pytest-rlbench run", "framework": "pytest-rlbench", "date": "2026-11-21"},
    phases={
        "generate_sequences": {"seconds": [0.60, 0.61, 0.62, 0.63, 0.64]},
        "reshard": {"seconds": [0.01, 0.01, 0.01, 0.01, 0.01]},
        "gen": {"seconds": [0.61, 0.62, 0.63, 0.64, 0.65]},
        "reward": {"seconds": [0.01, 0.01, 0.01, 0.01, 0.01]},
        "old_log_prob": {"seconds": [0.18, 0.19, 0.20, 0.21, 0.22]},
        "ref": {"seconds": [0.17, 0.18, 0.19, 0.20, 0.21]},
        "adv": {"seconds": [0.001, 0.001, 0.001, 0.001, 0.001]},
        "update_actor": {"seconds": [0.48, 0.49, 0.50, 0.51, 0.52]},
        "step": {"seconds": [1.31, 1.32, 1.33, 1.34, 1.35]},
    },
)
# The run's whole-step rounds, split by their own phases (what rl_bench records under breakdown=).
ROUNDS = [
    {
        "generate_sequences": 0.5,
        "reshard": 0.01,
        "gen": 0.52,
        "reward": 0.01,
        "old_log_prob": 0.15,
        "ref": 0.15,
        "adv": 0.001,
        "update_actor": 0.45,
        "step": 1.30 + d,
    }
    for d in (0.0, 0.01, 0.02, 0.03, 0.04)
]


def record(name: str = "cpu-run", scale: float = 1.0, **phases: Any) -> RunRecord:
    data = copy.deepcopy(RUN)
    data["name"] = name
    data["phases"] = {k: {"seconds": [s * scale for s in v["seconds"]]} for k, v in data["phases"].items()}
    data["phases"].update(phases)
    return record_from_dict(data)


def saved_baseline(**phases: Any) -> RunRecord:
    """A baseline saved by this plugin: its step 1.2 s, its phases timed apart adding up to 1.5 s."""
    return record("base", **{"step": {"seconds": [1.18, 1.19, 1.20, 1.21, 1.22]}, **phases})


# ----------------------------------------------------------------------------- reading the Figure back
def bars(ax) -> list[list[tuple[str, float]]]:
    """Per row (top to bottom), each filled segment's (colour, width) from the left."""
    rows: dict[int, list[tuple[float, str, float]]] = {}
    for patch in ax.patches:
        if not patch.get_fill():  # a failed phase's outline
            continue
        y = round(patch.get_y() + patch.get_height() / 2)
        rows.setdefault(y, []).append(
            (patch.get_x(), matplotlib.colors.to_hex(patch.get_facecolor()), patch.get_width())
        )
    return [[(c, w) for _, c, w in sorted(rows[y])] for y in sorted(rows)]


def totals(ax) -> list[float]:
    return [sum(w for _, w in row) for row in bars(ax)]


def row_labels(ax) -> list[str]:
    return [t.get_text() for t in ax.get_yticklabels()]


def kinds(ax) -> list[str]:
    """Each row's kind of figure, and for a baseline its role: the label's last line."""
    return [label.splitlines()[-1] for label in row_labels(ax)]


def inside(box, outer) -> bool:
    return (
        outer.x0 - 0.5 <= box.x0
        and box.x1 <= outer.x1 + 0.5
        and outer.y0 - 0.5 <= box.y0
        and box.y1 <= outer.y1 + 0.5
    )


# ----------------------------------------------------------------------------- the tests
def test_a_gated_run_is_drawn_step_beside_step_and_phases_beside_phases() -> None:
    run, base = record(), saved_baseline()
    results = compare_all(run, [base])
    assert results[0].mode == "gate"
    step = next(c for c in results[0].comparisons if c.metric == "timing_s/step")
    assert step.ratio == pytest.approx(1.33 / 1.20)  # the summary: this run's step is 1.11x slower
    ax = draw_chart(run, [base], results, ROUNDS).axes[0]
    assert kinds(ax) == [MEASURED_STEP, f"{MEASURED_STEP}; gate", PHASES_APART, f"{PHASES_APART}; gate"]
    run_step, base_step, run_apart, base_apart = totals(ax)
    # A measured step beside a measured step, as long as the summary's figures: the run's the longer.
    assert (run_step, base_step) == (pytest.approx(step.measured), pytest.approx(step.baseline))
    assert run_step > base_step
    # Phases beside phases: each segment the summary's figure of that phase.
    mine, theirs = summary_seconds(results), summary_seconds(results, "base")
    parts = ("generate_sequences", "reshard", "reward", "old_log_prob", "ref", "adv", "update_actor")
    assert run_apart == pytest.approx(sum(mine[k] for k in parts))
    assert base_apart == pytest.approx(sum(theirs[k] for k in parts))
    # The run's measured step is its median round, split by that round's own phases.
    median = median_step_round(ROUNDS)
    assert [w for _, w in bars(ax)[0]][:-1] == pytest.approx([v for _, v in breakdown_segments(median)][:-1])
    assert bars(ax)[1] == [(matplotlib.colors.to_hex("#4a5568"), pytest.approx(1.20))]  # no split kept: whole


def test_stacked_segments_are_drawn_on_a_linear_axis_at_their_true_lengths() -> None:
    rlinf = load_baseline("rlinf-1.5b")
    fast = replay_record(rlinf, world_size=1, speedup=30.0)  # the same work per GPU, 30x faster
    fig = draw_chart(fast, [rlinf], compare_all(fast, [rlinf]))
    seconds_axis = fig.axes[0]
    assert seconds_axis.get_xscale() == "linear" and seconds_axis.get_xlim()[0] == 0
    assert "log" not in seconds_axis.get_xlabel() + seconds_axis.get_title()
    # Each segment as long as its seconds: rlinf's published step, part by part.
    assert [w for _, w in bars(seconds_axis)[1]] == pytest.approx([v for _, v in step_segments(rlinf)])
    run_step, base_step = totals(seconds_axis)[:2]
    assert kinds(seconds_axis)[:2] == [MEASURED_STEP, f"{MEASURED_STEP}; gate"]
    assert base_step / run_step == pytest.approx(30.0, rel=0.01)


def test_a_same_work_baseline_is_labelled_as_a_gate_on_the_same_work() -> None:
    run, base = record(), saved_baseline()
    labels = row_labels(draw_chart(run, [base], compare_all(run, [base]), ROUNDS).axes[0])
    assert labels[1].splitlines()[2].endswith("; same work, same hardware") and labels[1].endswith("; gate")
    assert not any("other per-GPU work" in label for label in labels)
    rlinf, verl = load_baseline("rlinf-1.5b"), load_baseline("verl-v0.5.0-1.5b")
    replay = replay_record(rlinf, world_size=1)
    results = compare_all(replay, [rlinf, verl])
    assert [r.mode for r in results] == ["gate", "reference"]
    assert work_label(rlinf, replay, results[0]).endswith("; same per-GPU work")
    labels = row_labels(draw_chart(replay, [rlinf, verl], results).axes[0])
    assert [label.splitlines()[-1] for label in labels[1:3]] == [
        f"{MEASURED_STEP}; gate",
        f"{MEASURED_STEP}; reference only, not a gate",
    ]


def test_the_legend_and_the_note_fit_inside_the_figure_with_failed_phases() -> None:
    run, base = record(scale=2.0), saved_baseline()  # every phase twice as long: every gate fails
    others = [load_baseline("verl-7b"), load_baseline("verl-v0.5.0-1.5b"), load_baseline("rlinf-1.5b")]
    results = compare_all(run, [base, *others])
    assert len(results[0].failures) >= 5
    fig = draw_chart(run, [base, *others], results, ROUNDS)
    renderer = fig.canvas.get_renderer()
    (legend,) = fig.legends
    assert inside(legend.get_window_extent(renderer), fig.bbox), (
        legend.get_window_extent(renderer),
        fig.bbox,
    )
    (crosses,) = [t.get_text() for t in legend.get_texts() if t.get_text().startswith("failed gate: ")]
    reasons = failure_reasons(results)
    assert reasons and all(f"({reason})" in crosses for reason in reasons.values()), (crosses, reasons)
    (note,) = [t for t in fig.texts if t.get_text().startswith("Not drawn: ")]
    assert inside(note.get_window_extent(renderer), fig.bbox), (note.get_window_extent(renderer), fig.bbox)
    assert (
        "rlinf-1.5b (DeepSeek-R1-Distill-Qwen-1.5B: another model than this run's)"
        in note.get_text().replace("\n", " ")
    )
    # The legend above the note, the axes' labels above the legend: nothing drawn over anything.
    assert legend.get_window_extent(renderer).y0 >= note.get_window_extent(renderer).y1
    for ax in fig.axes:
        assert ax.get_tightbbox(renderer).y0 >= legend.get_window_extent(renderer).y1 - 1


def test_failed_phases_are_marked_on_the_run_bar_of_the_kind_their_gate_compared() -> None:
    run, base = record(update_actor={"seconds": [1.5, 1.55, 1.6, 1.65, 1.7]}), saved_baseline()
    results = compare_all(run, [base])
    assert [c.phase for c in results[0].failures] == ["update_actor", "step"]
    ax = draw_chart(run, [base], results, ROUNDS).axes[0]
    outlines = {
        round(p.get_y() + p.get_height() / 2): p
        for p in ax.patches
        if (p.get_gid() or "").startswith("failed")
    }
    assert sorted(outlines) == [kinds(ax).index(MEASURED_STEP), kinds(ax).index(PHASES_APART)]
    # update_actor: on the run's phases timed apart, as long as the summary's figure of it
    assert outlines[kinds(ax).index(PHASES_APART)].get_width() == pytest.approx(1.6)
    # step: the whole measured step
    assert outlines[kinds(ax).index(MEASURED_STEP)].get_width() == pytest.approx(totals(ax)[0])
    crosses = [line.get_label() for line in ax.get_lines() if line.get_label().startswith("failed")]
    assert crosses == ["failed: update_actor", "failed: step"]


def test_an_inconclusive_phase_is_outlined_dashed_and_named_in_the_legend() -> None:
    run = record(update_actor={"seconds": [1.6, 1.62, 1.64, 1.66]})
    base = saved_baseline(update_actor={"seconds": [0.9, 1.0, 1.05, 1.1]}, step={"seconds": [1.33] * 5})
    results = compare_all(run, [base])
    assert [c.phase for c in results[0].inconclusive] == ["update_actor"]  # too few rounds to tell
    assert results[0].passed
    fig = draw_chart(run, [base], results, ROUNDS)
    ax = fig.axes[0]
    (outline,) = [p for p in ax.patches if not p.get_fill()]
    assert outline.get_linestyle() == "--" and outline.get_gid() == "inconclusive: update_actor"
    assert round(outline.get_y() + outline.get_height() / 2) == kinds(ax).index(PHASES_APART)
    # no cross: it did not fail
    assert not [line for line in ax.get_lines() if line.get_label().startswith("failed")]
    assert "inconclusive: update_actor" in [t.get_text() for t in fig.legends[0].get_texts()]


def test_a_phase_that_passed_on_its_counted_work_is_outlined_dotted_and_named() -> None:
    # every phase 1.35x slower alike, the same ops and FLOPs: the session's pace, so each passes on its
    # counted work ("same work"); the chart must not show slower phases with nothing said
    phases = list(RUN["phases"])
    work = {f"work/{kind}/{p}": Metric([1000.0], kind, False) for kind in ("ops", "flops") for p in phases}
    run, base = (dataclasses.replace(r, metrics={**r.metrics, **work}) for r in (record(scale=1.35), record("base")))
    results = compare_all(run, [base])
    passed = {c.phase for c in results[0].comparisons if (c.verdict, c.reason) == ("pass", "same work")}
    assert {"gen", "update_actor", "step"} <= passed
    fig = draw_chart(run, [base], results, ROUNDS)
    outlines = {p.get_gid(): p.get_linestyle() for p in fig.axes[0].patches if not p.get_fill()}
    assert outlines["same work: update_actor"] == ":" and outlines["same work: step"] == ":"
    (label,) = [t.get_text() for t in fig.legends[0].get_texts() if t.get_text().startswith("passed on")]
    assert label.startswith("passed on counted work (the machine ran slower): ") and "update_actor" in label


def test_a_reference_only_baseline_is_drawn_faded_and_a_published_step_beside_the_run_step() -> None:
    rlinf, verl = load_baseline("rlinf-1.5b"), load_baseline("verl-v0.5.0-1.5b")
    slow = replay_record(rlinf, world_size=1, speedup=0.5)
    results = compare_all(slow, [rlinf, verl])
    ax = draw_chart(slow, [rlinf, verl], results).axes[0]
    reference_row = kinds(ax).index(f"{MEASURED_STEP}; reference only, not a gate")
    faded = {
        round(p.get_alpha() or 1.0, 2)
        for p in ax.patches
        if round(p.get_y() + p.get_height() / 2) == reference_row
    }
    assert faded == {REFERENCE_ALPHA}
    # A published run has one measured step and no phases timed apart: it stands in that group only.
    assert kinds(ax) == [
        MEASURED_STEP,
        f"{MEASURED_STEP}; gate",
        f"{MEASURED_STEP}; reference only, not a gate",
        PHASES_APART,
    ]
    # Without whole-step rounds the run's step is drawn whole, as long as its summary figure.
    assert bars(ax)[0] == [
        (matplotlib.colors.to_hex("#4a5568"), pytest.approx(summary_seconds(results)["step"]))
    ]
    failed = {line.get_label() for line in ax.get_lines() if line.get_label().startswith("failed")}
    assert {"failed: gen", "failed: step"} <= failed


def test_chart_draws_only_baselines_of_the_run_model_with_their_per_gpu_work() -> None:
    rlinf, seven = load_baseline("rlinf-1.5b"), load_baseline("verl-7b")
    replay = replay_record(rlinf, world_size=1)
    drawn, left_off = drawn_baselines(replay, [seven, rlinf])
    assert drawn == [rlinf]
    assert left_off == ["verl-7b (DeepSeek-R1-Distill-Qwen-7B: another model than this run's)"]
    assert work_label(replay) == "64 seq/GPU, response 13,975 tokens"
    assert work_label(rlinf, replay) == "64 seq/GPU, response 13,975 tokens; same per-GPU work"
    tiny_drawn, _ = drawn_baselines(record(), [seven, rlinf])
    assert tiny_drawn == []  # a tiny CPU run is drawn alone, never beside a 1.5B or 7B step
    assert work_label(record(), rlinf).endswith("; other per-GPU work")


def test_a_replay_of_heavier_rows_names_the_rows_it_generated() -> None:
    # A replay of the slowest shares generates more than the workload's mean: the label says so.
    rlinf = load_baseline("rlinf-1.5b")
    replay = replay_record(rlinf, world_size=1)
    step = replay.phases["step"]
    rounds = [TokenCounts(num_sequences=64, response_tokens=64 * 15_800 + i) for i in range(len(step.seconds))]
    heavier = dataclasses.replace(
        replay, phases={**replay.phases, "step": dataclasses.replace(step, round_tokens=rounds)}
    )
    assert work_label(heavier) == "64 seq/GPU, response 13,975 tokens (its rows: 15,800)"
    # within 1% of the workload's mean (a draw's own spread): nothing added
    as_drawn = [TokenCounts(num_sequences=64, response_tokens=64 * 14_080)] * len(step.seconds)
    same = dataclasses.replace(replay, phases={**replay.phases, "step": dataclasses.replace(step, round_tokens=as_drawn)})
    assert work_label(same) == "64 seq/GPU, response 13,975 tokens"


def test_step_segments_follow_the_phase_key_order() -> None:
    segments = step_segments(load_baseline("verl-7b"))
    labels = [label for label, _ in segments]
    assert labels == [
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
    assert [k for k in PHASE_KEYS if k in labels] == [k for k in labels if k in PHASE_KEYS]
    assert sum(v for _, v in segments) == pytest.approx(447.358303)  # the whole step, nothing twice
    assert step_segments(load_baseline("rlinf-1.5b"))[0] == ("gen", 266.083)


def test_the_default_run_alone_shows_its_measured_step_and_its_phases(tmp_path: Path) -> None:
    run = record()
    ax = draw_chart(run, step_breakdown=ROUNDS).axes[0]
    assert kinds(ax) == [MEASURED_STEP, PHASES_APART]
    assert totals(ax)[0] == pytest.approx(1.33)  # the run's median step, as the summary gives it
    assert WHOLE_STEP not in {label for label, _ in breakdown_segments(median_step_round(ROUNDS))}
    path = write_chart(tmp_path / "chart.png", run, [load_baseline("verl-7b")], step_breakdown=ROUNDS)
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    image = matplotlib.image.imread(path)
    assert image.shape[1] > 1000 and image.shape[0] > 400
    assert image[..., :3].std() > 0.05  # not a blank canvas


def test_a_chart_with_no_bar_draws_without_a_legend_and_says_why() -> None:
    run = record_from_dict({**copy.deepcopy(RUN), "phases": {"save_checkpoint": {"seconds": 0.08}}})
    assert nothing_to_draw(run, [load_baseline("verl-7b")]) == (
        "no phase inside the step was timed (timed: save_checkpoint), and no baseline of this model to draw"
    )
    assert nothing_to_draw(record()) is None
    fig = draw_chart(run)  # matplotlib refuses a legend of 0 columns: none is drawn
    assert fig.legends == []


def test_a_session_of_whole_steps_alone_draws_one_bar_and_no_save() -> None:
    # its phases were timed inside the step (recorded for their gates): no second bar of phases apart;
    # a save its rounds also ran (trainer.save_freq) is outside the step, as the baselines' is: not drawn
    saves = [dict(r, save_checkpoint=0.2) for r in ROUNDS]
    inside = {k: {"seconds": [r[k] for r in saves], "inside_step": True} for k in saves[0] if k != "step"}
    run = record(**inside, step={"seconds": [r["step"] for r in saves]})  # recorded less its saves
    assert run.phases["gen"].inside_step and not run.phases["step"].inside_step
    ax = draw_chart(run, step_breakdown=saves).axes[0]
    assert kinds(ax) == [MEASURED_STEP]
    assert totals(ax)[0] == pytest.approx(median_step_round(saves)["step"])  # the table's step, no save
    labels = {label for label, _ in breakdown_segments(median_step_round(saves))}
    assert "save_checkpoint" not in labels


def test_an_assumed_gpu_model_is_named_as_assumed_on_its_bar() -> None:
    seven = load_baseline("verl-7b")  # "8 nodes x 8 GPUs": its workload assumes H100
    assert "8 nodes x 8 GPUs (H100 assumed), rollout TP 2" in _hardware_label(seven)  # its replicas of 2 GPUs
    unnamed = dataclasses.replace(seven, workload=dataclasses.replace(seven.workload, gpu_model=None))
    assert "8 nodes x 8 GPUs (model unknown)" in _hardware_label(unnamed)
    run = load_baseline("verl-v0.5.0-1.5b")  # no rollout_tp named: nothing said
    assert "rollout TP" not in _hardware_label(run)
    split = dataclasses.replace(run, config=dataclasses.replace(run.config, parallelism={"dp": 8, "rollout_tp": 2}))
    assert _hardware_label(split).endswith(", rollout TP 2")
    # RLinf publishes "tp": 2 without saying it is the rollout's: the gate takes it as one, and the bar says so
    assert _hardware_label(load_baseline("rlinf-1.5b")).endswith(", rollout TP 2 assumed")


def test_a_failed_phase_timed_inside_the_step_is_marked_on_the_measured_step() -> None:
    slow = {"seconds": [2 * s for s in RUN["phases"]["gen"]["seconds"]], "inside_step": True}
    run, base = record(gen=slow), saved_baseline()
    results = compare_all(run, [base])
    assert "gen" in [c.phase for c in results[0].failures]
    ax = draw_chart(run, [base], results, ROUNDS).axes[0]
    (outline,) = [p for p in ax.patches if not p.get_fill() and p.get_gid() == "failed: gen"]
    assert round(outline.get_y() + outline.get_height() / 2) == kinds(ax).index(MEASURED_STEP)


def test_a_baseline_saved_from_whole_steps_alone_is_drawn_split_by_its_median_round() -> None:
    # its phases were timed inside the step, one sample per step round: the median round's split
    inside = {k: {"seconds": [r[k] for r in ROUNDS], "inside_step": True} for k in ROUNDS[0] if k != "step"}
    base = record("base", **inside, step={"seconds": [r["step"] for r in ROUNDS]})
    results = compare_all(record(), [base])
    ax = draw_chart(record(), [base], results, ROUNDS).axes[0]
    base_row = kinds(ax).index(f"{MEASURED_STEP}; gate")
    median = median_step_round(ROUNDS)
    assert [w for _, w in bars(ax)[base_row]][:-1] == pytest.approx([v for _, v in breakdown_segments(median)][:-1])
    assert totals(ax)[base_row] == pytest.approx(summary_seconds(results, "base")["step"])  # as the table says


def test_the_failed_legend_groups_the_phases_by_why_they_failed() -> None:
    reasons = {"old_log_prob": "slower beside its peers", "gen": "slower", "update_actor": "slower"}
    label = failed_label(["gen", "old_log_prob", "update_actor"], reasons)
    assert label == "failed gate: gen, update_actor (slower); old_log_prob (slower beside its peers)", label
    assert failed_label(["ref"], {}) == "failed gate: ref (failed)"


def test_phases_timed_apart_that_are_fewer_than_the_step_s_say_how_many_they_sum() -> None:
    # A run narrowed with -k: its step (every phase inside it) and two phases timed apart.
    data = copy.deepcopy(RUN)
    data["phases"] = {k: v for k, v in data["phases"].items() if k in ("reward", "adv", "step")}
    narrowed = record_from_dict(data)
    ax = draw_chart(narrowed, [], [], ROUNDS).axes[0]
    apart = " ".join(row_labels(ax)[1].splitlines()[3:])  # after name, hardware and work
    assert apart == f"{PHASES_APART}: only 2 of the step's 6 phases, not gen, old_log_prob, ref, update_actor", apart
    # every phase timed apart: the kind alone, as before
    assert kinds(draw_chart(record(), [], [], ROUNDS).axes[0]) == [MEASURED_STEP, PHASES_APART]
