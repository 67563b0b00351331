"""trainer.config: VERL's dotted keys, Hydra-style values, clear errors."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest

from trainer.config import (
    ConfigError,
    UnsupportedConfigError,
    build_config,
    clip_ratios,
    known_keys,
    parse_literal,
)

SEED_COMMAND = Path(__file__).parent / "data" / "seed_verl_command.sh"


def seed_overrides() -> list[str]:
    """The key=value arguments of the seed's VERL command line, paths and sizes for this machine."""
    text = SEED_COMMAND.read_text()
    start = text.index("python3 -m verl.trainer.main_ppo")
    args = [a for a in shlex.split(text[start:].replace("\\\n", " ")) if "=" in a]
    sizes = {
        "data.train_files": "train.parquet",
        "data.val_files": "val.parquet",
        "actor_rollout_ref.model.path": "tiny",
        "actor_rollout_ref.rollout.name": "hf",
        "actor_rollout_ref.actor.ulysses_sequence_parallel_size": "1",
        "trainer.n_gpus_per_node": "1",
        "trainer.nnodes": "1",
        "trainer.device": "cpu",
    }
    out = []
    for a in args:
        key = a.split("=", 1)[0]
        out.append(f"{key}={sizes[key]}" if key in sizes else a)
    return out


def test_every_key_of_the_seed_command_is_known():
    keys = [a.split("=", 1)[0] for a in seed_overrides()]
    assert len(keys) >= 45
    assert set(keys) <= set(known_keys())


def test_seed_command_is_accepted_with_values_read_as_verl_does():
    cfg = build_config(seed_overrides())
    assert cfg.algorithm.adv_estimator == "grpo"
    assert cfg.data.train_batch_size == 128
    assert cfg.data.max_response_length == 27648
    assert cfg.data.filter_overlong_prompts is True
    assert cfg.data.truncation == "error"  # quoted 'error' in the seed
    assert cfg.actor_rollout_ref.actor.optim.lr == pytest.approx(1e-6)
    assert cfg.actor_rollout_ref.rollout.n == 16
    assert cfg.actor_rollout_ref.rollout.top_k == 1000000
    assert cfg.actor_rollout_ref.actor.kl_loss_type == "low_var_kl"
    assert cfg.trainer.logger == ["console", "tensorboard"]
    assert cfg.trainer.default_local_dir == "checkpoints/verl_grpo_boba/ds_7b_fsdp_sglang"


def test_seed_engine_sglang_is_reported_as_not_supported_yet():
    args = [a for a in seed_overrides() if not a.startswith("actor_rollout_ref.rollout.name")]
    with pytest.raises(UnsupportedConfigError, match=r"rollout.name=sglang is not supported yet.*hf"):
        build_config(args + ["actor_rollout_ref.rollout.name=sglang"])


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("data.train_batch_sise=3", r"unknown config key 'data.train_batch_sise'; did you mean data.train_batch_size"),
        ("actor_rollout_ref.rollout.nn=3", r"did you mean actor_rollout_ref.rollout.n\b"),
        ("no_equals_sign", r"malformed override 'no_equals_sign': expected KEY=VALUE"),
        ("data.train_batch_size=abc", r"data.train_batch_size expects an integer, got 'abc'"),
        ("data.filter_overlong_prompts=maybe", r"expects true or false"),
        ("data.truncation=sideways", r"data.truncation='sideways' is not valid; choose one of: error, left, right, middle"),
        ("algorithm.adv_estimator=gae", r"not supported yet: GAE needs a critic"),
        ("trainer.logger=[console,wandb]", r"trainer.logger 'wandb' is not supported"),
        ("actor_rollout_ref.rollout.n=0", r"actor_rollout_ref.rollout.n must be at least 1, got 0"),
        ("actor_rollout_ref.rollout.top_p=1.5", r"top_p must be in \(0, 1\]"),
        ("trainer.max_actor_ckpt_to_keep=0", r"max_actor_ckpt_to_keep must be null \(keep all\) or at least 1, got 0"),
    ],
)
def test_bad_overrides_name_the_key_and_what_is_valid(override, message):
    with pytest.raises(ConfigError, match=message):
        build_config([override])


def test_max_actor_ckpt_to_keep_is_verls_key_null_by_default():
    assert build_config([]).trainer.max_actor_ckpt_to_keep is None
    assert build_config(["trainer.max_actor_ckpt_to_keep=2"]).trainer.max_actor_ckpt_to_keep == 2
    assert build_config(["trainer.max_actor_ckpt_to_keep=null"]).trainer.max_actor_ckpt_to_keep is None


def test_use_liger_is_refused_before_any_work_where_its_gpu_kernels_cannot_run():
    assert build_config([]).actor_rollout_ref.model.use_liger is False
    with pytest.raises(UnsupportedConfigError, match=r"use_liger=True needs trainer.device=cuda.*trainer.device=cpu"):
        build_config(["actor_rollout_ref.model.use_liger=True"])


def test_cross_field_checks():
    with pytest.raises(ConfigError, match=r"ppo_mini_batch_size \(16\) must not exceed data.train_batch_size \(8\)"):
        build_config(["data.train_batch_size=8", "actor_rollout_ref.actor.ppo_mini_batch_size=16"])
    with pytest.raises(ConfigError, match=r"must split evenly over 3 workers"):
        build_config(["trainer.n_gpus_per_node=3", "actor_rollout_ref.rollout.n=4"])


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("True", True),
        ("false", False),
        ("1e-6", 1e-6),
        ("128", 128),
        ("'error'", "error"),
        ('"x y"', "x y"),
        ('["console","tensorboard"]', ["console", "tensorboard"]),
        ("[console, tensorboard]", ["console", "tensorboard"]),
        ("[]", []),
        ("null", None),
        ("some/path.parquet", "some/path.parquet"),
    ],
)
def test_parse_literal(text, value):
    assert parse_literal(text) == value


def test_a_single_path_becomes_a_list_and_later_overrides_win():
    cfg = build_config(["data.train_files=a.parquet", "data.train_batch_size=4", "data.train_batch_size=8"])
    assert cfg.data.train_files == ["a.parquet"]
    assert cfg.data.train_batch_size == 8


def test_clip_ratio_low_and_high_fall_back_to_clip_ratio():
    cfg = build_config(["actor_rollout_ref.actor.clip_ratio=0.3", "actor_rollout_ref.actor.clip_ratio_high=0.28"])
    assert clip_ratios(cfg.actor_rollout_ref.actor) == (0.3, 0.28)


def test_flat_lists_every_key_once():
    flat = build_config().flat()
    assert list(flat) == known_keys()
    assert all(re.fullmatch(r"[a-z_]+(\.[a-z_0-9]+)+", k) for k in flat)


# ----------------------------------------------------------------------------- registries
def test_valid_names_come_from_the_registries(request: pytest.FixtureRequest) -> None:
    from trainer.algorithms.advantages import ADV_ESTIMATORS, grpo

    ADV_ESTIMATORS.register("my_grpo", grpo)
    request.addfinalizer(lambda: ADV_ESTIMATORS.unregister("my_grpo"))
    assert build_config(["algorithm.adv_estimator=my_grpo"]).algorithm.adv_estimator == "my_grpo"
    names = [n for n in ADV_ESTIMATORS if n != "gae"]  # gae: registered, needs a critic
    with pytest.raises(ConfigError, match=re.escape(f"choose one of: {', '.join(names)}")):
        build_config(["algorithm.adv_estimator=nope"])


@pytest.mark.parametrize(
    ("key", "module", "registry"),
    [
        ("actor_rollout_ref.rollout.name", "trainer.rollout", "ENGINES"),
        ("actor_rollout_ref.actor.loss_agg_mode", "trainer.algorithms.aggregation", "LOSS_AGG_MODES"),
        ("actor_rollout_ref.actor.kl_loss_type", "trainer.algorithms.kl", "KL_ESTIMATORS"),
        ("algorithm.kl_penalty", "trainer.algorithms.kl", "KL_ESTIMATORS"),
        ("algorithm.kl_ctrl.type", "trainer.algorithms.kl", "KL_CONTROLLERS"),
        ("actor_rollout_ref.actor.policy_loss.loss_mode", "trainer.algorithms.policy_loss", "POLICY_LOSSES"),
    ],
)
def test_every_registered_name_is_valid_and_others_are_refused_naming_them(key, module, registry):
    import importlib
    import importlib.util

    from trainer.config import KNOWN_BUT_UNSUPPORTED, supported_choices

    names = list(getattr(importlib.import_module(module), registry))
    unsupported = KNOWN_BUT_UNSUPPORTED.get(key, {})
    assert supported_choices(key) == tuple(n for n in names if n not in unsupported)
    for name in supported_choices(key):
        if name == "vllm" and importlib.util.find_spec("vllm") is None:
            continue  # valid, but refused at start-up without vLLM: tests/test_vllm_engine.py
        build_config([f"{key}={name}"])
    with pytest.raises(ConfigError, match=re.escape(f"{key}='nope' is not valid; choose one of: {', '.join(supported_choices(key))}")):
        build_config([f"{key}=nope"])


@pytest.mark.parametrize("value", ["full", "full+"])
@pytest.mark.parametrize("key", ["actor_rollout_ref.actor.kl_loss_type", "algorithm.kl_penalty"])
def test_the_full_vocabulary_kl_is_refused_at_start_up_with_its_reason(key: str, value: str) -> None:
    # It used to pass validation and fail at the first update ("loss_mat must be [B, T]").
    with pytest.raises(UnsupportedConfigError, match=f"{re.escape(f'{key}={value}')} is not supported yet: needs the full-voc"):
        build_config([f"{key}={value}"])


# ----------------------------------------------------------------------------- target lengths
TARGETS = "actor_rollout_ref.rollout.target_lengths"


def test_target_length_distributions_come_from_their_registry(request: pytest.FixtureRequest) -> None:
    from trainer.rollout.target_lengths import DISTRIBUTIONS, constant_lengths

    cfg = build_config([f"{TARGETS}.distribution=lognormal", f"{TARGETS}.mean=20", f"{TARGETS}.sigma=0.5"])
    targets = cfg.actor_rollout_ref.rollout.target_lengths
    assert (targets.distribution, targets.mean, targets.sigma) == ("lognormal", 20.0, 0.5)
    assert build_config().actor_rollout_ref.rollout.target_lengths.distribution == "none"
    DISTRIBUTIONS.register("flat", constant_lengths)
    request.addfinalizer(lambda: DISTRIBUTIONS.unregister("flat"))
    build_config([f"{TARGETS}.distribution=flat", f"{TARGETS}.mean=4"])
    with pytest.raises(
        ConfigError,
        match=re.escape(f"{TARGETS}.distribution='uniform' is not valid; choose one of: none, constant, lognormal, flat"),
    ):
        build_config([f"{TARGETS}.distribution=uniform", f"{TARGETS}.mean=4"])


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ([f"{TARGETS}.distribution=constant", f"{TARGETS}.mean=33"], r"mean must be in \(0, data.max_response_length=32\]"),
        ([f"{TARGETS}.distribution=lognormal", "data.max_response_length=100", f"{TARGETS}.mean=100.5"], r"=100\] .* got 100.5"),
        ([f"{TARGETS}.distribution=lognormal"], r"mean must be in \(0, .* got 0.0"),
        ([f"{TARGETS}.sigma=-0.1"], r"sigma must be >= 0, got -0.1"),
        (["data.synthetic_prompt_length=-1"], r"data.synthetic_prompt_length must be >= 0"),
        ([f"{TARGETS}.slowest_of=4"], r"slowest_of=4 needs drawn lengths: set .*distribution to a distribution"),
        ([f"{TARGETS}.slowest_of=-1"], r"slowest_of must be >= 0 \(0: off\), got -1"),
        (
            [f"{TARGETS}.distribution=constant", f"{TARGETS}.mean=8", f"{TARGETS}.slowest_of=1"],
            r"slowest_of=1 \(the shares of the run replayed; 0: off\) must exceed the 1 share\(s\) this run's 1 worker",
        ),
        ([f"{TARGETS}.gpus_per_share=0"], r"gpus_per_share must be >= 1, got 0"),
        (
            [f"{TARGETS}.distribution=constant", f"{TARGETS}.mean=8", f"{TARGETS}.slowest_of=8", f"{TARGETS}.gpus_per_share=2"],
            r"gpus_per_share=2 must divide this run's 1 worker\(s\)",
        ),
        (
            [f"{TARGETS}.distribution=constant", f"{TARGETS}.mean=8", f"{TARGETS}.slowest_of=8", "trainer.n_gpus_per_node=2",
             "data.train_batch_size=3", "actor_rollout_ref.actor.ppo_mini_batch_size=3"],
            r"slowest_of=8 needs data.train_batch_size \(3\) to be a multiple of the 2 worker\(s\)",
        ),
    ],
)
def test_target_lengths_and_prompt_length_are_checked_at_start_up(overrides, message):
    with pytest.raises(ConfigError, match=message):
        build_config(overrides)


def test_a_target_mean_at_the_cap_is_accepted_and_none_ignores_the_mean():
    build_config([f"{TARGETS}.distribution=constant", f"{TARGETS}.mean=32"])
    # a replay's gpus_per_share stays set when its slowest_of is turned off (a reference run): ignored
    build_config([f"{TARGETS}.distribution=constant", f"{TARGETS}.mean=8", f"{TARGETS}.gpus_per_share=2"])
    build_config([f"{TARGETS}.mean=1000"])  # distribution none: the mean is not used


@pytest.mark.parametrize(
    "override",
    [
        "actor_rollout_ref.actor.optim.lr=nan",
        "actor_rollout_ref.actor.kl_loss_coef=inf",
        "algorithm.kl_ctrl.kl_coef=-inf",
        "actor_rollout_ref.actor.optim.betas=[0.9,nan]",
    ],
)
def test_a_non_finite_float_is_refused_naming_its_key(override: str) -> None:
    key = override.partition("=")[0]
    with pytest.raises(ConfigError, match=rf"{re.escape(key)} must be a finite number"):
        build_config([override])


def test_a_verl_key_that_changes_nothing_here_is_reported_only_when_set() -> None:
    from trainer.config import settings_without_effect

    assert settings_without_effect(build_config([])) == []
    lines = settings_without_effect(build_config(["trainer.test_freq=5"]))
    assert len(lines) == 1 and lines[0].startswith("trainer.test_freq=5 has no effect")
    assert "validation is not run" in lines[0]
    # use_remove_padding packs the rows now: no longer reported
    assert settings_without_effect(build_config(["actor_rollout_ref.model.use_remove_padding=True"])) == []
    # the vLLM engine reads gpu_memory_utilization: not reported there, reported for the other engines
    key = "actor_rollout_ref.rollout.gpu_memory_utilization=0.3"
    assert settings_without_effect(build_config([key]))
    assert not settings_without_effect(build_config([key, "actor_rollout_ref.rollout.name=vllm"], check_names=False))
