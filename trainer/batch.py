"""The batch that flows through one training step, phase by phase.

Rows are responses (prompts repeated rollout.n times). Prompts are left-padded and responses
right-padded, so ``prompt_ids ++ response_ids`` puts every prompt's last token at the same column
and every response starts at column P. The response mask covers the generated tokens, the EOS that
ends a response included, and excludes padding after it.
"""

from __future__ import annotations

import itertools
from collections.abc import Collection, Sequence
from dataclasses import dataclass, field, fields, replace
from typing import Any

import torch

# The rows themselves: every phase's workers read them (Batch.select's ``only`` keeps them always).
ROW_FIELDS: frozenset[str] = frozenset({"prompt_ids", "prompt_mask", "response_ids", "response_mask", "uids"})


@dataclass
class Batch:
    prompt_ids: torch.Tensor  # [B, P] left-padded
    prompt_mask: torch.Tensor  # [B, P] 1 on real prompt tokens
    response_ids: torch.Tensor  # [B, R] right-padded
    response_mask: torch.Tensor  # [B, R] 1 on generated tokens (EOS included)
    uids: torch.Tensor  # [B] prompt index: responses to one prompt form a GRPO group
    ground_truths: list[str] = field(default_factory=list)
    # [B, R] float32, set by the rollout engine: each response token's log-prob under the engine's own
    # logits / temperature (before top-k/top-p), 0 where response_mask is 0 (trainer/rollout/base.py)
    rollout_log_probs: torch.Tensor | None = None
    # [B, R] float32, only when SamplingParams.report_entropy asked: the entropy of the distribution each
    # rollout_log_probs entry was taken from, 0 where response_mask is 0 (the sampler check reads it)
    rollout_entropies: torch.Tensor | None = None
    # Filled by later phases; all [B, R] over response positions unless noted.
    token_level_scores: torch.Tensor | None = None
    token_level_rewards: torch.Tensor | None = None
    old_log_probs: torch.Tensor | None = None
    ref_log_probs: torch.Tensor | None = None
    advantages: torch.Tensor | None = None
    returns: torch.Tensor | None = None
    scores: torch.Tensor | None = None  # [B] sequence score

    @property
    def size(self) -> int:
        return int(self.prompt_ids.shape[0])

    @property
    def input_ids(self) -> torch.Tensor:
        return torch.cat([self.prompt_ids, self.response_ids], dim=1)

    @property
    def attention_mask(self) -> torch.Tensor:
        return torch.cat([self.prompt_mask, self.response_mask], dim=1)

    @property
    def position_ids(self) -> torch.Tensor:
        return position_ids_from_mask(self.attention_mask)

    @property
    def response_lengths(self) -> torch.Tensor:
        return self.response_mask.sum(dim=1)

    @property
    def prompt_lengths(self) -> torch.Tensor:
        return self.prompt_mask.sum(dim=1)

    @property
    def sequence_lengths(self) -> torch.Tensor:
        return self.prompt_lengths + self.response_lengths

    def select(self, index: torch.Tensor | list[int], only: Collection[str] | None = None) -> Batch:
        """The rows at ``index``, in that order (tensors and the ground-truth list alike).

        ``only``: of the fields beyond the rows themselves (ROW_FIELDS), keep those named, leaving the
        others out (None, or an empty list). A phase ships its workers only what they read: the driver
        serialises each worker's part, and a worker copies every tensor of each micro-batch to its GPU."""
        idx = torch.as_tensor(index, dtype=torch.long)
        if only is not None and (unknown := set(only) - {f.name for f in fields(self)}):
            raise ValueError(f"Batch.select(only=...): no field {sorted(unknown)}")
        out: dict[str, Any] = {}
        for f in fields(self):
            value = getattr(self, f.name)
            if only is not None and f.name not in ROW_FIELDS and f.name not in only:
                out[f.name] = [] if isinstance(value, list) else None
                continue
            if isinstance(value, torch.Tensor):
                out[f.name] = value.index_select(0, idx.to(value.device))
            elif isinstance(value, list):
                out[f.name] = [value[i] for i in idx.tolist()] if value else []
            else:
                out[f.name] = value
        return Batch(**out)

    def to(self, device: torch.device | str) -> Batch:
        return replace(
            self,
            **{
                f.name: getattr(self, f.name).to(device)
                for f in fields(self)
                if isinstance(getattr(self, f.name), torch.Tensor)
            },
        )

    def to_device(self, device: torch.device) -> Batch:
        """``to(device)`` without the host waiting on the GPU: from the CPU to a GPU each tensor goes
        through pinned memory as an asynchronous copy, queued behind the work already on the stream.
        A plain ``to`` from pageable memory synchronises the stream once per tensor, so the GPU ran dry
        at every micro-batch while the host got the next one ready (docs/benchmarks.md, "Where the
        training phases wait on the host"). Elsewhere it is ``to``."""
        if device.type != "cuda":
            return self.to(device)
        return replace(
            self,
            **{
                # contiguous first: a trimmed micro-batch's columns are a strided view, and a strided
                # copy to the GPU would go through a pageable temporary instead of the pinned buffer
                name: t.contiguous().pin_memory().to(device, non_blocking=True) if t.device.type == "cpu" else t.to(device)
                for name, t in self.tensors().items()
            },
        )

    def tensors(self) -> dict[str, torch.Tensor]:
        return {f.name: getattr(self, f.name) for f in fields(self) if isinstance(getattr(self, f.name), torch.Tensor)}


def position_ids_from_mask(attention_mask: torch.Tensor) -> torch.Tensor:
    """Positions count real tokens only, so left padding does not shift a prompt's positions."""
    return (attention_mask.long().cumsum(dim=1) - 1).clamp(min=0)


def left_justify(input_ids: torch.Tensor, attention_mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Rows laid out [left padding | real tokens | right padding] ([B, S]) moved to [real tokens |
    padding]: returns (ids [B, S], pads [B], each row's count of left padding it lost).

    Why: with every row's real tokens at positions 0..n-1, a causal forward needs no attention mask
    (no real token can see a later padding token), so attention runs the fused causal kernel; with a
    [B, S] padding mask it ran a masked kernel 8x slower at 14k tokens per row on an H100
    (benchmarks/longseq_profile.py). The real tokens' outputs are the same; the padding's are not used.
    The real tokens of a row must be contiguous, as this module's batches are.
    """
    b, s = input_ids.shape
    pads = (attention_mask.long().cumsum(dim=1) == 0).sum(dim=1)  # [B] leading zeros of the mask
    cols = (torch.arange(s, device=input_ids.device).unsqueeze(0) + pads.unsqueeze(1)).clamp(max=s - 1)  # [B, S]
    return input_ids.gather(1, cols), pads


# Pack a micro-batch only where padding it to its longest row would add at least this share of its
# real tokens. On an H100 (benchmarks/longseq_profile.py, rows of 2,000-28,000 tokens) the
# variable-length flash kernel of packed rows ran 5-20% slower than the padded causal kernel at 3-9%
# padding, even at 17%, and 1.14-1.38x faster at 33-83%.
PACK_MIN_PADDING = 0.2


def packing_pays(lengths: Sequence[int], min_padding: float = PACK_MIN_PADDING) -> bool:
    """Whether rows of these real-token ``lengths``, padded to the longest, would compute at least
    ``min_padding`` more tokens than their real ones."""
    return max(lengths, default=0) * len(lengths) >= (1.0 + min_padding) * sum(lengths)


@dataclass
class PackedRows:
    """Rows with their padding removed, end to end in one sequence (VERL's use_remove_padding).

    ids and positions are [1, T], T the real tokens of all rows; row i holds packed tokens
    cu_seqlens[i]:cu_seqlens[i + 1], at positions 0..n_i - 1. cu_seqlens is int32 [B + 1] on the ids'
    device, bounds the same values on the host; max_len is the longest row, as variable-length
    attention kernels take it.
    """

    ids: torch.Tensor  # [1, T]
    positions: torch.Tensor  # [1, T]
    cu_seqlens: torch.Tensor  # [B + 1] int32
    max_len: int
    bounds: list[int]  # [B + 1], cu_seqlens' values


def pack_rows(input_ids: torch.Tensor, attention_mask: torch.Tensor, lengths: Sequence[int]) -> PackedRows:
    """Rows laid out [left padding | real tokens | right padding] ([B, S]) packed into one row of
    their real tokens, in row order; ``lengths`` are the mask's row sums, read on the host by the
    caller (which decides with them whether to pack). The real tokens of a row must be contiguous, as
    this module's batches are; a row with none is packed as zero tokens."""
    device = input_ids.device
    bounds = [0, *itertools.accumulate(lengths)]
    cu = torch.tensor(bounds, dtype=torch.int32, device=device)  # [B + 1]
    ids = input_ids[attention_mask.bool()].unsqueeze(0)  # [1, T], row-major: rows in order, tokens in order
    starts = torch.repeat_interleave(  # [T] each token's row start
        cu[:-1].long(), torch.as_tensor(lengths, device=device), output_size=bounds[-1]
    )
    positions = (torch.arange(bounds[-1], device=device) - starts).unsqueeze(0)  # [1, T]
    return PackedRows(ids, positions, cu, max(lengths, default=0), bounds)


def left_pad(sequences: list[list[int]], pad_id: int, width: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Left-pad token lists to ``width`` (default: the longest); returns (ids, mask)."""
    return _pad_rows(sequences, pad_id, width, torch.long, left=True)


def right_pad(
    sequences: Sequence[Sequence[float]], pad: float, width: int | None = None, dtype: torch.dtype = torch.long
) -> tuple[torch.Tensor, torch.Tensor]:
    """Right-pad value lists (token ids by default; any ``dtype``) to ``width`` (default: the longest);
    returns (values, mask), the mask long as left_pad's."""
    return _pad_rows(sequences, pad, width, dtype, left=False)


def _pad_rows(
    sequences: Sequence[Sequence[float]], pad: float, width: int | None, dtype: torch.dtype, left: bool
) -> tuple[torch.Tensor, torch.Tensor]:
    width = max((len(s) for s in sequences), default=0) if width is None else width
    values = torch.full((len(sequences), width), pad, dtype=dtype)
    mask = torch.zeros((len(sequences), width), dtype=torch.long)
    for row, seq in enumerate(sequences):
        if len(seq) > width:
            raise ValueError(f"sequence {row} has {len(seq)} tokens, more than the width {width}")
        if seq:
            span = slice(width - len(seq), width) if left else slice(0, len(seq))
            values[row, span] = torch.as_tensor(list(seq), dtype=dtype)
            mask[row, span] = 1
    return values, mask


def concat_batches(parts: list[Batch]) -> Batch:
    """Stack batches row-wise, padding prompts on the left and responses on the right as needed."""
    if not parts:
        raise ValueError("concat_batches needs at least one batch")
    p_width = max(b.prompt_ids.shape[1] for b in parts)
    r_width = max(b.response_ids.shape[1] for b in parts)
    out: dict[str, Any] = {}
    for f in fields(Batch):
        values = [getattr(b, f.name) for b in parts]
        if all(v is None for v in values):
            out[f.name] = None
        elif f.name == "ground_truths":
            out[f.name] = [g for v in values for g in v]
        elif any(v is None for v in values):
            raise ValueError(f"field {f.name} is set in some batches and not in others")
        elif values[0].dim() == 1:
            out[f.name] = torch.cat(values)
        elif f.name.startswith("prompt"):
            out[f.name] = torch.cat([_pad_to(v, p_width, left=True) for v in values])
        else:
            out[f.name] = torch.cat([_pad_to(v, r_width, left=False) for v in values])
    return Batch(**out)


def _pad_to(t: torch.Tensor, width: int, left: bool, value: int | float = 0) -> torch.Tensor:
    extra = width - t.shape[1]
    if extra == 0:
        return t
    pad = torch.full((t.shape[0], extra), value, dtype=t.dtype, device=t.device)
    return torch.cat([pad, t] if left else [t, pad], dim=1)
