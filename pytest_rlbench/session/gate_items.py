"""One gate test per phase benchmark: the phase judged against every baseline once the whole session
has been measured.

A phase's verdict on CPU workers reads the session's pace from its other phases
(``pytest_rlbench.verdict.session_pace``), so it can only be given after they ran: the benchmark test
(``rl_bench``) times and records its phase, and a gate test made for it runs after every other test
of the session and fails on a regression, with one short line per failed figure (the first is what
pytest's short summary shows), then each verdict's whole message. So a regression is a failed
test in pytest's summary, and ``-x``, ``-k``, ``--lf`` and CI annotations see it:

- the gate of ``suites/test_phases.py::test_ref`` is ``suites/test_phases.py::test_ref[gate]`` (of
  ``test_ref[trl]``, ``test_ref[trl-gate]``), so ``-k ref`` selects the benchmark and its gate alike;
- a gate is made for each benchmark left after selection (``-k``, ``--lf``, ``-m``), never for a
  deselected one: a subset gates what ran;
- a failed gate marks its benchmark as failed in pytest's cache too, so ``--lf`` reruns the
  benchmark, and with it its gate (the gate alone has nothing to judge);
- a benchmark that did not time its phase (failed, skipped) leaves its gate skipped, naming it;
- on CPU workers a gate times its phase again, as its benchmark timed it (``bench.RETIMERS_KEY``),
  kept as the run's ``retimed_s/<phase>`` metric (``pytest_rlbench.verdict.retiming``): every phase of a
  session that saves a baseline, twice, the second time after every phase was timed once (the
  baseline's bar is the median of its three blocks, spread over the session), and a phase whose time
  failed with the phases that pace it, whose verdict then stands only if the re-timed rounds fail too;
- the session's first gate also times every gated phase side by side (on CPU workers; on GPUs where
  every phase's rounds are short enough to wait on the host, ``bench.side_by_side_rule``): one round
  of each in turn, ``retiming.side_by_side_passes`` passes (``side_by_side_s/<phase>``), so that each
  phase is judged against its peers in the same seconds (``pytest_rlbench.verdict.session_pace.SideBySide``);
  where both sessions have them, they stand in for the pace and the re-timing.

Gates are made where a baseline can gate: one given with ``--rl-baseline`` (or the ini file, or a
``pytest_rlbench_baselines`` hook) or a replayed ``--rl-workload``; and in a session that saves a
baseline (``--rl-save-baseline``), to time its phases again. The published runs a
session compares with by default ran on GPUs: they are references, and a session with only them
makes no gates.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Generator, Iterable, Sequence
from typing import TYPE_CHECKING, Any

import pytest

from pytest_rlbench.records.metrics import TIMING
from pytest_rlbench.reports.verdict_lines import short_verdict
from pytest_rlbench.session.bench import RETIMERS_KEY, ROUND_TIMERS_KEY, complete_context
from pytest_rlbench.session.fixtures import get_session
from pytest_rlbench.session.recorder import RECORDERS_KEY
from pytest_rlbench.verdict.compare import (
    BaselineComparison,
    Comparison,
    deciding_side_by_side,
    phase_comparisons,
)
from pytest_rlbench.verdict.noise import GPU_SIDE_BY_SIDE_MAX_ROUND_S
from pytest_rlbench.verdict.retiming import (
    SAVED_RETIMED_BLOCKS,
    blocks_of,
    reads_side_by_side,
    retimed_metric,
    side_by_side_metric,
    side_by_side_passes,
)
from pytest_rlbench.verdict.session_pace import MIN_SIDE_BY_SIDE_GROUPS, session_paces

if TYPE_CHECKING:
    from pytest_rlbench.records.record import RunRecord
    from pytest_rlbench.session.recorder import BenchRecorder

GATE_ID = "gate"


def gate_name(bench_name: str) -> str:
    """The gate's name beside its benchmark's: ``test_ref`` -> ``test_ref[gate]``, ``test_ref[trl]`` ->
    ``test_ref[trl-gate]`` (as pytest writes parameter ids)."""
    if bench_name.endswith("]"):
        return f"{bench_name[:-1]}-{GATE_ID}]"
    return f"{bench_name}[{GATE_ID}]"


def bench_id(gate_id: str) -> str | None:
    """The benchmark's node id of a gate's (None when ``gate_id`` is not a gate's)."""
    if gate_id.endswith(f"[{GATE_ID}]"):
        return gate_id[: -len(GATE_ID) - 2]
    if gate_id.endswith(f"-{GATE_ID}]"):
        return gate_id[: -len(GATE_ID) - 2] + "]"
    return None


class PhaseGate(pytest.Item):
    """The verdict on the phase that ``bench`` timed, against every baseline of the session."""

    def __init__(self, *, bench: pytest.Item, phase: str, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.bench = bench
        self.phase = phase
        self.own_markers.extend(bench.iter_markers())  # -m selects a benchmark and its gate alike

    def runtest(self) -> None:
        config = self.config
        if self is self._framework_gates()[0]:  # its trainer's phases, side by side, before any verdict
            self._time_side_by_side()
        recorder = config.stash[RECORDERS_KEY].of_benchmark(self.bench.nodeid)
        if recorder is None:
            pytest.skip(f"{self.bench.nodeid} did not time {self.phase}: nothing to judge")
        complete_context(recorder, get_session(config))
        if get_session(config).opts.save_baseline is not None:  # a saved baseline keeps three blocks
            self._retime(recorder, self.phase)
            if self is _gates(self.session)[-1]:
                self._time_every_phase_again()
        if not gating_session(config):
            return  # a session that only saves a baseline: its phase was timed again, nothing to judge
        results = self._compare(recorder)
        if self._timing_failed(results) and not self._judged_side_by_side(recorder, results):
            # a regression must reproduce, against its peers timed again too
            for phase in (self.phase, *self._peers(recorder, results)):
                self._retime(recorder, phase)
            results = self._compare(recorder)
        recorder.verdicts[self.phase] = results  # the session's summary, report and chart show these
        gated = [r for r in results if r.mode == "gate"]
        if not gated:  # every baseline did other work, or ran on other hardware: nothing to pass or fail
            why = "; ".join(
                f"'{r.baseline}' is a reference ({r.mismatches[0]})" for r in results if r.mismatches
            )
            pytest.skip(f"no baseline gates {self.phase}: {why or 'none has it'}")
        failures = [(r.baseline, c) for r in gated for c in r.failures]
        if failures:
            pytest.fail(failure_text(failures), pytrace=False)

    def _compare(self, recorder: BenchRecorder) -> list[BaselineComparison]:
        tolerance = get_session(self.config).opts.tolerance
        return phase_comparisons(
            recorder.build_record(), get_session(self.config).baseline_records, self.phase, tolerance
        )

    def _timing_failed(self, results: list[BaselineComparison]) -> bool:
        timing = f"{TIMING}/{self.phase}"
        return any(c.metric == timing for r in results if r.mode == "gate" for c in r.failures)

    def _judged_side_by_side(self, recorder: BenchRecorder, results: list[BaselineComparison]) -> bool:
        """Whether the phase's side-by-side rounds decide its verdict against every baseline that gates it
        (``compare.deciding_side_by_side``): then a re-timing would add nothing."""
        gated, record = self._gating(results), recorder.build_record()
        return bool(gated) and all(deciding_side_by_side(record, b, self.phase) is not None for b in gated)

    def _gating(self, results: list[BaselineComparison]) -> list[RunRecord]:
        """The session's baselines that gate this phase (``results``: its comparisons, one per baseline)."""
        baselines = get_session(self.config).baseline_records
        return [b for b, r in zip(baselines, results, strict=True) if r.mode == "gate"]

    def _framework_gates(self) -> list[PhaseGate]:
        """The session's gates of this gate's framework (all of them where one framework runs)."""
        return [g for g in _gates(self.session) if framework_of(g.bench) == framework_of(self.bench)]

    def _peers(self, recorder: BenchRecorder, results: list[BaselineComparison]) -> list[str]:
        """The phases that pace this one against the baselines it is gated on in the same session."""
        record = recorder.build_record()
        paces = [session_paces(record, b).get(self.phase) for b in self._gating(results)]
        return list(dict.fromkeys(p for pace in paces if pace is not None for p, _ in pace.peers))

    def _retime(self, recorder: BenchRecorder, phase: str, blocks: int = 1) -> None:
        """Time ``phase`` again as its benchmark did and keep the rounds after those it has (one block more,
        ``pytest_rlbench.verdict.retiming``) until it holds ``blocks`` blocks; only benchmarks on CPU workers
        keep how to (``bench.RETIMERS_KEY``)."""
        metric = retimed_metric(phase)
        bench = recorder.sources.get(phase)
        retimer = self.config.stash.get(RETIMERS_KEY, {}).get(bench) if bench is not None else None
        if retimer is None:
            return
        kept = recorder.metrics[metric].value if metric in recorder.metrics else []
        own = recorder.phases.get(phase)
        if len(blocks_of(kept, len(own.seconds) if own is not None else None)) >= blocks:
            return
        recorder.add_metric(metric, [*kept, *retimer()], "s", higher_is_better=False)

    def _time_side_by_side(self) -> None:
        """A framework's first gate: one round of each of its gated phases in turn (on GPUs only where
        every one kept a round timer: all wait on the host), pass after pass
        (``retiming.side_by_side_passes``), kept as ``side_by_side_s/<phase>``, so that each phase is judged
        against peers timed in the same seconds (``pytest_rlbench.verdict.session_pace.SideBySide``)."""
        session = get_session(self.config)
        timers = self.config.stash.get(ROUND_TIMERS_KEY, {})
        benches = {gate.bench.nodeid for gate in self._framework_gates()}
        kept = {bench: timers.pop(bench) for bench in benches & set(timers)}  # nothing kept alive past here
        readers = [b for b in session.baseline_records if reads_side_by_side(b, session.opts.gpu)]
        if session.opts.save_baseline is None and not readers:
            return  # no baseline of this session could read them (the published ones have none)
        recorders = self.config.stash[RECORDERS_KEY]
        ran = {
            gate.bench.nodeid: (gate.phase, recorder) for gate in self._framework_gates()
            if (recorder := recorders.of_benchmark(gate.bench.nodeid)) is not None
        }
        timed = []
        for bench in side_by_side_benches(ran, kept, session.opts.gpu):
            phase, recorder = ran[bench]
            timed.append((phase, kept[bench], recorder))
        if len(timed) <= MIN_SIDE_BY_SIDE_GROUPS:  # a phase needs that many peers apart from itself
            return
        rounds: dict[str, list[float]] = {phase: [] for phase, _, _ in timed}
        progress, passes = session.progress(), side_by_side_passes(session.opts.gpu)
        with progress.stage("every phase side by side", passes * len(timed)) as stage:
            for index in range(passes):
                for phase, one_round, _ in timed:
                    stage.step(f"pass {index + 1}/{passes}: {phase}")
                    rounds[phase].append(one_round())
                    stage.done()
        for phase, _, recorder in timed:
            recorder.add_metric(side_by_side_metric(phase), rounds[phase], "s", higher_is_better=False)

    def _time_every_phase_again(self) -> None:
        """A saving session's last gate: every gated phase's second re-timed block, after each was timed
        again once, so that a baseline's three blocks are not timed within the same few seconds."""
        recorders = self.config.stash[RECORDERS_KEY]
        for gate in _gates(self.session):
            recorder = recorders.of_benchmark(gate.bench.nodeid)
            if recorder is not None:
                self._retime(recorder, gate.phase, SAVED_RETIMED_BLOCKS)

    def reportinfo(self) -> tuple[Any, int | None, str]:
        return self.bench.path, None, f"{self.name}: the verdict on {self.phase}"


def _gates(session: pytest.Session) -> list[PhaseGate]:
    return [item for item in session.items if isinstance(item, PhaseGate)]


def failure_text(failures: Sequence[tuple[str, Comparison]]) -> str:
    """A failed gate's message: first one short line per failure (the first is what pytest's short
    summary shows), then each verdict's whole message, as the JSON report keeps it."""
    short = [f"{short_verdict(c, word=False)} (baseline '{baseline}')" for baseline, c in failures]
    return "\n".join([*short, *(c.message for _, c in failures)])


PhaseOf = Callable[[pytest.Item], "str | None"]  # the phase key an item's rl_phase marker names


def gates_for(items: Iterable[pytest.Item], phase_of: PhaseOf) -> list[PhaseGate]:
    """A gate for every item that times a phase with rl_bench, in the items' order."""
    gates = []
    for item in items:
        phase = phase_of(item)
        if phase is None or "rl_bench" not in getattr(item, "fixturenames", ()):
            continue
        parent = item.parent if item.parent is not None else item.session
        name = gate_name(item.name)
        # the node id given as a string, as pytest's cache parses one (its [...] read as parameters)
        nodeid = f"{item.nodeid.rpartition('::')[0]}::{name}"
        gates.append(PhaseGate.from_parent(parent, name=name, nodeid=nodeid, bench=item, phase=phase))
    return gates


def framework_of(item: pytest.Item) -> str | None:
    """The --rl-trainer framework an item runs with, where the session runs several (its parameter)."""
    callspec = getattr(item, "callspec", None)
    return callspec.params.get("rl_framework") if callspec is not None else None


def with_gates(items: list[pytest.Item], gates: list[PhaseGate]) -> list[PhaseGate | pytest.Item]:
    """``items`` with each gate after the last item of its benchmark's framework: the end of the
    session, or, where several frameworks run one after the other, before the next framework's items
    (pytest tears a framework's trainer down before it builds the next, and a gate may time its phase
    again on it)."""
    out: list[PhaseGate | pytest.Item] = list(items)
    for framework in dict.fromkeys(framework_of(g.bench) for g in gates):
        own = [g for g in gates if framework_of(g.bench) == framework]
        mine = [i for i, item in enumerate(out) if framework_of(item) == framework]
        last = mine[-1] if framework is not None and mine else len(out) - 1
        out[last + 1 : last + 1] = own
    return out


def side_by_side_benches(ran: Collection[str], timers: Collection[str], gpu: bool) -> list[str]:
    """Of the benchmarks that timed their phase (``ran``, node ids), those a side-by-side pass times: each
    that kept a round timer (``timers``); on GPUs none unless every one did (``bench.side_by_side_rule``):
    a session with a phase of seconds is a real model's, judged at its measured tolerances."""
    kept = [bench for bench in ran if bench in timers]
    return [] if gpu and len(kept) < len(ran) else kept


def gating_session(config: pytest.Config) -> bool:
    """Whether a baseline of the session can gate (see the module docstring)."""
    return get_session(config).gating


def needs_gates(config: pytest.Config) -> bool:
    """Whether the session makes gate tests: to judge, or to time phases again for a baseline it saves
    (each phase on CPU workers, the side-by-side passes of the short ones on GPUs)."""
    return gating_session(config) or get_session(config).opts.save_baseline is not None


class GatePlugin:
    """Adds the gates after selection and keeps ``--lf`` rerunning the benchmark of a failed gate."""

    NAME = "rlbench-gates"

    def __init__(self, phase_of: PhaseOf) -> None:
        self.phase_of = phase_of

    # Registered in pytest_configure, after pytest's --lf plugin: this wrapper is outside its, so the
    # gates are added once --lf, -k and -m have chosen the benchmarks.
    @pytest.hookimpl(wrapper=True, tryfirst=True)
    def pytest_collection_modifyitems(
        self, config: pytest.Config, items: list[pytest.Item]
    ) -> Generator[None]:
        result = yield
        if needs_gates(config):
            items[:] = with_gates(items, gates_for(items, self.phase_of))
        return result

    def pytest_report_collectionfinish(self, config: pytest.Config, items: list[pytest.Item]) -> str | None:
        """Say at the start that saving a baseline on CPU workers times every phase three times (its gate
        times it twice more at the end), and on GPUs where short phases are timed again, so the session's
        longer run is no surprise."""
        opts = get_session(config).opts
        if opts.save_baseline is None or not any(isinstance(i, PhaseGate) for i in items):
            return None
        if opts.gpu:
            return (
                f"rlbench: saving a baseline: where every phase takes under {GPU_SIDE_BY_SIDE_MAX_ROUND_S:g} s a "
                f"round (a small model's, which wait on the host), they are timed again side by side at the end "
                f"of the session ({side_by_side_passes(gpu=True)} passes)"
            )
        return (
            f"rlbench: saving a baseline: each phase is timed three times, by its benchmark and twice more at "
            f"the end of the session (all kept in {opts.save_baseline.name}; a gate reads the median block)"
        )

    @pytest.hookimpl(trylast=True)  # after pytest's own cache plugin wrote this session's failures
    def pytest_sessionfinish(self, session: pytest.Session) -> None:
        """Each gate still failed in pytest's cache keeps its benchmark there too: ``--lf`` then reruns
        the benchmark (which passed: it only timed) and with it the gate, even where ``-x`` stopped
        before the gate ran again."""
        cache = getattr(session.config, "cache", None)
        if cache is None:
            return
        last_failed = dict(cache.get("cache/lastfailed", {}))
        benches = {b: True for g in last_failed if (b := bench_id(g)) is not None and b not in last_failed}
        if benches:
            cache.set("cache/lastfailed", {**last_failed, **benches})
