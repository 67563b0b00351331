"""A rollout engine built for decode throughput on GPU (name "fast").

What makes it fast, and why each piece is there:
- A lean forward of our own for dense Qwen2/Llama decoders (lean_decoder.py: ``LeanWeights`` +
  ``decode_logits``): q/k/v fused into one matrix and gate/up into another, so a layer is four
  matmuls, and a KV cache preallocated as one [layers, batch, kv heads, slots, head dim] tensor per
  K and V.
- Static shapes and device-side state (``DecodeBuffers``): the token fed in, positions, the cache
  slot written, the attention bias over slots, finished flags, the step and the sampling seed are
  all device tensors updated in place, so one decode step reads nothing from the host and can be
  captured in a CUDA graph and replayed (transformers' forward with its StaticCache did not
  capture when tried, see static_engine.py).
- Attention over a bucket of slots: a step attends over the first ``attn_len`` cache slots, rounded
  up to a bucket, with one graph per bucket; the host knows the step count, so it picks the graph
  without reading the device.
- Sampling in one fused kernel on GPU (trainer/kernels/triton_sampling.py): the keyed exponential
  race of ``sampling.sample_keyed`` (a row's draw does not depend on its batch), with temperature,
  and top-k / top-p through ``sampling.process_logits`` when they are on. The same pass flags
  non-finite logits and, without top-k / top-p, computes each sampled token's log-prob
  (base.GeneratedRows) from a running log-sum-exp; with filters it is one logsumexp and one gather
  over the step's raw logits in float32. Either way it happens inside the captured step. The loop
  (decode_loop.py, shared with the static engine) reads the host every ``check_every`` steps to stop
  once every row has ended (EOS) and to raise NonFiniteLogitsError, never a device assert.
- Target lengths (rollout.target_lengths): each row's target sits in a device buffer that the
  captured step reads to mark the row finished; the buffers keep max_new_tokens as their shape (so
  the graphs are reused from step to step) and the loop stops at the longest target.
- Weights come from the actor on the device in the reshard phase: each parameter (gathered whole
  with ``DTensor.full_tensor()`` under FSDP2) is copied into the engine's fixed buffers, whose
  addresses the captured graphs hold.

On CPU, or with rollout.enforce_eager, the same step runs eagerly, and sampling goes through
``sampling.sample_keyed``: greedy decoding gives the tokens of the hf and static engines.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

import torch
import torch.nn.functional as F
from torch import nn

from trainer.rollout.base import GeneratedRows, RolloutEngine, RowsRequest, SamplingParams
from trainer.rollout.decode_loop import decode_until_done
from trainer.rollout.lean_decoder import LeanWeights, decode_logits, lean_shape, prefill_logits
from trainer.rollout.sampling import (
    greedy,
    nonfinite_rows_mask,
    process_logits,
    sample_keyed,
    token_log_probs,
)
from trainer.workers.fsdp import compute_dtype

if TYPE_CHECKING:
    from trainer.config import RolloutConfig

PROMPT_ALIGN = 128  # prompt width and cache length are rounded up to this: stable shapes across steps
PREFILL_TOKENS = 32768  # rows per prefill chunk are chosen so that a chunk holds about this many tokens


# ----------------------------------------------------------------------------- decode buffers
def _round_up(n: int, multiple: int) -> int:
    return (n + multiple - 1) // multiple * multiple


class DecodeBuffers:
    """The KV cache and every piece of decode state for one (batch, prompt width, max_new) shape.

    Allocated once per shape and reused across generate calls (and by the CUDA graphs captured over
    them); ``reset`` fills them for a new micro-batch.
    """

    def __init__(
        self, w: LeanWeights, batch: int, prompt_width: int, max_new: int, stop_ids: tuple[int, ...], pad_id: int
    ) -> None:
        s, dev = w.shape, w.device
        self.batch, self.prompt_width, self.max_new = batch, prompt_width, max_new
        self.slots = _round_up(prompt_width + max_new, PROMPT_ALIGN)
        # zeros, not empty: a slot not yet written is masked by -inf, and 0 x NaN garbage would be NaN
        cache = (s.num_layers, batch, s.num_kv_heads, self.slots, s.head_dim)
        self.cache_k = torch.zeros(cache, dtype=w.dtype, device=dev)
        self.cache_v = torch.zeros(cache, dtype=w.dtype, device=dev)
        self.attn_bias = torch.full((batch, self.slots), float("-inf"), dtype=w.dtype, device=dev)
        self.tokens = torch.full((batch, max_new), pad_id, dtype=torch.long, device=dev)
        self.log_probs = torch.zeros((batch, max_new), dtype=torch.float32, device=dev)  # base.GeneratedRows
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
        self.stop_ids = torch.tensor(list(stop_ids), dtype=torch.long, device=dev)
        self.sampled = torch.zeros(batch, dtype=torch.long, device=dev)
        self.sampled_log_probs = torch.zeros(batch, dtype=torch.float32, device=dev)
        self.bad = torch.zeros(batch, dtype=torch.bool, device=dev)
        self.pad_id = pad_id

    @property
    def nbytes(self) -> int:
        return 2 * self.cache_k.numel() * self.cache_k.element_size()

    def reset(
        self, prompt_mask: torch.Tensor, row_keys: torch.Tensor, seed: int, targets: torch.Tensor | None = None
    ) -> None:
        width = self.prompt_width
        self.attn_bias.fill_(float("-inf"))
        self.attn_bias[:, :width].masked_fill_(prompt_mask.bool(), 0.0)
        self.tokens.fill_(self.pad_id)
        self.log_probs.zero_()
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

    def attn_len(self, decode_index: int, bucket: int) -> int:
        """Slots the ``decode_index``-th decode step (from 1) attends over: its token sits at slot
        P + decode_index - 1, so P + decode_index slots, rounded up to the bucket."""
        return min(_round_up(self.prompt_width + decode_index, bucket), self.slots)


# ----------------------------------------------------------------------------- the engine
class FastRolloutEngine(RolloutEngine):
    name = "fast"

    def __init__(
        self,
        model: nn.Module,
        tokenizer: Any,
        config: RolloutConfig | None = None,
        share_weights: bool = False,  # accepted for the registry's signature; this engine always copies
        check_every: int = 32,
        use_cuda_graphs: bool | None = None,
    ) -> None:
        super().__init__(model, tokenizer, config, share_weights=False)
        if check_every < 1:
            raise ValueError(f"check_every must be >= 1, got {check_every}")
        self.check_every = check_every
        self.shape = lean_shape(model.config)
        source = next(model.parameters())
        device = source.device
        if device.type == "cpu" and torch.cuda.is_available() and _is_offloaded(source):
            device = torch.device("cuda", torch.cuda.current_device())  # FSDP CPU offload: decode on the GPU
        self.weights = LeanWeights(self.shape, compute_dtype(source.dtype, device.type), device)
        self.weights.load(model)  # usable at once, like the other engines (reshard refreshes it)
        eager = bool(config.enforce_eager) if config is not None else False
        self.use_cuda_graphs = (device.type == "cuda" and not eager) if use_cuda_graphs is None else use_cuda_graphs
        if self.use_cuda_graphs and device.type != "cuda":
            raise ValueError("use_cuda_graphs needs the engine's weights on a CUDA device")
        self.free_cache = bool(config.free_cache_engine) if config is not None else False
        self._buffers: DecodeBuffers | None = None
        self._buffers_key: tuple[Any, ...] | None = None
        self._graphs: dict[int, torch.cuda.CUDAGraph] = {}
        self._race: Callable[..., None] | None = None
        if device.type == "cuda":
            from trainer.kernels.triton_sampling import keyed_race

            self._race = keyed_race
        self.stats: dict[str, float] = {}

    @property
    def device(self) -> torch.device:
        return self.weights.device

    # ------------------------------------------------------------------ reshard
    def sync_from(self, actor_model: nn.Module) -> int:
        """Copy the actor's current weights into the engine's buffers, on the device (see LeanWeights.load)."""
        return self.weights.load(actor_model)

    def load_weights(self, weights: Mapping[str, torch.Tensor] | nn.Module) -> int:
        return self.weights.load(weights)

    # ------------------------------------------------------------------ decoding
    def _bucket(self, slots: int) -> int:
        """Slots per attention bucket: 128, or coarser for long contexts (at most 32 graphs)."""
        return max(PROMPT_ALIGN, _round_up(math.ceil(slots / 32), PROMPT_ALIGN))

    def _sample(self, buf: DecodeBuffers, logits: torch.Tensor, sampling: SamplingParams) -> None:
        """Pick token ``buf.step`` for every row from logits [b, V] and advance the state; no host reads."""
        log_prob: torch.Tensor | None = None  # the race kernel computes it in its pass when unfiltered
        if sampling.do_sample:
            filters = sampling.top_k_or_zero > 0 or sampling.top_p < 1.0
            if self._race is not None:
                scores = process_logits(logits, sampling.temperature, sampling.top_k_or_zero, sampling.top_p) if filters else logits
                inv_t = 1.0 if filters else 1.0 / sampling.temperature
                fused = None if filters else buf.sampled_log_probs
                self._race(scores, buf.row_keys, buf.step, buf.seed, inv_t, buf.sampled, buf.bad, fused)
                token, bad, log_prob = buf.sampled, buf.bad, fused
            else:
                scores = process_logits(logits, sampling.temperature, sampling.top_k_or_zero, sampling.top_p)
                token = sample_keyed(scores, buf.row_keys, buf.step, buf.seed)
                bad = nonfinite_rows_mask(logits)
        else:
            token, bad = greedy(logits), nonfinite_rows_mask(logits)
        if log_prob is None:
            log_prob = token_log_probs(logits, token, sampling.temperature if sampling.do_sample else 1.0)
        buf.log_probs.index_copy_(1, buf.step.view(1), log_prob.view(-1, 1))
        buf.first_bad.copy_(torch.where(bad & (buf.first_bad < 0), buf.step, buf.first_bad))
        token = token.masked_fill(buf.finished, buf.pad_id)  # finished rows emit padding
        buf.tokens.index_copy_(1, buf.step.view(1), token.view(-1, 1))
        if buf.stop_ids.numel():
            buf.finished.logical_or_((token.unsqueeze(1) == buf.stop_ids).any(dim=1))
        buf.finished.logical_or_(buf.step + 1 >= buf.targets)  # token ``step`` was the row's last
        buf.last.copy_(token)
        buf.step.add_(1)

    def _decode_step(self, buf: DecodeBuffers, attn_len: int, sampling: SamplingParams) -> None:
        """One decode step: the graph-captured body."""
        buf.attn_bias.index_fill_(1, buf.write_slot.view(1), 0.0)  # the slot written now becomes visible
        logits = decode_logits(
            self.weights, buf.cache_k, buf.cache_v, buf.last, buf.positions, buf.write_slot, buf.attn_bias, attn_len
        )
        buf.write_slot.add_(1)
        buf.positions.add_(1)
        self._sample(buf, logits, sampling)

    def _prepare(self, batch: int, width: int, max_new: int, sampling: SamplingParams) -> DecodeBuffers:
        """Buffers (and graphs) for this shape: reused when the shape repeats, else built anew."""
        key = (batch, width, max_new, sampling, self.stop_token_ids)
        if self._buffers is not None and self._buffers_key == key:
            return self._buffers
        self.release()
        buf = DecodeBuffers(self.weights, batch, width, max_new, self.stop_token_ids, self.pad_token_id)
        self._buffers, self._buffers_key = buf, key
        if self.use_cuda_graphs and max_new > 1:
            self._capture(buf, sampling)
        return buf

    def _capture(self, buf: DecodeBuffers, sampling: SamplingParams) -> None:
        """One CUDA graph of the decode step per attention bucket, sharing one memory pool.

        Each bucket's step runs once eagerly first (on a side stream: kernel selection, Triton
        compilation and workspaces happen outside capture); the state those runs leave is reset
        before every generate call.
        """
        import time

        start = time.perf_counter()
        bucket = self._bucket(buf.slots)
        lengths = sorted({buf.attn_len(i, bucket) for i in range(1, buf.max_new)})
        buf.reset(torch.ones(buf.batch, buf.prompt_width, device=self.device), buf.row_keys, 0)
        side = torch.cuda.Stream(self.device)
        side.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(side):
            for n in lengths:
                self._decode_step(buf, n, sampling)
        torch.cuda.current_stream(self.device).wait_stream(side)
        torch.cuda.synchronize(self.device)
        pool = torch.cuda.graph_pool_handle()
        for n in lengths:
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=pool):
                self._decode_step(buf, n, sampling)
            self._graphs[n] = graph
        torch.cuda.synchronize(self.device)
        self.stats["capture_s"] = time.perf_counter() - start
        self.stats["graphs"] = float(len(lengths))

    def release(self) -> None:
        """Drop the KV cache, decode state and graphs (VERL's free_cache_engine)."""
        self._graphs.clear()
        self._buffers, self._buffers_key = None, None

    def _generate_rows(self, request: RowsRequest) -> GeneratedRows:
        prompt_ids, prompt_mask, sampling = request.prompt_ids, request.prompt_mask, request.sampling
        b, width = prompt_ids.shape
        padded = _round_up(width, PROMPT_ALIGN)
        if padded > width:  # more left padding: the cache's shape stays the same from step to step
            prompt_ids = F.pad(prompt_ids, (padded - width, 0), value=self.pad_token_id)
            prompt_mask = F.pad(prompt_mask, (padded - width, 0), value=0)
        buf = self._prepare(b, padded, request.max_new_tokens, sampling)
        buf.reset(prompt_mask, request.row_keys, request.seed, request.targets)
        chunk = max(1, PREFILL_TOKENS // padded)
        logits = torch.empty((b, self.shape.vocab), dtype=self.weights.dtype, device=self.device)
        for r in range(0, b, chunk):
            logits[r : r + chunk] = prefill_logits(
                self.weights, buf.cache_k[:, r : r + chunk], buf.cache_v[:, r : r + chunk],
                prompt_ids[r : r + chunk], prompt_mask[r : r + chunk],
            )
        self._sample(buf, logits, sampling)
        del logits
        bucket = self._bucket(buf.slots)

        def step(decode_index: int) -> None:
            attn_len = buf.attn_len(decode_index, bucket)
            graph = self._graphs.get(attn_len)
            if graph is not None:
                graph.replay()
            else:
                self._decode_step(buf, attn_len, sampling)

        steps = decode_until_done(step, buf.first_bad, buf.finished, request, self.check_every, self.name)
        out = GeneratedRows(buf.tokens[:, :steps].clone(), buf.log_probs[:, :steps].clone())
        if self.free_cache:
            self.release()
        return out


def _is_offloaded(param: torch.Tensor) -> bool:
    """A parameter whose FSDP2 shard lives on the CPU (CPUOffloadPolicy)."""
    from torch.distributed.tensor import DTensor

    return isinstance(param, DTensor) and param.to_local().device.type == "cpu"
