"""What a rollout engine is asked and what it answers: sampling parameters, the request for one
left-padded micro-batch, the generated rows, and the error for logits that cannot be sampled.

Kept apart from the engine interface (base.py) so that callers that only build sampling parameters
(the workers, the fidelity checks) need not import an engine.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from trainer.config.schema import RolloutConfig


@dataclass(frozen=True)
class SamplingParams:
    """How to pick each next token. ``do_sample=False`` is greedy and ignores the other fields."""

    temperature: float = 1.0
    top_k: int = -1  # -1 or 0: off
    top_p: float = 1.0  # 1.0: off
    do_sample: bool = True
    # also return each sampling distribution's entropy (Batch.rollout_entropies), which the sampler check
    # reads; it costs one more pass over the logits at each step, so only an audit asks for it
    report_entropy: bool = False

    def __post_init__(self) -> None:
        if not self.temperature > 0:
            raise ValueError(f"temperature must be > 0, got {self.temperature}; use do_sample=False for greedy")
        if self.top_k < -1:
            raise ValueError(f"top_k must be -1 or 0 (off) or a positive count, got {self.top_k}")
        if not 0.0 < self.top_p <= 1.0:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")

    @property
    def log_prob_temperature(self) -> float:
        """The temperature every engine's rollout_log_probs are taken at: the configured one, greedy or
        not, because the trainer's old_log_prob divides the logits by rollout.temperature either way
        (VERL's compute_log_prob does), and the fidelity figures compare the two."""
        return self.temperature

    @property
    def top_k_or_zero(self) -> int:
        """top_k with "off" spelled 0, as transformers and ``sampling.top_k_filter`` take it."""
        return max(self.top_k, 0)

    @classmethod
    def from_config(cls, rollout: RolloutConfig) -> SamplingParams:
        return cls(
            temperature=rollout.temperature,
            top_k=rollout.top_k,
            top_p=rollout.top_p,
            do_sample=rollout.do_sample,
        )


class NonFiniteLogitsError(RuntimeError):
    """Logits whose softmax is not a distribution (NaN, +inf, or a row of -inf) at some decode step.

    Raised instead of letting a sampler hit them: on a GPU, torch.multinomial on NaN probabilities
    is a device-side assert that kills the process (pytorch/pytorch issue #7014 and PR #7647, the
    CUDA multinomial's NaN/inf checks). Random or diverged bf16 weights do produce such logits.
    ``step`` counts generated tokens from 0 (step 0 is the first token, sampled from the prefill's
    logits); ``rows`` are row indices of the whole output batch.
    """

    def __init__(self, engine: str, step: int, rows: Sequence[int], micro_batch: int, n: int = 1) -> None:
        self.engine = engine
        self.step = step
        self.rows = list(rows)
        self.micro_batch = micro_batch
        prompts = sorted({r // n for r in self.rows})
        super().__init__(
            f"{engine} rollout: non-finite logits (NaN, +inf, or every token -inf) at decode step {step} "
            f"in batch rows {self.rows} (prompts {prompts}, micro-batch {micro_batch}); expected finite "
            "logits. Random or diverged weights (often bf16) cause this; try fp32 or check the last update."
        )


@dataclass(frozen=True, eq=False)
class GeneratedRows:
    """What an engine's ``_generate_rows`` returns for one micro-batch."""

    tokens: torch.Tensor  # [b, T] int64 raw generated tokens (anything after a row's end)
    # [b, T] float32: each generated token's log-prob under the engine's own logits / temperature
    # (before top-k/top-p filtering; T = 1 for greedy)
    log_probs: torch.Tensor
    # [b, T] float32: the entropy of the distribution each log-prob was taken from, H(softmax(logits / T));
    # only when SamplingParams.report_entropy asks for it
    entropies: torch.Tensor | None = None


@dataclass(frozen=True, eq=False)
class RowsRequest:
    """One left-padded micro-batch to decode: what ``generate`` hands an engine's ``_generate_rows``.

    Each engine reads what it needs: hf samples from the seeded global stream (``generator`` is None
    there), static and fast draw keyed noise from ``row_keys`` and ``seed``. ``micro_batch``,
    ``row_offset`` and ``n`` only serve to name rows and prompts of the whole batch in errors.
    """

    prompt_ids: torch.Tensor  # [b, P] left-padded
    prompt_mask: torch.Tensor  # [b, P] 1 on real prompt tokens
    row_keys: torch.Tensor  # [b] row j of prompt uid u has key u * n + j (see sampling.keyed_exponential)
    max_new_tokens: int
    sampling: SamplingParams
    seed: int
    generator: torch.Generator | None
    micro_batch: int
    row_offset: int  # index of this micro-batch's first row in the whole batch
    n: int  # responses per prompt
    # [b] int64 on the device: each row's target length (rollout.target_lengths), None without targets
    targets: torch.Tensor | None = None
    longest_target: int = 0  # the largest of ``targets`` (a host value, known before decoding)

    @property
    def decode_limit(self) -> int:
        """Tokens to decode: the longest target with targets, else max_new_tokens."""
        return self.longest_target if self.targets is not None else self.max_new_tokens

    def nonfinite(self, engine: str, step: int, rows: Sequence[int]) -> NonFiniteLogitsError:
        """The error for non-finite logits at ``step`` in these micro-batch ``rows``."""
        return NonFiniteLogitsError(engine, step, [r + self.row_offset for r in rows], self.micro_batch, self.n)


def rollout_seed(trainer_seed: int, global_step: int) -> int:
    """The generation seed of step ``global_step``, every worker's: a row's sampling noise and target
    length depend on (this seed, the row's key) alone, wherever the row runs."""
    return (trainer_seed * 1_000_003 + global_step * 1_009) % (2**31 - 1)
