"""liger-kernel's fused RMSNorm, SwiGLU and RoPE (actor_rollout_ref.model.use_liger): GPU only."""

from __future__ import annotations

import pytest
import torch

from trainer.models.liger import apply_liger, liger_installed
from trainer.models.presets import build_model

pytestmark = pytest.mark.skipif(
    not (torch.cuda.is_available() and liger_installed()), reason="needs a CUDA GPU and liger-kernel"
)


@pytest.fixture(autouse=True, scope="module")
def restore_transformers_qwen2():
    """liger's patch also swaps classes and functions in transformers' Qwen2 module for the whole
    process: put them back, so later tests' CPU models do not run liger's Triton kernels."""
    from transformers.models.qwen2 import modeling_qwen2

    saved = dict(vars(modeling_qwen2))
    yield
    for name, value in saved.items():
        setattr(modeling_qwen2, name, value)


def test_liger_kernels_give_the_same_loss_and_gradients_as_transformers_layers():
    plain = build_model("tiny", torch.float32, "cuda", seed=0)
    fused = build_model("tiny", torch.float32, "cuda", seed=0)
    apply_liger(fused)
    assert "Liger" in repr(fused.model.norm) and "Liger" not in repr(plain.model.norm)  # really swapped
    ids = torch.randint(0, plain.config.vocab_size, (4, 64), device="cuda")
    losses = []
    for model in (plain, fused):
        loss = model(ids, labels=ids).loss
        loss.backward()
        losses.append(loss.detach())
    assert torch.allclose(losses[0], losses[1], rtol=1e-4)
    for (name, a), (_, b) in zip(plain.named_parameters(), fused.named_parameters(), strict=True):
        assert torch.allclose(a.grad, b.grad, rtol=1e-3, atol=1e-5), name
