"""Run the sampling-correctness check (trainer/algorithms/sampling_check.py) on a rollout engine.

    check = check_engine_sampling(engine, actor_lm, prompts, n=8, max_new_tokens=256,
                                  sampling=SamplingParams(temperature=1.0), seed=0)
    assert check.passed, check.describe()

    sampling = SamplingParams(report_entropy=True)
    check = sampler_check(engine.generate(..., sampling, seed), sampling)

The engine samples; an fp32 copy of ``reference`` (the policy the engine should be sampling from,
e.g. the actor's module after an update and a reshard) is the judge: it scores each sampled token
and the entropy of each distribution it was drawn from, at ``judge_temperature`` (the sampling
temperature unless given: a different one is how a test shows that the check catches a wrong one).
The reference forward runs ``rows_per_forward`` rows at a time through ``PolicyModel``, whose
chunked log-softmax never builds the [rows, R, V] float32 logits.

``sampler_check`` judges the same statistic under the engine's own distribution q instead: its
rollout_log_probs log q(y) against the entropies H(q) it reports. That test is exact at any precision:
it fails only if the sampler does not draw from the distribution the engine computed (a wrong
temperature inside the sampler, biased noise, a token scored against another step's logits), and it
is blind to a wrong q (stale weights, a broken cache), which the fp32 judge and the fidelity figures
see. It reads means over the response tokens, so figures stored in another row's place pass it: the
tests compare each token's entropy with a reference forward's for that. The
fp32 judge's gap is the sampler's gap plus ``sampling_check.precision_shift``, the part of the gap
that the engine's precision (bf16 logits against fp32) makes.
"""

from __future__ import annotations

import copy

import torch
from torch import nn

from trainer.algorithms.sampling_check import DEFAULT_LIMIT, SamplingCheck, sampling_check
from trainer.batch import Batch
from trainer.rollout.base import RolloutEngine, model_device
from trainer.rollout.requests import SamplingParams
from trainer.workers.fsdp import PolicyModel


def fp32_reference(model: nn.Module) -> PolicyModel:
    """A float32 copy of ``model`` (a causal LM) in eval mode, wrapped to score responses."""
    lm = model.lm if isinstance(model, PolicyModel) else model
    return PolicyModel(copy.deepcopy(lm).float().eval())


@torch.no_grad()
def reference_figures(
    reference: PolicyModel, batch: Batch, temperature: float, rows_per_forward: int = 4
) -> tuple[torch.Tensor, torch.Tensor]:
    """(log p(y), H(p)) [B, R] float32 on the CPU under ``reference`` at ``temperature``."""
    device = model_device(reference)
    log_probs, entropies = [], []
    for start in range(0, batch.size, rows_per_forward):
        part = batch.select(list(range(start, min(start + rows_per_forward, batch.size)))).to(device)
        lp, h = reference(
            input_ids=part.input_ids, attention_mask=part.attention_mask,
            response_ids=part.response_ids, temperature=temperature, with_entropy=True,
        )
        assert h is not None
        log_probs.append(lp.float().cpu())
        entropies.append(h.float().cpu())
    return torch.cat(log_probs), torch.cat(entropies)


def require_plain_sampling(sampling: SamplingParams) -> None:
    """The checks judge plain sampling: with top-k/top-p the engine draws from a truncated distribution,
    and greedy decoding draws nothing."""
    if not sampling.do_sample or sampling.top_k_or_zero > 0 or sampling.top_p < 1.0:
        raise ValueError(
            f"the sampling check judges plain sampling (do_sample, top_k off, top_p 1.0); got {sampling}"
        )


def check_engine_sampling(
    engine: RolloutEngine,
    reference: nn.Module,
    prompts: list[list[int]],
    n: int,
    max_new_tokens: int,
    sampling: SamplingParams,
    seed: int,
    judge_temperature: float | None = None,
    limit: float = DEFAULT_LIMIT,
) -> SamplingCheck:
    """Sample n responses per prompt with ``engine`` and judge them under an fp32 copy of ``reference``."""
    require_plain_sampling(sampling)
    batch = engine.generate(prompts, list(range(len(prompts))), [], n, max_new_tokens, sampling, seed).to("cpu")
    judge = fp32_reference(reference)
    temperature = sampling.temperature if judge_temperature is None else judge_temperature
    log_probs, entropies = reference_figures(judge, batch, temperature)
    return sampling_check(log_probs, entropies, batch.response_mask, limit)


def sampler_check(batch: Batch, sampling: SamplingParams, limit: float = DEFAULT_LIMIT) -> SamplingCheck:
    """The sampling check of ``batch`` under the engine's own distributions (see the module's text).

    ``sampling``: what the batch was generated with; plain sampling with ``report_entropy=True``.
    """
    require_plain_sampling(sampling)
    if batch.rollout_log_probs is None or batch.rollout_entropies is None:
        raise ValueError(
            "the sampler check reads rollout_log_probs and rollout_entropies: generate with "
            "SamplingParams(report_entropy=True) on an engine that reports them (fast, static, hf)"
        )
    return sampling_check(batch.rollout_log_probs, batch.rollout_entropies, batch.response_mask, limit)
