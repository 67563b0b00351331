"""pytest-rlbench's pytest hooks: options, markers, the start-up checks and the clean-up.

Loaded through the ``pytest11`` entry point. The order of a session:

1. ``pytest_addoption``: the ``--rl-*`` options and their ini twins (group "rlbench").
2. ``pytest_configure``: markers registered; options parsed (a bad value is a usage error, exit 4).
3. collection: an ``rl_phase`` marker with an unknown phase key is a collection error.
4. ``pytest_collection_finish``: if any selected test uses an rl_* fixture, the resources those tests
   need (model, data set, trainer config, Ray cluster) are built and checked before the first test
   runs; a failure ends the session at once (exit 4) with a message naming what is wrong.
5. the tests (once per framework when ``--rl-trainer`` names several, ids ``[ours]``/``[trl]``; a
   phase the trainer cannot time is skipped with the reason, ``frameworks/phase_skips.py``):
   ``rl_bench`` records each phase's timed rounds (pytest_rlbench/session/bench.py); where a baseline can
   gate, a gate test per phase benchmark (``test_ref[gate]``, pytest_rlbench/session/gate_items.py), run
   after every other test, judges the phase against every baseline: a regression fails that gate
   test, so pytest counts it as failed and ``-x``, ``-k`` and ``--lf`` see it; phases the baselines
   have but the session did not run (``-k``) are "not run", neither pass nor fail.
6. ``pytest_sessionfinish`` (last: after the session fixtures' teardown stopped the trainer's
   workers): the run record (one per ``--rl-trainer`` framework) is built and compared with every
   baseline; the JSON report, its chart and the saved baseline are written, each on its own
   (pytest_rlbench/records/files.py, pytest_rlbench/frameworks/session.py); the baseline only
   when every selected test passed and the session was not interrupted. A regression (of a phase,
   already a failed test, or of a custom metric, judged only here) or an output that could not be
   written makes the exit status 1. Then Ray is stopped, every process of an
   embedded Ray included (an atexit guard covers harder exits).
7. ``pytest_terminal_summary``: first the answer (PASS or FAIL per gate; with no gate, the command
   that would gate this work), then the session's notes, the run's own times (with no gate), the
   gates' tables, one line per reference (with several frameworks, first a table of them side by
   side, phase by phase), with ``-v`` the references' figures and the baselines' consistency
   findings, files written and files not written (one line each, with the reason).
   pytest-benchmark's own table is off unless one of its reporting options is given
   (``benchmark_table_defaults``); then it is in seconds, with the columns a user reads.

Signals and dead workers are handled by ``pytest_rlbench.session.faults`` (registered in pytest_configure).
"""

from __future__ import annotations

import os
from collections.abc import Generator, Sequence
from typing import Any

import pytest

from pytest_rlbench import hookspec
from pytest_rlbench.frameworks import hooks as framework_hooks
from pytest_rlbench.frameworks.fixture import rl_framework, rl_trainer  # noqa: F401  (fixtures, found as attributes)
from pytest_rlbench.frameworks.phase_skips import absent_phases
from pytest_rlbench.frameworks.session import extra_outputs, finish_frameworks
from pytest_rlbench.markers import GPU_MARKER, MARKERS, check_phase_marks, phase_of
from pytest_rlbench.options.parse import parse_options
from pytest_rlbench.options.table import OPTIONS
from pytest_rlbench.options.trainer_config import OPTION_KEYS, VLLM_ON_CPU, vllm_cpu_defaults
from pytest_rlbench.options.values import OptionError, RawValue
from pytest_rlbench.records.files import clashing_outputs
from pytest_rlbench.reports.answer import Invocation
from pytest_rlbench.reports.chart import chart_path_for
from pytest_rlbench.reports.side_by_side import session_lines
from pytest_rlbench.session.bench import rl_batch, rl_bench, rl_prompts  # noqa: F401  (fixtures, as above)
from pytest_rlbench.session.faults import FaultHandling
from pytest_rlbench.session.fixtures import (  # noqa: F401  (fixtures, as above)
    SESSION_KEY,
    RLBenchSession,
    SetupError,
    rl_cluster,
    rl_config,
    rl_dataset,
    rl_fixtures_used,
    rl_model,
    rl_options,
)
from pytest_rlbench.session.gate_items import GatePlugin
from pytest_rlbench.session.recorder import OUTCOME_KEY, RECORDERS_KEY, install_recorders


def pytest_addhooks(pluginmanager: pytest.PytestPluginManager) -> None:
    pluginmanager.add_hookspecs(hookspec)


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("rlbench", "RL post-training benchmarks (pytest-rlbench)")
    for spec in OPTIONS:
        text = spec.help
        if spec.kind == "flag":
            group.addoption(spec.flag, action="store_true", default=None, dest=spec.dest, help=text)
        elif spec.kind == "multi":
            group.addoption(
                spec.flag, action="append", default=None, dest=spec.dest, metavar=spec.metavar, help=text
            )
        else:
            group.addoption(spec.flag, default=None, dest=spec.dest, metavar=spec.metavar, help=text)
        ini_type = "linelist" if spec.kind == "multi" else "string"
        order = f"applied before {spec.flag}'s" if spec.accumulates else f"{spec.flag} wins"
        parser.addini(spec.dest, f"{text} ({order})", type=ini_type)


def read_raw_options(config: pytest.Config) -> dict[str, RawValue | None]:
    """Each option's raw value: the command line's if given, else the ini file's, else None.

    --rl-config is the exception: the ini file's overrides come first, then the command line's."""
    cli_dir = config.invocation_params.dir
    ini_dir = config.inipath.parent if config.inipath else config.rootpath
    raw: dict[str, RawValue | None] = {}
    for spec in OPTIONS:
        value = config.getoption(spec.dest)
        ini_value = config.getini(spec.dest)
        if ini_value in ("", [], None):
            ini_value = None
        if value is not None and ini_value is not None and spec.accumulates:
            raw[spec.dest] = RawValue(
                [*ini_value, *value], f"{spec.flag} (after {spec.dest} of the ini file)", cli_dir, len(ini_value)
            )
        elif value is not None:
            raw[spec.dest] = RawValue(value, spec.flag, cli_dir)
        elif ini_value is not None:
            count = len(ini_value) if isinstance(ini_value, list) else 0
            raw[spec.dest] = RawValue(ini_value, f"{spec.dest} (ini)", ini_dir, count)
        else:
            raw[spec.dest] = None
    return raw


@pytest.hookimpl(trylast=True)  # after pytest's tmpdir plugin: the session's temp dir holds config paths
def pytest_configure(config: pytest.Config) -> None:
    for line in MARKERS:
        config.addinivalue_line("markers", line)
    if config.option.help or config.option.version:
        return  # --help must work even with a bad value in the ini file
    try:
        opts = parse_options(read_raw_options(config), os.environ, cwd=config.invocation_params.dir)
    except OptionError as exc:
        raise pytest.UsageError(f"pytest-rlbench: {exc}") from None
    clash = clashing_outputs(
        {
            opts.source_of("rl_report"): opts.report,
            "the report's chart": chart_path_for(opts.report) if opts.report else None,
            opts.source_of("rl_save_baseline"): opts.save_baseline,
            **extra_outputs(opts),  # each further --rl-trainer framework's baseline file
        }
    )
    if clash:
        raise pytest.UsageError(f"pytest-rlbench: {clash}")
    session = RLBenchSession(config, opts)
    config.stash[SESSION_KEY] = session
    config.pluginmanager.register(FaultHandling(config), FaultHandling.NAME)
    config.pluginmanager.register(framework_hooks, framework_hooks.NAME)  # --rl-trainer
    config.pluginmanager.register(GatePlugin(phase_of), GatePlugin.NAME)  # a gate test per phase benchmark
    session.load_baselines()
    session.build_config()  # once; with --gpu alone, once the cluster gives the GPU count
    install_recorders(config, opts)  # one per --rl-trainer framework


def pytest_report_header(config: pytest.Config) -> list[str] | None:
    session = config.stash.get(SESSION_KEY, None)
    if session is None:
        return None
    o = session.opts
    ray = f"{o.ray_address} (from {o.ray_address_source})" if o.ray_address else "embedded local Ray"
    gpus = f"gpu, {o.gpus_per_node or 'all'} per node" if o.gpu else "cpu"
    defaults = {d.key: d.value for d in vllm_cpu_defaults(o)}
    lines = [
        f"rlbench: model {defaults.get(OPTION_KEYS['rl_model'], o.model)}, rollout {o.rollout}, {o.nodes} node(s), "
        f"{gpus}, ray {ray}, data {o.dataset or 'synthetic'}, "
        f"tolerance {o.tolerance:g}"  # what the verdicts apply (a baseline file may give its own)
    ]
    if defaults:
        shown = ", ".join(f"{key}={value}" for key, value in defaults.items())
        lines.append(f"rlbench: {VLLM_ON_CPU} (set the key to change it): {shown}")
    return lines


def _items(result: Any) -> Sequence[Any]:
    if result is None:
        return []
    return result if isinstance(result, list) else [result]


@pytest.hookimpl(wrapper=True)
def pytest_pycollect_makeitem(
    collector: pytest.Module | pytest.Class, name: str, obj: object
) -> Generator[None, Any, Any]:
    # Checked where the test is made, so a bad phase key is a collection error of its module.
    result = yield
    for item in _items(result):
        if isinstance(item, pytest.Item):
            problem = check_phase_marks(item)
            if problem:
                raise collector.CollectError(problem)
    return result


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_call(item: pytest.Item) -> None:
    # One rule (frameworks/phase_skips.py) for the phases a trainer cannot time: skipped with its reason.
    phase = phase_of(item)
    trainer = getattr(item, "funcargs", {}).get("rl_trainer")
    reason = absent_phases(trainer).get(phase) if phase is not None and trainer is not None else None
    if reason:
        pytest.skip(reason)


def pytest_runtest_setup(item: pytest.Item) -> None:
    session = item.config.stash.get(SESSION_KEY, None)
    if item.get_closest_marker(GPU_MARKER) is not None and not (session and session.opts.gpu):
        pytest.skip("needs GPUs: run with --gpu")


# ----------------------------------------------------------------------------- start-up and end
def pytest_collection_finish(session: pytest.Session) -> None:
    config = session.config
    state = config.stash.get(SESSION_KEY, None)
    if state is None or config.option.collectonly:
        return
    used = rl_fixtures_used(session.items)
    if not used:
        return  # plain unit tests: never start Ray or load a model
    try:
        state.prepare(used)
    except SetupError as exc:  # one "ERROR: pytest-rlbench: ..." line and exit 4, as an option's error
        raise pytest.UsageError(f"pytest-rlbench: {exc}") from None


@pytest.hookimpl(trylast=True)  # after the session fixtures' teardown: the workers go before Ray
def pytest_sessionfinish(session: pytest.Session) -> None:
    config = session.config
    state = config.stash.get(SESSION_KEY, None)
    if state is None:
        return
    try:
        # each --rl-trainer framework's run compared, reported and saved (frameworks/session.py)
        outcome = finish_frameworks(config, state, incomplete_reason(session)) if RECORDERS_KEY in config.stash else None
        if outcome is not None:
            config.stash[OUTCOME_KEY] = outcome
            failed = outcome.regressions or outcome.write_failed
            if failed and session.exitstatus == pytest.ExitCode.OK:
                session.exitstatus = pytest.ExitCode.TESTS_FAILED
    finally:
        state.close()


def incomplete_reason(session: pytest.Session) -> str | None:
    """Why the session's measurements are not a complete run (None when they are): a saved
    baseline with phases missing would silently stop gating them."""
    if session.exitstatus == pytest.ExitCode.INTERRUPTED:
        return "the session was interrupted"
    if session.testsfailed:
        return f"{session.testsfailed} test(s) failed or errored"
    if session.exitstatus != pytest.ExitCode.OK:
        return f"the session ended with exit status {int(session.exitstatus)}"
    return None


# pytest-benchmark's options that ask for its own reporting: given any, its table is shown.
BENCHMARK_REPORTING = (
    "benchmark_columns",
    "benchmark_time_unit",
    "benchmark_histogram",
    "benchmark_compare",
    "benchmark_cprofile",
    "benchmark_verbose",
    "benchmark_save",
    "benchmark_autosave",
    "benchmark_json",
)
BENCHMARK_COLUMNS = ["median", "iqr", "min", "max", "rounds"]  # its table's columns unless chosen
# pytest-benchmark before 5.3 gives --benchmark-columns this default where 5.3 gives None: not a choice
UNCHOSEN_COLUMNS = ["min", "max", "mean", "stddev", "median", "iqr", "outliers", "ops", "rounds", "iterations"]
BENCHMARK_TABLE_HINT = "pytest-benchmark's table: --benchmark-columns=median,iqr,rounds"
TABLE_OFF_KEY = pytest.StashKey[bool]()
ANSWER_COLOURS = {"FAIL": "red", "PASS": "green", "NO": "yellow"}  # an answer line's first word


@pytest.hookimpl(tryfirst=True)  # before pytest_configure, where pytest-benchmark reads its options
def pytest_cmdline_main(config: pytest.Config) -> None:
    benchmark_table_defaults(config)


def benchmark_table_defaults(config: pytest.Config) -> None:
    """pytest-benchmark's table (230 columns in microseconds, each cell's ratio to the fastest phase)
    repeats the summary's times: off (``--benchmark-quiet``) unless the user gave one of its reporting
    options; then in seconds with ``BENCHMARK_COLUMNS``, where the user did not choose them."""
    opt = config.option
    if not hasattr(opt, "benchmark_columns"):
        return  # pytest-benchmark not loaded (-p no:benchmark)
    if opt.benchmark_columns == UNCHOSEN_COLUMNS:
        opt.benchmark_columns = None
    if not any(getattr(opt, name, None) for name in BENCHMARK_REPORTING):
        opt.benchmark_quiet = True
        config.stash[TABLE_OFF_KEY] = True
        return
    if opt.benchmark_columns is None:
        opt.benchmark_columns = list(BENCHMARK_COLUMNS)
    if opt.benchmark_time_unit is None:
        opt.benchmark_time_unit = "s"


def pytest_terminal_summary(terminalreporter: Any, config: pytest.Config) -> None:
    outcome = config.stash.get(OUTCOME_KEY, None)
    if outcome is None:
        return
    terminalreporter.section("rlbench")
    session = config.stash.get(SESSION_KEY, None)
    notes = [*session.replay_notes, *session.config_notes] if session is not None else []
    save_path = session.opts.save_baseline if session is not None else None
    invocation = Invocation(
        tuple(config.invocation_params.args), save_path, save_path is not None and save_path in outcome.written
    )
    outcomes = [outcome, *outcome.others]  # several frameworks: side by side
    lines = session_lines(
        outcomes,
        outcome.findings,
        config.option.verbose > 0,
        baselines=session.baseline_records if session is not None else (),
        invocation=invocation,
        notes=notes,
        table_hint=BENCHMARK_TABLE_HINT if config.stash.get(TABLE_OFF_KEY, False) else "",
        report=str(session.opts.report) if session is not None and session.opts.report is not None else None,
    )
    for line in lines:  # the answer in colour: a FAIL red, a PASS green, NO GATE yellow
        colour = ANSWER_COLOURS.get(line.split(" ", 1)[0])
        terminalreporter.write_line(line, **({colour: True, "bold": True} if colour else {}))
    for path in outcome.written:
        terminalreporter.write_line(f"wrote {path}")
    for note in outcome.notes:
        terminalreporter.write_line(f"pytest-rlbench: {note}")
    for problem in outcome.problems:
        terminalreporter.write_line(f"pytest-rlbench: {problem}", red=True, bold=True)


def pytest_unconfigure(config: pytest.Config) -> None:
    state = config.stash.get(SESSION_KEY, None)
    if state is not None:
        state.close()  # idempotent; covers a session that ended before pytest_sessionfinish
