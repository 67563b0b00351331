"""The one rule for which phase benchmarks a trainer cannot time, and why: the plugin skips them.

A phase is absent from a trainer when its configuration has no such work (no reference model: no
``ref``) or when its framework does not separate it (the trainer's ``absent_phases``: TRL's ``adv``
is computed inline, ...). Such a phase is skipped with the reason, never timed as something else, and
the run record lists it (``provenance.absent_phases``), so the report says "absent" rather than "not
run". The plugin applies the rule before a phase test's body runs (``hooks.pytest_runtest_call``);
``suites/test_step.py`` uses it to know which keys a step must report.
"""

from __future__ import annotations

from pytest_rlbench.frameworks.protocol import OptionalTraits, TrainerUnderTest

NO_REF = "no reference model in this configuration: set actor_rollout_ref.actor.use_kl_loss=True"


def absent_phases(trainer: TrainerUnderTest) -> dict[str, str]:
    """Phase key -> why ``trainer`` has no time of its own for it; empty when it times every phase: ``ref``
    without a reference model, and the phases its framework does not separate (its ``absent_phases``)."""
    out: dict[str, str] = {}
    if not trainer.uses_ref:
        out["ref"] = NO_REF
    out.update(OptionalTraits.of(trainer).absent_phases)
    return out
