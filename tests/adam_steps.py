"""Comparing two runs' AdamW steps by what the math fixes, for the tests that check that one way of
computing a step (micro-batches, workers, FSDP shards, packed rows) takes the step of another.

Adam moves a weight by lr * m_hat / (sqrt(v_hat) + eps): after one step lr * g / (|g| + eps), about
+-lr wherever |g| >> eps, whatever g's size. A change dg of the gradient moves that step by up to
lr * dg / (|g| + eps), lr / eps = 1e6 times dg where g is ~0. Where a gradient is zero in exact
arithmetic or nearly so (the components of a key bias that RoPE barely rotates shift every score of
a query alike, and softmax cancels them; a component of an embedding row whose uses cancel), its float
rounding noise, which the order of the sums (micro-batches, shards, packed rows, the host's SIMD
width) decides, then decides the step: a key bias's gradient of 2.307e-9 summed over the whole
batch and 2.275e-9 summed over micro-batches moves the weight 2.1e-5 apart (tests/test_actor_update.py
on an AVX2 host), and a sign flip 2 lr. Weights compared after the step pass on one host and fail on
another while both runs are right. So these checks compare

* Adam's first moments, exp_avg: (1 - beta1) times the gradient after one step, a fixed linear
  combination of the steps' gradients after more, so what the loss and its normalisation fix. The
  tolerance is relative to the largest first moment of each tensor: float32 rounding is ~1e-7 of it,
  while a wrong loss weight or normaliser moves the moments by a fraction of themselves;
* the weights, every element, allowing on top of the usual float tolerance the difference of
  Adam's last step that the two runs' moments explain (lr times the difference of
  m_hat / (sqrt(v_hat) + eps)): after one step from the same weights that is exactly the difference
  there is: up to 2 lr where a gradient is ~0, next to nothing where |g| >> eps. So the weights check that the
  optimizer did the same with the same gradients, and the moments that the gradients are the same.

Failures name the tensor and say what differed, by how much, against which tolerance, and how large
the gradient is there. Only the last step's difference is allowed for: the runs compared here take
one step, or a few whose gradients all lie far below eps (where Adam is linear in them).
"""

from __future__ import annotations

from collections.abc import Mapping

import torch

ADAM_EPS = 1e-8  # torch.optim.AdamW's default, which the trainer and these tests use
BETAS = (0.9, 0.999)  # likewise


def plain_name(name: str) -> str:
    """A parameter's name in the language model's own state dict: PolicyModel's parameters are
    ``lm.<name>``; the optimizer state of an FSDP model keeps that prefix too."""
    return name.removeprefix("lm.")


def adam_moments(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> dict[str, dict[str, torch.Tensor]]:
    """{parameter name: {"exp_avg", "exp_avg_sq", "step"}} of an AdamW over ``model``'s parameters,
    whole tensors on the CPU. Under FSDP the moments are sharded DTensors and gathering them is a
    collective: every rank must call this, at the same point."""
    out = {}
    for name, param in model.named_parameters():
        state = optimizer.state.get(param)
        if not state:
            continue
        entry = {}
        for key in ("exp_avg", "exp_avg_sq", "step"):
            value = state[key]
            if hasattr(value, "full_tensor"):
                value = value.full_tensor()
            entry[key] = value.detach().cpu().clone()
        out[plain_name(name)] = entry
    return out


def moments_from_state_dict(optimizer_state: Mapping, model: torch.nn.Module) -> dict[str, dict[str, torch.Tensor]]:
    """The same from an optimizer ``state_dict()``: keyed by parameter index (torch.optim's own) or
    by name (torch.distributed.checkpoint's full state dict, what the trainer's FSDP2 workers give).
    ``model`` (a PolicyModel like the run's) names the indices, in its parameters' order."""
    names = [name for name, _ in model.named_parameters()]
    out = {}
    for key, state in optimizer_state["state"].items():
        name = names[key] if isinstance(key, int) else key
        out[plain_name(name)] = {k: state[k].detach().cpu().clone() for k in ("exp_avg", "exp_avg_sq", "step")}
    return out


def moment_tolerances(
    want: Mapping[str, Mapping[str, torch.Tensor]], rtol: float
) -> dict[str, float]:
    """The absolute tolerance of each tensor's first moments: ``rtol`` times its largest (a tensor
    whose gradients are all ~0 still gets one, from the largest of all tensors)."""
    largest = max(float(w["exp_avg"].abs().max()) for w in want.values())
    return {name: rtol * max(float(w["exp_avg"].abs().max()), 1e-6 * largest) for name, w in want.items()}


def assert_same_moments(
    got: Mapping[str, Mapping[str, torch.Tensor]],
    want: Mapping[str, Mapping[str, torch.Tensor]],
    rtol: float = 1e-5,
    label: str = "",
) -> None:
    """Every tensor's first moments (the gradients: see the module docstring) agree within ``rtol``
    of the tensor's largest reference moment, and both runs took as many steps."""
    prefix = f"{label}: " if label else ""
    assert got.keys() == want.keys(), f"{prefix}moments of other parameters: {sorted(got.keys() ^ want.keys())}"
    tolerances = moment_tolerances(want, rtol)
    for name, w in want.items():
        g = got[name]
        assert float(g["step"]) == float(w["step"]), (
            f"{prefix}{name}: {float(g['step']):g} optimizer steps, expected {float(w['step']):g}"
        )
        ref, value, tol = w["exp_avg"].double(), g["exp_avg"].double(), tolerances[name]
        diff = (value - ref).abs()
        if float(diff.max()) > tol:
            i = int(diff.reshape(-1).argmax())
            raise AssertionError(
                f"{prefix}{name}: Adam's first moments (the gradients) differ by up to {float(diff.max()):.3e}, "
                f"tolerance {tol:.3e} ({rtol:g} x the tensor's largest |moment| {tol / rtol:.3e}); at flat index {i}: "
                f"{float(value.reshape(-1)[i]):.6e} vs {float(ref.reshape(-1)[i]):.6e}; "
                f"{int((diff > tol).sum())} of {diff.numel()} elements out of tolerance"
            )


def _tied_to(name: str, weights: Mapping[str, torch.Tensor], moments: Mapping) -> str | None:
    """The stepped parameter that ``name`` is another name of (a tied LM head is the embedding's
    weight under a second key of the state dict), or None."""
    value = weights[name]
    for other in moments:
        if other != name and other in weights and weights[other].shape == value.shape and torch.equal(weights[other], value):
            return other
    return None


def adam_direction(moment: Mapping[str, torch.Tensor]) -> torch.Tensor:
    """m_hat / (sqrt(v_hat) + eps): Adam's last step, in units of lr (weight decay aside)."""
    step = float(moment["step"])
    m_hat = moment["exp_avg"].double() / (1 - BETAS[0] ** step)
    v_hat = moment["exp_avg_sq"].double() / (1 - BETAS[1] ** step)
    return m_hat / (v_hat.sqrt() + ADAM_EPS)


def assert_same_weights_given_the_moments(
    got: Mapping[str, torch.Tensor],
    want: Mapping[str, torch.Tensor],
    got_moments: Mapping[str, Mapping[str, torch.Tensor]],
    want_moments: Mapping[str, Mapping[str, torch.Tensor]],
    lr: float,
    atol: float = 2e-5,
    rtol: float = 1e-4,
    label: str = "",
) -> None:
    """The weights after the steps agree to within ``atol`` + ``rtol`` * |weight| plus the difference
    of Adam's last step that the two runs' moments explain: lr * |m_hat / (sqrt(v_hat) + eps)| apart
    (after one step from the same weights, exactly the difference there is: up to 2 lr where a
    gradient is ~0, next to nothing where |g| >> eps). Every element is compared; parameters the optimizer
    did not step are compared within ``atol`` + ``rtol`` * |weight| alone."""
    prefix = f"{label}: " if label else ""
    assert got.keys() == want.keys(), f"{prefix}weights of other tensors: {sorted(got.keys() ^ want.keys())}"
    for name, ref in want.items():
        value, ref = got[name].double(), ref.double()
        key = name if name in want_moments else _tied_to(name, want, want_moments)
        explained = torch.zeros_like(ref)
        if key is not None:
            explained = lr * (adam_direction(got_moments[key]) - adam_direction(want_moments[key])).abs()
        diff = (value - ref).abs()
        allowed = atol + rtol * ref.abs() + 1.01 * explained  # 1%: the moments' own rounding
        if bool((diff > allowed).any()):
            i = int((diff - allowed).reshape(-1).argmax())
            there = ""
            if key is not None:
                grads = [float((m[key]["exp_avg_sq"].reshape(-1)[i] / (1 - BETAS[1] ** float(m[key]["step"]))).sqrt())
                         for m in (got_moments, want_moments)]
                there = (f"; the gradient there (Adam's sqrt(v_hat)) is {grads[0]:.3e} vs {grads[1]:.3e}, whose "
                         f"difference explains {float(explained.reshape(-1)[i]):.3e} of the step")
            raise AssertionError(
                f"{prefix}{name}: weights differ by up to {float(diff.max()):.3e}; at flat index {i}: "
                f"{float(value.reshape(-1)[i]):.6e} vs {float(ref.reshape(-1)[i]):.6e}, by {float(diff.reshape(-1)[i]):.3e} "
                f"where {float(allowed.reshape(-1)[i]):.3e} is allowed ({atol:g} + {rtol:g} x |weight| + what the "
                f"moments explain){there}; {int((diff > allowed).sum())} of {diff.numel()} elements out of tolerance"
            )


def assert_same_adam_steps(
    got_weights: Mapping[str, torch.Tensor],
    want_weights: Mapping[str, torch.Tensor],
    got_moments: Mapping[str, Mapping[str, torch.Tensor]],
    want_moments: Mapping[str, Mapping[str, torch.Tensor]],
    lr: float,
    moment_rtol: float = 1e-5,
    weight_atol: float = 2e-5,
    label: str = "",
) -> None:
    """Two runs took the same AdamW steps at learning rate ``lr``: the same gradients (first
    moments), and the same weights but for the step difference that those explain (see the module
    docstring)."""
    assert_same_moments(got_moments, want_moments, rtol=moment_rtol, label=label)
    assert_same_weights_given_the_moments(
        got_weights, want_weights, got_moments, want_moments, lr, atol=weight_atol, label=label
    )
