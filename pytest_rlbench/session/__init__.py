"""A benchmark session in pytest: its resources and fixtures (``fixtures``: model, data set, trainer
config, cluster), the ``rl_bench`` fixture that times a phase (``bench``, ``round_timer``), what the
session measured (``recorder``), the gate test per phase (``gate_items``), the rollout panel, progress
bars, interrupts and dead workers (``faults``).
"""
