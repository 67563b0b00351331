"""The fast engine's model: a lean forward of our own for dense Qwen2/Llama/Mistral decoders.

- ``lean_shape`` reads a Hugging Face config into the few numbers the forward needs, and names what
  it cannot run (other model types, scaled RoPE, activations other than SiLU).
- ``LeanWeights`` is the weights layout and the reshard target: q/k/v fused into one matrix and
  gate/up into another (a layer is four matmuls), in buffers allocated once, whose addresses the
  engine's captured CUDA graphs hold; ``load`` copies an actor's parameters into them.
- ``prefill_logits`` and ``decode_logits`` run the forward over a KV cache preallocated as one
  [layers, batch, kv heads, slots, head dim] tensor per K and V, with static shapes and no host
  reads, so a decode step can be captured. The numerics follow transformers' Qwen2/Llama modeling
  (transformers/models/qwen2/modeling_qwen2.py: RMSNorm in float32, RoPE cos/sin in float32 then
  cast, grouped-query attention with query head i reading KV head i // group). On GPU a decode
  step's elementwise work between the matmuls runs fused (``decode_logits(fused=True)``,
  trainer/kernels/triton_decode_fused.py), rounding where these ops round.

The decode state and the loop that drives this forward are the engine's (fast_engine.py).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from trainer.batch import position_ids_from_mask
from trainer.rollout.tensor_parallel import TP_KEY, local_part
from trainer.workers.fsdp import full_tensor

SUPPORTED_MODEL_TYPES: tuple[str, ...] = ("qwen2", "llama", "mistral")


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

    def sharded(self, size: int) -> LeanShape:
        """What one GPU of a decode group of ``size`` holds (tensor_parallel.py): 1/size of the query
        and key/value heads and of the MLP's width; ValueError naming what does not split."""
        if size == 1:
            return self
        uneven = [
            f"{value} {what}" for value, what in (
                (self.num_heads, "attention heads"), (self.num_kv_heads, "key/value heads"),
                (self.intermediate, "MLP intermediate width"),
            ) if value % size
        ]
        if uneven:
            raise ValueError(
                f"{TP_KEY}={size}: the model's {', '.join(uneven)} "
                f"do not split evenly over {size} GPUs; use a size that divides {self.num_kv_heads} (its key/value heads)"
            )
        return replace(
            self, num_heads=self.num_heads // size, num_kv_heads=self.num_kv_heads // size,
            intermediate=self.intermediate // size,
        )


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
class LeanWeights:
    """The engine's own copy of the weights, in fused, fixed-address buffers.

    Per layer l: qkv[l] = [W_q; W_k; W_v] ([q + 2 kv, H]), gate_up[l] = [W_gate; W_up] ([2 I, H]),
    o[l] [H, q], down[l] [H, I], and the two RMSNorm weights; plus embed, the final norm and the LM
    head (the embedding itself when tied).
    """

    def __init__(
        self, shape: LeanShape, dtype: torch.dtype, device: torch.device, tp_rank: int = 0, tp_size: int = 1
    ) -> None:
        self.shape = shape  # what this GPU holds: LeanShape.sharded(tp_size) in a decode group
        self.tp_rank, self.tp_size = tp_rank, tp_size  # its place in the group (tensor_parallel.py)
        self.dtype = dtype
        self.device = device
        L, H, inter = shape.num_layers, shape.hidden, shape.intermediate
        qkv = shape.q_size + 2 * shape.kv_size

        def empty(*size: int) -> torch.Tensor:
            return torch.zeros(size, dtype=dtype, device=device)

        # On CUDA each matmul weight is stored transposed, [in, out], and kept here as its [out, in]
        # view, so F.linear hands cuBLAS the transposed layout: at decode batch 128 on an H100 that
        # layout ran the five matmuls 7% faster in all (gate/up 9%, down 6%, LM head 12%;
        # benchmarks/decode_kernels_tune.py). Loading weights into the views is a strided copy (reshard
        # took 0.05 s instead of 0.035 s at the 1.5B model). The CPU keeps the plain layout.
        def matrix(*size: int) -> torch.Tensor:
            if device.type != "cuda":
                return empty(*size)
            return empty(*size[:-2], size[-1], size[-2]).transpose(-1, -2)

        self.embed = empty(shape.vocab, H)
        self.norm = empty(H)
        self.lm_head = self.embed if shape.tied else matrix(shape.vocab, H)  # tied: the embedding's rows
        self.qkv = matrix(L, qkv, H)
        self.qkv_bias = empty(L, qkv) if shape.qkv_bias else None
        self.o = matrix(L, H, shape.q_size)
        self.gate_up = matrix(L, 2 * inter, H)
        self.down = matrix(L, H, inter)
        self.ln_in = empty(L, H)
        self.ln_post = empty(L, H)
        inv = 1.0 / (shape.rope_theta ** (torch.arange(0, shape.head_dim, 2, dtype=torch.int64).float() / shape.head_dim))
        self.inv_freq = inv.to(device)  # float32, as transformers' default RoPE

    @property
    def weight_bytes_per_step(self) -> int:
        """What one decode step reads of the weights: every matrix and norm, and the head (the embedding
        only through its one row per token, unless tied to the head)."""
        parts = [self.lm_head, self.qkv, self.o, self.gate_up, self.down, self.ln_in, self.ln_post, self.norm]
        if self.qkv_bias is not None:
            parts.append(self.qkv_bias)
        return sum(t.numel() * t.element_size() for t in parts)

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
        """Copy the source model's tensors in (gathering FSDP2 shards on this device; in a decode group
        of tp_size, this GPU's part of each); return bytes copied.

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
            whole = local_part(name, full_tensor(src, self.device), self.tp_rank, self.tp_size)
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


def _summed(partial: torch.Tensor, reduce: Callable[[torch.Tensor], torch.Tensor] | None) -> torch.Tensor:
    """A split matmul's (o's, down's) partial sum, added over the decode group (``reduce``: its
    all-reduce, tensor_parallel.py); on one GPU it is the whole sum already."""
    return partial if reduce is None else reduce(partial)


def _mlp(w: LeanWeights, layer: int, h: torch.Tensor, reduce: Callable[[torch.Tensor], torch.Tensor] | None = None) -> torch.Tensor:
    x = rms_norm(h, w.ln_post[layer], w.shape.rms_eps)
    gate, up = F.linear(x, w.gate_up[layer]).chunk(2, dim=-1)
    return h + _summed(F.linear(F.silu(gate) * up, w.down[layer]), reduce)


def _attention(
    s: LeanShape, q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, attn_bias: torch.Tensor,
    attn_len: int, attend: Callable[..., torch.Tensor] | None,
) -> torch.Tensor:
    """Queries [b, heads, d] over one layer's cache slots [0, attn_len) -> [b, heads * d].

    Grouped-query attention without repeating K/V: the query heads that share a KV head are that
    head's "query positions" (transformers' repeat_kv maps query head i to KV head i // group)."""
    b = q.shape[0]
    grouped = q.reshape(b, s.num_kv_heads, s.group, s.head_dim)
    if attend is not None:
        attn = attend(grouped, k_cache, v_cache, attn_bias, attn_len)
    else:
        attn = F.scaled_dot_product_attention(
            grouped, k_cache[:, :, :attn_len], v_cache[:, :, :attn_len], attn_mask=attn_bias[:, None, None, :attn_len]
        )
    return attn.reshape(b, s.q_size)


def decode_logits(
    w: LeanWeights,
    cache_k: torch.Tensor,
    cache_v: torch.Tensor,
    last: torch.Tensor,
    positions: torch.Tensor,
    write_slot: torch.Tensor,
    attn_bias: torch.Tensor,
    attn_len: int,
    attend: Callable[..., torch.Tensor] | None = None,
    fused: bool = False,
    attend_with_rope: Callable[..., torch.Tensor] | None = None,
    reduce: Callable[[torch.Tensor], torch.Tensor] | None = None,
) -> torch.Tensor:
    """One token per row through the decoder: [b] -> logits [b, V]; writes this token's K and V at
    ``write_slot`` and attends over cache slots [0, attn_len) (the bias is 0 on visible slots, -inf
    elsewhere). Static shapes, no host reads.

    ``attend(q [b, KV heads, group, d], k_cache [b, KV heads, slots, d], v_cache, bias [b, slots],
    attn_len)``, when given, replaces SDPA (the GPU's split-cache kernel,
    trainer/kernels/triton_decode_attention.py). ``fused`` runs the elementwise work between the
    matmuls as the Triton kernels of trainer/kernels/triton_decode_fused.py (Triton only), with the
    same roundings as the eager ops here. ``attend_with_rope(qkv [b, (heads + 2 KV heads) d], cos, sin
    [b, d], k_cache, v_cache, bias, attn_len, write_slot, heads)`` does a layer's RoPE, cache write at
    ``write_slot`` and attention in one kernel (decode_attention_with_rope) in the fused step; it
    needs ``fused``. ``reduce``: the decode group's all-reduce (it returns the sum), when ``w`` holds one GPU's
    part of a tensor-parallel group's weights (tensor_parallel.py)."""
    s = w.shape
    if attend_with_rope is not None and not fused:
        raise ValueError("decode_logits: attend_with_rope replaces a fused step's kernels; it needs fused=True")
    if fused:
        return _decode_logits_fused(
            w, cache_k, cache_v, last, positions, write_slot, attn_bias, attn_len, attend, attend_with_rope, reduce
        )
    b = last.shape[0]
    q_size, kv_size, d = s.q_size, s.kv_size, s.head_dim
    h = F.embedding(last, w.embed)
    cos, sin = rope_cos_sin(positions, w.inv_freq, w.dtype)
    cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)  # [b, 1, d]: broadcast over heads
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
        attn = _attention(s, q, cache_k[layer], cache_v[layer], attn_bias, attn_len, attend)
        h = h + _summed(F.linear(attn, w.o[layer]), reduce)
        h = _mlp(w, layer, h, reduce)
    return F.linear(rms_norm(h, w.norm, s.rms_eps), w.lm_head)


def _decode_logits_fused(
    w: LeanWeights, cache_k: torch.Tensor, cache_v: torch.Tensor, last: torch.Tensor, positions: torch.Tensor,
    write_slot: torch.Tensor, attn_bias: torch.Tensor, attn_len: int, attend: Callable[..., torch.Tensor] | None,
    attend_with_rope: Callable[..., torch.Tensor] | None, reduce: Callable[[torch.Tensor], torch.Tensor] | None = None,
) -> torch.Tensor:
    """decode_logits with a layer's elementwise work in three kernels: each residual add joins the
    RMSNorm after it, RoPE joins the K/V cache write (and, given ``attend_with_rope``, the attention
    kernel too), SiLU joins the product with up."""
    from trainer.kernels.triton_decode_fused import add_rms_norm, rope_and_cache_write, silu_mul

    s = w.shape
    h = F.embedding(last, w.embed)
    cos, sin = rope_cos_sin(positions, w.inv_freq, w.dtype)  # [b, d], once per step
    delta: torch.Tensor | None = None  # what the previous layer's MLP adds to h
    for layer in range(s.num_layers):
        h, x = add_rms_norm(h, delta, w.ln_in[layer], s.rms_eps)
        bias_l = w.qkv_bias[layer] if w.qkv_bias is not None else None
        qkv = F.linear(x, w.qkv[layer], bias_l)
        if attend_with_rope is not None:
            attn = attend_with_rope(
                qkv, cos, sin, cache_k[layer], cache_v[layer], attn_bias, attn_len, write_slot, s.num_heads
            ).reshape(qkv.shape[0], s.q_size)
        else:
            q = rope_and_cache_write(qkv, cos, sin, cache_k[layer], cache_v[layer], write_slot, s.num_heads)
            attn = _attention(s, q, cache_k[layer], cache_v[layer], attn_bias, attn_len, attend)
        h, x = add_rms_norm(h, _summed(F.linear(attn, w.o[layer]), reduce), w.ln_post[layer], s.rms_eps)
        delta = _summed(F.linear(silu_mul(F.linear(x, w.gate_up[layer])), w.down[layer]), reduce)
    return F.linear(add_rms_norm(h, delta, w.norm, s.rms_eps)[1], w.lm_head)


def prefill_logits(
    w: LeanWeights,
    cache_k: torch.Tensor,
    cache_v: torch.Tensor,
    prompt_ids: torch.Tensor,
    prompt_mask: torch.Tensor,
    into: tuple[torch.Tensor, torch.Tensor] | None = None,
    reduce: Callable[[torch.Tensor], torch.Tensor] | None = None,
) -> torch.Tensor:
    """Left-padded prompts [b, P] into cache slots [0, P); the last position's logits [b, V].

    ``into`` = (rows, prompt) [n] each: cache row rows[i] gets prompt prompt[i]'s K/V (a prompt may go
    to several rows, one layer at a time); by default row i of the caches gets prompt i.
    A padding query attends to itself only (never to nothing, which would give NaN rows whose
    values, even weighted by 0, would poison the real tokens' sums). ``reduce``: as decode_logits'.
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
        if into is None:
            cache_k[layer, :, :, :width] = k
            cache_v[layer, :, :, :width] = v
        else:
            cache_k[layer, into[0], :, :width] = k[into[1]]
            cache_v[layer, into[0], :, :width] = v[into[1]]
        attn = F.scaled_dot_product_attention(
            q, k.repeat_interleave(s.group, dim=1), v.repeat_interleave(s.group, dim=1), attn_mask=allowed
        )
        h = h + _summed(F.linear(attn.transpose(1, 2).reshape(b, width, q_size), w.o[layer]), reduce)
        h = _mlp(w, layer, h, reduce)
    return F.linear(rms_norm(h[:, -1], w.norm, s.rms_eps), w.lm_head)


