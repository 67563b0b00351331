"""GRPO and friends as small pure torch functions."""
