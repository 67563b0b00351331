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
  up to a bucket, with one graph per (decoded slots, bucket, attention chunks per row: see
  ``_attention_splits``), captured the second time it is met
  (the first runs eagerly); the host knows the step count, so it picks the graph without reading the
  device. The GPU attention kernel reads the write slot on the device and reads no slot after it, so
  the bucket's unwritten slots cost nothing.
- One prefill per distinct prompt: GRPO's rollout.n rows of a prompt get its K/V and logits by copy
  (``_prefill_once_per_prompt``), as vLLM's prefix caching shares a prompt's blocks among its samples.
- Row compaction (decode_buffers.py): at a check, once at most half the decoded slots still run,
  the running rows and their caches move to the front and later steps decode only those slots, so
  ragged lengths do not keep paying for rows that have ended. Between compactions the attention
  kernel skips the rows that ended (``skip_rows``: their programs read no K/V), so an ended row
  still in the decoded slots costs its share of the matmuls, not its cache's reads, which
  at long caches are most of a row's cost (``skip_ended_rows=False`` reads them, to compare).
- Decode attention on GPU split over the cache (trainer/kernels/triton_decode_attention.py): one
  program per (row, KV head, chunk of slots), so a few long rows still keep every SM reading; with
  many rows, one program per (row, KV head). The rows of one prompt (GRPO's rollout.n) read the
  prompt's K/V from one row's cache (``DecodeBuffers.prompt_rows``), so their programs share it in L2.
- The elementwise work of a decode step fused on GPU (trainer/kernels/triton_decode_fused.py):
  residual add + RMSNorm, RoPE + the K/V cache write, SiLU(gate) * up, each one kernel, so a layer
  is its four matmuls, attention and three small kernels instead of ~28 launches (``fused_decode``,
  or the RLBENCH_FUSED_DECODE environment variable read when the engine is built: "0" turns it off):
  with the split attention kernel, RoPE and the K/V cache write run inside it
  (``decode_attention_with_rope``; ``rope_in_attention=False`` keeps them a kernel of their own).
- Sampling in one pass over the logits on GPU (trainer/kernels/triton_sampling.py: a kernel over
  chunks of each row's vocabulary, and one that combines a row's chunks): the keyed exponential
  race of ``sampling.sample_keyed`` (a row's draw does not depend on its batch), with temperature,
  and top-k / top-p through ``sampling.process_logits`` when they are on. The same pass flags
  non-finite logits and, without top-k / top-p, computes each sampled token's log-prob
  (base.GeneratedRows) from a running log-sum-exp; with filters it is one logsumexp and one gather
  over the step's raw logits in float32. Either way it happens inside the captured step. The loop
  (decode_loop.py, shared with the static engine) reads the host every ``check_every`` steps to stop
  once every row has ended (EOS), to compact, and to raise NonFiniteLogitsError, never a device assert.
- Target lengths (rollout.target_lengths): each row's target sits in a device buffer that the
  captured step reads to mark the row finished; the buffers keep max_new_tokens as their shape (so
  the graphs are reused from step to step) and the loop stops at the longest target.
- Weights come from the actor on the device in the reshard phase: each parameter (gathered whole
  with ``DTensor.full_tensor()`` under FSDP2 over several GPUs; on one, its local shard is already
  whole) is copied into the engine's fixed buffers, whose addresses the captured graphs hold.

- Tensor-parallel decoding (rollout.tensor_model_parallel_size = t > 1; tensor_parallel.py): t
  consecutive workers decode their rows together, each GPU holding 1/t of every layer's heads and MLP
  width, two all-reduces a layer inside the captured step and the sampled tokens broadcast from the
  group's first member, so the members stay in step; each member keeps its own rows.

On CPU, or with rollout.enforce_eager, the same step runs eagerly, and sampling goes through
``sampling.sample_keyed``: greedy decoding gives the tokens of the hf and static engines.
"""

from __future__ import annotations

import functools
import math
import os
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
import torch.nn.functional as F
from torch import nn

from trainer.batch import Batch
from trainer.rollout.base import RolloutEngine
from trainer.rollout.decode_buffers import (
    PROMPT_ALIGN,
    DecodeBuffers,
    compacted_size,
    round_up,
    shared_prompt_rows,
)
from trainer.rollout.decode_loop import decode_until_done
from trainer.rollout.decode_trace import DecodeTrace, trace_dir, write_trace
from trainer.rollout.lean_decoder import LeanWeights, decode_logits, lean_shape, prefill_logits
from trainer.rollout.requests import GeneratedRows, RowsRequest, SamplingParams
from trainer.rollout.sampling import (
    greedy,
    nonfinite_rows_mask,
    process_logits,
    sample_keyed,
    token_entropies,
    token_log_probs,
)
from trainer.rollout.tensor_parallel import (
    TP_KEY,
    DecodeGroup,
    decode_groups,
    own_rows,
    reduce_from_env,
    row_starts,
)
from trainer.workers.fsdp import compute_dtype

if TYPE_CHECKING:
    from trainer.config import Config, RolloutConfig

PREFILL_TOKENS = 32768  # distinct prompts per prefill chunk are chosen so that a chunk holds about this many tokens
FUSED_DECODE_ENV = "RLBENCH_FUSED_DECODE"  # "0": the eager elementwise ops on GPU too (to compare), "1": fused


def fused_decode_from_env(environ: Mapping[str, str] | None = None) -> bool:
    """Whether a CUDA engine fuses its decode step's elementwise work (on unless FUSED_DECODE_ENV is "0")."""
    value = (os.environ if environ is None else environ).get(FUSED_DECODE_ENV, "1")
    if value not in ("0", "1"):
        raise ValueError(f"{FUSED_DECODE_ENV} must be '0' or '1', got {value!r}")
    return value == "1"


# ----------------------------------------------------------------------------- the engine
class FastRolloutEngine(RolloutEngine):
    name = "fast"
    reports_entropy = True
    accepts_sharded_model = True  # copies the weights into its fixed-address buffers (LeanWeights)
    supports_tensor_parallel = True  # tensor_parallel.py

    def __init__(
        self,
        model: nn.Module,
        tokenizer: Any,
        config: RolloutConfig | None = None,
        share_weights: bool = False,  # accepted for the registry's signature; this engine always copies
        check_every: int = 32,
        use_cuda_graphs: bool | None = None,
        compact_rows: bool = True,
        split_attention: bool = True,
        fused_decode: bool | None = None,
        rope_in_attention: bool = True,
        skip_ended_rows: bool = True,
        tensor_parallel: DecodeGroup | None = None,
    ) -> None:
        super().__init__(model, tokenizer, config, share_weights=False)
        if check_every < 1:
            raise ValueError(f"check_every must be >= 1, got {check_every}")
        self.check_every = check_every
        self.compact_rows = compact_rows  # see decode_buffers.py: decode only the rows still running
        # between compactions the GPU attention kernel reads no K/V for the rows that ended (skip_rows)
        self.skip_ended_rows = skip_ended_rows
        # in a decode group (rollout.tensor_model_parallel_size > 1) this GPU holds its part of the
        # heads and MLP width and adds the split matmuls' sums over the group (tensor_parallel.py)
        tp_rank, tp_size = (tensor_parallel.rank, tensor_parallel.size) if tensor_parallel is not None else (0, 1)
        self.shape = lean_shape(model.config).sharded(tp_size)
        source = next(model.parameters())
        device = source.device
        if device.type == "cpu" and torch.cuda.is_available() and _is_offloaded(source):
            device = torch.device("cuda", torch.cuda.current_device())  # FSDP CPU offload: decode on the GPU
        dtype = compute_dtype(source.dtype, device.type)
        one_shot_asked = tensor_parallel is not None and tensor_parallel.one_shot is None and reduce_from_env() == "one_shot"
        if one_shot_asked and device.type == "cuda":
            tensor_parallel = tensor_parallel.with_one_shot(device, dtype)
        self.tp = tensor_parallel
        self._reduce = tensor_parallel.all_reduce if tensor_parallel is not None else None
        self.weights = LeanWeights(self.shape, dtype, device, tp_rank, tp_size)
        self.weights.load(model)  # usable at once, like the other engines (reshard refreshes it)
        eager = bool(config.enforce_eager) if config is not None else False
        self.use_cuda_graphs = (device.type == "cuda" and not eager) if use_cuda_graphs is None else use_cuda_graphs
        if self.use_cuda_graphs and device.type != "cuda":
            raise ValueError("use_cuda_graphs needs the engine's weights on a CUDA device")
        self.free_cache = bool(config.free_cache_engine) if config is not None else False
        self._buffers: DecodeBuffers | None = None
        self._buffers_key: tuple[Any, ...] | None = None
        # (slots, attention length, attention chunks per row) -> graph
        self._graphs: dict[tuple[int, int, int], torch.cuda.CUDAGraph] = {}
        self._warmed: set[tuple[int, int, int]] = set()  # keys whose step ran once eagerly (see _step)
        self._capture_stream: torch.cuda.Stream | None = None
        self._pool: tuple[int, int] | None = None
        self._race: Callable[..., None] | None = None
        self._attend: Callable[..., torch.Tensor] | None = None  # None: SDPA
        self._attend_with_rope: Callable[..., torch.Tensor] | None = None  # with fused_decode: RoPE in the kernel
        # Triton kernels for the elementwise work between a decode step's matmuls (lean_decoder.py);
        # None: read FUSED_DECODE_ENV once, here. CPU keeps the eager ops.
        wanted = fused_decode_from_env() if fused_decode is None else fused_decode
        self.fused_decode = wanted and device.type == "cuda"
        self._attention_programs = 0  # the split attention kernel's program target (0: no split kernel)
        self._split_count: Callable[..., int] | None = None  # its chunks-per-row rule, with the kernel
        if device.type == "cuda":
            from trainer.kernels.triton_decode_attention import (
                decode_attention,
                decode_attention_with_rope,
                default_programs,
                split_count,
            )
            from trainer.kernels.triton_sampling import keyed_race

            self._race = keyed_race
            # the kernel takes power-of-two head dims of 16 or more; other models keep SDPA
            d = self.shape.head_dim
            self._attend = decode_attention if split_attention and d >= 16 and not d & (d - 1) else None
            if self._attend is not None and self.fused_decode and rope_in_attention:
                self._attend_with_rope = decode_attention_with_rope
            if self._attend is not None:
                self._attention_programs = default_programs(device)
                self._split_count = split_count
        # CUDA-graph capture seconds and graph count, cumulative: benchmarks/gpu_micro.py's engine run records them
        self.stats: dict[str, float] = {}

    @property
    def device(self) -> torch.device:
        return self.weights.device

    @staticmethod
    def check_config(cfg: Config) -> None:
        """A decode group must be whole workers of one node (tensor_parallel.py)."""
        from trainer.config.schema import ConfigError

        size = int(cfg.actor_rollout_ref.rollout.tensor_model_parallel_size)
        if size == 1:
            return
        try:
            decode_groups(cfg.world_size, size)
            reduce_from_env()  # a bad RLBENCH_TP_REDUCE fails here, before any worker starts
        except ValueError as err:
            raise ConfigError(str(err)) from None
        per_node = cfg.trainer.n_gpus_per_node
        if cfg.trainer.device == "cuda" and per_node % size:
            raise ConfigError(f"{TP_KEY}={size} must divide trainer.n_gpus_per_node={per_node}: a decode group stays on one node")

    def generate(
        self, prompt_token_lists: list[list[int]], uids: list[int], ground_truths: list[str], n: int,
        max_new_tokens: int, sampling: SamplingParams, seed: int,
    ) -> Batch:
        """RolloutEngine.generate; in a decode group, over every member's prompts together (each member
        calls it with its own), returning this member's rows."""
        if self.tp is None:
            return super().generate(prompt_token_lists, uids, ground_truths, n, max_new_tokens, sampling, seed)
        asked = self.tp.gather((prompt_token_lists, uids, ground_truths, n, max_new_tokens, sampling, seed))
        if len({tuple(a[3:]) for a in asked}) > 1:
            raise RuntimeError(f"fast rollout: a decode group's members asked for different steps: {[a[3:] for a in asked]}")
        group = super().generate(
            [p for a in asked for p in a[0]], [u for a in asked for u in a[1]], [g for a in asked for g in a[2]],
            n, max_new_tokens, sampling, seed,
        )
        return own_rows(group, row_starts([len(a[0]) for a in asked], n)[self.tp.rank], len(prompt_token_lists) * n)

    # ------------------------------------------------------------------ set-up
    def warm_up(self, prompts: int, n: int, prompt_len: int, max_new_tokens: int, sampling: SamplingParams) -> float:
        """RolloutEngine.warm_up: one short call of a step's shape (its decode group's rows and cache
        slots) whose rows end a few at each host check (``warm_up_targets``), so that it passes every
        compacted size and attention kernel variant the step will: their Triton kernels compile here, at
        set-up, not in the first timed generate. On a 7B decode-group member's rows on one H200 the
        first call took 10.3 s longer than the next (docs/benchmarks.md). Every member of a decode group
        calls it together (the same rows on each). Workers call it on GPUs only (CPU has nothing to compile)."""
        start = time.perf_counter()
        members = self.tp.size if self.tp is not None else 1
        rows = prompts * n * members
        per_call = self.micro_batch_size or rows
        targets = [min(t, max_new_tokens) for t in warm_up_targets(min(per_call, rows), self.check_every)]
        width = round_up(max(1, prompt_len), PROMPT_ALIGN)
        count = len(targets)
        prompt_of = torch.arange(count, device=self.device) // n  # n rows a prompt, as in a step
        # distinct prompts of any tokens: [count, width]
        prompt_ids = (prompt_of[:, None] * 7919 + torch.arange(width, device=self.device)) % max(1, self.shape.vocab - 1) + 1
        request = RowsRequest(
            prompt_ids=prompt_ids, prompt_mask=torch.ones_like(prompt_ids), row_keys=torch.arange(count, device=self.device),
            max_new_tokens=max_new_tokens, sampling=sampling, seed=0, generator=None, micro_batch=0, row_offset=0, n=n,
            targets=torch.tensor(targets, device=self.device), longest_target=max(targets),
        )
        with self._generation_mode():
            decoded = self._generate_rows(request, traced=False)
        self.stats["warm_up_tokens"] = float(decoded.tokens.shape[1])  # what it decoded: the longest target
        self.release()  # the step's own call builds its buffers and graphs anew, as every call with free_cache_engine
        if self.device.type == "cuda":
            torch.cuda.empty_cache()  # set-up's memory, and the reshard's peak after it, as without the call
        return time.perf_counter() - start

    # ------------------------------------------------------------------ reshard
    def sync_from(self, actor_model: nn.Module) -> int:
        """Copy the actor's current weights into the engine's buffers, on the device (see LeanWeights.load)."""
        return self.weights.load(actor_model)

    def load_weights(self, weights: Mapping[str, torch.Tensor] | nn.Module) -> int:
        return self.weights.load(weights)

    # ------------------------------------------------------------------ decoding
    def _bucket(self, slots: int) -> int:
        """Slots per attention bucket: 128, or coarser for long contexts (at most 32 graphs)."""
        return max(PROMPT_ALIGN, round_up(math.ceil(slots / 32), PROMPT_ALIGN))

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
        if self.tp is not None:
            # the group's first member's pick and non-finite flag, so every member decodes, ends its rows
            # and raises in step (a member that stopped alone would leave the others in a collective).
            # Their logits hold the same bits (NCCL's all-reduce gives every member the same sums, the
            # LM head is whole on each), so this changes nothing but guards against that ever failing;
            # the one-shot kernel (RLBENCH_TP_REDUCE) may add in another order on each member beyond 2.
            packed = self.tp.broadcast_(token * 2 + bad.long())
            token, bad = packed // 2, (packed % 2).bool()
        if log_prob is None:
            log_prob = token_log_probs(logits, token, sampling.log_prob_temperature)
        # outputs are indexed by the slot's row (``rows``): compaction moves rows between slots
        at = (buf.rows, buf.step.expand(buf.batch))
        buf.log_probs.index_put_(at, log_prob.float())
        if buf.entropies is not None:  # an audit's: one more pass over the logits
            buf.entropies.index_put_(at, token_entropies(logits, sampling.log_prob_temperature))
        # an ended row's logits are never used (its attention may be skipped): non-finite there is no error
        flagged = bad & ~buf.finished & (buf.first_bad < 0)
        buf.first_bad.copy_(torch.where(flagged, buf.step, buf.first_bad))
        token = token.masked_fill(buf.finished, buf.pad_id)  # finished rows emit padding
        buf.tokens.index_put_(at, token)
        if buf.stop_ids.numel():
            buf.finished.logical_or_((token.unsqueeze(1) == buf.stop_ids).any(dim=1))
        buf.finished.logical_or_(buf.step + 1 >= buf.targets)  # token ``step`` was the row's last
        buf.last.copy_(token)
        buf.step.add_(1)

    def _attention_splits(self, rows: int, attn_len: int) -> int:
        """Chunks per (row, KV head) for the split attention kernel over ``rows`` rows that read their
        caches (0 without the kernel)."""
        if self._split_count is None:
            return 0
        return self._split_count(max(1, rows), self.shape.num_kv_heads, attn_len, self._attention_programs)

    def _decode_step(self, buf: DecodeBuffers, attn_len: int, sampling: SamplingParams, splits: int = 0) -> None:
        """One decode step: the graph-captured body. ``splits``: the attention kernel's chunks per
        (row, KV head) (0: its own rule, for the slots decoded)."""
        buf.attn_bias.index_fill_(1, buf.write_slot.view(1), 0.0)  # the slot written now becomes visible
        # the GPU kernel reads each prompt group's K/V from one row's cache, and no slot after the one
        # written now (the rest of the attention bucket is masked)
        attend = attend_with_rope = None
        skip = buf.finished if self.skip_ended_rows else None  # an ended row emits padding whatever its logits
        chunks = splits or None
        if self._attend_with_rope is not None:  # this step's RoPE and K/V write in the kernel too
            attend_with_rope = functools.partial(
                self._attend_with_rope, kv_rows=buf.prompt_rows, shared_slots=buf.prompt_width, skip_rows=skip,
                splits=chunks,
            )
        elif self._attend is not None:
            attend = functools.partial(
                self._attend, kv_rows=buf.prompt_rows, shared_slots=buf.prompt_width, last_slot=buf.write_slot,
                skip_rows=skip, splits=chunks,
            )
        logits = decode_logits(
            self.weights, buf.cache_k, buf.cache_v, buf.last, buf.positions, buf.write_slot, buf.attn_bias, attn_len,
            attend, self.fused_decode, attend_with_rope, self._reduce,
        )
        buf.write_slot.add_(1)
        buf.positions.add_(1)
        self._sample(buf, logits, sampling)

    def _prepare(self, batch: int, width: int, max_new: int, sampling: SamplingParams) -> DecodeBuffers:
        """Buffers for this shape: reused (with their graphs) when the shape repeats, else built anew."""
        key = (batch, width, max_new, sampling, self.stop_token_ids)
        if self._buffers is not None and self._buffers_key == key:
            return self._buffers
        self.release()
        buf = DecodeBuffers(
            self.weights, batch, width, max_new, self.stop_token_ids, self.pad_token_id, sampling.report_entropy
        )
        self._buffers, self._buffers_key = buf, key
        return buf

    def _step(self, view: DecodeBuffers, attn_len: int, sampling: SamplingParams, running: int | None = None) -> None:
        """One decode step over ``view``'s slots: a graph replay when one is captured for its
        (slots, attention length, attention chunks), else eager. ``running``: the rows still running at
        the last check (at most, as rows only end), for which the attention's chunks are chosen
        (default: every slot's row).

        Graphs are captured lazily, one per (slots, attention bucket, chunks) met, sharing one memory pool:
        the first time a key is met its step runs eagerly on the capture stream (kernel selection,
        Triton compilation and workspaces happen outside capture), the second time it is captured
        (capture records, it does not run) and replayed. The keys a generate call meets form a path
        (attention grows, slots and running rows shrink), so a call meets at most buckets + log2(batch) +
        the chunk counts it passes through.
        """
        # Chunks for the rows running, not the slots decoded: ended rows' programs read nothing
        # (skip_rows), so 33 running rows of 64 slots would run half the programs the kernel aims for
        # if the chunks were counted for 64 rows
        reading = running if running is not None and self.skip_ended_rows else view.batch
        splits = self._attention_splits(reading, attn_len)
        if not self.use_cuda_graphs:
            self._decode_step(view, attn_len, sampling, splits)
            return
        key = (view.batch, attn_len, splits)
        graph = self._graphs.get(key)
        if graph is None:
            start = time.perf_counter()
            if self._capture_stream is None:
                self._capture_stream = torch.cuda.Stream(self.device)
                self._pool = torch.cuda.graph_pool_handle()
            stream, current = self._capture_stream, torch.cuda.current_stream(self.device)
            if key not in self._warmed:
                self._warmed.add(key)
                stream.wait_stream(current)
                with torch.cuda.stream(stream):
                    self._decode_step(view, attn_len, sampling, splits)
                current.wait_stream(stream)
                return
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=self._pool, stream=stream):
                self._decode_step(view, attn_len, sampling, splits)
            self._graphs[key] = graph
            self.stats["capture_s"] = self.stats.get("capture_s", 0.0) + time.perf_counter() - start
            self.stats["graphs"] = float(len(self._graphs))
        graph.replay()

    def _prefill_once_per_prompt(
        self, buf: DecodeBuffers, prompt_ids: torch.Tensor, prompt_mask: torch.Tensor, groups: torch.Tensor
    ) -> torch.Tensor:
        """Prefill each distinct prompt once and give every row of its group that prompt's K/V and
        last-position logits [b, V]: GRPO's rollout.n rows of one prompt would otherwise each redo the
        same forward (at 16 prompts x 8 of 256 tokens, 8x the prefill's FLOPs). Prefix caching in
        vLLM shares a prompt's KV blocks among its n samples the same way. ``groups`` [b] (host): each
        row's group's first row (shared_prompt_rows). Every row's cache then holds its prompt's K/V
        bit for bit, whichever row the attention kernel reads it from (DecodeBuffers.prompt_rows)."""
        firsts, group_of = torch.unique(groups, return_inverse=True)  # firsts ascending; row -> its index there
        b, width = prompt_ids.shape
        logits = torch.empty((b, self.shape.vocab), dtype=self.weights.dtype, device=self.device)
        chunk = max(1, PREFILL_TOKENS // width)  # distinct prompts per prefill forward
        for start in range(0, len(firsts), chunk):
            at = firsts[start : start + chunk].to(prompt_ids.device)
            rows = torch.nonzero((group_of >= start) & (group_of < start + len(at))).flatten()
            of = (group_of[rows] - start).to(self.device)  # each row's prompt within this chunk
            rows = rows.to(self.device)
            prompt_logits = prefill_logits(  # each layer's K/V written straight into every row of its group
                self.weights, buf.cache_k, buf.cache_v, prompt_ids[at], prompt_mask[at], into=(rows, of),
                reduce=self._reduce,
            )
            logits[rows] = prompt_logits[of]
        return logits

    def release(self) -> None:
        """Drop the KV cache, decode state and graphs (VERL's free_cache_engine)."""
        self._graphs.clear()
        self._warmed.clear()
        self._buffers, self._buffers_key = None, None

    def _generate_rows(self, request: RowsRequest, traced: bool = True) -> GeneratedRows:
        prompt_ids, prompt_mask, sampling = request.prompt_ids, request.prompt_mask, request.sampling
        b, width = prompt_ids.shape
        padded = round_up(width, PROMPT_ALIGN)
        if padded > width:  # more left padding: the cache's shape stays the same from step to step
            prompt_ids = F.pad(prompt_ids, (padded - width, 0), value=self.pad_token_id)
            prompt_mask = F.pad(prompt_mask, (padded - width, 0), value=0)
        buf = self._prepare(b, padded, request.max_new_tokens, sampling)
        groups = shared_prompt_rows(prompt_ids, prompt_mask)
        buf.reset(prompt_mask, request.row_keys, request.seed, request.targets, groups.to(self.device))
        logits = self._prefill_once_per_prompt(buf, prompt_ids, prompt_mask, groups)
        self._sample(buf, logits, sampling)
        del logits
        bucket = self._bucket(buf.slots)
        view = buf  # the slots decoded now: all, then the running rows' after each compaction
        running_rows = buf.batch  # rows running at the last check (the attention's chunks are sized for them)
        traces = trace_dir() if traced else None  # RLBENCH_DECODE_TRACE, read once a call (not for a warm-up)
        trace = self._start_trace(buf, request) if traces is not None else None

        def step(decode_index: int) -> None:
            self._step(view, buf.attn_len(decode_index, bucket), sampling, running_rows)

        def compact(running: int, steps: int) -> None:
            nonlocal view, running_rows
            running_rows = running
            size = compacted_size(running, view.batch) if self.compact_rows else view.batch
            if size < view.batch:
                view = buf.compact(size, written_slots=buf.prompt_width + steps - 1)
            if trace is not None:
                trace.mark(steps, running, view.batch)

        steps = decode_until_done(
            step, buf.first_bad, buf.finished, request, self.check_every, self.name, on_check=compact, rows=buf.rows
        )
        if trace is not None and traces is not None:
            self._finish_trace(trace, steps, traces)
        entropies = buf.entropies[:, :steps].clone() if buf.entropies is not None else None
        out = GeneratedRows(buf.tokens[:, :steps].clone(), buf.log_probs[:, :steps].clone(), entropies)
        if self.free_cache:
            self.release()
        return out

    # ------------------------------------------------------------------ tracing (RLBENCH_DECODE_TRACE)
    def _start_trace(self, buf: DecodeBuffers, request: RowsRequest) -> DecodeTrace:
        """A decode trace of this call (RLBENCH_DECODE_TRACE names a directory: decode_trace.py)."""
        s = self.shape
        kv_token = 2 * s.num_layers * s.num_kv_heads * s.head_dim * self.weights.lm_head.element_size()
        targets = request.targets.tolist() if request.targets is not None else None
        trace = DecodeTrace(buf.batch, buf.prompt_width, self.weights.weight_bytes_per_step, kv_token, targets)
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)  # the prefill is not the decode's
        trace.mark(1, buf.batch, buf.batch)
        return trace

    def _finish_trace(self, trace: DecodeTrace, steps: int, directory: Path) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        trace.finish(steps)
        write_trace(trace, directory)


def warm_up_targets(rows: int, check_every: int) -> list[int]:
    """Each row's target length in a warm-up call of ``rows`` rows: half the rows still running end
    before each host check (every ``check_every`` steps), so the call compacts through every size down
    to one row, and meets both one attention chunk per row (its first steps, while the attention spans
    256 slots or fewer, or 100 rows and more with 2 KV heads) and several (later, fewer rows). Row i runs
    check_every * (1 + L - B(i)) tokens, L = ceil(log2(rows)) and B(i) the bit length of i (0 for row 0,
    L for the upper half of 2**L rows): at the j-th check 2**(L - j) rows of 2**L still run."""
    if rows < 1 or check_every < 1:
        raise ValueError(f"warm_up_targets: rows and check_every must be >= 1, got {rows} and {check_every}")
    levels = (rows - 1).bit_length()
    return [check_every * (1 + levels - i.bit_length()) for i in range(rows)]


def _is_offloaded(param: torch.Tensor) -> bool:
    """A parameter whose FSDP2 shard lives on the CPU (CPUOffloadPolicy)."""
    from torch.distributed.tensor import DTensor

    return isinstance(param, DTensor) and param.to_local().device.type == "cpu"
