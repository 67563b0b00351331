"""Our own decode loop over a preallocated KV cache (name "static"): the base for a fast GPU engine.

One micro-batch runs as:
  1. prefill: the left-padded prompts [b, P] in one forward into a transformers StaticCache sized
     P + max_new_tokens, asking for the last position's logits only (transformers' ``logits_to_keep=1``:
     full-prompt logits are b x P x vocab floats, 160 GB in fp32 at b = 256, P = 1024 and a 152k
     vocabulary);
  2. ``sample_step`` on those logits gives token 0 (and its log-prob, see base.GeneratedRows);
  3. ``decode_step`` per further token: one forward of [b, 1] then ``sample_step``.

A step has static shapes and keeps its state in device tensors updated in place (``DecodeState``):
the cache slot, positions, slot mask, finished flags (an EOS, or a row's target length with
rollout.target_lengths) and the first step at which each row saw non-finite logits. The loop (decode_loop.py, shared with the fast engine) reads the host only every
``check_every`` steps, to stop early when every row has finished and to raise NonFiniteLogitsError
(naming the first bad step and its rows); sampling uses the exponential race driven by per-row
keyed noise (``sampling.sample_keyed``), which cannot device-assert on NaN, so the check can wait,
and which gives a row the same draw whichever worker or micro-batch it lands in. CUDA graphs are not
used here: capturing transformers' forward with its StaticCache under torch.cuda.graph failed when
tried on a GPU; the "fast" engine (fast_engine.py) has a lean forward of its own (lean_decoder.py)
that captures.

Slot layout: cache slot j < P holds prompt column j (left padding included, masked out by the slot
mask); slot P + t holds the token generated at step t. Position ids count real tokens only, as in
``trainer.batch.position_ids_from_mask``, so they match the training forward's positions.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch
from torch import nn
from transformers import StaticCache

from trainer.batch import position_ids_from_mask
from trainer.rollout.base import RolloutEngine
from trainer.rollout.decode_loop import decode_until_done
from trainer.rollout.requests import GeneratedRows, RowsRequest, SamplingParams
from trainer.rollout.sampling import (
    greedy,
    nonfinite_rows_mask,
    process_logits,
    sample_keyed,
    token_entropies,
    token_log_probs,
)

if TYPE_CHECKING:
    from trainer.config.schema import RolloutConfig


@dataclass
class DecodeState:
    """Per-micro-batch decode state; every field a device tensor of fixed shape, updated in place."""

    tokens: torch.Tensor  # [b, max_new] generated tokens (pad where not yet written)
    log_probs: torch.Tensor  # [b, max_new] float32 log-prob of each generated token (GeneratedRows)
    entropies: torch.Tensor | None  # [b, max_new] float32 entropy of each step's distribution, if asked
    last: torch.Tensor  # [b] the token fed to the next forward
    positions: torch.Tensor  # [b] position id of ``last``
    slot_mask: torch.Tensor  # [b, P + max_new] 1 on cache slots a query may attend to
    write_slot: torch.Tensor  # [] cache slot ``last`` is written to
    step: torch.Tensor  # [] index of the next token to sample
    finished: torch.Tensor  # [b] bool: the row has produced an EOS or reached its target length
    targets: torch.Tensor  # [b] each row's target length (max_new without rollout.target_lengths)
    first_bad_step: torch.Tensor  # [b] first step with non-finite logits, -1 if none
    eos: torch.Tensor  # [k] EOS ids
    row_keys: torch.Tensor  # [b] each row's sampling key (see sampling.keyed_exponential)
    pad_token_id: int
    seed: int

    @classmethod
    def start(
        cls,
        prompt_mask: torch.Tensor,
        max_new_tokens: int,
        eos_token_ids: tuple[int, ...],
        pad_token_id: int,
        row_keys: torch.Tensor,
        seed: int,
        targets: torch.Tensor | None = None,
        with_entropy: bool = False,
    ) -> DecodeState:
        b, width = prompt_mask.shape
        device = prompt_mask.device
        slot_mask = torch.zeros((b, width + max_new_tokens), dtype=torch.long, device=device)
        slot_mask[:, :width] = prompt_mask
        return cls(
            tokens=torch.full((b, max_new_tokens), pad_token_id, dtype=torch.long, device=device),
            log_probs=torch.zeros((b, max_new_tokens), dtype=torch.float32, device=device),
            entropies=torch.zeros((b, max_new_tokens), dtype=torch.float32, device=device) if with_entropy else None,
            last=torch.full((b,), pad_token_id, dtype=torch.long, device=device),
            positions=prompt_mask.sum(dim=1).long(),  # the first generated token follows the prompt
            slot_mask=slot_mask,
            write_slot=torch.tensor(width, dtype=torch.long, device=device),
            step=torch.tensor(0, dtype=torch.long, device=device),
            finished=torch.zeros(b, dtype=torch.bool, device=device),
            targets=(
                torch.full((b,), max_new_tokens, dtype=torch.long, device=device)
                if targets is None
                else targets.to(device=device, dtype=torch.long)
            ),
            first_bad_step=torch.full((b,), -1, dtype=torch.long, device=device),
            eos=torch.tensor(list(eos_token_ids), dtype=torch.long, device=device),
            row_keys=row_keys.to(device),
            pad_token_id=pad_token_id,
            seed=seed,
        )


def sample_step(
    state: DecodeState, logits: torch.Tensor, sampling: SamplingParams
) -> None:
    """Pick token ``state.step`` from logits [b, V] and record it; no host reads."""
    bad = nonfinite_rows_mask(logits)
    state.first_bad_step.copy_(torch.where(bad & (state.first_bad_step < 0), state.step, state.first_bad_step))
    if sampling.do_sample:
        filtered = process_logits(logits, sampling.temperature, sampling.top_k_or_zero, sampling.top_p)
        token = sample_keyed(filtered, state.row_keys, state.step, state.seed)
    else:
        token = greedy(logits)
    log_prob = token_log_probs(logits, token, sampling.log_prob_temperature)
    state.log_probs.index_copy_(1, state.step.view(1), log_prob.view(-1, 1))
    if state.entropies is not None:
        entropy = token_entropies(logits, sampling.log_prob_temperature)  # [b]
        state.entropies.index_copy_(1, state.step.view(1), entropy.view(-1, 1))
    token = token.masked_fill(state.finished, state.pad_token_id)  # finished rows emit padding
    state.tokens.index_copy_(1, state.step.view(1), token.view(-1, 1))
    state.finished.logical_or_(torch.isin(token, state.eos))
    state.finished.logical_or_(state.step + 1 >= state.targets)  # token ``step`` was its last
    state.last.copy_(token)
    state.step.add_(1)


def decode_step(
    model: nn.Module,
    cache: StaticCache,
    state: DecodeState,
    sampling: SamplingParams,
) -> None:
    """Feed ``state.last`` (one token per row) through the model and sample the next token.

    Static shapes: input [b, 1], positions [b, 1], slot mask [b, P + max_new]; the step's slot is
    a device tensor, so nothing here depends on the step number on the host.
    """
    state.slot_mask.index_fill_(1, state.write_slot.view(1), 1)
    out = model(
        input_ids=state.last.view(-1, 1),
        attention_mask=state.slot_mask,
        position_ids=state.positions.view(-1, 1),
        past_key_values=cache,
        use_cache=True,
    )
    state.write_slot.add_(1)
    state.positions.add_(1)
    sample_step(state, out.logits[:, -1, :], sampling)


def prefill(
    model: nn.Module, cache: StaticCache, prompt_ids: torch.Tensor, prompt_mask: torch.Tensor
) -> torch.Tensor:
    """Write the prompts into the cache; return the last position's logits [b, V]."""
    out = model(
        input_ids=prompt_ids,
        attention_mask=prompt_mask,
        position_ids=position_ids_from_mask(prompt_mask),
        past_key_values=cache,
        use_cache=True,
        logits_to_keep=1,
    )
    return out.logits[:, -1, :]


class StaticRolloutEngine(RolloutEngine):
    name = "static"
    reports_entropy = True

    def __init__(
        self,
        model: nn.Module,
        tokenizer: Any,
        config: RolloutConfig | None = None,
        share_weights: bool = True,
        check_every: int = 8,
    ) -> None:
        super().__init__(model, tokenizer, config, share_weights)
        if check_every < 1:
            raise ValueError(f"check_every must be >= 1, got {check_every}")
        self.check_every = check_every

    def _generate_rows(self, request: RowsRequest) -> GeneratedRows:
        width = request.prompt_ids.shape[1]
        max_new = request.decode_limit  # with targets, the longest: no cache beyond it
        cache = StaticCache(config=self.model.config, max_cache_len=width + max_new)
        state = DecodeState.start(
            request.prompt_mask, max_new, self.stop_token_ids, self.pad_token_id, request.row_keys, request.seed,
            request.targets, request.sampling.report_entropy,
        )
        sampling = request.sampling
        sample_step(state, prefill(self.model, cache, request.prompt_ids, request.prompt_mask), sampling)
        steps = decode_until_done(
            lambda _: decode_step(self.model, cache, state, sampling),
            state.first_bad_step, state.finished, request, self.check_every, self.name,
        )
        entropies = state.entropies[:, :steps] if state.entropies is not None else None
        return GeneratedRows(state.tokens[:, :steps], state.log_probs[:, :steps], entropies)
