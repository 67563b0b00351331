"""The markers the plugin registers, and the one check of a phase key a test names.

``@pytest.mark.rl_phase(KEY)`` says which phase a benchmark times (one of ``trainer.phases.PHASE_KEYS``,
VERL's timing keys); ``@pytest.mark.rl_gpu`` marks a test that needs GPUs.
"""

from __future__ import annotations

import pytest

from trainer.phases import PHASE_KEYS

PHASE_MARKER = "rl_phase"
GPU_MARKER = "rl_gpu"
MARKERS = (
    f"{PHASE_MARKER}(name): the phase key this benchmark times; one of: {', '.join(PHASE_KEYS)}",
    f"{GPU_MARKER}: the test needs GPUs; skipped without --gpu",
)


def phase_of(item: pytest.Item) -> str | None:
    """The phase key an item benchmarks (its closest rl_phase marker), or None."""
    mark = item.get_closest_marker(PHASE_MARKER)
    return mark.args[0] if mark is not None and mark.args else None


def phase_key_problem(name: object) -> str | None:
    """None if ``name`` is a phase key, else what is wrong with it ("is not a phase key; valid keys:
    ..."): the one check of a phase key a test names (its marker at collection, the recorder when a
    phase is recorded)."""
    if isinstance(name, str) and name in PHASE_KEYS:
        return None
    return f"is not a phase key; valid keys: {', '.join(PHASE_KEYS)}"


def missing_phase_mark(item: pytest.Item) -> str:
    """The problem of a test that times a phase with rl_bench without saying which."""
    return (
        f"{item.nodeid}: uses rl_bench but has no @pytest.mark.{PHASE_MARKER}(KEY) saying which phase "
        f"it times; valid keys: {', '.join(PHASE_KEYS)}"
    )


def check_phase_marks(item: pytest.Item) -> str | None:
    """None if every rl_phase marker on ``item`` names one known phase key, and a test that times a
    phase with rl_bench has one; else the problem."""
    if "rl_bench" in getattr(item, "fixturenames", ()) and item.get_closest_marker(PHASE_MARKER) is None:
        return missing_phase_mark(item)
    for mark in item.iter_markers(PHASE_MARKER):
        name = mark.args[0] if len(mark.args) == 1 and not mark.kwargs else None
        if not isinstance(name, str):
            given = ", ".join([*map(repr, mark.args), *(f"{k}={v!r}" for k, v in mark.kwargs.items())])
            return (
                f"{item.nodeid}: @pytest.mark.{PHASE_MARKER} takes one phase key, got ({given}); "
                f"valid keys: {', '.join(PHASE_KEYS)}"
            )
        if (problem := phase_key_problem(name)) is not None:
            return f"{item.nodeid}: @pytest.mark.{PHASE_MARKER}({name!r}) {problem}"
    return None
