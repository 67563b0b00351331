"""Every --rl-rollout engine of the panel gets its start-up checks before any work, with the session's
own engine's (they used to run inside the panel's test, after the trainer was built)."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.usefixtures("plugin_deps_loaded")  # see tests/conftest.py

RECORDS_RUN = """
import pathlib
def test_uses_rl_config(rl_config):
    pathlib.Path("ran").write_text("yes")
"""


def test_a_panel_engine_that_cannot_run_ends_the_session_at_start_up(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(RECORDS_RUN)
    result = pytester.runpytest_subprocess(
        "--rl-rollout=hf", "--rl-rollout=vllm", "--rl-config=actor_rollout_ref.rollout.tensor_model_parallel_size=2"
    )
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    out = result.stdout.str() + result.stderr.str()
    assert "tensor_model_parallel_size=2 is not supported yet with rollout.name=vllm" in out, out
    assert not (pytester.path / "ran").exists(), "a test body ran although a panel engine's check failed"
