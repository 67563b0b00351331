"""A rollout engine built for decode throughput on GPU (name "fast").

What makes it fast, and why each piece is there:
- A lean forward of our own for dense Qwen2/Llama decoders (``LeanWeights`` + ``decode_logits``):
  q/k/v fused into one matrix and gate/up into another, so a layer is four matmuls, and a KV cache
  preallocated as one [layers, batch, kv heads, slots, head dim] tensor per K and V.
- Static shapes and device-side state (``DecodeBuffers``): the token fed in, positions, the cache
  slot written, the attention bias over slots, finished flags, the step and the sampling seed are
  all device tensors updated in place, so one decode step reads nothing from the host and can be
  captured in a CUDA graph and replayed (transformers' forward with its StaticCache could not,
  REFERENCE.md section 6).
- Attention over a bucket of slots: a step attends over the first ``attn_len`` cache slots, rounded
  up to a bucket, with one graph per bucket; the host knows the step count, so it picks the graph
  without reading the device.
- Sampling in one fused kernel on GPU (trainer/kernels/triton_sampling.py): the keyed exponential
  race of ``sampling.sample_keyed`` (a row's draw does not depend on its batch), with temperature,
  and top-k / top-p through ``sampling.process_logits`` when they are on. The same pass flags
  non-finite logits; the loop reads the host every ``check_every`` steps to stop once every row has
  ended (EOS) and to raise NonFiniteLogitsError, never a device assert.
- Weights come from the actor on the device in the reshard phase: each parameter (gathered whole
  with ``DTensor.full_tensor()`` under FSDP2) is copied into the engine's fixed buffers, whose
  addresses the captured graphs hold.

On CPU, or with rollout.enforce_eager, the same step runs eagerly, and sampling goes through
``sampling.sample_keyed``: greedy decoding gives the tokens of the hf and static engines.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch
import torch.nn.functional as F
from torch import nn

from trainer.batch import position_ids_from_mask
from trainer.rollout.base import NonFiniteLogitsError, RolloutEngine, SamplingParams
from trainer.rollout.sampling import greedy, nonfinite_rows_mask, process_logits, sample_keyed
from trainer.workers.fsdp import compute_dtype, full_tensor

if TYPE_CHECKING:
    from trainer.config import RolloutConfig

SUPPORTED_MODEL_TYPES: tuple[str, ...] = ("qwen2", "llama", "mistral")
PROMPT_ALIGN = 128  # prompt width and cache length are rounded up to this: stable shapes across steps
PREFILL_TOKENS = 32768  # rows per prefill chunk are chosen so that a chunk holds about this many tokens


# ----------------------------------------------------------------------------- architecture
@dataclass(frozen=True)
class LeanShape:
    """What the lean forward needs to know of a dense decoder."""

    num_layers: int
    hidden: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate: int
    vocab: int
    rms_eps: float
    rope_theta: float
    tied: bool
    qkv_bias: bool
    max_positions: int

    @property
    def q_size(self) -> int:
        return self.num_heads * self.head_dim

    @property
    def kv_size(self) -> int:
        return self.num_kv_heads * self.head_dim

    @property
    def group(self) -> int:
        return self.num_heads // self.num_kv_heads


def _rope_theta(config: Any) -> float:
    params = getattr(config, "rope_parameters", None) or {}
    scaling = getattr(config, "rope_scaling", None) or {}
    kind = params.get("rope_type") or scaling.get("rope_type") or scaling.get("type") or "default"
    if kind != "default":
        raise ValueError(f"fast rollout engine: rope_type {kind!r} is not supported; expected 'default' (plain RoPE)")
    theta = params.get("rope_theta", getattr(config, "rope_theta", None))
    if theta is None:
        raise ValueError("fast rollout engine: the model config has no rope_theta")
    return float(theta)


def lean_shape(config: Any) -> LeanShape:
    """Read a Hugging Face config; raise ValueError naming what is unsupported."""
    model_type = getattr(config, "model_type", None)
    if model_type not in SUPPORTED_MODEL_TYPES:
        raise ValueError(
            f"fast rollout engine: model_type {model_type!r} is not supported; expected one of "
            f"{', '.join(SUPPORTED_MODEL_TYPES)} (dense decoders with plain RoPE)"
        )
    act = getattr(config, "hidden_act", "silu")
    if act != "silu":
        raise ValueError(f"fast rollout engine: hidden_act {act!r} is not supported; expected 'silu'")
    heads = config.num_attention_heads
    kv_heads = getattr(config, "num_key_value_heads", None) or heads
    if heads % kv_heads:
        raise ValueError(f"fast rollout engine: {heads} query heads do not split over {kv_heads} key/value heads")
    return LeanShape(
        num_layers=config.num_hidden_layers,
        hidden=config.hidden_size,
        num_heads=heads,
        num_kv_heads=kv_heads,
        head_dim=getattr(config, "head_dim", None) or config.hidden_size // heads,
        intermediate=config.intermediate_size,
        vocab=config.vocab_size,
        rms_eps=float(config.rms_norm_eps),
        rope_theta=_rope_theta(config),
        tied=bool(getattr(config, "tie_word_embeddings", False)),
        # Qwen2 has q/k/v biases; Llama and Mistral have none (attention_bias False)
        qkv_bias=model_type == "qwen2" or bool(getattr(config, "attention_bias", False)),
        max_positions=int(getattr(config, "max_position_embeddings", 1 << 30)),
    )


# ----------------------------------------------------------------------------- weights
_LAYER_KEY = re.compile(r"^model\.layers\.(\d+)\.(.+)$")


class LeanWeights:
    """The engine's own copy of the weights, in fused, fixed-address buffers.

    Per layer l: qkv[l] = [W_q; W_k; W_v] ([q + 2 kv, H]), gate_up[l] = [W_gate; W_up] ([2 I, H]),
    o[l] [H, q], down[l] [H, I], and the two RMSNorm weights; plus embed, the final norm and the LM
    head (the embedding itself when tied).
    """

    def __init__(self, shape: LeanShape, dtype: torch.dtype, device: torch.device) -> None:
        self.shape = shape
        self.dtype = dtype
        self.device = device
        L, H, inter = shape.num_layers, shape.hidden, shape.intermediate
        qkv = shape.q_size + 2 * shape.kv_size

        def empty(*size: int) -> torch.Tensor:
            return torch.zeros(size, dtype=dtype, device=device)

        self.embed = empty(shape.vocab, H)
        self.norm = empty(H)
        self.lm_head = self.embed if shape.tied else empty(shape.vocab, H)
        self.qkv = empty(L, qkv, H)
        self.qkv_bias = empty(L, qkv) if shape.qkv_bias else None
        self.o = empty(L, H, shape.q_size)
        self.gate_up = empty(L, 2 * inter, H)
        self.down = empty(L, H, inter)
        self.ln_in = empty(L, H)
        self.ln_post = empty(L, H)
        inv = 1.0 / (shape.rope_theta ** (torch.arange(0, shape.head_dim, 2, dtype=torch.int64).float() / shape.head_dim))
        self.inv_freq = inv.to(device)  # float32, as transformers' default RoPE

    def _targets(self) -> dict[str, torch.Tensor]:
        """Every source parameter name -> the view of our buffers it is copied into."""
        s = self.shape
        q, kv, inter = s.q_size, s.kv_size, s.intermediate
        out: dict[str, torch.Tensor] = {"model.embed_tokens.weight": self.embed, "model.norm.weight": self.norm}
        if not s.tied:
            out["lm_head.weight"] = self.lm_head
        for i in range(s.num_layers):
            p = f"model.layers.{i}."
            out[p + "self_attn.q_proj.weight"] = self.qkv[i, :q]
            out[p + "self_attn.k_proj.weight"] = self.qkv[i, q : q + kv]
            out[p + "self_attn.v_proj.weight"] = self.qkv[i, q + kv :]
            if self.qkv_bias is not None:
                out[p + "self_attn.q_proj.bias"] = self.qkv_bias[i, :q]
                out[p + "self_attn.k_proj.bias"] = self.qkv_bias[i, q : q + kv]
                out[p + "self_attn.v_proj.bias"] = self.qkv_bias[i, q + kv :]
            out[p + "self_attn.o_proj.weight"] = self.o[i]
            out[p + "mlp.gate_proj.weight"] = self.gate_up[i, :inter]
            out[p + "mlp.up_proj.weight"] = self.gate_up[i, inter:]
            out[p + "mlp.down_proj.weight"] = self.down[i]
            out[p + "input_layernorm.weight"] = self.ln_in[i]
            out[p + "post_attention_layernorm.weight"] = self.ln_post[i]
        return out

    @torch.no_grad()
    def load(self, source: Mapping[str, torch.Tensor] | nn.Module) -> int:
        """Copy the source model's tensors in (gathering FSDP2 shards on this device); return bytes copied.

        Every worker calls this in the same order (the gathers are collectives). A source name we do
        not map, or one of ours the source lacks, is an error naming it.
        """
        tensors = source.state_dict() if isinstance(source, nn.Module) else dict(source)
        targets = self._targets()
        if self.shape.tied:
            tensors = {k: v for k, v in tensors.items() if k != "lm_head.weight"}
        unknown = sorted(k for k in tensors if k not in targets)
        missing = sorted(k for k in targets if k not in tensors)
        if unknown or missing:
            raise ValueError(
                "fast rollout engine: the model's parameters do not match a plain Qwen2/Llama decoder: "
                f"unexpected {unknown[:5]}, missing {missing[:5]}"
            )
        copied = 0
        for name, src in tensors.items():
            dst = targets[name]
            whole = full_tensor(src, self.device)
            if tuple(whole.shape) != tuple(dst.shape):
                raise ValueError(f"fast rollout engine: {name} has shape {tuple(whole.shape)}, expected {tuple(dst.shape)}")
            dst.copy_(whole)
            copied += dst.numel() * dst.element_size()
        return copied


# ----------------------------------------------------------------------------- the forward
def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """weight * (x / rms(x)) with the normalisation in float32, as transformers' Qwen2RMSNorm."""
    return weight * F.rms_norm(x.float(), (x.shape[-1],), eps=eps).to(x.dtype)


def rope_cos_sin(positions: torch.Tensor, inv_freq: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin [..., head_dim] of the positions, computed in float32 and cast (transformers' order)."""
    freqs = positions.float().unsqueeze(-1) * inv_freq
    emb = torch.cat((freqs, freqs), dim=-1)
    return emb.cos().to(dtype), emb.sin().to(dtype)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return x * cos + rotated * sin


def _mlp(w: LeanWeights, layer: int, h: torch.Tensor) -> torch.Tensor:
    x = rms_norm(h, w.ln_post[layer], w.shape.rms_eps)
    gate, up = F.linear(x, w.gate_up[layer]).chunk(2, dim=-1)
    return h + F.linear(F.silu(gate) * up, w.down[layer])


def decode_logits(
    w: LeanWeights,
    cache_k: torch.Tensor,
    cache_v: torch.Tensor,
    last: torch.Tensor,
    positions: torch.Tensor,
    write_slot: torch.Tensor,
    attn_bias: torch.Tensor,
    attn_len: int,
) -> torch.Tensor:
    """One token per row through the decoder: [b] -> logits [b, V]; writes this token's K and V at
    ``write_slot`` and attends over cache slots [0, attn_len) (the bias is 0 on visible slots, -inf
    elsewhere). Static shapes, no host reads."""
    s = w.shape
    b = last.shape[0]
    q_size, kv_size, d = s.q_size, s.kv_size, s.head_dim
    h = F.embedding(last, w.embed)
    cos, sin = rope_cos_sin(positions, w.inv_freq, w.dtype)
    cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)  # [b, 1, d]: broadcast over heads
    bias = attn_bias[:, None, None, :attn_len]
    slot = write_slot.view(1)
    for layer in range(s.num_layers):
        x = rms_norm(h, w.ln_in[layer], s.rms_eps)
        bias_l = w.qkv_bias[layer] if w.qkv_bias is not None else None
        qkv = F.linear(x, w.qkv[layer], bias_l)
        qk = apply_rope(qkv[:, : q_size + kv_size].view(b, s.num_heads + s.num_kv_heads, d), cos, sin)
        q, k = qk[:, : s.num_heads], qk[:, s.num_heads :]
        v = qkv[:, q_size + kv_size :].view(b, s.num_kv_heads, d)
        cache_k[layer].index_copy_(2, slot, k.unsqueeze(2))
        cache_v[layer].index_copy_(2, slot, v.unsqueeze(2))
        # Grouped-query attention without repeating K/V: the query heads that share a KV head are
        # that head's "query positions" (transformers' repeat_kv maps query head i to KV head i // group).
        attn = F.scaled_dot_product_attention(
            q.reshape(b, s.num_kv_heads, s.group, d),
            cache_k[layer, :, :, :attn_len],
            cache_v[layer, :, :, :attn_len],
            attn_mask=bias,
        )
        h = h + F.linear(attn.reshape(b, q_size), w.o[layer])
        h = _mlp(w, layer, h)
    return F.linear(rms_norm(h, w.norm, s.rms_eps), w.lm_head)


def prefill_logits(
    w: LeanWeights,
    cache_k: torch.Tensor,
    cache_v: torch.Tensor,
    prompt_ids: torch.Tensor,
    prompt_mask: torch.Tensor,
) -> torch.Tensor:
    """Left-padded prompts [b, P] into cache slots [0, P); the last position's logits [b, V].

    A padding query attends to itself only (never to nothing, which would give NaN rows whose
    values, even weighted by 0, would poison the real tokens' sums).
    """
    s = w.shape
    b, width = prompt_ids.shape
    d, q_size, kv_size = s.head_dim, s.q_size, s.kv_size
    positions = position_ids_from_mask(prompt_mask)
    cos, sin = rope_cos_sin(positions, w.inv_freq, w.dtype)
    cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)  # [b, 1, P, d]
    causal = torch.ones(width, width, dtype=torch.bool, device=prompt_ids.device).tril()
    allowed = (causal & prompt_mask.bool()[:, None, :]) | torch.eye(width, dtype=torch.bool, device=prompt_ids.device)
    allowed = allowed.unsqueeze(1)  # [b, 1, P, P]
    h = F.embedding(prompt_ids, w.embed)
    for layer in range(s.num_layers):
        x = rms_norm(h, w.ln_in[layer], s.rms_eps)
        bias_l = w.qkv_bias[layer] if w.qkv_bias is not None else None
        qkv = F.linear(x, w.qkv[layer], bias_l)
        q = apply_rope(qkv[..., :q_size].view(b, width, s.num_heads, d).transpose(1, 2), cos, sin)
        k = apply_rope(qkv[..., q_size : q_size + kv_size].view(b, width, s.num_kv_heads, d).transpose(1, 2), cos, sin)
        v = qkv[..., q_size + kv_size :].view(b, width, s.num_kv_heads, d).transpose(1, 2)
        cache_k[layer, :, :, :width] = k
        cache_v[layer, :, :, :width] = v
        attn = F.scaled_dot_product_attention(
            q, k.repeat_interleave(s.group, dim=1), v.repeat_interleave(s.group, dim=1), attn_mask=allowed
        )
        h = h + F.linear(attn.transpose(1, 2).reshape(b, width, q_size), w.o[layer])
        h = _mlp(w, layer, h)
    return F.linear(rms_norm(h[:, -1], w.norm, s.rms_eps), w.lm_head)


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
        self.last = torch.zeros(batch, dtype=torch.long, device=dev)
        self.positions = torch.zeros(batch, dtype=torch.long, device=dev)
        self.write_slot = torch.zeros((), dtype=torch.long, device=dev)
        self.step = torch.zeros((), dtype=torch.long, device=dev)
        self.seed = torch.zeros((), dtype=torch.long, device=dev)
        self.finished = torch.zeros(batch, dtype=torch.bool, device=dev)
        self.first_bad = torch.full((batch,), -1, dtype=torch.long, device=dev)
        self.row_keys = torch.zeros(batch, dtype=torch.long, device=dev)
        self.stop_ids = torch.tensor(list(stop_ids), dtype=torch.long, device=dev)
        self.sampled = torch.zeros(batch, dtype=torch.long, device=dev)
        self.bad = torch.zeros(batch, dtype=torch.bool, device=dev)
        self.pad_id = pad_id

    @property
    def nbytes(self) -> int:
        return 2 * self.cache_k.numel() * self.cache_k.element_size()

    def reset(self, prompt_mask: torch.Tensor, row_keys: torch.Tensor, seed: int) -> None:
        width = self.prompt_width
        self.attn_bias.fill_(float("-inf"))
        self.attn_bias[:, :width].masked_fill_(prompt_mask.bool(), 0.0)
        self.tokens.fill_(self.pad_id)
        self.last.fill_(self.pad_id)
        self.positions.copy_(prompt_mask.sum(dim=1))  # the first generated token follows the prompt
        self.write_slot.fill_(width)
        self.step.zero_()
        self.seed.fill_(seed & 0xFFFFFFFF)
        self.finished.zero_()
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
        if sampling.do_sample:
            filters = sampling.top_k_or_zero > 0 or sampling.top_p < 1.0
            if self._race is not None:
                scores = process_logits(logits, sampling.temperature, sampling.top_k_or_zero, sampling.top_p) if filters else logits
                inv_t = 1.0 if filters else 1.0 / sampling.temperature
                self._race(scores, buf.row_keys, buf.step, buf.seed, inv_t, buf.sampled, buf.bad)
                token, bad = buf.sampled, buf.bad
            else:
                scores = process_logits(logits, sampling.temperature, sampling.top_k_or_zero, sampling.top_p)
                token = sample_keyed(scores, buf.row_keys, buf.step, buf.seed)
                bad = nonfinite_rows_mask(logits)
        else:
            token, bad = greedy(logits), nonfinite_rows_mask(logits)
        buf.first_bad.copy_(torch.where(bad & (buf.first_bad < 0), buf.step, buf.first_bad))
        token = token.masked_fill(buf.finished, buf.pad_id)  # finished rows emit padding
        buf.tokens.index_copy_(1, buf.step.view(1), token.view(-1, 1))
        if buf.stop_ids.numel():
            buf.finished.logical_or_((token.unsqueeze(1) == buf.stop_ids).any(dim=1))
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

    def _generate_rows(
        self,
        prompt_ids: torch.Tensor,
        prompt_mask: torch.Tensor,
        *,
        max_new_tokens: int,
        sampling: SamplingParams,
        generator: torch.Generator | None,  # unused: sampling noise is keyed by row (sample_keyed)
        row_keys: torch.Tensor,
        seed: int,
        micro_batch: int,
        row_offset: int,
        n: int,
    ) -> torch.Tensor:
        b, width = prompt_ids.shape
        padded = _round_up(width, PROMPT_ALIGN)
        if padded > width:  # more left padding: the cache's shape stays the same from step to step
            prompt_ids = F.pad(prompt_ids, (padded - width, 0), value=self.pad_token_id)
            prompt_mask = F.pad(prompt_mask, (padded - width, 0), value=0)
        buf = self._prepare(b, padded, max_new_tokens, sampling)
        buf.reset(prompt_mask, row_keys, seed)
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
        steps = 1
        while steps < max_new_tokens:
            if steps % self.check_every == 0 and self._all_done(buf, micro_batch, row_offset, n):
                break
            attn_len = buf.attn_len(steps, bucket)
            graph = self._graphs.get(attn_len)
            if graph is not None:
                graph.replay()
            else:
                self._decode_step(buf, attn_len, sampling)
            steps += 1
        self._all_done(buf, micro_batch, row_offset, n)  # the last steps' non-finite flags
        tokens = buf.tokens[:, :steps].clone()
        if self.free_cache:
            self.release()
        return tokens

    def _all_done(self, buf: DecodeBuffers, micro_batch: int, row_offset: int, n: int) -> bool:
        """The loop's only host read: raise on recorded non-finite logits; else whether all rows ended."""
        any_bad, all_finished = torch.stack([(buf.first_bad >= 0).any(), buf.finished.all()]).tolist()
        if any_bad:
            flagged = buf.first_bad >= 0
            first = int(buf.first_bad[flagged].min())
            rows = (torch.nonzero(buf.first_bad == first).flatten() + row_offset).tolist()
            raise NonFiniteLogitsError(self.name, first, rows, micro_batch, n)
        return bool(all_finished)


def _is_offloaded(param: torch.Tensor) -> bool:
    """A parameter whose FSDP2 shard lives on the CPU (CPUOffloadPolicy)."""
    from torch.distributed.tensor import DTensor

    return isinstance(param, DTensor) and param.to_local().device.type == "cpu"
