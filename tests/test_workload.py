"""Workloads: the stored baselines' workloads, replaying them per GPU, and telling the same work apart."""

from __future__ import annotations

import dataclasses
import math

import pytest
from replay_records import replay_config, replay_record

from pytest_rlbench.options.replay import replay_notes
from pytest_rlbench.records.baselines import load_baseline
from pytest_rlbench.records.length_shapes import expected_lengths, lognormal_mu, truncated_lognormal_mean
from pytest_rlbench.records.record import BaselineError, record_from_dict, record_to_dict
from pytest_rlbench.records.workload import run_workload, workload_matches, workload_tokens
from pytest_rlbench.records.workload_format import (
    ASSUMED,
    HARDWARE_READINGS,
    INFERRED,
    PUBLISHED,
    assumptions,
    sourced_items,
)
from pytest_rlbench.records.workload_replay import TARGET_LENGTHS, WorkloadError, workload_overrides
from pytest_rlbench.verdict.consistency import check_published
from trainer.config import Config, Override, known_keys

NAMES = ("verl-v0.5.0-1.5b", "rlinf-1.5b", "verl-7b")
# The smallest GPU count each baseline's per-GPU work divides into (7B: 32 sequences / 16 = 2 prompts,
# which do not split into its 4 PPO mini-batches on one GPU).
REPLAY_GPUS = {"verl-v0.5.0-1.5b": 1, "rlinf-1.5b": 1, "verl-7b": 2}


def settings(name: str, world_size: int) -> dict:
    return {s.key: s.value for s in workload_overrides(load_baseline(name), world_size)}


@pytest.mark.parametrize("name", NAMES)
def test_every_stored_baseline_has_a_workload_with_a_reason_for_each_guess(name: str) -> None:
    w = load_baseline(name).workload
    assert w is not None
    items = dict(sourced_items(w))
    assert {"sequences_per_gpu", "response_length.mean", "response_length.shape", "temperature"} <= set(items)
    for key, item in items.items():
        assert item.source in (PUBLISHED, INFERRED, ASSUMED), key
        assert item.source == PUBLISHED or item.why, key
    # the report lists every assumed value, with its reason (an assumed GPU model with the hardware's
    # readings, verdict.gate_basis: tests/test_assumed_gpu.py)
    listed = [k for k, item in items.items() if item.source == ASSUMED and k not in HARDWARE_READINGS]
    assert len(assumptions(w)) == len(listed) > 0


def test_the_1_5b_workloads_hold_what_their_notes_and_figures_say() -> None:
    verl, rlinf = load_baseline("verl-v0.5.0-1.5b").workload, load_baseline("rlinf-1.5b").workload
    for w in (verl, rlinf):
        assert (w.sequences_per_step.value, w.sequences_per_step.source) == (512, INFERRED)
        assert w.sequences_per_gpu.value == 64
        assert (w.response_length.max.value, w.response_length.max.source) == (27648, INFERRED)
        assert w.response_length.shape.value == "lognormal" and w.response_length.shape.source == ASSUMED
    assert (
        verl.response_length.mean.value == 14254.837890625 and verl.response_length.mean.source == PUBLISHED
    )
    assert rlinf.response_length.mean.value == 13975.0
    assert verl.parallelism.value == {"dp": 4, "sp": 2} and rlinf.parallelism.value == {"dp": 4, "tp": 2}
    assert rlinf.use_kl_loss.source == INFERRED  # "does not count ref logprob time": a reference model ran
    seven = load_baseline("verl-7b").workload
    assert (seven.sequences_per_step.value, seven.sequences_per_gpu.value) == (2048, 32)
    assert seven.param_offload.value is True and seven.param_offload.source == PUBLISHED
    assert seven.temperature.value == 0.6 and seven.ppo_mini_batches.value == 4


@pytest.mark.parametrize("name", ["verl-v0.5.0-1.5b", "rlinf-1.5b"])
def test_the_inferred_values_are_the_readings_the_consistency_checks_support(name: str) -> None:
    baseline = load_baseline(name)
    w = baseline.workload
    blog = check_published(baseline, "gen_throughput_blog")
    agreeing = [r for r in blog.interpretations if r.consistent]
    assert [r.sequences for r in agreeing] == [w.sequences_per_step.value]
    logprob = check_published(baseline, "prev_logprob_throughput")
    implied = next(r.implied_prompt_mean for r in logprob.interpretations if r.sequences == 512)
    assert w.prompt_length.mean.value == pytest.approx(implied, abs=0.1)


def test_old_records_without_a_workload_still_load_and_a_bad_one_is_refused() -> None:
    data = record_to_dict(load_baseline("verl-7b"))
    del data["workload"]
    assert record_from_dict(data).workload is None
    data = record_to_dict(load_baseline("verl-7b"))
    data["workload"]["sequences_per_gpu"]["value"] = 31
    data["workload"]["temperature"]["source"] = "guessed"
    data["workload"]["ppo_epochs"] = {"value": 1, "source": "assumed"}
    data["workload"]["response_length"].pop("sigma")
    with pytest.raises(BaselineError) as err:
        record_from_dict(data)
    text = str(err.value)
    assert (
        "$.workload.sequences_per_gpu.value: expected sequences_per_step / world_size = 32, found 31" in text
    )
    assert (
        "$.workload.temperature.source: expected one of published, inferred, assumed, found 'guessed'" in text
    )
    assert "$.workload.ppo_epochs.why: an assumed value needs a reason" in text
    assert "$.workload.response_length.sigma: a lognormal shape needs sigma" in text


def test_overrides_do_the_baselines_work_per_gpu() -> None:
    one = settings("verl-v0.5.0-1.5b", 1)
    # 64 sequences per GPU on one GPU: 4 prompts x 16 samples; 4 mini-batches of one prompt
    assert one["data.train_batch_size"] == 4 and one["actor_rollout_ref.rollout.n"] == 16
    assert one["actor_rollout_ref.actor.ppo_mini_batch_size"] == 1
    assert one["data.max_prompt_length"] == 1024 and one["data.max_response_length"] == 27648
    assert one["data.synthetic_prompt_length"] == 148  # the implied mean 148.5, rounded half to even
    assert one[f"{TARGET_LENGTHS}.distribution"] == "lognormal"
    assert one[f"{TARGET_LENGTHS}.mean"] == 14254.837890625 and one[f"{TARGET_LENGTHS}.sigma"] == 0.5
    assert one["actor_rollout_ref.actor.use_kl_loss"] is True
    assert one["actor_rollout_ref.actor.kl_loss_type"] == "low_var_kl"
    assert one["actor_rollout_ref.actor.use_dynamic_bsz"] is True
    assert one["actor_rollout_ref.actor.ppo_max_token_len_per_gpu"] == 30000
    assert one["actor_rollout_ref.ref.log_prob_max_token_len_per_gpu"] == 30000
    assert one["actor_rollout_ref.model.enable_gradient_checkpointing"] is True
    assert one["actor_rollout_ref.actor.fsdp_config.param_offload"] is False
    assert one["actor_rollout_ref.rollout.temperature"] == 0.6
    assert one["actor_rollout_ref.model.path"] == "r1-distill-qwen-1.5b"
    assert one["actor_rollout_ref.actor.fsdp_config.model_dtype"] == "bf16"
    eight = settings("verl-v0.5.0-1.5b", 8)  # the baseline's own 512 sequences on 8 GPUs
    assert (eight["data.train_batch_size"], eight["actor_rollout_ref.actor.ppo_mini_batch_size"]) == (32, 8)
    seven = settings("verl-7b", 2)
    assert (seven["data.train_batch_size"], seven["actor_rollout_ref.actor.ppo_mini_batch_size"]) == (4, 1)
    assert seven["actor_rollout_ref.model.path"] == "r1-distill-qwen-7b"
    assert seven["actor_rollout_ref.actor.fsdp_config.optimizer_offload"] is True
    assert settings("rlinf-1.5b", 1)[f"{TARGET_LENGTHS}.mean"] == 13975.0


def test_a_replay_note_tells_memory_placement_from_work() -> None:
    seven = load_baseline("verl-7b")
    cfg = replay_config(seven, 4)
    offload, n = "actor_rollout_ref.actor.fsdp_config.param_offload", "actor_rollout_ref.rollout.n"
    cfg.actor_rollout_ref.actor.fsdp_config.param_offload = False
    cfg.actor_rollout_ref.rollout.n = 8
    given = [Override(offload, False, "--rl-config A"), Override(n, 8, "--rl-config B")]
    notes = replay_notes(cfg, workload_overrides(seven, 4), given)
    assert notes == [
        f"{n}=8 (from --rl-config B) instead of the replay's 16: comparisons with the replayed baseline are references",
        f"{offload}=False (from --rl-config A) instead of the replay's True: memory placement, not work: "
        "the replayed baseline still gates, naming it",
    ]


@pytest.mark.parametrize("name", NAMES)
def test_override_keys_are_trainer_config_keys(name: str) -> None:
    pending = {"data.synthetic_prompt_length"} | {
        f"{TARGET_LENGTHS}.{k}" for k in ("distribution", "mean", "sigma")
    }
    keys = {s.key for s in workload_overrides(load_baseline(name), REPLAY_GPUS[name])}
    assert keys - pending <= set(known_keys())
    for s in workload_overrides(load_baseline(name), REPLAY_GPUS[name]):
        assert s.why, s.key  # each setting says which workload values it comes from


def test_a_workload_that_does_not_divide_over_the_gpus_is_refused() -> None:
    with pytest.raises(WorkloadError, match="2 prompts per step / ppo_mini_batches 4"):
        workload_overrides(load_baseline("verl-7b"), 1)
    base = load_baseline("verl-v0.5.0-1.5b")
    odd = dataclasses.replace(
        base.workload, sequences_per_gpu=dataclasses.replace(base.workload.sequences_per_gpu, value=24)
    )
    with pytest.raises(WorkloadError, match="sequences_per_gpu 24 .* = 24 is not a multiple of 16"):
        workload_overrides(dataclasses.replace(base, workload=odd), 1)
    with pytest.raises(WorkloadError, match="records no workload"):
        workload_overrides(dataclasses.replace(base, workload=None), 1)


def test_a_model_without_a_preset_is_not_given_one() -> None:
    base = load_baseline("verl-v0.5.0-1.5b")
    other = dataclasses.replace(base, model=dataclasses.replace(base.model, num_layers=27))
    keys = {s.key for s in workload_overrides(other, 1)}
    assert "actor_rollout_ref.model.path" not in keys


@pytest.mark.parametrize("name", NAMES)
def test_a_faithful_replay_does_the_same_work_per_gpu(name: str) -> None:
    baseline = load_baseline(name)
    for world in (REPLAY_GPUS[name], 8):
        run = replay_record(baseline, world_size=world)
        assert workload_matches(run, baseline) == []
        assert all(item.source == PUBLISHED for _, item in sourced_items(run.workload))


def test_the_run_workload_records_the_configured_lengths() -> None:
    cfg = replay_config(load_baseline("verl-v0.5.0-1.5b"), 1)
    w = run_workload(cfg, load_baseline("verl-v0.5.0-1.5b").model, 1, rollout_tp=1)
    assert (w.response_length.shape.value, w.response_length.mean.value, w.response_length.sigma.value) == (
        "lognormal",
        14254.837890625,
        0.5,
    )
    assert (w.prompt_length.shape.value, w.prompt_length.mean.value) == ("constant", 148.0)
    assert (w.sequences_per_step.value, w.sequences_per_gpu.value, w.ppo_mini_batches.value) == (64, 64, 4)
    plain = Config()  # no target lengths: the model's own lengths, or the cap with ignore_eos
    model = load_baseline("verl-v0.5.0-1.5b").model
    assert run_workload(plain, model, 1, rollout_tp=1).response_length.shape.value == "natural"
    plain.actor_rollout_ref.rollout.ignore_eos = True
    capped = run_workload(plain, model, 1, rollout_tp=1).response_length
    assert (capped.shape.value, capped.mean.value) == ("constant", float(plain.data.max_response_length))
    assert run_workload(plain, model, 3, rollout_tp=1).sequences_per_gpu.value == pytest.approx(32 / 3)


@pytest.mark.parametrize(
    ("path", "value", "expected"),
    [
        ("samples_per_prompt", 8, "workload.samples_per_prompt: run 8, baseline 16"),
        ("sequences_per_gpu", 32, "workload.sequences_per_gpu: run 32, baseline 64"),
        ("response_length.mean", 1024.0, "workload.response_length.mean: run 1024, baseline 14255"),
        (
            "response_length.shape",
            "constant",
            "workload.response_length.shape: run 'constant', baseline 'lognormal'",
        ),
        ("use_kl_loss", False, "workload.use_kl_loss: run False, baseline True"),
        ("gradient_checkpointing", False, "workload.gradient_checkpointing: run False, baseline True"),
        ("temperature", 1.0, "workload.temperature: run 1.0, baseline 0.6"),
        ("ppo_mini_batches", 1, "workload.ppo_mini_batches: run 1, baseline 4"),
    ],
)
def test_other_work_is_named(path: str, value, expected: str) -> None:
    baseline = load_baseline("verl-v0.5.0-1.5b")
    run = replay_record(baseline)
    data = record_to_dict(run)
    node = data["workload"]
    for part in path.split("."):
        node = node[part]
    node["value"] = value
    if path == "sequences_per_gpu":
        data["workload"]["sequences_per_step"]["value"] = 32
    if path == "response_length.shape":
        del data["workload"]["response_length"]["sigma"]
    assert expected in workload_matches(record_from_dict(data), baseline)


def test_another_model_or_no_workload_is_other_work() -> None:
    verl = load_baseline("verl-v0.5.0-1.5b")
    seven_replay = replay_record(load_baseline("verl-7b"), world_size=2)
    assert any(
        d.startswith("model: run 'DeepSeek-R1-Distill-Qwen-7B'") for d in workload_matches(seven_replay, verl)
    )
    bare = dataclasses.replace(replay_record(verl), workload=None)
    assert workload_matches(bare, verl) == ["workload: not recorded in the run"]


def test_workload_tokens_fill_only_what_the_record_lacks() -> None:
    verl = load_baseline("verl-v0.5.0-1.5b")
    tokens = workload_tokens(verl)
    assert tokens.num_sequences == 512 and tokens.response_length_mean == 14254.837890625
    assert max(tokens.response_lengths) <= 27648 and set(tokens.prompt_lengths) <= {148, 149}
    assert tokens.decode_steps == 8 * max(tokens.response_lengths)  # 8 replicas: no rollout tp stated
    run = replay_record(verl)
    assert workload_tokens(run) == run.tokens  # a run's own counts are kept
    assert workload_tokens(dataclasses.replace(verl, workload=None)) == verl.tokens


def test_truncated_lognormal_lengths() -> None:
    mu = lognormal_mu(14254.84, 0.5, 27648)
    assert truncated_lognormal_mean(mu, 0.5, 27648) == pytest.approx(14254.84)
    # without the cap the mean would be higher: part of the mass sits on the cap
    assert math.exp(mu + 0.125) > 14254.84
    lengths = expected_lengths("lognormal", 14254.84, 512, 27648, 0.5)
    assert sum(lengths) == round(512 * 14254.84) and max(lengths) == 27648 and min(lengths) >= 1
    assert lengths == sorted(lengths)
    assert expected_lengths("constant", 148.5, 3) == [148, 148, 148]
    with pytest.raises(ValueError, match="no lengths can be computed for shape 'natural'"):
        expected_lengths("natural", 100.0, 4)
    with pytest.raises(ValueError, match="0 < mean < cap"):
        lognormal_mu(30000.0, 0.5, 27648)


@pytest.mark.parametrize(("engine", "recorded"), [("fast", 2), ("hf", 1), ("static", 1)])
def test_a_run_records_the_rollout_tp_its_engine_decoded_at(engine: str, recorded: int) -> None:
    """rollout.tensor_model_parallel_size=2 splits the fast engine's decode over two workers; hf and
    static ignore the key, so their runs record 1: read as a baseline, such a run's decode replicas
    are its GPUs, not half of them."""
    from pytest_rlbench.records.workload_replay import decode_replicas
    from pytest_rlbench.session.bench import describe_workload

    cfg = Config()
    cfg.trainer.n_gpus_per_node = 4
    cfg.actor_rollout_ref.rollout.name = engine
    cfg.actor_rollout_ref.rollout.tensor_model_parallel_size = 2
    w = describe_workload(cfg, load_baseline("verl-v0.5.0-1.5b").model)
    assert w.parallelism.value == {"dp": 4, "rollout_tp": recorded, "sp": 1}, w.parallelism.value
    seven = load_baseline("verl-7b")
    record = dataclasses.replace(seven, workload=w, hardware=dataclasses.replace(seven.hardware, world_size=4))
    assert decode_replicas(record) == (4 // recorded, None)
