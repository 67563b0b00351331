"""One config path: the dedicated options are overrides ahead of --rl-config's, the session's
defaults come before both, and the trainer config is built once from that list."""

from __future__ import annotations

from pathlib import Path

import pytest

import pytest_rlbench.options.trainer_config as config_path
from pytest_rlbench.options.parse import parse_options
from pytest_rlbench.options.parsed import RLBenchOptions
from pytest_rlbench.options.trainer_config import SESSION_DEFAULT, build_trainer_config
from pytest_rlbench.options.values import OptionError, RawValue
from pytest_rlbench.records.workload import SYNTHETIC_FILE
from trainer.config import Override
from trainer.data.synthetic import write_synthetic_parquet

pytestmark = pytest.mark.usefixtures("plugin_deps_loaded")  # see tests/conftest.py


def parse(tmp: Path, **values: object) -> RLBenchOptions:
    raw = {
        dest: RawValue(value, "--gpu" if dest == "rl_gpu" else "--" + dest.replace("_", "-"), tmp)
        for dest, value in values.items()
    }
    return parse_options(raw, {}, cwd=tmp)


def test_options_are_overrides_ahead_of_rl_config_with_their_sources(tmp_path: Path) -> None:
    opts = parse(tmp_path, rl_nodes="2", rl_rollout="static", rl_config=["actor_rollout_ref.rollout.n=2"])
    assert opts.overrides == (
        Override("trainer.nnodes", 2, "--rl-nodes"),
        Override("actor_rollout_ref.rollout.name", "static", "--rl-rollout"),
        Override("actor_rollout_ref.rollout.n", 2, "--rl-config actor_rollout_ref.rollout.n=2"),
    )


def model_dir_stub(path: Path) -> Path:
    """A directory with what the option check looks for (a config.json and a weights file): files
    only, which no test here loads."""
    path.mkdir()
    (path / "config.json").write_text("{}")
    (path / "model.safetensors").write_bytes(b"")
    return path


def test_an_owned_key_in_rl_config_alone_is_checked_as_its_option(tmp_path: Path) -> None:
    model_dir_stub(tmp_path / "mymodel")
    opts = parse(tmp_path, rl_config=["actor_rollout_ref.model.path=mymodel", "trainer.device=cuda"])
    # the relative directory is made absolute, as --rl-model would
    assert opts.model == str(tmp_path / "mymodel") and opts.gpu
    cfg = build_trainer_config(opts)
    assert cfg.actor_rollout_ref.model.path == str(tmp_path / "mymodel")
    assert cfg.trainer.device == "cuda" and cfg.trainer.n_gpus_per_node == 1  # 1 stands in until start


@pytest.mark.parametrize(
    ("values", "both"),
    [
        (
            {"rl_nodes": "2", "rl_config": ["trainer.nnodes=2"]},
            ["--rl-nodes=2", "--rl-config trainer.nnodes=2"],
        ),
        (
            {"rl_gpu": True, "rl_config": ["trainer.device=cuda"]},
            ["--gpu and", "--rl-config trainer.device=cuda"],
        ),
        (
            {"rl_gpu": True, "rl_gpus_per_node": "2", "rl_config": ["trainer.n_gpus_per_node=2"]},
            ["--rl-gpus-per-node=2", "--rl-config trainer.n_gpus_per_node=2"],
        ),
        (
            {"rl_model": "tiny", "rl_config": ["actor_rollout_ref.model.path=tiny"]},
            ["--rl-model=tiny", "--rl-config actor_rollout_ref.model.path=tiny"],
        ),
        (
            {"rl_rollout": "hf", "rl_config": ["actor_rollout_ref.rollout.name=hf"]},
            ["--rl-rollout=hf", "--rl-config actor_rollout_ref.rollout.name=hf"],
        ),
        (
            {"rl_dataset": "d.parquet", "rl_config": ["data.train_files=[d.parquet]"]},
            ["--rl-dataset=d.parquet", "--rl-config data.train_files=[d.parquet]"],
        ),
    ],
)
def test_a_key_given_by_its_option_and_in_rl_config_is_refused_even_when_equal(
    tmp_path: Path, values: dict, both: list[str]
) -> None:
    write_synthetic_parquet(tmp_path / "d.parquet", 8, seed=0)
    with pytest.raises(OptionError, match="one key given twice") as info:
        parse(tmp_path, **values)
    for place in both:
        assert place in str(info.value)


def test_a_key_twice_inside_rl_config_keeps_the_later(tmp_path: Path) -> None:
    opts = parse(tmp_path, rl_config=["trainer.nnodes=3", "trainer.nnodes=2"])
    assert opts.nodes == 2 and build_trainer_config(opts).trainer.nnodes == 2
    assert opts.source_of("rl_nodes") == "--rl-config trainer.nnodes=2"


def test_cpu_workers_per_node_stay_the_user_s_rl_config_key(tmp_path: Path) -> None:
    opts = parse(tmp_path, rl_config=["trainer.n_gpus_per_node=2"])
    assert opts.gpus_per_node is None
    assert build_trainer_config(opts).trainer.n_gpus_per_node == 2


def test_session_defaults_come_first_and_the_user_s_value_wins(tmp_path: Path) -> None:
    work = tmp_path / "work"
    cfg = build_trainer_config(parse(tmp_path), workdir=work)
    assert cfg.data.train_files == [str(work / SYNTHETIC_FILE)]  # no --rl-dataset: the synthetic file
    assert cfg.trainer.default_local_dir == str(work / "checkpoints")
    mine = parse(tmp_path, rl_config=[f"trainer.default_local_dir={tmp_path / 'mine'}"])
    assert build_trainer_config(mine, workdir=work).trainer.default_local_dir == str(tmp_path / "mine")
    data = write_synthetic_parquet(tmp_path / "d.parquet", 8, seed=0)
    given = parse(tmp_path, rl_dataset="d.parquet")
    assert build_trainer_config(given, workdir=work).data.train_files == [str(data)]
    gpu = parse(tmp_path, rl_gpu=True)
    assert config_path.session_defaults(gpu, gpus_per_node=8) == [
        Override("trainer.n_gpus_per_node", 8, SESSION_DEFAULT)
    ]
    assert build_trainer_config(gpu, gpus_per_node=8).trainer.n_gpus_per_node == 8


def test_an_empty_train_files_in_rl_config_means_the_synthetic_set(tmp_path: Path) -> None:
    opts = parse(tmp_path, rl_config=["data.train_files=[]"])
    assert opts.dataset is None
    assert build_trainer_config(opts, workdir=tmp_path).data.train_files == [str(tmp_path / SYNTHETIC_FILE)]


# ----------------------------------------------------------------------------- through pytest
def test_the_session_builds_its_config_once_with_its_defaults(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    builds = []
    original = config_path.build_config

    def counting(overrides, **kwargs):
        builds.append(list(overrides))
        return original(overrides, **kwargs)

    monkeypatch.setattr(config_path, "build_config", counting)
    pytester.makepyfile(
        """
        def test_config(rl_config, rl_dataset, tmp_path_factory):
            base = tmp_path_factory.getbasetemp()
            assert rl_dataset.synthetic and rl_dataset.path.is_file()
            assert rl_config.data.train_files == [str(rl_dataset.path)]
            assert rl_dataset.path.name == "synthetic_math.parquet" and rl_dataset.path.is_relative_to(base)
            assert rl_config.trainer.default_local_dir == str(rl_dataset.path.parent / "checkpoints")
        """
    )
    pytester.runpytest("--rl-config=data.synthetic_size=32").assert_outcomes(passed=1)
    # one build, at configure, with the session's defaults first
    assert len(builds) == 1
    assert [o.source for o in builds[0][:2]] == [SESSION_DEFAULT, SESSION_DEFAULT]


def test_the_user_s_checkpoint_dir_wins_in_the_session(pytester: pytest.Pytester, tmp_path: Path) -> None:
    pytester.makepyfile(
        f"""
        def test_config(rl_config):
            assert rl_config.trainer.default_local_dir == {str(tmp_path / "ckpt")!r}
        """
    )
    pytester.runpytest(f"--rl-config=trainer.default_local_dir={tmp_path / 'ckpt'}").assert_outcomes(passed=1)


def test_an_option_and_its_key_in_rl_config_is_a_usage_error(pytester: pytest.Pytester) -> None:
    pytester.makeini("[pytest]\nrl_nodes = 1\n")
    pytester.makepyfile("def test_x(rl_options):\n    pass\n")
    result = pytester.runpytest("--rl-config=trainer.nnodes=1")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    err = result.stderr.str()
    assert "rl_nodes (ini)=1 and --rl-config trainer.nnodes=1" in err and "one key given twice" in err


def test_the_session_pads_its_synthetic_prompts_to_the_asked_length(pytester: pytest.Pytester) -> None:
    # data.synthetic_prompt_length used to be ignored by the plugin's own synthetic file.
    pytester.makepyfile(
        """
        def test_prompts(rl_dataset):
            lengths = {len(p.input_ids) for p in rl_dataset.prompts.prompts}
            assert lengths == {160}, sorted(lengths)
        """
    )
    pytester.runpytest(
        "--rl-config=data.synthetic_size=16",
        "--rl-config=data.synthetic_prompt_length=160",
        "--rl-config=data.max_prompt_length=200",
    ).assert_outcomes(passed=1)
