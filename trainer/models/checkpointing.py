"""Gradient (activation) checkpointing of the decoder layers: a full recompute, or a selective one.

VERL's ``actor_rollout_ref.model.enable_gradient_checkpointing`` keeps only each decoder layer's input
in the forward and recomputes the layer's whole forward in the backward: one extra forward, about a
third of the update's FLOPs, causal attention included (at 14k tokens a large part of each layer).
Our extension ``actor_rollout_ref.model.gradient_checkpointing_policy`` chooses what that recompute
may skip, with PyTorch's selective activation checkpointing (``torch.utils.checkpoint.
create_selective_checkpoint_contexts``, PyTorch 2.4+, non-reentrant only): the outputs of the ATen ops
a policy names are kept from the forward and handed back to the recompute, every other op runs again.

- ``full``: nothing is kept; every op is recomputed (VERL's behaviour, and the default).
- ``save_attention``: the fused attention kernels' outputs (SDPA's flash, memory-efficient, cuDNN and
  CPU-flash ops, and torch.nn.attention.varlen's op for packed rows, with their log-sum-exp), so
  attention never runs twice. Per layer and token that keeps
  the attention output (hidden size values) and one float per head.
- ``save_matmuls``: those and every matmul's output (the q/k/v/o projections, gate, up and down), so
  only elementwise work (RMSNorm, rotary, SiLU, residual adds) is recomputed. It keeps 3 x hidden +
  2 x KV width + 2 x intermediate values per layer and token (q, o, down; k, v; gate, up).
- ``mlp``: only each layer's MLP block is checkpointed (its input kept, gate/up/down and the
  activation recomputed); the attention block keeps its activations as without checkpointing, so
  attention and the q/k/v/o projections never run twice. The MLP's activations (three of
  intermediate size per token) are most of a layer's, so this keeps about a third of what no
  checkpointing keeps, with no per-op policy call.

``actor_rollout_ref.model.gradient_checkpointing_layers`` (our extension) checkpoints only the first
that many decoder layers; the rest keep all their activations, for memory that allows it.

The policy sees ATen ops, so it covers attention run through SDPA (transformers' default ``sdpa``
implementation); the ``eager`` implementation's attention is plain matmuls and a softmax (saved by
``save_matmuls`` only). Kernels launched outside the dispatcher (Triton kernels of an autograd
Function, such as liger-kernel's) are invisible to it and always recomputed.
"""

from __future__ import annotations

import functools
import types
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from trainer.models.layers import decoder_layers
from trainer.registry import Registry

KEY = "actor_rollout_ref.model.gradient_checkpointing_policy"
FULL = "full"


def _aten_packets(*names: str) -> frozenset[Any]:
    """The ATen op packets of these names that this PyTorch build has (the set differs by release)."""
    return frozenset(getattr(torch.ops.aten, n) for n in names if hasattr(torch.ops.aten, n))


# The attention kernels scaled_dot_product_attention dispatches to, one per back end, and the
# lower-level flash / memory-efficient forwards that some call paths reach directly.
_SDPA_OPS = _aten_packets(
    "_scaled_dot_product_flash_attention",
    "_scaled_dot_product_efficient_attention",
    "_scaled_dot_product_cudnn_attention",
    "_scaled_dot_product_flash_attention_for_cpu",
    "_scaled_dot_product_fused_attention_overrideable",
    "_flash_attention_forward",
    "_efficient_attention_forward",
)
MATMUL_OPS = _aten_packets("mm", "addmm", "bmm", "baddbmm")


def _varlen_attention_ops() -> frozenset[Any]:
    """torch.nn.attention.varlen's custom op, which packed rows' attention (use_remove_padding) runs:
    the policy sees it, not the flash forward inside it. Empty where this PyTorch has none."""
    try:
        import torch.nn.attention.varlen  # noqa: F401  (registers torch.ops.torch_attn)
    except ImportError:
        return frozenset()
    namespace = getattr(torch.ops, "torch_attn", None)
    op = getattr(namespace, "_varlen_attn", None) if namespace is not None else None
    return frozenset([op]) if op is not None else frozenset()


@functools.cache
def attention_ops() -> frozenset[Any]:
    """Every attention op a policy keeps: SDPA's kernels and the varlen op. Built on first use, not at
    import: importing torch.nn.attention.varlen imports torch._dynamo (~1.5 s of CPU), which every
    process importing the train worker paid, the Ray driver and pytest's own too, that build no model
    (a process that builds a transformers model imports torch._dynamo anyway, through its masking)."""
    return _SDPA_OPS | _varlen_attention_ops()


def __getattr__(name: str) -> Any:
    """``ATTENTION_OPS``: ``attention_ops()``, the complete set, computed when first read."""
    if name == "ATTENTION_OPS":
        return attention_ops()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


MLP = "mlp"
# policy name -> a function of no arguments giving the op packets the policy keeps (full: none, a plain
# recompute); called only when a model is checkpointed (attention_ops: why). The registered names are
# the valid values of gradient_checkpointing_policy (config validation reads them).
POLICIES: Registry[Callable[[], frozenset[Any]]] = Registry(KEY)
POLICIES.register(FULL, frozenset)
POLICIES.register("save_attention", attention_ops)
POLICIES.register("save_matmuls", lambda: attention_ops() | MATMUL_OPS)
POLICIES.register(MLP, frozenset)  # a plain recompute of a smaller region: each layer's MLP block
LAYERS_KEY = "actor_rollout_ref.model.gradient_checkpointing_layers"
# Policies that would compute wrong gradients with use_liger, and why: liger-kernel's RoPE
# (src/liger_kernel/ops/rope.py, rope_forward) rotates q and k in place in the q/k projections' output
# buffers, so a kept projection output would come back already rotated and be rotated again. Its
# Triton writes do not bump the tensor's version counter, so PyTorch's mutation check cannot catch it.
UNSAFE_WITH_LIGER: dict[str, str] = {
    "save_matmuls": "liger-kernel's RoPE rotates the q/k projections' outputs in place, and this policy keeps "
    "those outputs for the recompute, which would rotate them twice",
}


def _keep_named_ops(saved: frozenset[Any], ctx: Any, func: Any, *args: Any, **kwargs: Any) -> Any:
    """The selective-checkpoint policy: keep the outputs of ops in ``saved``, recompute the rest."""
    from torch.utils.checkpoint import CheckpointPolicy

    if func.overloadpacket in saved:
        return CheckpointPolicy.MUST_SAVE
    return CheckpointPolicy.PREFER_RECOMPUTE


def checkpoint_kwargs(policy: str) -> dict[str, Any]:
    """The keyword arguments of ``torch.utils.checkpoint.checkpoint`` for ``policy``: non-reentrant (the
    kind that composes with FSDP2's hooks) and, for a selective policy, a fresh pair of selective
    contexts per checkpointed call (``context_fn``)."""
    saved = POLICIES[policy]()
    kwargs: dict[str, Any] = {"use_reentrant": False}
    if saved:
        from torch.utils.checkpoint import create_selective_checkpoint_contexts

        keep: Callable[..., Any] = functools.partial(_keep_named_ops, saved)
        kwargs["context_fn"] = functools.partial(create_selective_checkpoint_contexts, keep)
    return kwargs


def check_layer_count(layers: int | None, total: int, model_type: str) -> int:
    """How many of a model's ``total`` decoder layers to checkpoint: ``layers``, or all when None; a
    clear error when the model has fewer (the config alone cannot know the model's depth: the plugin
    checks this against the model's config at start-up, the worker again on the built model)."""
    if layers is None:
        return total
    if not 1 <= layers <= total:
        raise ValueError(f"{LAYERS_KEY}={layers}: the model ({model_type}) has {total} decoder layers; expected 1 to {total}")
    return layers


def _checkpointed_forward(self: nn.Module, *args: Any, **kwargs: Any) -> Any:
    """A checkpointed module's forward: the plain one under torch.utils.checkpoint when it trains
    with gradients, else the plain one (a no-grad forward has no backward to recompute for)."""
    from torch.utils.checkpoint import checkpoint

    plain = self._rlbench_plain_forward
    if self.training and torch.is_grad_enabled():
        return checkpoint(plain, *args, **self._rlbench_checkpoint_kwargs, **kwargs)
    return plain(*args, **kwargs)


def _checkpoint_module_forward(module: nn.Module, kwargs: dict[str, Any]) -> None:
    """Checkpoint ``module``'s forward as bound now (liger's, where liger replaced it). Bound methods
    and attributes, not a closure: a deep copy of the model then calls its own weights."""
    module._rlbench_plain_forward = module.forward
    module._rlbench_checkpoint_kwargs = kwargs
    module.forward = types.MethodType(_checkpointed_forward, module)


def enable_gradient_checkpointing(lm: nn.Module, policy: str = FULL, layers: int | None = None) -> None:
    """Checkpoint the first ``layers`` decoder layers (all when None) of the transformers model ``lm``
    under ``policy``, in place.

    transformers checkpoints each layer's ``forward`` (from 4.5x on, outside module hooks such as
    FSDP2's), with the kwargs given here; ``activation_checkpointing_enable`` is the newer name of
    ``gradient_checkpointing_enable``, which later releases deprecate. The ``mlp`` policy checkpoints
    each chosen layer's ``mlp`` submodule's forward instead, inside the layer (and its FSDP2 unit,
    whose parameters are gathered again for the layer's backward, where the recompute runs)."""
    kwargs = checkpoint_kwargs(policy)
    blocks = decoder_layers(lm)
    count = check_layer_count(layers, len(blocks), getattr(lm.config, "model_type", type(lm).__name__))
    if policy == MLP:
        for layer in blocks[:count]:
            mlp = getattr(layer, "mlp", None)
            if not isinstance(mlp, nn.Module):
                raise ValueError(f"{KEY}=mlp: {type(layer).__name__} has no mlp submodule to checkpoint")
            _checkpoint_module_forward(mlp, kwargs)
        return
    enable = getattr(lm, "activation_checkpointing_enable", None)
    if enable is not None:
        enable(activation_checkpointing_kwargs=kwargs)
    else:
        lm.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kwargs)
    for layer in blocks[count:]:
        layer.gradient_checkpointing = False  # read on each call by transformers' wrapper


def disable_gradient_checkpointing(lm: nn.Module) -> None:
    """Undo ``enable_gradient_checkpointing`` on ``lm``, whatever the policy: every layer and MLP block
    runs its plain forward again (benchmarks compare settings on one model)."""
    disable = getattr(lm, "activation_checkpointing_disable", None) or lm.gradient_checkpointing_disable
    disable()
    for module in lm.modules():
        plain = module.__dict__.pop("_rlbench_plain_forward", None)
        if plain is not None:
            module.forward = plain
            del module._rlbench_checkpoint_kwargs
