"""The decode loop the static and fast engines share; each engine supplies only its step.

Token 0 comes from the prefill (the engine samples it before the loop). The loop then calls the
engine's step once per further token up to ``request.decode_limit`` (max_new_tokens, or the
longest row target with rollout.target_lengths: the step itself marks a row finished at its
target), and reads the host only every ``check_every`` steps: to stop early once every row has
ended, to raise NonFiniteLogitsError naming the first step at which some row saw non-finite
logits, and to tell the engine how many rows still run (the fast engine then compacts them).
Keyed sampling (``sampling.sample_keyed``) cannot device-assert on NaN, so that check can wait; a
final check after the loop covers the last steps' flags.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from trainer.rollout.requests import RowsRequest


def check_rows(
    first_bad: torch.Tensor,
    finished: torch.Tensor,
    request: RowsRequest,
    engine: str,
    rows: torch.Tensor | None = None,
) -> int:
    """The loop's only host read: raise on recorded non-finite logits, else how many rows still run.

    ``first_bad`` [b] holds each slot's first step with non-finite logits (-1: none); ``finished`` [b]
    whether the slot's row has produced a stop token or reached its target length; ``rows`` [b] the
    micro-batch row each slot decodes (None: slot i is row i), to name the rows in the error.
    """
    any_bad, running = torch.stack([(first_bad >= 0).any().long(), (~finished).sum()]).tolist()
    if any_bad:
        first = int(first_bad[first_bad >= 0].min())
        slots = torch.nonzero(first_bad == first).flatten()
        named = slots if rows is None else rows[slots]
        raise request.nonfinite(engine, first, sorted(named.tolist()))
    return int(running)


def decode_until_done(
    step: Callable[[int], None],
    first_bad: torch.Tensor,
    finished: torch.Tensor,
    request: RowsRequest,
    check_every: int,
    engine: str,
    on_check: Callable[[int, int], None] | None = None,
    rows: torch.Tensor | None = None,
) -> int:
    """Call ``step(i)`` for tokens i = 1, 2, ... until ``request.decode_limit`` tokens exist or every
    row has ended (seen at a check); return how many tokens were generated.

    ``step`` updates the engine's device state in place, ``first_bad`` and ``finished`` included.
    ``on_check(running, steps)``, when given, hears after each check that did not stop the loop how
    many rows still run, before step ``steps``. ``rows``: see ``check_rows``.
    """
    steps = 1
    while steps < request.decode_limit:
        if steps % check_every == 0:
            running = check_rows(first_bad, finished, request, engine, rows)
            if running == 0:
                break
            if on_check is not None:
                on_check(running, steps)
        step(steps)
        steps += 1
    check_rows(first_bad, finished, request, engine, rows)  # the last steps' non-finite flags
    return steps
