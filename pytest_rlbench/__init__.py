"""pytest-rlbench: benchmark RL post-training phases against VERL and RLinf baselines."""

__version__ = "0.1.0"
