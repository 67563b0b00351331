"""Fused training kernels from liger-kernel (VERL's ``actor_rollout_ref.model.use_liger``).

liger-kernel (github.com/linkedin/Liger-Kernel) replaces a transformers decoder's RMSNorm, SwiGLU
MLP and rotary embedding with Triton kernels that fuse each one's elementwise work, forward and
backward. Only those three: the trainer's log-probs come from its own chunked LM-head path
(trainer/workers/fsdp.py), so liger's fused cross-entropy is left off. The kernels are Triton, so
this runs on CUDA devices only; the config check refuses use_liger on the CPU.
"""

from __future__ import annotations

import importlib.util

from torch import nn

LIGER_EXTRA = 'pip install -e ".[liger]"'


def liger_installed() -> bool:
    return importlib.util.find_spec("liger_kernel") is not None


def apply_liger(lm: nn.Module) -> None:
    """Swap ``lm``'s RMSNorm, SwiGLU and RoPE for liger-kernel's, in place (a CUDA model).

    liger's patch also replaces those classes and the RoPE function in transformers' modeling module
    of the model type, for the whole process: in the trainer that process is a GPU worker, whose
    every model (actor and reference) uses them anyway."""
    try:
        from liger_kernel.transformers.monkey_patch import MODEL_TYPE_TO_APPLY_LIGER_FN
    except ImportError as exc:
        raise RuntimeError(f"actor_rollout_ref.model.use_liger=True needs liger-kernel: {LIGER_EXTRA}") from exc
    model_type = getattr(lm.config, "model_type", None)
    patch = MODEL_TYPE_TO_APPLY_LIGER_FN.get(model_type)
    if patch is None:
        raise ValueError(
            f"actor_rollout_ref.model.use_liger=True: liger-kernel has no kernels for model_type {model_type!r}; "
            f"supported: {', '.join(sorted(MODEL_TYPE_TO_APPLY_LIGER_FN))}"
        )
    patch(model=lm, rope=True, rms_norm=True, swiglu=True, cross_entropy=False, fused_linear_cross_entropy=False)
