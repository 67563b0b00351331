"""The decode loop the static and fast engines share; each engine supplies only its step.

Token 0 comes from the prefill (the engine samples it before the loop). The loop then calls the
engine's step once per further token up to ``request.decode_limit`` (max_new_tokens, or the
longest row target with rollout.target_lengths: the step itself marks a row finished at its
target), and reads the host only every ``check_every`` steps: to stop early once every row has
ended, and to raise NonFiniteLogitsError naming the first step at which some row saw non-finite
logits. Keyed sampling (``sampling.sample_keyed``) cannot device-assert on
NaN, so that check can wait; a final check after the loop covers the last steps' flags.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from trainer.rollout.base import RowsRequest


def check_rows(first_bad: torch.Tensor, finished: torch.Tensor, request: RowsRequest, engine: str) -> bool:
    """The loop's only host read: raise on recorded non-finite logits, else whether every row ended.

    ``first_bad`` [b] holds each row's first step with non-finite logits (-1: none); ``finished`` [b]
    whether the row has produced a stop token or reached its target length.
    """
    any_bad, all_finished = torch.stack([(first_bad >= 0).any(), finished.all()]).tolist()
    if any_bad:
        first = int(first_bad[first_bad >= 0].min())
        raise request.nonfinite(engine, first, torch.nonzero(first_bad == first).flatten().tolist())
    return bool(all_finished)


def decode_until_done(
    step: Callable[[int], None],
    first_bad: torch.Tensor,
    finished: torch.Tensor,
    request: RowsRequest,
    check_every: int,
    engine: str,
) -> int:
    """Call ``step(i)`` for tokens i = 1, 2, ... until ``request.decode_limit`` tokens exist or every
    row has ended (seen at a check); return how many tokens were generated.

    ``step`` updates the engine's device state in place, ``first_bad`` and ``finished`` included.
    """
    steps = 1
    while steps < request.decode_limit:
        if steps % check_every == 0 and check_rows(first_bad, finished, request, engine):
            break
        step(steps)
        steps += 1
    check_rows(first_bad, finished, request, engine)  # the last steps' non-finite flags
    return steps
