"""The session recorder: provenance worked out once, the step breakdown, and a phase's figures."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from pytest_rlbench.records.record import Hardware, ModelArch, RunConfig, TokenCounts
from pytest_rlbench.session.recorder import BenchRecorder, git_commit

TINY = ModelArch(
    name="tiny", num_layers=1, hidden_size=2, intermediate_size=4, num_heads=1, num_kv_heads=1, head_dim=2, vocab_size=3
)


def git(repo: Path, *args: str) -> None:
    subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@t", *args], cwd=repo, check=True, capture_output=True)


def described(code_dir: Path) -> BenchRecorder:
    recorder = BenchRecorder("run", code_dir)
    recorder.context.hardware = Hardware(device="cpu", nodes=1, world_size=2, gpus_per_node=0, cpu_model="x86")
    recorder.context.model = TINY
    recorder.context.config = RunConfig(train_batch_size=1, rollout_n=2)
    recorder.context.tokens = TokenCounts(prompt_lengths=[2, 2], response_lengths=[1, 3])
    return recorder


def test_provenance_is_worked_out_once_per_session(tmp_path: Path) -> None:
    git(tmp_path, "init", "-q")
    git(tmp_path, "commit", "-q", "--allow-empty", "-m", "first")
    first = git_commit(tmp_path)
    recorder = described(tmp_path)
    recorder.record("gen", [1.0], "t::gen")
    assert recorder.build_record().provenance.commit == first

    git(tmp_path, "commit", "-q", "--allow-empty", "-m", "second")
    assert git_commit(tmp_path) != first  # git sees the new commit ...
    recorder.record("update_actor", [2.0], "t::update_actor")
    record = recorder.build_record()
    assert record.provenance.commit == first  # ... the session asked once, at its first record
    assert record.provenance.notes == ["gen: t::gen", "update_actor: t::update_actor"]
    assert recorder.session_provenance.notes == []  # each record's notes are its own


def test_a_tree_that_differs_from_its_commit_is_named_dirty(tmp_path: Path) -> None:
    git(tmp_path, "init", "-q")
    (tmp_path / "code.py").write_text("x = 1\n")
    git(tmp_path, "add", "code.py")
    git(tmp_path, "commit", "-q", "-m", "first")
    clean = git_commit(tmp_path)
    assert clean is not None and not clean.endswith("-dirty")
    (tmp_path / "code.py").write_text("x = 2\n")  # the code that runs is not the commit's
    assert git_commit(tmp_path) == f"{clean}-dirty"
    (tmp_path / "code.py").write_text("x = 1\n")
    (tmp_path / "new_module.py").write_text("")  # a file git does not hold yet
    assert git_commit(tmp_path) == f"{clean}-dirty"


def test_phase_figures_are_the_phase_time_and_its_derived_figures(tmp_path: Path) -> None:
    recorder = BenchRecorder("run", tmp_path)
    recorder.record("gen", [1.0, 2.0, 4.0], "t::gen")
    assert recorder.phase_figures("gen") == {}  # the run is not described yet

    recorder = described(tmp_path)
    recorder.record("gen", [1.0, 2.0, 4.0], "t::gen")
    recorder.record("old_log_prob", [0.5], "t::old_log_prob")
    figures = recorder.phase_figures("gen")
    # 4 response tokens over 2 ranks at the median 2 s; 2000 ms / 4 tokens.
    assert figures == {
        "timing_s/gen": 2.0,
        "tokens_per_s_per_gpu/gen": pytest.approx(1.0),
        "timing_per_token_ms/gen": pytest.approx(500.0),
    }
    assert recorder.phase_figures("old_log_prob")["tokens_per_s_per_gpu/old_log_prob"] == pytest.approx(8.0)


def test_step_breakdown_rounds_are_kept_as_seconds(tmp_path: Path) -> None:
    recorder = BenchRecorder("run", tmp_path)
    recorder.add_step_breakdown([{"gen": 1, "step": 2.5}])
    recorder.add_step_breakdown([{"gen": 1.5, "step": 3.0}])
    assert recorder.step_breakdown == [{"gen": 1.0, "step": 2.5}, {"gen": 1.5, "step": 3.0}]
    assert all(isinstance(v, float) for r in recorder.step_breakdown for v in r.values())


def test_a_session_of_whole_steps_alone_records_each_phase_of_their_breakdown(tmp_path: Path) -> None:
    # VERL times its phases inside the step: a session that runs only the step (a 7B replay's is one
    # round in 10 minutes) must still record, and so gate, every phase its rounds timed
    recorder = described(tmp_path)
    work = [TokenCounts(prompt_lengths=[2, 2], response_lengths=r) for r in ([1, 3], [5, 3])]
    recorder.record("step", [3.0, 4.0], "t::step", work[-1], round_tokens=work)
    rounds = [
        {"gen": 1.0, "update_actor": 1.5, "step": 2.9, "save_checkpoint": 0.1},
        {"gen": 2.0, "update_actor": 1.5, "step": 3.8, "save_checkpoint": 0.2},
    ]
    recorder.add_step_breakdown(rounds, "t::step", work)
    recorder.record("update_actor", [1.25], "t::update_actor")  # a benchmark of its own wins
    record = recorder.build_record()
    assert set(record.phases) == {"step", "gen", "update_actor", "save_checkpoint"}
    gen = record.phases["gen"]
    assert (gen.seconds, gen.inside_step, gen.round_tokens) == ([1.0, 2.0], True, work)
    assert record.phases["save_checkpoint"].seconds == [0.1, 0.2]  # saved after the step's span (save_freq)
    assert (record.phases["update_actor"].seconds, record.phases["update_actor"].inside_step) == ([1.25], False)
    assert "gen: inside the steps of t::step" in record.provenance.notes
    # the step's rounds also saved, after the step's span: VERL's step excludes the save, so does ours
    assert record.phases["step"].seconds == pytest.approx([2.9, 3.8])
    assert "step: t::step, each round less the save_checkpoint it ran" in record.provenance.notes
    assert recorder.phase_figures("gen")["timing_s/gen"] == pytest.approx(1.5)  # the rounds' median


def test_a_step_breakdown_without_each_rounds_work_records_no_phase(tmp_path: Path) -> None:
    recorder = described(tmp_path)
    recorder.record("step", [3.0], "t::step")
    recorder.add_step_breakdown([{"gen": 1.0, "step": 2.9}])  # no work per round: no throughput to gate
    assert set(recorder.build_record().phases) == {"step"}


def test_a_session_of_metrics_alone_writes_its_report_without_a_chart(tmp_path: Path) -> None:
    # the rollout panel records metrics and times no phase: its figures must still be reported
    recorder = described(tmp_path)
    assert not recorder.measured_anything
    recorder.add_metric("rollout_panel/hf/tokens_per_s", [100.0, 110.0], "tokens/s", True)
    assert recorder.measured_anything
    outcome = recorder.finish([], 0.1, tmp_path / "r.json", None)
    assert outcome.problems == []
    assert (tmp_path / "r.json").exists() and not (tmp_path / "r.png").exists()
    assert "rollout_panel/hf/tokens_per_s" in (tmp_path / "r.json").read_text()


def test_a_session_of_save_checkpoint_alone_says_in_one_line_why_it_has_no_chart(tmp_path: Path) -> None:
    # save_checkpoint runs outside the step the chart breaks down: no bar to draw, and that is no failure
    recorder = described(tmp_path)
    recorder.record("save_checkpoint", [0.08], "t::save_checkpoint")
    outcome = recorder.finish([], 0.1, tmp_path / "r.json", None)
    assert outcome.problems == [] and not outcome.write_failed
    assert outcome.notes == [
        f"no chart {str(tmp_path / 'r.png')!r}: no phase inside the step was timed (timed: save_checkpoint), "
        "and no baseline of this model to draw"
    ]
    assert (tmp_path / "r.json").exists() and not (tmp_path / "r.png").exists()


def test_a_session_of_save_checkpoint_and_a_step_phase_draws_the_phase(tmp_path: Path) -> None:
    recorder = described(tmp_path)
    recorder.record("save_checkpoint", [0.08], "t::save_checkpoint")
    recorder.record("gen", [1.0], "t::gen")
    outcome = recorder.finish([], 0.1, tmp_path / "r.json", None)
    assert outcome.problems == [] and outcome.notes == []
    assert (tmp_path / "r.png").read_bytes()[:4] == b"\x89PNG"
