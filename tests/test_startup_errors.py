"""Usage errors end a session as one ``ERROR: pytest-rlbench: ...`` line with exit 4, found as early as
what they depend on is known: a config's names and batch sizes while the options are read (before
collection, torch not imported for a name refused from the table), the data set's size before the
model loads and before any cluster, and a resource a test asks for by name later, still as that one
line (issue 30, items 5 and 6).

Each session runs in a subprocess whose conftest writes down whether collection finished and which
heavy modules were imported, so a test can say at which stage an error was found.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from trainer.data.schema import write_rows

pytestmark = pytest.mark.usefixtures("plugin_deps_loaded")  # see tests/conftest.py

# What the session got to: "collected" once collection finished, "modules" the heavy ones imported.
STAGES = """
import pathlib, sys

def pytest_collection_finish(session):
    pathlib.Path("collected").write_text("yes")

def pytest_unconfigure(config):
    pathlib.Path("modules").write_text(" ".join(m for m in ("torch", "ray") if m in sys.modules))
"""
RECORDS_RUN = """
import pathlib
def test_uses_{fixture}({fixture}):
    pathlib.Path("ran").write_text("yes")
"""


def run(pytester: pytest.Pytester, fixture: str, *args: str) -> tuple[pytest.RunResult, str]:
    pytester.makeconftest(STAGES)
    pytester.makepyfile(RECORDS_RUN.format(fixture=fixture))
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", *args, timeout=300)
    return result, result.stderr.str()


def assert_one_usage_error(result: pytest.RunResult, err: str, *expected: str) -> None:
    """Exit 4; on stderr one ERROR line (a message of several problems continues on indented lines);
    never pytest.exit's banner or a traceback; no test body ran."""
    out = result.stdout.str()
    assert result.ret == pytest.ExitCode.USAGE_ERROR, f"exit {result.ret}\n{out}\n{err}"
    errors = [line for line in err.splitlines() if line.startswith("ERROR")]
    assert len(errors) == 1 and errors[0].startswith("ERROR: pytest-rlbench: "), err
    for text in expected:
        assert text in err, f"{text!r} not in the error:\n{err}"
    for banner in ("_pytest.outcomes.Exit", "Traceback", "!!!!"):
        assert banner not in out + err, f"{banner!r} in the output:\n{out}\n{err}"


def stage(pytester: pytest.Pytester) -> tuple[bool, set[str], bool]:
    """(collection finished, heavy modules imported, a test body ran)."""
    collected = (pytester.path / "collected").exists()
    modules = set((pytester.path / "modules").read_text().split())
    return collected, modules, (pytester.path / "ran").exists()


def small_set(path: Path, rows: int) -> Path:
    """A gsm8k-shaped file of ``rows`` short prompts."""
    return write_rows(
        [
            {
                "data_source": "openai/gsm8k",
                "prompt": [{"role": "user", "content": f"What is {i} + {i}?"}],
                "ability": "math",
                "reward_model": {"style": "rule", "ground_truth": str(2 * i)},
                "extra_info": {"split": "train", "index": i, "answer": str(2 * i), "question": f"{i} + {i}"},
            }
            for i in range(rows)
        ],
        path,
    )


# ----------------------------------------------------------------------------- names (item 6)
def test_an_estimator_known_but_unsupported_is_refused_before_collection_without_torch(
    pytester: pytest.Pytester,
) -> None:
    result, err = run(pytester, "rl_trainer", "--rl-config", "algorithm.adv_estimator=gae")
    assert_one_usage_error(
        result, err, "algorithm.adv_estimator=gae is not supported yet", "GAE needs a critic"
    )
    assert stage(pytester) == (False, set(), False)  # at configure, from the table alone


def test_an_unknown_estimator_is_refused_before_collection_naming_the_valid_ones(
    pytester: pytest.Pytester,
) -> None:
    result, err = run(pytester, "rl_trainer", "--rl-config", "algorithm.adv_estimator=grpoo")
    assert_one_usage_error(result, err, "algorithm.adv_estimator='grpoo' is not valid", "grpo, rloo")
    collected, modules, ran = stage(pytester)
    assert (collected, "ray" in modules, ran) == (False, False, False)


def test_a_model_directory_without_a_config_is_refused_before_collection_without_torch(
    pytester: pytest.Pytester,
) -> None:
    empty = pytester.mkdir("empty_model")
    result, err = run(pytester, "rl_trainer", f"--rl-model={empty}")
    assert_one_usage_error(result, err, str(empty), "has no config.json")
    assert stage(pytester) == (False, set(), False)


@pytest.mark.skipif(importlib.util.find_spec("vllm") is not None, reason="vLLM is installed here")
def test_an_engine_that_is_not_installed_is_refused_before_collection(pytester: pytest.Pytester) -> None:
    result, err = run(pytester, "rl_trainer", "--rl-rollout", "vllm")
    assert_one_usage_error(result, err, "rollout.name=vllm needs vLLM, which is not installed")
    collected, modules, ran = stage(pytester)
    assert (collected, "ray" in modules, ran) == (False, False, False)


def test_a_resource_a_test_asks_for_by_name_fails_as_one_line(pytester: pytest.Pytester) -> None:
    """rl_model asked for inside the test (getfixturevalue), so the start-up check could not build it:
    its failure is still the one ERROR line and exit 4, not pytest.exit's banner."""
    model = pytester.mkdir("model")
    (model / "config.json").write_text('{"model_type": "no-such-architecture"}')
    (model / "model.safetensors").write_bytes(b"")
    pytester.makeconftest(STAGES)
    pytester.makepyfile(
        """
        import pathlib
        def test_asks_late(request):
            request.getfixturevalue("rl_model")
            pathlib.Path("ran").write_text("yes")
        """
    )
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", f"--rl-model={model}", timeout=300)
    assert_one_usage_error(result, result.stderr.str(), str(model), "could not be read by transformers")
    assert "ray" not in stage(pytester)[1]


# ----------------------------------------------------------------------------- sizes (item 5)
def test_every_batch_size_problem_is_listed_at_once_with_values_that_fit(
    pytester: pytest.Pytester, tmp_path: Path
) -> None:
    """Three problems in one config and a 3-row set: all named in one error before collection, each
    with what fixes it, and one pair of values that fixes them all."""
    data = small_set(tmp_path / "three.parquet", 3)
    sizes = ["data.train_batch_size=16", "actor_rollout_ref.actor.ppo_mini_batch_size=5"]
    sizes += ["actor_rollout_ref.rollout.n=3", "trainer.n_gpus_per_node=2"]
    args = [f"--rl-config={value}" for value in sizes]
    result, err = run(pytester, "rl_trainer", f"--rl-dataset={data}", *args)
    assert_one_usage_error(
        result,
        err,
        "data.train_batch_size (16) is larger than --rl-dataset",
        "which has 3 row(s)",
        "set data.train_batch_size to at most 3",
        "data.train_batch_size (16) must be a multiple of actor_rollout_ref.actor.ppo_mini_batch_size (5)",
        "5 x 3 = 15 responses must split evenly over 2 workers",
        "must be a multiple of 2",
        "values that work together: data.train_batch_size=2 actor_rollout_ref.actor.ppo_mini_batch_size=2",
    )
    assert stage(pytester)[0] is False  # found while the options were read


def test_a_data_set_smaller_than_the_batch_is_found_before_the_model_loads_or_ray_starts(
    pytester: pytest.Pytester, tmp_path: Path
) -> None:
    """The config's sizes fit together; only the data set is too small: found once the tests show
    they train on it, from the file's row count, before the model, the tokenizer or Ray."""
    data = small_set(tmp_path / "three.parquet", 3)
    sizes = ["data.train_batch_size=16", "actor_rollout_ref.actor.ppo_mini_batch_size=8"]
    args = [f"--rl-config={value}" for value in sizes]
    result, err = run(pytester, "rl_trainer", f"--rl-dataset={data}", *args)
    assert_one_usage_error(
        result,
        err,
        "set data.train_batch_size to at most 3",
        "values that work together: data.train_batch_size=3 actor_rollout_ref.actor.ppo_mini_batch_size=3",
    )
    collected, modules, ran = stage(pytester)
    assert (collected, "ray" in modules, ran) == (True, False, False)


def test_plain_tests_run_whatever_the_data_set_size(pytester: pytest.Pytester, tmp_path: Path) -> None:
    """The data set's size matters only to tests that train on it."""
    data = small_set(tmp_path / "three.parquet", 3)
    result, _ = run(pytester, "rl_options", f"--rl-dataset={data}", "--rl-config=data.train_batch_size=16")
    result.assert_outcomes(passed=1)


SCHEMA_SUITE = Path(__file__).resolve().parents[1] / "suites" / "test_schema.py"


def test_the_schema_suite_needs_no_full_batch(pytester: pytest.Pytester, tmp_path: Path) -> None:
    """suites/test_schema.py on a 3-row set: the schema checks pass, and the batch sizes a run would
    refuse are one warning with the values that fit."""
    data = small_set(tmp_path / "three.parquet", 3)
    pytester.copy_example(str(SCHEMA_SUITE))
    result = pytester.runpytest_subprocess(
        "-p",
        "no:cacheprovider",
        "test_schema.py",
        "-k",
        "has_what_the_trainer_reads or limits",
        f"--rl-dataset={data}",
        "--rl-config=data.train_batch_size=16",
        "--rl-config=actor_rollout_ref.actor.ppo_mini_batch_size=8",
        timeout=300,
    )
    result.assert_outcomes(passed=2)  # pytest's own warnings vary with what was imported: not counted
    out = result.stdout.str()
    assert "BatchSizeWarning" in out and "set data.train_batch_size to at most 3" in out, out


def test_a_trainer_from_a_hook_that_lacks_members_ends_the_session_as_one_line(
    pytester: pytest.Pytester,
) -> None:
    """Found only once the cluster is up and the hook has built its trainer: still the one ERROR line."""
    pytester.makeconftest(
        STAGES
        + """
class Partial:
    def shutdown(self):
        pass

def pytest_rlbench_make_trainer(config, rl_config, cluster, rl_framework):
    return Partial()
"""
    )
    pytester.makepyfile(RECORDS_RUN.format(fixture="rl_trainer"))
    result = pytester.runpytest_subprocess(
        "-p",
        "no:cacheprovider",
        "--rl-config=data.synthetic_size=16",
        "--rl-config=data.train_batch_size=8",
        timeout=300,
    )
    assert_one_usage_error(result, result.stderr.str(), "(Partial, from pytest_rlbench_make_trainer) lacks")
    assert stage(pytester)[2] is False


# ----------------------------------------------------------------------------- a replay with --gpu alone
def test_a_replay_with_gpu_alone_waits_for_the_cluster_s_gpu_count(pytester: pytest.Pytester) -> None:
    # verl-7b's 32 sequences per GPU are 2 prompts on one GPU, which do not split into its 4 PPO
    # mini-batches: with --gpu alone one GPU must not stand in for the count the cluster gives later
    result = pytester.runpytest_subprocess(
        "-p", "no:cacheprovider", "--gpu", "--rl-workload", "verl-7b", "--collect-only", timeout=300
    )
    assert result.ret == pytest.ExitCode.NO_TESTS_COLLECTED, result.stderr.str()
    # a count the work does not divide over, given, is still refused at once, naming the division
    result, err = run(pytester, "rl_trainer", "--gpu", "--rl-gpus-per-node", "1", "--rl-workload", "verl-7b")
    assert_one_usage_error(result, err, "--rl-workload: cannot replay per GPU", "is not a multiple of 4")
    collected, modules, ran = stage(pytester)
    assert (collected, "ray" in modules, ran) == (False, False, False)  # at configure


def test_a_decode_group_with_gpu_alone_waits_for_the_cluster_s_gpu_count(pytester: pytest.Pytester) -> None:
    # two GPUs decode together (rollout.tensor_model_parallel_size=2): one GPU must not stand in for
    # the count the cluster gives later; one GPU per node, given, is refused at once, naming the key
    tp = "--rl-config=actor_rollout_ref.rollout.tensor_model_parallel_size=2"
    result = pytester.runpytest_subprocess(
        "-p", "no:cacheprovider", "--gpu", "--rl-rollout", "fast", tp, "--collect-only", timeout=300
    )
    assert result.ret == pytest.ExitCode.NO_TESTS_COLLECTED, result.stderr.str()
    result, err = run(pytester, "rl_trainer", "--gpu", "--rl-gpus-per-node", "1", "--rl-rollout", "fast", tp)
    assert_one_usage_error(result, err, "tensor_model_parallel_size=2 must be >= 1 and divide the 1 worker(s)")
