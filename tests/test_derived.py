"""Derived figures, checked against hand-computed values on small numbers."""

from __future__ import annotations

import copy
import dataclasses
from typing import Any

import pytest

from pytest_rlbench.records.baselines import load_baseline
from pytest_rlbench.records.record import ModelArch, record_from_dict
from pytest_rlbench.records.workload import workload_tokens
from pytest_rlbench.verdict.derived import decode_weight_bytes, derive, kv_cache_read_bytes
from pytest_rlbench.verdict.peaks import peak_bf16_flops, peak_memory_bandwidth
from trainer.models.flops import flops_params, train_flops

# L=1, H=2, I=4, n_h=1, n_kv=1, d=2, V=3.
TINY = ModelArch(
    name="tiny", num_layers=1, hidden_size=2, intermediate_size=4, num_heads=1, num_kv_heads=1, head_dim=2, vocab_size=3
)
QWEN_1_5B = load_baseline("verl-v0.5.0-1.5b").model
QWEN_7B = load_baseline("verl-7b").model

RUN: dict[str, Any] = {
    "format_version": 1,
    "name": "hand",
    "provenance": {"source": "test"},
    "hardware": {"device": "gpu", "nodes": 1, "gpus_per_node": 2, "world_size": 2, "gpu_model": "NVIDIA H100 80GB HBM3"},
    "model": {k: v for k, v in vars(TINY).items()},
    "config": {"train_batch_size": 1, "rollout_n": 2},
    # Two sequences: prompt 2 + response 1 = 3 tokens, prompt 2 + response 3 = 5 tokens.
    "tokens": {"prompt_lengths": [2, 2], "response_lengths": [1, 3], "decode_steps": 3},
    "phases": {
        "gen": {"seconds": [1.0, 2.0, 4.0]},
        "old_log_prob": {"seconds": 0.5},
        "update_actor": {"seconds": 4.0},
        "step": {"seconds": 8.0},
    },
}


def _derive(**changes: Any) -> dict:
    data = copy.deepcopy(RUN)
    for section, value in changes.items():
        data[section] = {**data[section], **value} if isinstance(value, dict) else value
    return derive(record_from_dict(data))


def test_flops_params_by_hand() -> None:
    # L (3 H I + H (q + k + v + n_h d)) + 2 V H = 1 * (3*2*4 + 2*(2+2+2+2)) + 2*3*2 = 24 + 16 + 12
    assert flops_params(TINY) == 52
    # DeepSeek-R1-Distill-Qwen-1.5B: 28 * (3*1536*8960 + 1536*(1536+256+256+1536)) + 2*151936*1536
    assert flops_params(QWEN_1_5B) == 28 * (41_287_680 + 5_505_024) + 466_747_392 == 1_776_943_104
    # DeepSeek-R1-Distill-Qwen-7B: 28 * (3*3584*18944 + 3584*8192) + 2*152064*3584
    assert flops_params(QWEN_7B) == 7_615_283_200


def test_train_flops_by_hand() -> None:
    # 6 N sum(s) + 6 sum(s^2) d n_h L = 6*52*(3+5) + 6*(9+25)*2*1*1
    assert train_flops(TINY, [3, 5]) == 2496 + 408


def test_decode_bytes_by_hand() -> None:
    # layers 40 + LM head V*H 6 = 46 parameters, bf16
    assert decode_weight_bytes(TINY) == 92
    # K and V, 1 layer, 1 KV head of 2, bf16: 8 bytes a position; positions read: 1*2 + (3*2 + 3) = 11
    assert kv_cache_read_bytes(TINY, [2, 2], [1, 3]) == 88


def test_throughput_and_timing_per_token_by_hand() -> None:
    figures = _derive()
    gen = figures["tokens_per_s_per_gpu/gen"]
    assert gen.value == 4 / (2.0 * 2)  # 4 response tokens, median 2 s, 2 GPUs
    assert gen.samples == (2.0, 1.0, 0.5)  # one per sample, in sample order
    assert figures["timing_per_token_ms/gen"].value == 2.0 * 1000 / 4
    assert figures["tokens_per_s_per_gpu/old_log_prob"].value == 8 / (0.5 * 2)  # prompt + response
    assert figures["tokens_per_s_per_gpu/step"].value == 8 / (8.0 * 2)  # VERL's perf/throughput
    assert figures["timing_s/gen"].value == 2.0 and figures["timing_s/gen"].samples == (1.0, 2.0, 4.0)


def test_rounds_on_their_own_batches_each_count_their_own_tokens() -> None:
    # Three whole steps, each on the next batch: 8, 16 and 4 tokens in 8, 8 and 1 s. The step's
    # throughput used to divide one batch's tokens by every round's time.
    rounds = [
        {"prompt_lengths": [2, 2], "response_lengths": [1, 3], "decode_steps": 3},
        {"prompt_lengths": [4, 4], "response_lengths": [5, 3], "decode_steps": 5},
        {"prompt_lengths": [1, 1], "response_lengths": [1, 1], "decode_steps": 1},
    ]
    phases = {**RUN["phases"], "step": {"seconds": [8.0, 8.0, 1.0], "round_tokens": rounds}}
    figures = _derive(phases=phases)
    step = figures["tokens_per_s_per_gpu/step"]
    assert step.samples == (8 / (8.0 * 2), 16 / (8.0 * 2), 4 / (1.0 * 2))
    assert step.value == 16 / (8.0 * 2)  # the median of the rounds' own throughputs
    assert "each round over its own batch" in step.basis
    again = record_from_dict({**copy.deepcopy(RUN), "phases": phases})
    assert len(again.phases["step"].round_tokens) == 3  # the record keeps them


def test_mfu_by_hand() -> None:
    figures = _derive()
    train = 6 * 52 * 8 + 6 * (9 + 25) * 2 * 1 * 1
    assert figures["mfu/update_actor"].value == pytest.approx(train / 4.0 / 989e12 / 2)
    assert figures["mfu/old_log_prob"].value == pytest.approx(train / 3 / 0.5 / 989e12 / 2)
    two_epochs = _derive(config={"ppo_epochs": 2})
    assert two_epochs["mfu/update_actor"].value == pytest.approx(2 * figures["mfu/update_actor"].value)


def test_mfu_of_a_realistic_step() -> None:
    # 1.5B, 8 sequences of 200 + 800 tokens, one H100, a 0.2 s update: about 44% MFU.
    figures = _derive(
        model=vars(QWEN_1_5B),
        hardware={"gpus_per_node": 1, "world_size": 1},
        tokens={"prompt_lengths": [200] * 8, "response_lengths": [800] * 8, "decode_steps": 800},
        phases={"update_actor": {"seconds": 0.2}},
    )
    flops = 6 * 1_776_943_104 * 8000 + 6 * 8 * 1000**2 * 128 * 12 * 28
    assert figures["mfu/update_actor"].value == pytest.approx(flops / 0.2 / 989e12)
    assert figures["mfu/update_actor"].value == pytest.approx(0.4416, abs=1e-4)


def test_bandwidth_with_and_without_sequence_lengths() -> None:
    figures = _derive()
    assert figures["bandwidth_util/gen"].value == pytest.approx((92 * 3 + 88) / 2.0 / 3.35e12 / 2)
    assert "KV-cache reads" in figures["bandwidth_util/gen"].basis
    weights_only = _derive(tokens={"prompt_lengths": None, "response_lengths": None, "response_tokens": 4})
    assert weights_only["bandwidth_util/gen"].value == pytest.approx(92 * 3 / 2.0 / 3.35e12 / 2)
    assert "lower bound" in weights_only["bandwidth_util/gen"].basis
    # generate_sequences, when timed, is the decode time
    timed = _derive(phases={**RUN["phases"], "generate_sequences": {"seconds": 1.0}})
    assert timed["bandwidth_util/gen"].value == pytest.approx((92 * 3 + 88) / 1.0 / 3.35e12 / 2)


@pytest.mark.parametrize(
    ("changes", "metric", "reason"),
    [
        ({"hardware": {"device": "cpu", "gpus_per_node": None, "gpu_model": None}}, "mfu/update_actor", "CPU run"),
        ({"hardware": {"gpu_model": None}}, "mfu/update_actor", "GPU model not recorded"),
        ({"hardware": {"gpu_model": "Tesla T4"}}, "mfu/update_actor", "'Tesla T4'"),
        ({"hardware": {"gpu_model": "H100"}}, "bandwidth_util/gen", "'H100'"),
        ({"tokens": {"prompt_lengths": None, "response_lengths": None}}, "mfu/update_actor", "per-sequence"),
        ({"tokens": {"prompt_lengths": None}}, "tokens_per_s_per_gpu/update_actor", "prompt token counts"),
        ({"tokens": {"decode_steps": None}}, "bandwidth_util/gen", "decode steps"),
    ],
)
def test_a_missing_input_gives_none_and_a_reason(changes: dict, metric: str, reason: str) -> None:
    figure = _derive(**changes)[metric]
    assert figure.value is None
    assert reason in figure.reason


def test_mean_length_times_sequences_from_the_config() -> None:
    seven = load_baseline("verl-7b")
    figures = derive(seven)
    # 128 prompts x 16 responses x mean 10425.773048 tokens over 325.086604 s on 64 GPUs
    assert figures["tokens_per_s_per_gpu/gen"].value == pytest.approx(2048 * 10425.773048 / 325.086604 / 64)
    assert figures["tokens_per_s_per_gpu/gen"].value == pytest.approx(1026.26, abs=0.01)
    # prompt lengths are not published: without a workload there is no prompt + response figure
    bare = derive(dataclasses.replace(seven, workload=None))
    assert bare["tokens_per_s_per_gpu/update_actor"].value is None
    # with it, the workload's assumed prompt mean (150 tokens) counts
    expected = 2048 * (150 + 10425.773048) / 73.008971 / 64
    assert figures["tokens_per_s_per_gpu/update_actor"].value == pytest.approx(expected, abs=0.01)
    verl_1_5b = load_baseline("verl-v0.5.0-1.5b")
    without = derive(dataclasses.replace(verl_1_5b, workload=None))
    assert without["tokens_per_s_per_gpu/gen"].value is None
    assert "number of sequences" in without["tokens_per_s_per_gpu/gen"].reason


def test_a_baseline_without_token_counts_gets_them_from_its_workload() -> None:
    verl = derive(load_baseline("verl-v0.5.0-1.5b"))
    # the per-GPU gen throughput the consistency checks support: 512 sequences over 8 GPUs, not 6,993
    assert verl["tokens_per_s_per_gpu/gen"].value == pytest.approx(512 * 14254.837890625 / 260.922 / 8)
    assert verl["tokens_per_s_per_gpu/gen"].value == pytest.approx(3496.48, abs=0.01)
    # MFU from the expected lengths of the workload's shape (512 sequences, prompt 148.5 as 148 or 149 tokens)
    tokens = workload_tokens(load_baseline("verl-v0.5.0-1.5b"))
    lengths = [p + r for p, r in zip(tokens.prompt_lengths, tokens.response_lengths, strict=True)]
    assert len(lengths) == 512 and sum(tokens.response_lengths) == round(512 * 14254.837890625)
    expected_mfu = train_flops(QWEN_1_5B, lengths) / 61.125 / 989e12 / 8
    assert verl["mfu/update_actor"].value == pytest.approx(expected_mfu)
    assert 0.15 < verl["mfu/update_actor"].value < 0.35
    # "H100" names no variant: no peak bandwidth, so no bandwidth use is guessed here
    assert verl["bandwidth_util/gen"].value is None


@pytest.mark.parametrize(
    ("name", "flops", "bandwidth"),
    [
        ("NVIDIA H100 80GB HBM3", 989e12, 3.35e12),
        ("NVIDIA H100 PCIe", 989e12, 2.0e12),  # VERL tables one H100 FLOP/s figure
        ("H100", 989e12, None),  # SXM or PCIe? not guessed
        ("NVIDIA H200", 989e12, 4.8e12),
        ("NVIDIA A100-SXM4-80GB", 312e12, 2.039e12),
        ("NVIDIA A100-SXM4-40GB", 312e12, 1.555e12),
        ("AMD Instinct MI300X", 1336e12, None),
        ("NVIDIA B200", 2.25e15, None),
        ("Tesla T4", None, None),
    ],
)
def test_peak_tables(name: str, flops: float | None, bandwidth: float | None) -> None:
    assert peak_bf16_flops(name) == flops
    assert peak_memory_bandwidth(name) == bandwidth
