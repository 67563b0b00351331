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
  ``--rl-trainer trl``, and the skip of a phase the framework does not separate.
"""

from __future__ import annotations

OURS = "ours"
TRL = "trl"
FRAMEWORKS: tuple[str, ...] = (OURS, TRL)  # what --rl-trainer accepts
OURS_LABEL = "pytest-rlbench"  # the record's provenance.framework for the bundled trainer
