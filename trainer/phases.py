"""VERL's timing keys, in the order one training step runs them.

Every duration the trainer records and every phase the suites benchmark is named by one of these.
"""

from __future__ import annotations

# Keys timed inside one step. generate_sequences and reshard are nested inside gen.
STEP_PHASES: tuple[str, ...] = (
    "gen",
    "generate_sequences",
    "reshard",
    "reward",
    "old_log_prob",
    "ref",
    "adv",
    "update_actor",
)

# Every key the seed's VERL table reports, in the table's order; step spans the phases above.
PHASE_KEYS: tuple[str, ...] = (
    "generate_sequences",
    "reshard",
    "gen",
    "reward",
    "old_log_prob",
    "ref",
    "adv",
    "update_actor",
    "step",
    "save_checkpoint",
)

# Phases that run outside the step's own span (VERL times save_checkpoint after step).
OUTSIDE_STEP: tuple[str, ...] = ("save_checkpoint",)

# The work of a save, as tokens are a phase's: the bytes of every file the checkpoint holds, all
# workers' together. A step that saves reports it among its metrics under this name.
CHECKPOINT_BYTES = "checkpoint/bytes"


# Spans and the phases timed directly inside them: gen holds generate_sequences and reshard; step holds
# gen and the phases after it (save_checkpoint is timed after the step).
SPANS: dict[str, tuple[str, ...]] = {
    "gen": ("generate_sequences", "reshard"),
    "step": tuple(p for p in STEP_PHASES if p not in ("generate_sequences", "reshard")),
}


def phases_within(span: str) -> frozenset[str]:
    """Every phase timed inside ``span``, at any depth (empty for a phase that holds none)."""
    inner = set(SPANS.get(span, ()))
    for phase in tuple(inner):
        inner |= phases_within(phase)
    return frozenset(inner)


def nested(a: str, b: str) -> bool:
    """Whether one of the two phases is timed inside the other (their times share work)."""
    return a in phases_within(b) or b in phases_within(a)
