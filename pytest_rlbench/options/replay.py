"""``--rl-workload``: do a baseline's recorded work per GPU, so that the comparison with it can be a gate.

The baseline's workload becomes trainer overrides (``pytest_rlbench.records.workload_replay.workload_overrides``) for
the GPUs at hand. They come after the session's defaults and before the dedicated options and
``--rl-config``: what the user sets on top wins, and the run's recorded workload then differs from the
baseline's, so ``compare`` shows that baseline as a reference and names the difference. Nothing is
hidden: ``replay_notes`` lists every key the user changed from what the replay asked for.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from pytest_rlbench.records.record import RunRecord
from pytest_rlbench.records.workload_replay import WorkloadError, WorkloadSetting, workload_overrides
from trainer.config import Config, ConfigError, Override, get_value

if TYPE_CHECKING:
    from pytest_rlbench.options.parsed import RLBenchOptions


def replay_settings(baseline: RunRecord, world_size: int, source: str) -> list[WorkloadSetting]:
    """The settings that make ``world_size`` workers do ``baseline``'s work per GPU (ConfigError if
    the work does not divide over them)."""
    try:
        return workload_overrides(baseline, world_size)
    except WorkloadError as exc:
        raise ConfigError(f"{source}: {exc}") from None


def replay_overrides(settings: Sequence[WorkloadSetting], source: str) -> list[Override]:
    """The settings as overrides, each saying which workload values it comes from."""
    return [Override(s.key, s.value, f"{source} ({s.why})") for s in settings]


def replay_notes(cfg: Config, settings: Sequence[WorkloadSetting], given: Sequence[Override]) -> list[str]:
    """One line per key the replay set and the run ended with another value, naming who set it."""
    notes = []
    for setting in settings:
        value: Any = get_value(cfg, setting.key)
        if value == setting.value:
            continue
        by = next((o.source for o in reversed(given) if o.key == setting.key), "a pytest_rlbench_update_config hook")
        effect = (
            "memory placement, not work: the replayed baseline still gates, naming it"
            if setting.places_memory
            else "comparisons with the replayed baseline are references"
        )
        notes.append(f"{setting.key}={value!r} (from {by}) instead of the replay's {setting.value!r}: {effect}")
    return notes


def session_replay_notes(opts: RLBenchOptions, cfg: Config) -> list[str]:
    """With --rl-workload: what the session replays, then every key set otherwise on top of it."""
    if opts.workload_record is None:
        return []
    source = opts.source_of("rl_workload")
    baseline = opts.workload_record
    assert baseline is not None  # loaded with the options, which refuse one without a workload
    settings = replay_settings(baseline, cfg.world_size, source)
    head = f"{source}: replaying the work per GPU of baseline {baseline.name!r} on {cfg.world_size} worker(s)"
    return [head, *replay_notes(cfg, settings, [*opts.ini_overrides, *opts.overrides])]
