"""Adapters that run another RL framework's trainer under the suites, behind the bundled trainer's
phase methods, so one session can time both on the same model, data, reward and batch.

They live in the plugin, not in ``trainer/``: an adapter is benchmark glue (it maps the session's
trainer config onto another framework's settings and times that framework's own methods), and the
bundled trainer must not depend on other frameworks. One module per concern:

- ``trl_settings``: the trainer config as TRL ``GRPOConfig`` keywords, and the settings that cannot
  be made equal (pure; no TRL import);
- ``trl_adapter``: ``TRLAdapter``, TRL's ``GRPOTrainer`` driven one real step at a time, its methods
  timed under VERL's phase keys;
- ``hooks``: the ``pytest_rlbench_make_trainer`` implementation that builds the adapter for
  ``--rl-trainer trl``, and the parametrisation of the trainer by framework when several are given;
- ``fixture``: the ``rl_framework`` and ``rl_trainer`` fixtures (one trainer per framework, in turn);
- ``phase_skips``: the one rule for which phase benchmarks a trainer skips, and why;
- ``session``: one recorder per framework, and the end of a session with several (each framework's
  record compared and saved on its own, the report holding them all);
- ``side_by_side``: the terminal's table of the frameworks phase by phase.

A saved run names its framework (``provenance.framework``); ``framework_mismatch`` is the rule that a
run is gated only by a saved run of its own framework: against the other framework's it is a
reference, its heading naming the difference.
"""

from __future__ import annotations

OURS = "ours"
TRL = "trl"
FRAMEWORKS: tuple[str, ...] = (OURS, TRL)  # what --rl-trainer accepts
OURS_LABEL = "pytest-rlbench"  # the record's provenance.framework for the bundled trainer

# provenance.framework's first word in the records this plugin writes -> the --rl-trainer name
LABEL_KEYS = {OURS_LABEL: OURS, TRL: TRL}


def framework_key(label: str | None) -> str | None:
    """The --rl-trainer name of a record's ``provenance.framework`` ("pytest-rlbench" -> "ours",
    "trl 1.16.0" -> "trl"); None for a framework the suites do not run ("verl") or none."""
    return LABEL_KEYS.get((label or "").split(" ", 1)[0])


def framework_mismatch(run: str | None, baseline: str | None) -> list[str]:
    """Why a run of framework ``run`` cannot be gated by a baseline saved from a run of ``baseline``:
    two frameworks the suites run are other work even on the same settings. Empty when they are the
    same framework (versions aside: a TRL upgrade is what a gate should catch), or when the baseline
    is a published figure of a framework the suites do not run (VERL's, RLinf's: a target for either)."""
    ours, theirs = framework_key(run), framework_key(baseline)
    if ours is None or theirs is None or ours == theirs:
        return []
    return [f"framework: run {run!r}, baseline {baseline!r}"]
