"""The suites with --rl-rollout vllm on the embedded default (CPU, local Ray), and the session defaults
that make that run without further options (pytest_rlbench/options/trainer_config.py, VLLM_CPU_DEFAULTS).

The defaults are tested on parsed options (no vLLM needed); the suites run as a real pytest session
(pytester subprocess) with vLLM's CPU build, in CI's vLLM step (README, "vLLM"), and its report is read
back: every phase timed with vLLM as the trainer's engine, and the rollout panel's vLLM row judged
against the trainer's old_log_prob.
"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

from pytest_rlbench.options.parse import parse_options
from pytest_rlbench.options.parsed import RLBenchOptions
from pytest_rlbench.options.trainer_config import (
    VLLM_CPU_DEFAULTS,
    VLLM_ON_CPU,
    build_trainer_config,
    vllm_cpu_defaults,
)
from pytest_rlbench.options.values import RawValue
from trainer.models.presets import PRESETS
from trainer.phases import PHASE_KEYS

pytestmark = pytest.mark.usefixtures("plugin_deps_loaded")  # see tests/conftest.py
needs_vllm = pytest.mark.skipif(
    importlib.util.find_spec("vllm") is None, reason='vLLM is not installed (pip install -e ".[vllm]", README "vLLM")'
)
MODEL_KEY = "actor_rollout_ref.model.path"
MEMORY_KEY = "actor_rollout_ref.rollout.gpu_memory_utilization"


def parse(tmp: Path, **values: object) -> RLBenchOptions:
    raw = {
        dest: RawValue(value, "--gpu" if dest == "rl_gpu" else "--" + dest.replace("_", "-"), tmp)
        for dest, value in values.items()
    }
    return parse_options(raw, {}, cwd=tmp)


def built(opts: RLBenchOptions, tmp: Path) -> tuple[str, float]:
    cfg = build_trainer_config(opts, workdir=tmp, check_names=False)
    return cfg.actor_rollout_ref.model.path, cfg.actor_rollout_ref.rollout.gpu_memory_utilization


# ----------------------------------------------------------------------------- session defaults
def test_the_vllm_model_default_is_a_preset_with_heads_vllm_takes() -> None:
    preset = PRESETS[VLLM_CPU_DEFAULTS[MODEL_KEY]]
    assert preset["head_dim"] == 64 and preset["head_dim"] * preset["num_attention_heads"] == preset["hidden_size"]


@pytest.mark.parametrize("engines", [["vllm"], ["fast", "vllm"]])
def test_vllm_on_cpu_gets_a_model_and_memory_fraction_it_can_run_with(tmp_path: Path, engines: list[str]) -> None:
    opts = parse(tmp_path, rl_rollout=engines)
    assert built(opts, tmp_path) == ("tiny-hd64", 0.1)
    assert {o.key: o.source for o in vllm_cpu_defaults(opts)} == {MODEL_KEY: VLLM_ON_CPU, MEMORY_KEY: VLLM_ON_CPU}


def test_a_key_the_user_sets_is_not_replaced(tmp_path: Path) -> None:
    mine = parse(tmp_path, rl_rollout="vllm", rl_model="r1-distill-qwen-1.5b", rl_config=[f"{MEMORY_KEY}=0.05"])
    assert vllm_cpu_defaults(mine) == []
    assert built(mine, tmp_path) == ("r1-distill-qwen-1.5b", 0.05)
    memory_only = parse(tmp_path, rl_rollout="vllm", rl_config=[f"{MEMORY_KEY}=0.2"])
    assert built(memory_only, tmp_path) == ("tiny-hd64", 0.2)


@pytest.mark.parametrize("values", [{"rl_rollout": "fast"}, {"rl_rollout": "vllm", "rl_gpu": True}])
def test_other_engines_and_gpu_runs_keep_the_trainer_s_defaults(tmp_path: Path, values: dict) -> None:
    opts = parse(tmp_path, **values)
    assert vllm_cpu_defaults(opts) == []
    assert built(opts, tmp_path) == ("tiny", 0.5)


# ----------------------------------------------------------------------------- the suites
@needs_vllm
def test_the_suites_run_every_phase_with_vllm_and_the_panel_judges_its_log_probs(
    pytester: pytest.Pytester, request: pytest.FixtureRequest
) -> None:
    """``pytest suites/ --rl-rollout vllm`` with no other option (fast joins as a panel engine)."""
    suites = request.config.rootpath / "suites"
    report = pytester.path / "r.json"
    result = pytester.runpytest_subprocess(
        str(suites), "--rl-rollout", "vllm", "--rl-rollout", "fast", "--rl-rounds=2", "--rl-warmup-rounds=0",
        f"--rl-report={report}", "-p", "no:randomly", timeout=500,
    )
    out = result.stdout.str()
    assert result.ret == pytest.ExitCode.OK, out[-3000:]
    outcomes = result.parseoutcomes()
    assert "failed" not in outcomes and "errors" not in outcomes and outcomes.get("skipped", 0) == 0
    assert f"rlbench: {VLLM_ON_CPU} (set the key to change it): {MODEL_KEY}=tiny-hd64, {MEMORY_KEY}=0.1" in out
    data = json.loads(report.read_text())
    run = data["run"]
    assert run["model"]["name"] == "tiny-hd64"
    settings = run["config"]["settings"]
    assert settings["rollout"] == "vllm" and settings["rollout_panel"] == ["vllm", "fast"]
    assert settings["gpu_memory_utilization"] == 0.1
    assert {phase for phase, figures in data["phases"].items() if figures["seconds"] is not None} == set(PHASE_KEYS)
    metrics = data["metrics"]
    for engine in ("vllm", "fast"):  # each engine's log-probs against the trainer's old_log_prob (fp32 on CPU)
        assert metrics[f"rollout_panel/{engine}/tokens_per_s"]["value"] > 0
        assert abs(metrics[f"rollout_panel/{engine}/token_mult_prob_error"]["value"] - 1.0) < 1e-3
        assert metrics[f"rollout_panel/{engine}/mismatch_kl"]["value"] < 1e-4
    lines = out.splitlines()
    table = lines[lines.index("rollout engines, same prompts and seed:") + 1 :][:3]
    assert table[1].split()[:2] == ["vllm", "(trains)"] and table[2].split()[0] == "fast"


@needs_vllm
def test_a_model_vllm_cannot_run_on_cpu_is_refused_before_any_test(pytester: pytest.Pytester) -> None:
    pytester.makepyfile('import pathlib\ndef test_uses_rl_config(rl_config):\n    pathlib.Path("ran").write_text("yes")\n')
    result = pytester.runpytest_subprocess("--rl-rollout", "vllm", "--rl-model", "tiny", timeout=300)
    out = result.stderr.str()  # the session's one "ERROR: pytest-rlbench: ..." line
    assert result.ret == pytest.ExitCode.USAGE_ERROR, (result.stdout.str() + out)[-3000:]
    assert "ERROR: pytest-rlbench: " in out
    assert "path='tiny' has head_dim 16, which vLLM's CPU attention does not support" in out
    assert "e.g. a preset: tiny-hd64" in out
    assert not (pytester.path / "ran").exists(), "a test body ran although the start-up check failed"
