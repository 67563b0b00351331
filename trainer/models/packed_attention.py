"""Attention over packed rows (VERL's ``use_remove_padding``): a micro-batch's rows end to end in one
sequence, each row attending causally to its own tokens only, so no padding is computed.

``use_packed_attention(lm)`` switches a transformers model to the attention function registered here
under ``PACKED_ATTENTION`` (transformers' AttentionInterface). A call given the rows' bounds as
``cu_seq_lens_q`` / ``max_length_q`` (transformers' names for flash attention's cumulative lengths,
which its decoder layers pass through to the attention function) attends per row:

- on CUDA, rows of at least ``ROWS_ALONE_MIN`` tokens each (``rows_attend_alone``) one at a time
  through SDPA (cuDNN's kernel on Hopper), each row's tail padded up to a multiple of ``ROW_BUCKET``
  tokens so that rows of nearby lengths share one cuDNN execution plan (``_rows_alone_causal``):
  causal attention never lets a real token read the padding after it, and the padding's outputs are
  dropped. On an H200 cuDNN's kernel runs 8-28k-token rows' attention forward at 470-620 TFLOP/s,
  against 290-330 for the variable-length flash kernel (benchmarks/packed_attention_probe.py,
  docs/benchmarks.md);
  cuDNN builds a plan for each new shape (40-140 ms), so ``build_row_plans`` builds every bucket's at
  set-up;
- on CUDA, other rows in one variable-length flash-attention kernel
  (``torch.nn.attention.varlen.varlen_attn``, FlashAttention 2 in torch 2.11); where a micro-batch
  holds both, its long rows still attend alone and its short ones together in one flash call
  (``_long_alone_short_together``): one short row no longer takes its long neighbours to the slower
  kernel;
- on the CPU, row by row through SDPA (``_rows_alone_causal`` unpadded).

Any other call is SDPA's, with SDPA's masks: the hf rollout engine generates with the actor's own
module.

``trainer.workers.fsdp.PolicyModel(packed=True)`` makes the packed calls (trainer.batch.pack_rows).
"""

from __future__ import annotations

import functools
import inspect
import itertools
import math
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

PACKED_ATTENTION = "rlbench_packed"
ROW_BOUNDS = "rlbench_row_bounds"  # packed_call_kwargs' host list of the rows' bounds (cu_seqlens)
# tokens: below 5-6k tokens a call a row was slower than the flash kernel at the 1.5B's heads (the probe)
ROWS_ALONE_MIN = 6144
ROW_BUCKET = 512  # a lone row's width is a multiple of this: 3% more attention work on the 1.5B replay's rows


def rows_attend_alone(lengths: list[int], on_cuda: bool) -> bool:
    """Whether packed rows of these lengths attend one row at a time (``_rows_alone_causal``)."""
    return on_cuda and bool(lengths) and min(lengths) >= ROWS_ALONE_MIN


# How packed rows attend (``attention_path``): each alone, long ones alone beside the short ones in one
# flash call, all in one flash call, or (the CPU) each alone unpadded.
ALONE, LONG_ALONE_SHORT_TOGETHER, FLASH, ALONE_UNPADDED = "alone", "long alone, short together", "flash", "alone, unpadded"


def attention_path(lengths: list[int], on_cuda: bool) -> str:
    """Which way packed rows of these lengths attend (module docstring)."""
    if not on_cuda:
        return ALONE_UNPADDED
    if rows_attend_alone(lengths, on_cuda):
        return ALONE
    return LONG_ALONE_SHORT_TOGETHER if max(lengths, default=0) >= ROWS_ALONE_MIN else FLASH


def row_lengths(bounds: list[int]) -> list[int]:
    """Each packed row's tokens, from the rows' bounds (cu_seqlens' values)."""
    return [end - start for start, end in zip(bounds[:-1], bounds[1:], strict=True)]


def bucketed_width(length: int, bucket: int = ROW_BUCKET) -> int:
    """A lone row's width: its length rounded up to a multiple of ``bucket``."""
    return -(-length // bucket) * bucket


def packed_attention(
    module: nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    scaling: float | None = None,
    dropout: float = 0.0,
    **kwargs: Any,
) -> tuple[torch.Tensor, None]:
    """transformers' attention-function signature: query [1, H, T, D], key and value [1, KV, T, D]
    -> ([1, T, H, D], None) for packed calls; anything else goes to SDPA's function unchanged."""
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    cu_seqlens = kwargs.get("cu_seq_lens_q")
    if cu_seqlens is None:
        return ALL_ATTENTION_FUNCTIONS["sdpa"](
            module, query, key, value, attention_mask, scaling=scaling, dropout=dropout, **kwargs
        )
    if query.shape[0] != 1:
        raise ValueError(f"packed attention: expected one packed row, got a batch of {query.shape[0]}")
    if dropout:
        raise ValueError(f"packed attention: attention dropout {dropout} is not supported")
    if getattr(module, "sliding_window", None) is not None:
        raise ValueError("packed attention: sliding-window layers are not supported")
    scale = query.shape[-1] ** -0.5 if scaling is None else scaling
    q = query[0].transpose(0, 1).contiguous()  # [T, H, D]
    k = key[0].transpose(0, 1).contiguous()  # [T, KV, D]
    v = value[0].transpose(0, 1).contiguous()  # [T, KV, D]
    bounds = kwargs.get(ROW_BOUNDS) or cu_seqlens.tolist()  # the host's copy (packed_call_kwargs): no device read
    path = attention_path(row_lengths(bounds), q.is_cuda)
    if path == ALONE:
        out = _rows_alone_causal(q, k, v, bounds, scale)
    elif path == LONG_ALONE_SHORT_TOGETHER:
        out = _long_alone_short_together(q, k, v, bounds, scale, _varlen_group)
    elif path == FLASH:
        out = _varlen_causal(q, k, v, cu_seqlens, int(kwargs["max_length_q"]), scale)
    else:
        out = _rows_alone_causal(q, k, v, bounds, scale, bucket=1)
    return out.unsqueeze(0), None  # [1, T, H, D]


def _rows_alone_causal(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, bounds: list[int], scale: float, bucket: int = ROW_BUCKET
) -> torch.Tensor:
    """Causal SDPA on each row alone ([T, H, D] in and out), the row zero-padded at its end to
    ``bucketed_width`` (``bucket`` 1: not padded, the CPU's packed attention): the padding comes after
    every real token, so no real token attends to it, and its outputs (and, in the backward, its zero
    gradients) are dropped. A row of no tokens adds nothing."""
    out = []
    for start, end in zip(bounds[:-1], bounds[1:], strict=True):
        if end == start:
            continue
        pad = bucketed_width(end - start, bucket) - (end - start)
        rows = [F.pad(t[start:end], (0, 0, 0, 0, 0, pad)).transpose(0, 1).unsqueeze(0) for t in (q, k, v)]  # [1, heads, W, D]
        attended = F.scaled_dot_product_attention(*rows, is_causal=True, scale=scale, enable_gqa=True)  # [1, H, W, D]
        out.append(attended[0, :, : end - start].transpose(0, 1))  # [n, H, D]
    return torch.cat(out)


def _long_alone_short_together(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, bounds: list[int], scale: float,
    together: Callable[[torch.Tensor, torch.Tensor, torch.Tensor, list[int], float], torch.Tensor],
) -> torch.Tensor:
    """Rows of ROWS_ALONE_MIN tokens or more alone (``_rows_alone_causal``), the shorter ones end to
    end in one call of ``together(q, k, v, bounds, scale)`` (``_varlen_group`` on CUDA); [T, H, D] in
    and out, each row's outputs in its place. Rows of no tokens add nothing."""
    lengths = row_lengths(bounds)
    # one split per tensor: its backward assembles the rows' gradients in one cat, where a slice per
    # row would add a zero gradient of the whole micro-batch's size for each
    rows = [(n, *parts) for n, *parts in zip(lengths, *(t.split(lengths) for t in (q, k, v)), strict=True) if n]
    short = [parts for n, *parts in rows if n < ROWS_ALONE_MIN]
    short_out: list[torch.Tensor] = []
    if short:
        joined = [torch.cat(part) for part in zip(*short, strict=True)]  # q, k, v of the short rows end to end
        short_lengths = [part[0].shape[0] for part in short]
        short_bounds = [0, *itertools.accumulate(short_lengths)]
        short_out = list(together(*joined, short_bounds, scale).split(short_lengths))  # each [n, H, D]
    pieces = []  # each row's outputs, in row order
    for n, row_q, row_k, row_v in rows:
        if n < ROWS_ALONE_MIN:
            pieces.append(short_out.pop(0))
        else:
            pieces.append(_rows_alone_causal(row_q, row_k, row_v, [0, n], scale))
    return torch.cat(pieces)


def _varlen_group(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, bounds: list[int], scale: float) -> torch.Tensor:
    """``_varlen_causal`` over rows given by their host bounds."""
    cu_seqlens = torch.tensor(bounds, dtype=torch.int32).to(q.device, non_blocking=True)
    return _varlen_causal(q, k, v, cu_seqlens, max(row_lengths(bounds)), scale)


def build_row_plans(config: Any, device: torch.device, dtype: torch.dtype, longest: int) -> int:
    """Attention at every width a lone row of up to ``longest`` tokens can take (multiples of
    ROW_BUCKET from ROWS_ALONE_MIN up), forward without gradients (old_log_prob's and ref's) and
    forward + backward (update_actor's): cuDNN builds and caches its execution plans for those shapes
    here, at set-up, not in the phases. The plans are cached per thread: call it on the thread the
    phases run on. Returns how many widths were built."""
    heads = config.num_attention_heads
    kv_heads = getattr(config, "num_key_value_heads", None) or heads
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // heads
    # none where no row can be long enough to attend alone
    widths = range(bucketed_width(ROWS_ALONE_MIN), bucketed_width(longest) + 1 if longest >= ROWS_ALONE_MIN else 0,
                   ROW_BUCKET)
    for width in widths:
        bounds = [0, width]
        q, k, v = (torch.zeros(width, h, head_dim, device=device, dtype=dtype) for h in (heads, kv_heads, kv_heads))
        with torch.no_grad():
            _rows_alone_causal(q, k, v, bounds, head_dim ** -0.5)
        leaves = [t.requires_grad_() for t in (q, k, v)]
        _rows_alone_causal(*leaves, bounds, head_dim ** -0.5).sum().backward()
    return len(widths)


@functools.cache
def _varlen_parameters() -> frozenset[str]:
    from torch.nn.attention.varlen import varlen_attn

    return frozenset(inspect.signature(varlen_attn).parameters)


def _varlen_causal(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cu_seqlens: torch.Tensor, max_len: int, scale: float
) -> torch.Tensor:
    """Causal flash attention over the packed rows, through whichever varlen_attn signature this torch
    has: older releases take ``is_causal`` and no scale or GQA flag, newer ones a causal
    ``window_size=(-1, 0)``, ``scale`` and ``enable_gqa``."""
    from torch.nn.attention.varlen import varlen_attn

    params = _varlen_parameters()
    options: dict[str, Any] = {}
    if "is_causal" in params:
        options["is_causal"] = True
    else:
        options["window_size"] = (-1, 0)
    if "scale" in params:
        options["scale"] = scale
    elif not math.isclose(scale, q.shape[-1] ** -0.5):
        raise ValueError(f"packed attention: this torch's varlen_attn has no scale argument; the model asks for {scale}")
    if k.shape[1] != q.shape[1]:
        if "enable_gqa" in params:
            options["enable_gqa"] = True
        else:  # query head i reads KV head i // group, as transformers' repeat_kv
            group = q.shape[1] // k.shape[1]
            k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
    return varlen_attn(q, k, v, cu_seqlens, cu_seqlens, max_len, max_len, **options)


def check_packed_attention(lm: nn.Module) -> None:
    """Before any work: the model must list its layer types (``packed_call_kwargs`` hands each type
    its mask), and this torch must have what packed rows' attention runs on the model's device
    (torch.nn.attention.varlen on CUDA, from torch 2.10; SDPA's enable_gqa on the CPU, from 2.5)."""
    if not getattr(lm.config, "layer_types", None):
        raise ValueError(
            f"actor_rollout_ref.model.use_remove_padding=True: {type(lm).__name__} has no config.layer_types, "
            "so its forward cannot be handed the packed rows' attention per layer type (Qwen2 models can)"
        )
    params = next(lm.parameters(), None)
    on_cuda = params is not None and params.is_cuda
    if on_cuda:
        try:
            _varlen_parameters()
        except ImportError as exc:
            raise ValueError(
                f"actor_rollout_ref.model.use_remove_padding=True needs torch.nn.attention.varlen (torch 2.10 or "
                f"later) on CUDA; this torch is {torch.__version__}"
            ) from exc
    elif tuple(int(part) for part in torch.__version__.split(".")[:2]) < (2, 5):
        raise ValueError(
            "actor_rollout_ref.model.use_remove_padding=True needs scaled_dot_product_attention's enable_gqa "
            f"(torch 2.5 or later); this torch is {torch.__version__}"
        )


def register_packed_attention() -> None:
    """Register the function, with SDPA's mask maker for its ordinary calls (idempotent)."""
    from transformers import AttentionInterface
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, AttentionMaskInterface

    AttentionInterface.register(PACKED_ATTENTION, packed_attention)
    AttentionMaskInterface.register(PACKED_ATTENTION, ALL_MASK_ATTENTION_FUNCTIONS["sdpa"])


def use_packed_attention(lm: nn.Module) -> None:
    """Switch a transformers model (every submodel) to the packed attention function, in place, once
    ``check_packed_attention`` finds nothing missing."""
    check_packed_attention(lm)
    register_packed_attention()
    lm.set_attn_implementation(PACKED_ATTENTION)


def packed_call_kwargs(
    cu_seqlens: torch.Tensor, max_len: int, layer_types: list[str], bounds: list[int] | None = None
) -> dict[str, Any]:
    """What a decoder's forward is given for a packed call: the rows' bounds under transformers'
    names (and ``bounds``, the same on the host, which the decoder passes through to the attention
    function), and a mask per layer type (config.layer_types) that is None: the bounds are the mask,
    and a decoder handed a mapping builds none of its own (one [T, T] mask at 30k tokens is 0.9 GB)."""
    return {
        **({ROW_BOUNDS: bounds} if bounds is not None else {}),
        "attention_mask": dict.fromkeys(layer_types, None),
        "cu_seq_lens_q": cu_seqlens,
        "cu_seq_lens_k": cu_seqlens,
        "max_length_q": max_len,
        "max_length_k": max_len,
    }
