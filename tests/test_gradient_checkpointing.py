"""Selective gradient checkpointing (actor_rollout_ref.model.gradient_checkpointing_policy): the same
gradients as no checkpointing under every policy, a recompute that skips what the policy keeps, and
the config's checks. FSDP2 with a policy: tests/test_fsdp_gloo.py."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch
from op_counts import OpCounter

from trainer.config import ConfigError, UnsupportedConfigError, build_config
from trainer.models.checkpointing import (
    ATTENTION_OPS,
    MATMUL_OPS,
    POLICIES,
    checkpoint_kwargs,
    disable_gradient_checkpointing,
    enable_gradient_checkpointing,
)
from trainer.models.presets import build_model
from trainer.workers.fsdp import PolicyModel

POLICY = "actor_rollout_ref.model.gradient_checkpointing_policy"
CHECKPOINTING_ON = "actor_rollout_ref.model.enable_gradient_checkpointing=True"


def toy_inputs() -> tuple[torch.Tensor, ...]:
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(5, 100, (3, 14), generator=g)
    mask = torch.ones_like(ids)
    mask[1, :3] = 0  # a left-padded prompt
    ids = ids * mask
    weights = torch.randn(3, 5, generator=g)
    return ids, mask, ids[:, -5:], weights


def backward_of(policy: str | None) -> tuple[torch.Tensor, dict[str, torch.Tensor], OpCounter]:
    """The log-probs, the gradients of a weighted sum of them, and the ops the backward ran, for
    the tiny Qwen2 in fp32 checkpointed under ``policy`` (None: no checkpointing)."""
    lm = build_model("tiny", torch.float32, seed=0).train()
    if policy is not None:
        enable_gradient_checkpointing(lm, policy)
    ids, mask, response, weights = toy_inputs()
    logp, entropy = PolicyModel(lm)(ids, mask, response, temperature=0.7, with_entropy=True)
    loss = (logp * weights).sum() + 0.1 * entropy.sum()
    counter = OpCounter()
    with counter:
        loss.backward()
    return logp.detach(), {n: p.grad for n, p in lm.named_parameters()}, counter


@pytest.fixture(scope="module")
def runs() -> dict[str | None, tuple]:
    return {policy: backward_of(policy) for policy in (None, *POLICIES)}


@pytest.mark.parametrize("policy", list(POLICIES))
def test_every_policy_gives_the_gradients_of_no_checkpointing(runs, policy):
    logp, grads, _ = runs[policy]
    logp_ref, grads_ref, _ = runs[None]
    torch.testing.assert_close(logp, logp_ref, rtol=0, atol=0)  # the forward is the same computation
    assert grads.keys() == grads_ref.keys()
    for name, grad in grads.items():
        assert grad is not None and grad.abs().sum() > 0, name
        torch.testing.assert_close(grad, grads_ref[name], rtol=1e-5, atol=1e-7, msg=name)


def test_each_policy_recomputes_only_what_it_does_not_keep(runs):
    """Forward attention and matmuls that run during the backward, beyond the plain backward's own."""
    layers = build_model("tiny").config.num_hidden_layers
    plain = runs[None][2]
    assert plain.total(ATTENTION_OPS) == 0  # without checkpointing the backward runs no forward attention

    def recomputed(policy: str) -> tuple[int, int]:
        counter = runs[policy][2]
        return counter.total(ATTENTION_OPS), counter.total(MATMUL_OPS) - plain.total(MATMUL_OPS)

    full_attention, full_matmuls = recomputed("full")
    assert full_attention == layers and full_matmuls > 0  # one attention per layer, its projections too
    assert recomputed("save_attention") == (0, full_matmuls)  # attention kept, matmuls still recomputed
    assert recomputed("save_matmuls") == (0, 0)  # only elementwise work runs again
    mlp_attention, mlp_matmuls = recomputed("mlp")  # the MLP's matmuls only, never attention's
    assert mlp_attention == 0 and 0 < mlp_matmuls < full_matmuls


@pytest.mark.parametrize("policy", ["full", "mlp"])
def test_only_the_first_layers_are_checkpointed_when_layers_is_set(policy):
    """gradient_checkpointing_layers=1: the first layer recomputes, the second keeps its activations;
    the gradients stay those of no checkpointing."""
    def gradients(layers: int | None) -> tuple[dict[str, torch.Tensor], OpCounter]:
        lm = build_model("tiny", torch.float32, seed=0).train()
        assert lm.config.num_hidden_layers == 2
        if layers is not None:
            enable_gradient_checkpointing(lm, policy, layers=layers)
        ids, mask, response, weights = toy_inputs()
        logp, _ = PolicyModel(lm)(ids, mask, response, temperature=0.7)
        with OpCounter() as counter:
            (logp * weights).sum().backward()
        return {n: p.grad for n, p in lm.named_parameters()}, counter

    plain, plain_ops = gradients(None)
    first, first_ops = gradients(1)
    both, both_ops = gradients(2)
    for name, grad in first.items():
        torch.testing.assert_close(grad, plain[name], rtol=1e-5, atol=1e-7, msg=name)
    recomputed = [c.total(MATMUL_OPS) - plain_ops.total(MATMUL_OPS) for c in (first_ops, both_ops)]
    assert 0 < recomputed[0] and 2 * recomputed[0] == recomputed[1]  # one layer's recompute, then two
    assert first_ops.total(ATTENTION_OPS) == (1 if policy == "full" else 0)
    with pytest.raises(ValueError, match=r"gradient_checkpointing_layers=3: the model \(qwen2\) has 2 decoder layers"):
        enable_gradient_checkpointing(build_model("tiny"), "mlp", layers=3)


@pytest.mark.parametrize(("policy", "layers"), [("full", None), ("mlp", None), ("full", 1), ("mlp", 1)])
def test_disabling_undoes_every_policy(policy, layers):
    """disable_gradient_checkpointing (benchmarks/longseq_profile.py compares settings on one model):
    the backward then recomputes nothing, and the MLPs run their own forward again."""
    plain = build_model("tiny", torch.float32, seed=0).train()
    lm = build_model("tiny", torch.float32, seed=0).train()
    forwards = [layer.mlp.forward for layer in lm.model.layers]
    enable_gradient_checkpointing(lm, policy, layers)
    disable_gradient_checkpointing(lm)
    assert [layer.mlp.forward for layer in lm.model.layers] == forwards
    ids, mask, response, weights = toy_inputs()
    counts = []
    for model in (plain, lm):
        logp, _ = PolicyModel(model)(ids, mask, response)
        with OpCounter() as counter:
            (logp * weights).sum().backward()
        counts.append(counter.total(MATMUL_OPS))
    assert counts[0] == counts[1]


def test_a_deep_copy_of_an_mlp_checkpointed_model_runs_its_own_weights():
    import copy

    lm = build_model("tiny", torch.float32, seed=0).train()
    enable_gradient_checkpointing(lm, "mlp")
    twin = copy.deepcopy(lm)
    with torch.no_grad():
        for layer in twin.model.layers:
            layer.mlp.down_proj.weight.zero_()  # the MLPs of the copy now add nothing
    ids, mask, response, _ = toy_inputs()
    mine, theirs = PolicyModel(lm)(ids, mask, response)[0], PolicyModel(twin)(ids, mask, response)[0]
    assert not torch.allclose(mine, theirs)  # a closure over the original would have run its weights


def test_the_mlp_policy_is_a_plain_call_without_gradients():
    """old_log_prob and ref run the checkpointed model under no_grad: no checkpoint, same log-probs."""
    plain = build_model("tiny", torch.float32, seed=0).train()
    lm = build_model("tiny", torch.float32, seed=0).train()
    enable_gradient_checkpointing(lm, "mlp")
    ids, mask, response, _ = toy_inputs()
    with torch.no_grad():
        torch.testing.assert_close(PolicyModel(lm)(ids, mask, response)[0], PolicyModel(plain)(ids, mask, response)[0],
                                   rtol=0, atol=0)


def test_full_is_a_plain_non_reentrant_checkpoint():
    assert checkpoint_kwargs("full") == {"use_reentrant": False}
    selective = checkpoint_kwargs("save_attention")
    assert selective["use_reentrant"] is False and callable(selective["context_fn"])
    with pytest.raises(ValueError, match=r"unknown actor_rollout_ref.model.gradient_checkpointing_policy 'all'; valid names: full, "):
        checkpoint_kwargs("all")


def test_the_policy_key_names_its_valid_values():
    assert build_config([]).actor_rollout_ref.model.gradient_checkpointing_policy == "full"
    with pytest.raises(ConfigError, match=rf"{POLICY}='save_all' is not valid; choose one of: full, save_attention, "
                                          "save_matmuls, mlp"):
        build_config([CHECKPOINTING_ON, f"{POLICY}=save_all"])
    cfg = build_config([CHECKPOINTING_ON, f"{POLICY}=save_attention"])
    assert cfg.actor_rollout_ref.model.gradient_checkpointing_policy == "save_attention"


def test_a_selective_policy_without_checkpointing_is_refused_not_ignored():
    build_config([f"{POLICY}=full"])  # the default stays valid with checkpointing off
    with pytest.raises(ConfigError, match=rf"{POLICY}=save_matmuls needs .*enable_gradient_checkpointing=True"):
        build_config([f"{POLICY}=save_matmuls"])


def test_the_layers_key_needs_checkpointing_and_at_least_one_layer():
    key = "actor_rollout_ref.model.gradient_checkpointing_layers"
    assert build_config([]).actor_rollout_ref.model.gradient_checkpointing_layers is None
    with pytest.raises(ConfigError, match=rf"{key}=20 needs .*enable_gradient_checkpointing=True"):
        build_config([f"{key}=20"])
    with pytest.raises(ConfigError, match=rf"{key} must be null \(every layer\) or at least 1, got 0"):
        build_config([CHECKPOINTING_ON, f"{key}=0"])
    assert build_config([CHECKPOINTING_ON, f"{key}=20"]).actor_rollout_ref.model.gradient_checkpointing_layers == 20


def test_save_matmuls_is_refused_with_liger_whose_rope_overwrites_the_kept_projections():
    with pytest.raises(UnsupportedConfigError, match=rf"{POLICY}=save_matmuls is not supported with .*use_liger"):
        build_config([CHECKPOINTING_ON, f"{POLICY}=save_matmuls", "actor_rollout_ref.model.use_liger=True"])
    # save_attention keeps only attention's outputs, which liger never writes: its device check is what fails here
    with pytest.raises(UnsupportedConfigError, match="use_liger=True needs trainer.device=cuda"):
        build_config([CHECKPOINTING_ON, f"{POLICY}=save_attention", "actor_rollout_ref.model.use_liger=True"])


def test_records_and_trl_comparisons_name_a_selective_policy():
    from pytest_rlbench.frameworks.trl_settings import differences
    from pytest_rlbench.session.bench import describe_config

    plain = build_config([CHECKPOINTING_ON])
    assert "gradient_checkpointing_policy" not in describe_config(build_config([])).settings
    assert describe_config(plain).settings["gradient_checkpointing_policy"] == "full"
    assert not any("gradient_checkpointing_policy" in line for line in differences(plain, 4))
    selective = build_config([CHECKPOINTING_ON, f"{POLICY}=save_attention"])
    assert describe_config(selective).settings["gradient_checkpointing_policy"] == "save_attention"
    assert "gradient_checkpointing_policy save_attention: trl recomputes each checkpointed layer in full" in (
        differences(selective, 4)
    )
    some = build_config([CHECKPOINTING_ON, "actor_rollout_ref.model.gradient_checkpointing_layers=20"])
    assert describe_config(some).settings["gradient_checkpointing_layers"] == 20
    assert "gradient_checkpointing_layers" not in describe_config(plain).settings
    assert "gradient_checkpointing_layers 20: trl checkpoints every layer" in differences(some, 4)
    packed = build_config(["actor_rollout_ref.model.use_remove_padding=True"])
    assert describe_config(packed).settings["use_remove_padding"] is True
    assert "use_remove_padding" not in describe_config(plain).settings and "use_liger" not in describe_config(plain).settings


# In a fresh process: what importing the train worker imports, then what the policies keep.
ATTENTION_OPS_PROBE = """
import sys
import trainer.workers.train_worker
print("varlen imported by the worker:", "torch.nn.attention.varlen" in sys.modules)
from trainer.models.checkpointing import ATTENTION_OPS
import torch
op = getattr(getattr(torch.ops, "torch_attn", None), "_varlen_attn", None)
print("varlen op kept:", op is None or op in ATTENTION_OPS)
"""


def test_the_varlen_op_is_imported_only_when_the_attention_ops_are_read_and_then_kept():
    """Importing torch.nn.attention.varlen imports torch._dynamo (seconds of CPU in every Ray worker and
    driver): the train worker's import must not do it, and reading the set must still give it whole."""
    probe = [sys.executable, "-c", ATTENTION_OPS_PROBE]
    run = subprocess.run(probe, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]
    expected = ["varlen imported by the worker: False", "varlen op kept: True"]
    assert run.stdout.splitlines() == expected, run.stdout
