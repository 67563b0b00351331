"""Log-probs and entropy straight from hidden states (the chunked LM head), against full logits.

On CPU the torch path is checked in float64 against log_softmax of the full logits, values and
gradients; on a GPU the fused Triton kernels are checked against the torch path (skipped here).
"""

from __future__ import annotations

import pytest
import torch

from trainer.algorithms.entropy import logprobs_from_hidden

needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="the fused Triton kernels need a GPU")


def reference(hidden, weight, bias, labels, tau):
    logits = torch.nn.functional.linear(hidden, weight, bias) / tau
    logp = torch.log_softmax(logits, -1)
    return logp.gather(-1, labels.unsqueeze(-1)).squeeze(-1), -(logp.exp() * logp).sum(-1)


def inputs(dtype=torch.float64, device="cpu", vocab=33, bias=True, seed=0):
    g = torch.Generator().manual_seed(seed)
    hidden = torch.randn(3, 5, 16, generator=g, dtype=torch.float64).to(device, dtype).requires_grad_()
    weight = torch.randn(vocab, 16, generator=g, dtype=torch.float64).to(device, dtype).requires_grad_()
    b = torch.randn(vocab, generator=g, dtype=torch.float64).to(device, dtype).requires_grad_() if bias else None
    labels = torch.randint(0, vocab, (3, 5), generator=g).to(device)
    return hidden, weight, b, labels


@pytest.mark.parametrize("tau, with_entropy, bias, chunk", [(1.0, False, False, 4), (0.6, True, True, 4), (1.3, True, False, 100)])
def test_values_and_gradients_equal_full_logits(tau, with_entropy, bias, chunk):
    hidden, weight, b, labels = inputs(bias=bias)
    logp, entropy = logprobs_from_hidden(hidden, weight, labels, tau, bias=b, with_entropy=with_entropy, chunk_size=chunk)
    ref_logp, ref_entropy = reference(hidden, weight, b, labels, tau)
    torch.testing.assert_close(logp, ref_logp, rtol=1e-12, atol=1e-12)
    upstream = torch.randn(3, 5, dtype=torch.float64)
    loss = (logp * upstream).sum() + (0.3 * entropy.sum() if with_entropy else 0.0)
    ref_loss = (ref_logp * upstream).sum() + (0.3 * ref_entropy.sum() if with_entropy else 0.0)
    wrt = [hidden, weight] + ([b] if bias else [])
    for ours, theirs in zip(torch.autograd.grad(loss, wrt), torch.autograd.grad(ref_loss, wrt), strict=True):
        torch.testing.assert_close(ours, theirs, rtol=1e-10, atol=1e-12)
    if with_entropy:
        torch.testing.assert_close(entropy, ref_entropy, rtol=1e-12, atol=1e-12)
    else:
        assert entropy is None


def test_outputs_are_not_views_and_keep_the_label_shape():
    hidden, weight, _, labels = inputs()
    logp, _ = logprobs_from_hidden(hidden, weight, labels)
    assert logp.shape == labels.shape and logp._base is None


def test_bad_shapes_and_labels_are_named():
    hidden, weight, _, labels = inputs()
    with pytest.raises(ValueError, match="must agree on H"):
        logprobs_from_hidden(hidden, weight[:, :8], labels)
    with pytest.raises(ValueError, match="labels shape"):
        logprobs_from_hidden(hidden, weight, labels[:, :2])
    with pytest.raises(ValueError, match=r"labels must lie in \[0, 33\); found \[0, 40\]"):
        logprobs_from_hidden(hidden, weight, labels.clamp(max=0) + torch.tensor([[40, 0, 0, 0, 0]] * 3))


@needs_cuda
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("with_entropy", [False, True])
def test_fused_kernels_equal_the_torch_path(dtype, with_entropy):
    hidden, weight, b, labels = inputs(dtype=dtype, device="cuda", vocab=151936 // 8, bias=False)
    tau = 0.8
    upstream = torch.randn(3, 5, device="cuda")
    results = []
    for fused in (True, False):
        h, w = hidden.detach().clone().requires_grad_(), weight.detach().clone().requires_grad_()
        logp, entropy = logprobs_from_hidden(h, w, labels, tau, with_entropy=with_entropy, chunk_size=6, fused=fused)
        loss = (logp * upstream).sum() + (0.3 * entropy.sum() if with_entropy else 0.0)
        results.append((logp, entropy, *torch.autograd.grad(loss, [h, w])))
    # fp32: the kernel's exp and the cancelling entropy term differ from torch's by about 1e-5 absolute
    tol = dict(rtol=2e-2, atol=2e-2) if dtype == torch.bfloat16 else dict(rtol=1e-3, atol=5e-5)
    for ours, theirs in zip(results[0], results[1], strict=True):
        if ours is not None:
            torch.testing.assert_close(ours.float(), theirs.float(), **tol)


@needs_cuda
def test_fused_out_of_range_label_gives_nan_not_a_device_assert():
    hidden, weight, _, labels = inputs(dtype=torch.float32, device="cuda", bias=False)
    labels[1, 2] = 10_000
    logp, _ = logprobs_from_hidden(hidden, weight, labels, fused=True)
    assert torch.isnan(logp[1, 2]) and torch.isfinite(logp[0]).all()
