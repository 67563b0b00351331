"""The summary answers first (issue 30, items 2 and 4): PASS or FAIL per gate, or with no gate the
command that would gate this work; references one line each unless -v; pytest-benchmark's table off
unless asked for, then in seconds with few columns; the baselines' consistency only with -v."""

from __future__ import annotations

import copy
import re
from pathlib import Path

import pytest
from replay_records import H100, replay_record
from test_reports import RUN, run_record

from pytest_rlbench.records.baselines import PUBLISHED_BASELINES, load_baseline
from pytest_rlbench.records.record import RunRecord, record_from_dict
from pytest_rlbench.reports.answer import Invocation, answer_lines, efficiency_line
from pytest_rlbench.verdict.compare import compare, compare_all

PUBLISHED = [load_baseline(name) for name in PUBLISHED_BASELINES]


# ----------------------------------------------------------------------------- the answer, as lines
def test_no_gate_on_a_cpu_names_the_commands_that_save_and_gate_this_machine() -> None:
    run = run_record()
    args = ("suites/", "-q", "--rl-report", "out/r.json")
    lines = answer_lines([(run, compare_all(run, PUBLISHED))], PUBLISHED, Invocation(args))
    # a published GPU run never gates a CPU run: only a baseline of this machine can
    assert lines[0] == (
        "NO GATE: save this run as this machine's baseline with  "
        "pytest suites/ -q --rl-report out/r.json --rl-save-baseline rlbench-baseline.json"
    )
    assert (
        lines[1]
        == "  then gate later runs on it with  pytest suites/ -q --rl-report out/r.json --rl-baseline rlbench-baseline.json"
    )
    assert len(lines) == 3  # and why nothing passed or failed; a CPU has no peak, so no efficiency line


def test_a_run_that_saved_a_baseline_is_told_how_to_gate_on_it() -> None:
    run = run_record()
    for args in (
        ("suites/", "--rl-save-baseline", "b.json", "-x"),
        ("suites/", "--rl-save-baseline=b.json", "-x"),
    ):
        invocation = Invocation(args, Path("b.json"), saved=True)
        lines = answer_lines([(run, compare_all(run, PUBLISHED))], PUBLISHED, invocation)
        assert lines == [
            "NO GATE in this run, which saved a baseline: gate later runs on it with  pytest suites/ -x --rl-baseline b.json"
        ]


def test_no_gate_on_an_h100_names_the_replay_that_would_gate_it() -> None:
    data = copy.deepcopy(RUN)
    data["hardware"] = {"device": "gpu", "nodes": 1, "world_size": 1, "gpus_per_node": 1, "gpu_model": H100}
    run = record_from_dict(data)
    lines = answer_lines([(run, compare_all(run, PUBLISHED))], PUBLISHED, Invocation(("suites/", "--gpu")))
    # the published 1.5B runs, each replayed per GPU on this H100; not the 7B, whose 2 prompts per GPU
    # do not split into its 4 PPO mini-batches
    assert lines[0] == (
        "NO GATE: to gate against 'verl-v0.5.0-1.5b' (its per-GPU throughput), replay its work per GPU:  "
        "pytest suites/ --gpu --rl-workload verl-v0.5.0-1.5b"
    )
    assert lines[1] == "  (rlinf-1.5b the same way)"


# A session's own workload section, as the embedded default writes it (natural lengths): the
# comparison with a published run then lists the work's differences, not the hardware's
NATURAL_WORKLOAD = {
    "architecture": {"value": "tiny", "source": "published"},
    "dtype": {"value": "bfloat16", "source": "published"},
    "sequences_per_step": {"value": 64, "source": "published"},
    "sequences_per_gpu": {"value": 64, "source": "published"},
    "samples_per_prompt": {"value": 4, "source": "published"},
    "prompt_length": {"mean": {"value": None, "source": "published", "why": "see $.tokens"},
                      "max": {"value": 128, "source": "published"},
                      "shape": {"value": "natural", "source": "published", "why": "the data set's own prompts"}},
    "response_length": {"mean": {"value": None, "source": "published", "why": "see $.tokens"},
                        "max": {"value": 64, "source": "published"},
                        "shape": {"value": "natural", "source": "published", "why": "stops at EOS"}},
    "use_kl_loss": {"value": True, "source": "published"},
    "kl_loss_type": {"value": "low_var_kl", "source": "published"},
    "ppo_epochs": {"value": 1, "source": "published"},
    "ppo_mini_batches": {"value": 2, "source": "published"},
    "use_dynamic_bsz": {"value": False, "source": "published"},
    "ppo_max_token_len_per_gpu": {"value": 16384, "source": "published"},
    "log_prob_max_token_len_per_gpu": {"value": 16384, "source": "published"},
    "gradient_checkpointing": {"value": False, "source": "published"},
    "param_offload": {"value": False, "source": "published"},
    "optimizer_offload": {"value": False, "source": "published"},
    "temperature": {"value": 1.0, "source": "published"},
    "parallelism": {"value": {"dp": 1, "rollout_tp": 1, "sp": 1}, "source": "published"},
}


@pytest.mark.parametrize(("gpu", "gated"), [("NVIDIA H200", "its MFU and bandwidth use"), (H100, "its per-GPU throughput")])
def test_the_replay_advice_reads_the_gpu_whatever_the_comparison_listed(gpu: str, gated: str) -> None:
    """On an H200 the advice said "its times, on this same machine" against the published H100 runs:
    a run with its own workload section is compared by its work, whose list names no hardware."""
    data = copy.deepcopy(RUN)
    data["hardware"] = {"device": "gpu", "nodes": 1, "world_size": 1, "gpus_per_node": 1, "gpu_model": gpu}
    data["workload"] = copy.deepcopy(NATURAL_WORKLOAD)
    run = record_from_dict(data)
    results = compare_all(run, PUBLISHED)
    assert not any(m.startswith("hardware.") for r in results for m in r.mismatches)  # the case this covers
    lines = answer_lines([(run, results)], PUBLISHED, Invocation(("suites/", "--gpu")))
    assert lines[0].startswith(f"NO GATE: to gate against 'verl-v0.5.0-1.5b' ({gated}), replay its work per GPU"), lines


def test_a_gated_run_answers_pass_or_fail_per_baseline_first() -> None:
    base = run_record()
    base.name = "ci-runner"
    other = run_record()
    other.name = "ci-runner-2"
    slower = run_record(update_actor={"seconds": [1.5, 1.55, 1.6, 1.65, 1.7]})
    results = compare_all(slower, [base, load_baseline("verl-7b")])
    assert answer_lines([(slower, results)], [base], Invocation(("suites/",))) == [
        "FAIL  baseline 'ci-runner': 1 of 9 failed (update_actor seconds)"  # the reference: no answer line
    ]
    same = run_record()
    assert answer_lines([(same, [compare(same, base), compare(same, other)])]) == [
        "PASS  baseline 'ci-runner': all 9 passed",
        "PASS  baseline 'ci-runner-2': all 9 passed",
    ]


def test_a_cpu_session_markedly_faster_than_its_baseline_says_what_could_pass_unseen() -> None:
    base = run_record()
    base.name = "ci-runner"

    def scaled(factor: float) -> RunRecord:
        run = run_record()
        for phase in run.phases.values():
            phase.seconds = [t * factor for t in phase.seconds]
        return run

    # every phase at 0.80x: the pace only excuses a slower host, so 1.15 / 0.80 = 44% could hide
    lines = answer_lines([(scaled(0.8), [compare(scaled(0.8), base)])])
    assert lines == [
        "PASS  baseline 'ci-runner': all 9 passed",
        "note: this session ran faster than baseline 'ci-runner' (its phases at 0.80x the baseline's times, "
        "median of 8): a phase up to about 44% slower than its peers would still pass; if this machine usually "
        "runs this fast, save the baseline again",
    ]
    assert answer_lines([(scaled(0.9), [compare(scaled(0.9), base)])]) == ["PASS  baseline 'ci-runner': all 9 passed"]


def test_efficiency_is_shown_only_against_a_known_peak() -> None:
    verl = load_baseline("verl-v0.5.0-1.5b")
    replay = replay_record(verl, H100, world_size=1, speedup=2.0)
    (line,) = efficiency_line(replay)
    pattern = r"efficiency against the peak of (.*): old_log_prob MFU \d+\.\d%, update_actor MFU \d+\.\d%, gen bandwidth use \d+\.\d%"
    match = re.fullmatch(pattern, line)
    assert match and match.group(1) == H100, line
    assert efficiency_line(run_record()) == []  # no peak is known for a CPU


# ----------------------------------------------------------------------------- the terminal, through pytester
pytestmark_plugin = pytest.mark.usefixtures("plugin_deps_loaded", "steady_machine")

SUITE = """
import time
import pytest

@pytest.mark.rl_phase("old_log_prob")
def test_old_log_prob(rl_bench):
    rl_bench(lambda: time.sleep({delay}))

@pytest.mark.rl_phase("update_actor")
def test_update_actor(rl_bench):
    rl_bench(lambda: time.sleep({delay}))
"""


@pytest.fixture
def steady_machine(monkeypatch: pytest.MonkeyPatch) -> None:
    """Nobody else on the CPU, as the gate sees it (the phases are sleeps: tests/test_bench_gate.py)."""
    from pytest_rlbench.verdict import machine_load

    monkeypatch.setattr(machine_load, "cores_used", lambda before, after, ticks_per_s: (0.0, 0.0))


def session(pytester: pytest.Pytester, *args: str, delay: float = 0.02) -> pytest.RunResult:
    pytester.makepyfile(test_suite=SUITE.format(delay=delay))
    return pytester.runpytest("--rl-rounds=5", "--rl-warmup-rounds=1", "-p", "no:randomly", *args)


def summary(result: pytest.RunResult) -> list[str]:
    """The lines of the rlbench section, its heading left out."""
    lines = result.stdout.lines
    start = next(i for i, line in enumerate(lines) if re.fullmatch(r"=+ rlbench =+", line))
    return lines[start + 1 :]


@pytestmark_plugin
def test_the_default_run_opens_with_a_command_and_stays_quiet(pytester: pytest.Pytester) -> None:
    result = session(pytester, "-q")
    assert result.ret == pytest.ExitCode.OK, result.stdout.str()
    lines, out = summary(result), result.stdout.str()
    # this run's own command (pytester adds --basetemp), with what to add
    command = "pytest --rl-rounds=5 --rl-warmup-rounds=1 -p no:randomly -q --basetemp="
    assert lines[0].startswith(f"NO GATE: save this run as this machine's baseline with  {command}"), lines[
        :3
    ]
    assert lines[0].endswith(" --rl-save-baseline rlbench-baseline.json"), lines[0]
    assert lines[1].startswith(f"  then gate later runs on it with  {command}")
    assert lines[1].endswith(" --rl-baseline rlbench-baseline.json"), lines[1]
    assert lines[3].startswith("this run, seconds per round (pytest-benchmark's table: --benchmark-columns=")
    assert lines[4].split() == ["phase", "median", "min", "max", "rounds", "tokens/s", "per", "device"]
    # each published run: one line, none of its figures beside this run's
    references = [line for line in lines if line.startswith("reference '")]
    assert [line.split("'")[1] for line in references] == list(PUBLISHED_BASELINES)
    assert all(line.endswith("differences)") and "-v shows its figures" in line for line in references)
    assert "974.41" not in out and "ms per 1k tokens" not in out
    assert "consistency" not in out and "data-parallel ranks" not in out
    assert "benchmark: 2 tests" not in out and "Legend:" not in out and "(>1000.0)" not in out


@pytestmark_plugin
def test_with_v_the_references_show_their_figures_and_consistency(pytester: pytest.Pytester) -> None:
    result = session(pytester, "-v")
    assert result.ret == pytest.ExitCode.OK, result.stdout.str()
    lines = summary(result)
    assert (
        lines[0].startswith("NO GATE: save this run as this machine's baseline with  pytest ")
        and " -v " in lines[0]
    )
    verl = lines.index(next(line for line in lines if line.startswith("baseline 'verl-7b' (VERL's run")))
    assert lines[verl + 1] == "  it differs in:" and lines[verl + 2].startswith("    - ")
    figures = lines.index("  its figures (another model: not comparable with this run's):", verl)
    assert lines[figures + 1].split() == ["phase", "figure", "baseline"]
    gen = next(line.split() for line in lines[figures + 2 :] if line.split()[:1] == ["gen"])
    assert gen[-1] == "974.41" and len(gen) == 8  # the 7B's own figure, with no column of this run's
    assert "consistency of the baselines' published figures:" in lines


def test_pytest_benchmarks_old_default_columns_are_not_a_choice() -> None:
    """pytest-benchmark before 5.3 gives --benchmark-columns its full list by default (5.3: None): read
    as chosen, it showed the 230-column table on every run; a list the user gave still brings it back."""
    from types import SimpleNamespace

    from pytest_rlbench.plugin import BENCHMARK_REPORTING, UNCHOSEN_COLUMNS, benchmark_table_defaults

    def config(**given):
        option = SimpleNamespace(**{name: None for name in BENCHMARK_REPORTING}, benchmark_quiet=False)
        vars(option).update(given)
        return SimpleNamespace(option=option, stash={})

    old_default = config(benchmark_columns=list(UNCHOSEN_COLUMNS))
    benchmark_table_defaults(old_default)
    assert old_default.option.benchmark_quiet and old_default.option.benchmark_columns is None
    chosen = config(benchmark_columns=["median", "rounds"])
    benchmark_table_defaults(chosen)
    assert not chosen.option.benchmark_quiet and chosen.option.benchmark_columns == ["median", "rounds"]
    assert chosen.option.benchmark_time_unit == "s"


@pytestmark_plugin
def test_benchmark_columns_bring_back_pytest_benchmarks_table_in_seconds(pytester: pytest.Pytester) -> None:
    result = session(pytester, "-q", "--benchmark-columns=median,rounds")
    out = result.stdout.str()
    header = next(line for line in result.stdout.lines if line.startswith("Name (time in "))
    assert header.split() == ["Name", "(time", "in", "s)", "Median", "Rounds"], header
    assert "this run, seconds per round:" in out  # the hint is gone: the table is back
    # the time unit alone: the columns a user reads
    again = session(pytester, "-q", "--benchmark-time-unit=ms")
    header = next(line for line in again.stdout.lines if line.startswith("Name (time in "))
    assert header.split() == ["Name", "(time", "in", "ms)", "Median", "IQR", "Min", "Max", "Rounds"], header


@pytestmark_plugin
def test_a_gated_run_opens_with_pass_or_fail_per_baseline(pytester: pytest.Pytester) -> None:
    saved = pytester.path / "base.json"
    first = session(pytester, "-q", f"--rl-save-baseline={saved}", delay=0.05)
    assert first.ret == pytest.ExitCode.OK, first.stdout.str()
    line = summary(first)[0]
    assert line.startswith(
        "NO GATE in this run, which saved a baseline: gate later runs on it with  pytest "
    ), line
    assert line.endswith(f" --rl-baseline {saved}") and "--rl-save-baseline" not in line, line
    same = session(pytester, "-q", f"--rl-baseline={saved}", "--rl-tolerance=0.5", delay=0.05)
    assert summary(same)[0] == "PASS  baseline 'base': all 2 passed", summary(same)[:3]
    slower = session(pytester, "-q", f"--rl-baseline={saved}", "--rl-tolerance=0.10", delay=0.10)
    first_line = summary(slower)[0]
    assert (
        first_line == "FAIL  baseline 'base': 2 of 2 failed (old_log_prob seconds, update_actor seconds)"
    ), first_line


def test_the_replay_advice_leaves_out_this_run_s_settings_of_what_the_replay_sets() -> None:
    """Settings given on top of a workload are applied after it, and make the replay's work differ from
    the baseline's (docs/replay.md): a suggested command that kept them would gate nothing; so would
    a data set's own prompts, where the replay generates them. Memory placement is kept: placed
    otherwise, a replay still gates."""
    data = copy.deepcopy(RUN)
    data["hardware"] = {"device": "gpu", "nodes": 1, "world_size": 1, "gpus_per_node": 1, "gpu_model": H100}
    run = record_from_dict(data)
    args = (
        "suites/", "--gpu", "--rl-model", "r1-distill-qwen-1.5b", "--rl-dataset", "p.parquet",
        "--rl-config", "data.train_batch_size=32",
        "--rl-config=actor_rollout_ref.rollout.n=8", "--rl-config", "trainer.seed=3",
        "--rl-config", "actor_rollout_ref.actor.fsdp_config.param_offload=False", "-k", "not save",
    )  # fmt: skip
    lines = answer_lines([(run, compare_all(run, PUBLISHED))], PUBLISHED, Invocation(args))
    assert lines[:2] == [
        "NO GATE: to gate against 'verl-v0.5.0-1.5b' (its per-GPU throughput), replay its work per GPU:  "
        "pytest suites/ --gpu --rl-config trainer.seed=3 --rl-config actor_rollout_ref.actor.fsdp_config.param_offload=False "
        "-k 'not save' --rl-workload verl-v0.5.0-1.5b",
        "  (left out: --rl-model r1-distill-qwen-1.5b, --rl-dataset p.parquet, --rl-config data.train_batch_size=32, "
        "--rl-config=actor_rollout_ref.rollout.n=8: the replay sets these keys to what 'verl-v0.5.0-1.5b' did)",
    ], lines
