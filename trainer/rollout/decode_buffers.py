"""The fast engine's decode state for one (batch, prompt width, max_new) shape, and row compaction.

``DecodeBuffers`` holds the KV cache and every piece of per-row decode state as device tensors that
a decode step updates in place (so the step can be captured in a CUDA graph).

Compaction, and why: rows end at different lengths (an EOS, or rollout.target_lengths' ragged
targets). Without it, every step decodes every row of the micro-batch, and reads every row's KV
cache, until the longest row ends: with log-normal response lengths capped at 27,648 tokens (VERL's
1.5B workload) the batch runs about twice the steps its mean needs at full width. ``compact`` moves
the rows still running (with their caches) to the front slots and the engine then decodes only a
prefix of slots, so a step costs what its live rows cost, as continuous batching does in vLLM.
Slots are addressed through ``rows`` (slot -> the row of the micro-batch it decodes), so each row's
tokens and log-probs land in its own output row whatever slot it moved to, and its sampling key
moves with it: the tokens do not depend on when compaction happened.
"""

from __future__ import annotations

import copy

import torch

from trainer.rollout.lean_decoder import LeanWeights

PROMPT_ALIGN = 128  # prompt width and cache length are rounded up to this: stable shapes across steps

# per-slot state that must move with its row when rows are compacted
ROW_STATE = ("attn_bias", "last", "positions", "finished", "targets", "first_bad", "row_keys", "rows")
# per-slot scratch rewritten every step (views only, never moved)
ROW_SCRATCH = ("sampled", "sampled_log_probs", "bad")


def round_up(n: int, multiple: int) -> int:
    return (n + multiple - 1) // multiple * multiple


def shared_prompt_rows(prompt_ids: torch.Tensor, prompt_mask: torch.Tensor) -> torch.Tensor:
    """[b] long on the host: for each row, the first row with the same prompt (tokens and padding).

    GRPO repeats each prompt rollout.n times, so n rows' caches hold the same prompt K/V (bit for bit:
    the fast engine prefills each prompt once and copies its K/V to the group's rows); the attention
    kernel reads it from one of them, and the n programs reading it at once share it through L2."""
    first: dict[tuple[tuple[int, ...], tuple[int, ...]], int] = {}
    rows = [first.setdefault((tuple(ids), tuple(mask)), i)
            for i, (ids, mask) in enumerate(zip(prompt_ids.tolist(), prompt_mask.tolist(), strict=True))]
    return torch.tensor(rows, dtype=torch.long)


def compacted_size(running: int, size: int) -> int:
    """Slots to keep once ``running`` of ``size`` decoded slots are still running: the next power of two
    at or above ``running`` when that at least halves the slots, else ``size`` (no compaction)."""
    if running <= 0:
        return size
    target = 1 << (running - 1).bit_length()
    return target if 2 * target <= size else size


class DecodeBuffers:
    """The KV cache and every piece of decode state for one (batch, prompt width, max_new) shape.

    Allocated once per shape and reused across generate calls (and by the CUDA graphs captured over
    them); ``reset`` fills them for a new micro-batch. ``narrow(n)`` is the same state seen through
    its first n slots (views: what a compacted decode step reads and writes).
    """

    def __init__(
        self, w: LeanWeights, batch: int, prompt_width: int, max_new: int, stop_ids: tuple[int, ...], pad_id: int,
        with_entropy: bool = False,
    ) -> None:
        s, dev = w.shape, w.device
        self.batch, self.prompt_width, self.max_new = batch, prompt_width, max_new
        self.slots = round_up(prompt_width + max_new, PROMPT_ALIGN)
        # zeros, not empty: a slot not yet written is masked by -inf, and 0 x NaN garbage would be NaN
        cache = (s.num_layers, batch, s.num_kv_heads, self.slots, s.head_dim)
        self.cache_k = torch.zeros(cache, dtype=w.dtype, device=dev)
        self.cache_v = torch.zeros(cache, dtype=w.dtype, device=dev)
        self.attn_bias = torch.full((batch, self.slots), float("-inf"), dtype=w.dtype, device=dev)
        # outputs, indexed by the micro-batch's row (not by slot): see ``rows``
        self.tokens = torch.full((batch, max_new), pad_id, dtype=torch.long, device=dev)
        self.log_probs = torch.zeros((batch, max_new), dtype=torch.float32, device=dev)  # base.GeneratedRows
        # each step's distribution's entropy, only when SamplingParams.report_entropy asks (the sampler check)
        self.entropies = torch.zeros((batch, max_new), dtype=torch.float32, device=dev) if with_entropy else None
        self.last = torch.zeros(batch, dtype=torch.long, device=dev)
        self.positions = torch.zeros(batch, dtype=torch.long, device=dev)
        self.write_slot = torch.zeros((), dtype=torch.long, device=dev)
        self.step = torch.zeros((), dtype=torch.long, device=dev)
        self.seed = torch.zeros((), dtype=torch.long, device=dev)
        self.finished = torch.zeros(batch, dtype=torch.bool, device=dev)
        # each row's target length, read inside the captured step (max_new without target lengths)
        self.targets = torch.full((batch,), max_new, dtype=torch.long, device=dev)
        self.first_bad = torch.full((batch,), -1, dtype=torch.long, device=dev)
        self.row_keys = torch.zeros(batch, dtype=torch.long, device=dev)
        self.rows = torch.arange(batch, dtype=torch.long, device=dev)  # slot -> micro-batch row
        # slot -> the slot whose cache holds its prompt's K/V (the first slot of its prompt's group), which
        # the GPU's attention kernel reads for the prompt slots; itself once rows have been compacted
        self.prompt_rows = torch.arange(batch, dtype=torch.long, device=dev)
        self.stop_ids = torch.tensor(list(stop_ids), dtype=torch.long, device=dev)
        self.sampled = torch.zeros(batch, dtype=torch.long, device=dev)
        self.sampled_log_probs = torch.zeros(batch, dtype=torch.float32, device=dev)
        self.bad = torch.zeros(batch, dtype=torch.bool, device=dev)
        self.pad_id = pad_id
        self.live = batch  # slots decoded now: the first ``live`` (host value, changed by ``compact``)

    @property
    def nbytes(self) -> int:
        return 2 * self.cache_k.numel() * self.cache_k.element_size()

    def reset(
        self, prompt_mask: torch.Tensor, row_keys: torch.Tensor, seed: int, targets: torch.Tensor | None = None,
        prompt_rows: torch.Tensor | None = None,
    ) -> None:
        width = self.prompt_width
        self.attn_bias.fill_(float("-inf"))
        self.attn_bias[:, :width].masked_fill_(prompt_mask.bool(), 0.0)
        self.tokens.fill_(self.pad_id)
        self.log_probs.zero_()
        if self.entropies is not None:
            self.entropies.zero_()
        self.last.fill_(self.pad_id)
        self.positions.copy_(prompt_mask.sum(dim=1))  # the first generated token follows the prompt
        self.write_slot.fill_(width)
        self.step.zero_()
        self.seed.fill_(seed & 0xFFFFFFFF)
        self.finished.zero_()
        if targets is None:
            self.targets.fill_(self.max_new)
        else:
            self.targets.copy_(targets)
        self.first_bad.fill_(-1)
        self.row_keys.copy_(row_keys)
        torch.arange(self.batch, out=self.rows)
        if prompt_rows is None:
            torch.arange(self.batch, out=self.prompt_rows)
        else:
            self.prompt_rows.copy_(prompt_rows)
        self.live = self.batch

    def attn_len(self, decode_index: int, bucket: int) -> int:
        """Slots the ``decode_index``-th decode step (from 1) attends over: its token sits at slot
        P + decode_index - 1, so P + decode_index slots, rounded up to the bucket."""
        return min(round_up(self.prompt_width + decode_index, bucket), self.slots)

    def narrow(self, n: int) -> DecodeBuffers:
        """The state of the first ``n`` slots, as views (shared scalars and outputs): writes go through."""
        view = copy.copy(self)
        for name in ROW_STATE + ROW_SCRATCH:
            setattr(view, name, getattr(self, name)[:n])
        view.cache_k, view.cache_v = self.cache_k[:, :n], self.cache_v[:, :n]
        view.prompt_rows = self.prompt_rows[:n]
        view.batch = view.live = n
        return view

    @torch.no_grad()
    def compact(self, size: int, written_slots: int) -> DecodeBuffers:
        """Move the running rows among the ``live`` slots to the front, keep ``size`` slots, and return
        their view (``narrow(size)``). No host read: the caller chose ``size`` (>= rows running).

        Only the ``written_slots`` cache slots written so far are moved. The slots dropped are marked
        finished with no non-finite step, so checks over the whole buffers stay right.
        """
        live = self.live
        keep = torch.argsort(self.finished[:live].to(torch.int8), stable=True)[:size]  # running rows first
        for name in ROW_STATE:
            tensor = getattr(self, name)
            tensor[:size] = tensor[keep]
        for cache in (self.cache_k, self.cache_v):
            for layer in range(cache.shape[0]):  # one layer at a time: the temporary is 1/L of the cache
                cache[layer, :size, :, :written_slots] = cache[layer, keep, :, :written_slots]
        # each kept row's own cache holds its prompt: a group's first slot may have been dropped
        self.prompt_rows[:size].copy_(torch.arange(size, device=self.prompt_rows.device))
        self.finished[size:live] = True
        self.first_bad[size:live] = -1  # the dropped rows were checked before compaction
        self.live = size
        return self.narrow(size)
