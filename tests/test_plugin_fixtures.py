"""Markers, and the rl_model / rl_dataset / rl_config fixtures with their start-up checks.

None of these runs starts Ray (no test here uses rl_cluster), so they run in-process.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from trainer.data.synthetic import write_synthetic_parquet
from trainer.models.presets import save_preset
from trainer.phases import PHASE_KEYS

pytestmark = pytest.mark.usefixtures("plugin_deps_loaded")  # see tests/conftest.py

# A test that records that its body ran: the start-up checks must stop a session before it.
RECORDS_RUN = """
import pathlib
def test_uses_{fixture}({fixture}):
    pathlib.Path("ran").write_text("yes")
"""


def assert_ended_before_tests(result: pytest.RunResult, pytester: pytest.Pytester, *expected: str) -> None:
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    err = result.stderr.str()  # one "ERROR: pytest-rlbench: ..." line, as a bad option gives
    assert "ERROR: pytest-rlbench: " in err, err
    for text in expected:
        assert text in err, f"{text!r} not in the error:\n{err}"
    assert not (pytester.path / "ran").exists(), "a test body ran although the start-up check failed"


# ----------------------------------------------------------------------------- markers
def test_rl_phase_with_a_phase_key_passes_strict_markers(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(
        """
        import pytest

        pytestmark = pytest.mark.rl_phase("step")

        @pytest.mark.rl_phase("gen")
        def test_gen(request):
            from pytest_rlbench.markers import phase_of
            assert phase_of(request.node) == "gen"

        class TestUpdate:
            @pytest.mark.rl_phase("update_actor")
            @pytest.mark.parametrize("n", [1, 2])
            def test_update(self, n):
                pass

        @pytest.mark.rl_gpu
        def test_needs_gpu():
            raise AssertionError("must be skipped without --gpu")
        """
    )
    result = pytester.runpytest("--strict-markers", "-rs")
    result.assert_outcomes(passed=3, skipped=1)
    result.stdout.fnmatch_lines(["*needs GPUs: run with --gpu*"])


@pytest.mark.parametrize(
    ("mark", "expected"),
    [
        ('rl_phase("nope")', "@pytest.mark.rl_phase('nope') is not a phase key"),
        ("rl_phase()", "@pytest.mark.rl_phase takes one phase key, got ()"),
        ('rl_phase("gen", "ref")', "@pytest.mark.rl_phase takes one phase key, got ('gen', 'ref')"),
        ("usefixtures('rl_bench')", "uses rl_bench but has no @pytest.mark.rl_phase(KEY)"),
    ],
)
def test_a_bad_rl_phase_is_a_collection_error_naming_test_name_and_keys(
    pytester: pytest.Pytester, mark: str, expected: str
) -> None:
    # (the last case: a benchmark with no phase key used to fail only when it ran, test by test)
    pytester.makepyfile(
        test_phases=f"""
        import pytest

        @pytest.mark.{mark}
        def test_timed():
            pass

        def test_fine():
            pass
        """
    )
    result = pytester.runpytest("--strict-markers")
    assert result.ret == pytest.ExitCode.INTERRUPTED  # "errors during collection"
    result.assert_outcomes(errors=1)
    out = result.stdout.str()
    assert "ERROR collecting test_phases.py" in out
    assert f"test_phases.py::test_timed: {expected}" in out
    assert f"valid keys: {', '.join(PHASE_KEYS)}" in out


def test_markers_are_registered(pytester: pytest.Pytester) -> None:
    result = pytester.runpytest("--markers")
    result.stdout.fnmatch_lines(
        ["@pytest.mark.rl_phase(name): *generate_sequences*", "@pytest.mark.rl_gpu: *--gpu*"]
    )


# ----------------------------------------------------------------------------- rl_model
def test_an_empty_model_directory_ends_the_session_naming_it(pytester: pytest.Pytester) -> None:
    empty = pytester.mkdir("empty_model")
    pytester.makepyfile(RECORDS_RUN.format(fixture="rl_model"))
    result = pytester.runpytest(f"--rl-model={empty}")
    assert_ended_before_tests(result, pytester, "--rl-model", str(empty), "no config.json")


def test_a_broken_config_json_ends_the_session_naming_it(pytester: pytest.Pytester) -> None:
    broken = pytester.mkdir("broken_model")
    (broken / "model.safetensors").write_bytes(b"")  # the files the option check looks for are there
    (broken / "config.json").write_text('{"model_type": "qwen2", "hidden_size": ')
    pytester.makepyfile(RECORDS_RUN.format(fixture="rl_model"))
    result = pytester.runpytest(f"--rl-model={broken}")
    assert_ended_before_tests(
        result, pytester, "--rl-model", str(broken / "config.json"), "not readable JSON"
    )

    (broken / "config.json").write_text(json.dumps({"model_type": "no-such-architecture"}))
    result = pytester.runpytest(f"--rl-model={broken}")
    assert_ended_before_tests(result, pytester, str(broken), "could not be read by transformers")


@pytest.fixture(scope="module")
def saved_tiny(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny preset saved as a model directory (seed 7). Module scope on purpose: what building
    it imports must be in place before pytester snapshots sys.modules, or the snapshot's restore
    removes torch modules that refuse to be imported twice."""
    return save_preset("tiny", tmp_path_factory.mktemp("models") / "tiny", seed=7)


def test_a_model_directory_without_weights_ends_the_session(
    pytester: pytest.Pytester, saved_tiny: Path, tmp_path: Path
) -> None:
    model_dir = Path(shutil.copytree(saved_tiny, tmp_path / "tiny"))
    (model_dir / "model.safetensors").unlink()
    pytester.makepyfile(RECORDS_RUN.format(fixture="rl_model"))
    result = pytester.runpytest(f"--rl-model={model_dir}")
    assert_ended_before_tests(result, pytester, str(model_dir), "no weights", "model.safetensors")


def test_a_saved_preset_directory_loads_through_from_pretrained(
    pytester: pytest.Pytester, saved_tiny: Path
) -> None:
    model_dir = saved_tiny
    pytester.makepyfile(
        f"""
        import torch
        from trainer.models.flops import flops_per_token
        from trainer.models.presets import build_model

        def test_model(rl_model, rl_config):
            assert rl_model.name_or_path == {str(model_dir)!r} and not rl_model.is_preset
            assert rl_model.spec.source == {str(model_dir)!r}
            assert rl_config.actor_rollout_ref.model.path == {str(model_dir)!r}
            model = rl_model.build()
            assert type(model).__name__ == "Qwen2ForCausalLM"
            assert sum(p.numel() for p in model.parameters()) == rl_model.parameter_count
            # the saved weights, not a fresh random init: equal to the preset built with the same seed
            reference = build_model("tiny", seed=7)
            for (name, a), (_, b) in zip(model.state_dict().items(), reference.state_dict().items()):
                assert torch.equal(a, b), name
            assert rl_model.flops_per_token(128) == flops_per_token(rl_model.spec.arch, 128)
            assert rl_model.flops_per_token(train=False) == 2 * rl_model.flops_params
            ids = rl_model.tokenizer("12+3")["input_ids"]
            assert rl_model.tokenizer.decode(ids) == "12+3"
        """
    )
    # In a subprocess: from_pretrained imports torch modules that must not be imported twice.
    result = pytester.runpytest_subprocess(f"--rl-model={model_dir}", timeout=120)
    result.assert_outcomes(passed=1)


# ----------------------------------------------------------------------------- rl_dataset, rl_config
def test_the_default_data_set_is_synthetic_and_loaded_with_the_config(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(
        """
        def test_data(rl_dataset, rl_config, rl_model, tmp_path_factory):
            assert rl_dataset.synthetic
            assert rl_dataset.path.is_file()
            assert rl_dataset.path.is_relative_to(tmp_path_factory.getbasetemp())
            assert rl_config.data.train_files == [str(rl_dataset.path)]
            assert len(rl_dataset) == rl_config.data.synthetic_size == 64
            assert rl_model.name_or_path == "tiny"
            first = rl_dataset.prompts[0]
            assert first.data_source == "rlbench/synthetic_math" and first.ground_truth.isdigit()
            assert len(first.input_ids) <= rl_config.data.max_prompt_length
            text = rl_model.tokenizer.decode(first.input_ids)
            assert text.startswith("<|im_start|>user") and text.endswith("<|im_start|>assistant\\n")
        """
    )
    result = pytester.runpytest("--rl-config=data.synthetic_size=64")
    result.assert_outcomes(passed=1)


def test_a_valid_data_set_file_is_used(pytester: pytest.Pytester, tmp_path: Path) -> None:
    data = write_synthetic_parquet(tmp_path / "train.parquet", 24, seed=5, difficulty="tiny")
    pytester.makepyfile(
        f"""
        def test_data(rl_dataset, rl_config):
            assert not rl_dataset.synthetic
            assert str(rl_dataset.path) == {str(data)!r} == rl_config.data.train_files[0]
            assert len(rl_dataset) == 24
        """
    )
    pytester.runpytest(f"--rl-dataset={data}").assert_outcomes(passed=1)


def test_a_malformed_data_set_ends_the_session_naming_file_and_problems(
    pytester: pytest.Pytester, tmp_path: Path
) -> None:
    bad = tmp_path / "bad.parquet"
    table = pa.table(
        {
            "data_source": ["x", "y"],
            "prompt": [[{"role": "user", "content": "1+1?"}], [{"role": "robot", "content": "2+2?"}]],
            "ability": ["math", "math"],
            "extra_info": [{"split": "train", "index": 0, "answer": "2", "question": "q"}] * 2,
        }
    )
    pq.write_table(table, bad)
    pytester.makepyfile(RECORDS_RUN.format(fixture="rl_dataset"))
    result = pytester.runpytest(f"--rl-dataset={bad}")
    assert_ended_before_tests(result, pytester, "--rl-dataset", str(bad), "reward_model", "prompt[0].role")

    not_parquet = tmp_path / "notes.parquet"
    not_parquet.write_text("this is not parquet")
    result = pytester.runpytest(f"--rl-dataset={not_parquet}")
    assert_ended_before_tests(result, pytester, str(not_parquet), "parquet")


def test_prompts_longer_than_the_limit_end_the_session(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(RECORDS_RUN.format(fixture="rl_dataset"))
    result = pytester.runpytest("--rl-config=data.max_prompt_length=8", "--rl-config=data.synthetic_size=16")
    assert_ended_before_tests(result, pytester, "the synthetic data set", "longer than max_prompt_length 8")


def test_plain_tests_build_nothing(pytester: pytest.Pytester) -> None:
    # A broken model would end any session that builds it: these tests do not ask for it.
    pytester.makepyfile("def test_plain(rl_options):\n    assert rl_options.model.endswith('nowhere')\n")
    nowhere = pytester.mkdir("nowhere")  # the files the option check looks for, neither loadable
    (nowhere / "config.json").write_text("{}")
    (nowhere / "model.safetensors").write_bytes(b"")
    result = pytester.runpytest("--rl-model=nowhere")
    result.assert_outcomes(passed=1)


def test_a_batch_larger_than_the_data_set_ends_the_session_naming_both_numbers(
    pytester: pytest.Pytester,
) -> None:
    pytester.makepyfile(RECORDS_RUN.format(fixture="rl_dataset"))
    result = pytester.runpytest("--rl-config=data.synthetic_size=16", "--rl-config=data.train_batch_size=32")
    assert_ended_before_tests(
        result,
        pytester,
        "data.train_batch_size (32) is larger than the synthetic data set",
        "16 row(s)",
        "set data.train_batch_size to at most 16",
    )
