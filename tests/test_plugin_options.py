"""The --rl-* options: parsing, composing the trainer config, usage errors, ini files and --help.

Parsing is tested on plain values; the pytest side (usage errors, ini, --help) through pytester,
in-process: none of these runs starts Ray.
"""

from __future__ import annotations

import json
import pickle
from pathlib import Path

import pytest

from pytest_rlbench.options.parse import parse_options
from pytest_rlbench.options.parsed import RLBenchOptions
from pytest_rlbench.options.table import OPTIONS
from pytest_rlbench.options.trainer_config import build_trainer_config
from pytest_rlbench.options.values import OptionError, RawValue
from pytest_rlbench.records.baselines import resolve_baseline
from pytest_rlbench.verdict.noise import DEFAULT_CPU_TOLERANCE, DEFAULT_TOLERANCE, DefaultTolerance
from trainer.data.synthetic import write_synthetic_parquet
from trainer.models.presets import PRESETS

pytestmark = pytest.mark.usefixtures("plugin_deps_loaded")  # see tests/conftest.py


def cli(tmp: Path, **values: object) -> dict[str, RawValue | None]:
    """Raw values as the command line would give them: rl_nodes="2" -> --rl-nodes."""
    out: dict[str, RawValue | None] = {}
    for dest, value in values.items():
        flag = "--gpu" if dest == "rl_gpu" else "--" + dest.replace("_", "-")
        out[dest] = RawValue(value, flag, tmp)
    return out


def parse(tmp: Path, environ: dict[str, str] | None = None, **values: object) -> RLBenchOptions:
    return parse_options(cli(tmp, **values), environ or {}, cwd=tmp)


# ----------------------------------------------------------------------------- parsing, pure
def test_defaults_are_a_plain_local_cpu_run(tmp_path: Path) -> None:
    opts = parse(tmp_path)
    assert (opts.nodes, opts.gpus_per_node, opts.gpu) == (1, None, False)
    assert opts.embedded and opts.ray_address is None
    assert (opts.model, opts.rollout, opts.dataset) == ("tiny", "hf", None)
    assert opts.tolerance == DEFAULT_CPU_TOLERANCE == 0.15  # CPU workers (GPUs: 0.10)
    assert isinstance(opts.tolerance, DefaultTolerance)  # nobody chose it: verdicts name it the default
    assert parse(tmp_path, rl_gpu=True).tolerance == DEFAULT_TOLERANCE == 0.10
    assert opts.config_overrides == () and opts.baselines == ()
    cfg = build_trainer_config(opts)
    assert cfg.trainer.device == "cpu" and cfg.trainer.nnodes == 1 and cfg.trainer.n_gpus_per_node == 1
    assert cfg.data.train_files == []


def test_options_compose_into_the_trainer_config(tmp_path: Path) -> None:
    data = write_synthetic_parquet(tmp_path / "d.parquet", 16, seed=3)
    opts = parse(
        tmp_path,
        rl_nodes="2",
        rl_gpu=True,
        rl_gpus_per_node="4",
        rl_rollout="static",
        rl_model="r1-distill-qwen-1.5b",
        rl_dataset="d.parquet",  # relative: to the invocation directory
        rl_config=["actor_rollout_ref.rollout.n=16", "data.train_batch_size=16"],
    )
    assert opts.dataset == data
    cfg = build_trainer_config(opts)
    assert cfg.trainer.nnodes == 2 and cfg.trainer.n_gpus_per_node == 4 and cfg.trainer.device == "cuda"
    assert cfg.actor_rollout_ref.model.path == "r1-distill-qwen-1.5b"
    assert cfg.actor_rollout_ref.rollout.name == "static"
    assert cfg.actor_rollout_ref.rollout.n == 16 and cfg.data.train_batch_size == 16
    assert cfg.data.train_files == [str(data)]


def test_gpu_without_a_count_takes_the_cluster_s_and_cpu_workers_come_from_rl_config(tmp_path: Path) -> None:
    gpu = parse(tmp_path, rl_gpu=True)
    assert gpu.gpus_per_node is None
    assert build_trainer_config(gpu, gpus_per_node=8).trainer.n_gpus_per_node == 8
    cpu = parse(tmp_path, rl_config=["trainer.n_gpus_per_node=2"])  # on CPU: workers per node
    assert cpu.gpus_per_node is None and not cpu.gpu
    assert build_trainer_config(cpu).trainer.n_gpus_per_node == 2


def test_rl_config_may_set_an_owned_key_when_its_option_is_not_given(tmp_path: Path) -> None:
    opts = parse(
        tmp_path,
        rl_config=["trainer.nnodes=2", "trainer.device=cuda", "actor_rollout_ref.rollout.name=static"],
    )
    assert (opts.nodes, opts.gpu, opts.rollout) == (2, True, "static")
    assert opts.source_of("rl_nodes") == "--rl-config trainer.nnodes=2"


def test_tolerance_zero_is_allowed_and_ray_address_comes_from_the_environment(tmp_path: Path) -> None:
    assert parse(tmp_path, rl_tolerance="0").tolerance == 0.0
    assert parse(tmp_path, rl_tolerance="0.25").tolerance == 0.25
    chosen = parse(tmp_path, rl_tolerance="0.15").tolerance  # chosen: a plain number, never the default
    assert chosen == 0.15 and not isinstance(chosen, DefaultTolerance)
    copied = pickle.loads(pickle.dumps(parse(tmp_path).tolerance))
    assert isinstance(copied, DefaultTolerance) and copied == 0.15
    env = parse(tmp_path, environ={"RAY_ADDRESS": "10.0.0.1:6379"})
    assert env.ray_address == "10.0.0.1:6379" and env.ray_address_source == "RAY_ADDRESS" and not env.embedded
    both = parse(tmp_path, environ={"RAY_ADDRESS": "10.0.0.1:6379"}, rl_ray_address="10.0.0.2:6379")
    assert both.ray_address == "10.0.0.2:6379" and both.ray_address_source == "--rl-ray-address"


def test_baselines_are_stored_names_or_files_loaded_once_with_the_options(tmp_path: Path) -> None:
    data = json.loads(resolve_baseline("rlinf-1.5b").read_text())
    (tmp_path / "mine.json").write_text(json.dumps({**data, "name": "mine"}))
    opts = parse(tmp_path, rl_baseline=["verl-7b", "mine.json"])
    assert opts.baselines == ("verl-7b", str(tmp_path / "mine.json"))
    assert [r.name for r in opts.baseline_records] == ["verl-7b", "mine"]
    (tmp_path / "broken.json").write_text("{}")
    with pytest.raises(OptionError, match=r"--rl-baseline .*broken.json: not a usable run record"):
        parse(tmp_path, rl_baseline=["broken.json"])


def test_a_model_directory_becomes_an_absolute_path(tmp_path: Path) -> None:
    model_dir_stub(tmp_path / "mymodel")
    assert parse(tmp_path, rl_model="mymodel").model == str(tmp_path / "mymodel")


def model_dir_stub(path: Path, config: bool = True, weights: bool = True) -> Path:
    """A model directory with (or without) the files the option check looks for; none is loaded."""
    path.mkdir()
    if config:
        (path / "config.json").write_text("{}")
    if weights:
        (path / "model.safetensors").write_bytes(b"")
    return path


@pytest.mark.parametrize(
    ("config", "weights", "expected"),
    [
        (False, False, ["--rl-model='mymodel'", "has no config.json", "found nothing"]),
        (False, True, ["has no config.json", "found model.safetensors"]),
        (True, False, ["has a config.json but no weights", "model.safetensors", "found config.json"]),
    ],
)
def test_a_model_directory_without_its_files_is_an_option_error(
    tmp_path: Path, config: bool, weights: bool, expected: list[str]
) -> None:
    """Found while the options are parsed (files only, no transformers), not after collection."""
    model_dir_stub(tmp_path / "mymodel", config, weights)
    with pytest.raises(OptionError) as caught:
        parse(tmp_path, rl_model="mymodel")
    for text in expected:
        assert text in str(caught.value), str(caught.value)


@pytest.mark.parametrize(
    ("values", "expected"),
    [
        ({"rl_nodes": "0"}, ["--rl-nodes", ">= 1", "got 0"]),
        ({"rl_nodes": "two"}, ["--rl-nodes", "whole number", "'two'"]),
        ({"rl_tolerance": "1"}, ["--rl-tolerance", "0 <= t < 1"]),
        ({"rl_rollout": "sglang"}, ["--rl-rollout=sglang", "not supported yet", "hf, static, fast, vllm"]),
        (
            {"rl_config": ["data.train_batch=4"]},
            ["--rl-config", "unknown config key", "data.train_batch_size"],
        ),
        (
            {"rl_nodes": "2", "rl_config": ["trainer.nnodes=3"]},
            ["--rl-nodes=2", "--rl-config trainer.nnodes=3", "one key given twice"],
        ),
        ({"rl_config": ["data.train_files=[a.parquet,b.parquet]"]}, ["expected one training file, got 2"]),
        ({"rl_ray_address": "auto"}, ["--rl-ray-address='auto' is refused", "host:port"]),
    ],
)
def test_bad_values_name_the_option_and_what_is_valid(
    tmp_path: Path, values: dict, expected: list[str]
) -> None:
    with pytest.raises(OptionError) as info:
        parse(tmp_path, **values)
    for text in expected:
        assert text in str(info.value)


# ----------------------------------------------------------------------------- through pytest
TEST_OPTIONS = """
def test_options(rl_options, rl_config):
    import json, pathlib
    pathlib.Path("seen.json").write_text(json.dumps(rl_options.to_dict()))
    assert rl_config.trainer.nnodes == rl_options.nodes
"""


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (["--rl-nodes=0"], ["--rl-nodes", ">= 1"]),
        (["--rl-nodes=-2"], ["--rl-nodes", ">= 1", "-2"]),
        (["--rl-nodes=1.5"], ["--rl-nodes", "whole number", "'1.5'"]),
        (["--rl-gpus-per-node=2"], ["--rl-gpus-per-node=2 needs --gpu", "trainer.n_gpus_per_node"]),
        (["--gpu", "--rl-gpus-per-node=0"], ["--rl-gpus-per-node", ">= 1"]),
        (["--rl-tolerance=1.5"], ["--rl-tolerance", "0 <= t < 1", "'1.5'"]),
        (["--rl-tolerance=-0.1"], ["--rl-tolerance", "0 <= t < 1"]),
        (["--rl-tolerance=ten"], ["--rl-tolerance", "0 <= t < 1", "'ten'"]),
        (["--rl-rollout=sglang"], ["--rl-rollout=sglang", "not supported yet", "supported: hf, static"]),
        (["--rl-rollout=foo"], ["--rl-rollout='foo'", "choose one of: hf, static"]),
        (["--rl-config=data.train_batch_size"], ["--rl-config", "malformed override", "KEY=VALUE"]),
        (
            ["--rl-config=data.train_batch=4"],
            ["--rl-config", "unknown config key 'data.train_batch'", "data.train_batch_size"],
        ),
        (
            ["--rl-config=data.train_batch_size=many"],
            ["--rl-config", "data.train_batch_size expects an integer"],
        ),
        (
            ["--rl-config=actor_rollout_ref.actor.ppo_mini_batch_size=16"],
            [
                "the batch sizes do not fit",
                "ppo_mini_batch_size (16) must not exceed data.train_batch_size (8)",
                "values that work together: actor_rollout_ref.actor.ppo_mini_batch_size=8",
            ],
        ),
        (["--rl-model=tinyy"], ["--rl-model='tinyy'", "did you mean tiny", *PRESETS]),
        (["--rl-dataset=nowhere/train.parquet"], ["--rl-dataset", "nowhere/train.parquet", "does not exist"]),
        (["--rl-ray-address=auto"], ["--rl-ray-address", "refused"]),
        (
            ["--rl-baseline=nowhere/base.json"],
            ["--rl-baseline", "nowhere/base.json", "no such file", "verl-7b"],
        ),
        (["--rl-report=."], ["--rl-report", "expects a file", "directory"]),
    ],
)
def test_every_bad_option_value_is_a_usage_error(
    pytester: pytest.Pytester, args: list[str], expected: list[str]
) -> None:
    pytester.makepyfile(TEST_OPTIONS)
    result = pytester.runpytest(*args)
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    err = result.stderr.str()
    assert "ERROR: pytest-rlbench:" in err
    for text in expected:
        assert text in err, f"{text!r} not in {err!r}"
    assert not (pytester.path / "seen.json").exists()


def test_more_checkpointed_layers_than_the_model_has_stop_the_session_before_any_worker(
    pytester: pytest.Pytester,
) -> None:
    """The model's depth is read from its config when the session prepares the model, before Ray
    starts or a worker builds the model (where the same check would fail in the worker's set-up)."""
    pytester.makepyfile("import pathlib\n\ndef test_model(rl_model):\n    pathlib.Path('ran').touch()\n")
    result = pytester.runpytest(
        "--rl-config=actor_rollout_ref.model.enable_gradient_checkpointing=True",
        "--rl-config=actor_rollout_ref.model.gradient_checkpointing_layers=5",
    )
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    out = result.stdout.str() + result.stderr.str()
    assert (
        "pytest-rlbench: --rl-config: actor_rollout_ref.model.gradient_checkpointing_layers=5: the model "
        "(qwen2) has 2 decoder layers; expected 1 to 2" in out
    ), out
    assert not (
        pytester.path / "ran"
    ).exists()  # stopped at collection's end, before the test (and its workers)


def test_ini_values_apply_and_the_command_line_wins(pytester: pytest.Pytester) -> None:
    import json

    pytester.makeini(
        """
        [pytest]
        rl_nodes = 1
        rl_tolerance = 0.2
        rl_rollout = static
        rl_config =
            actor_rollout_ref.rollout.n=2
            actor_rollout_ref.rollout.temperature=0.5
        """
    )
    pytester.makepyfile(TEST_OPTIONS)
    result = pytester.runpytest("--rl-tolerance=0.3", "--rl-config=actor_rollout_ref.rollout.n=8")
    result.assert_outcomes(passed=1)
    seen = json.loads((pytester.path / "seen.json").read_text())
    assert seen["tolerance"] == 0.3 and seen["rollout"] == "static" and seen["nodes"] == 1
    # ini overrides first, then the command line's: the later one wins per key
    assert seen["config_overrides"] == [
        "actor_rollout_ref.rollout.n=2",
        "actor_rollout_ref.rollout.temperature=0.5",
        "actor_rollout_ref.rollout.n=8",
    ]


@pytest.mark.parametrize(
    ("args", "tolerance"), [([], "0.15"), (["--rl-tolerance=0.35"], "0.35"), (["--gpu"], "0.1")]
)
def test_the_session_header_names_the_tolerance_the_verdicts_apply(
    pytester: pytest.Pytester, args: list[str], tolerance: str
) -> None:
    pytester.makepyfile(TEST_OPTIONS)
    result = pytester.runpytest("--collect-only", *args)
    header = [line for line in result.stdout.lines if line.startswith("rlbench: model ")]
    assert len(header) == 1 and header[0].endswith(f", tolerance {tolerance}"), result.stdout.str()


def test_a_bad_ini_value_names_the_ini_setting(pytester: pytest.Pytester) -> None:
    pytester.makeini("[pytest]\nrl_nodes = 0\n")
    pytester.makepyfile(TEST_OPTIONS)
    result = pytester.runpytest()
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    assert "rl_nodes (ini) expects a whole number of Ray nodes >= 1, got 0" in result.stderr.str()


def test_help_lists_every_option_in_the_rlbench_group(pytester: pytest.Pytester) -> None:
    result = pytester.runpytest("--help")
    assert result.ret == pytest.ExitCode.OK
    out = result.stdout.str()
    group = out[out.index("RL post-training benchmarks (pytest-rlbench):") :]
    group = group[: group.index("\n\n")]
    for spec in OPTIONS:
        assert spec.flag in group, f"{spec.flag} missing from --help"
    joined = " ".join(group.split())  # help text wraps
    for name in PRESETS:
        assert name in joined
    # Engines are not listed (reading the registry imports torch); the help says where they come from.
    assert "Rollout engine registered in trainer.rollout" in joined
    for spec in OPTIONS:  # and the ini twins in the ini section
        assert f"{spec.dest} (" in out or f"  {spec.dest}" in out


def test_a_pytest_run_that_uses_no_rl_option_imports_neither_torch_nor_matplotlib(pytester):
    """The plugin loads with every pytest run in its environment: without --rl-* values it must not
    pay for torch (reading the registries), transformers, Ray or matplotlib (the chart)."""
    pytester.makepyfile(
        """
        import sys

        def test_heavy_modules_not_loaded():
            loaded = [m for m in ("torch", "transformers", "ray", "matplotlib") if m in sys.modules]
            assert not loaded, loaded
        """
    )
    pytester.runpytest_subprocess("-p", "no:cacheprovider").assert_outcomes(passed=1)
