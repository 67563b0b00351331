"""Rollout engines: sample n responses per prompt."""
