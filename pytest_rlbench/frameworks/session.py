"""The end of a session that ran several frameworks.

Each ``--rl-trainer`` framework gets its own ``BenchRecorder`` (``pytest_rlbench.session.recorder.Recorders``),
so its phases, metrics and run description make a record of their own (a record is one framework's
run: its provenance names it).

At the end every framework that measured something is compared with every baseline and saved on its
own: the first framework's record keeps the ``--rl-save-baseline`` path and name, each further one
goes beside it as ``<stem>-<framework><suffix>`` (``base-trl.json``, record ``base-trl``). The JSON
report keeps the first framework's report at its top level and adds ``"frameworks"``: each
framework's report by ``--rl-trainer`` name; "passed" covers them all. The chart draws the first.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from pytest_rlbench.reports.json_report import build_report
from pytest_rlbench.session.bench import complete_context
from pytest_rlbench.session.recorder import RECORDERS_KEY, SessionOutcome

if TYPE_CHECKING:
    from pytest_rlbench.options.parsed import RLBenchOptions
    from pytest_rlbench.session.fixtures import RLBenchSession

def framework_path(path: Path, framework: str, first: bool) -> Path:
    """Where a framework's record is saved: ``path`` for the first framework, else beside it."""
    return path if first else path.with_name(f"{path.stem}-{framework}{path.suffix}")


def extra_outputs(opts: RLBenchOptions) -> dict[str, Path]:
    """The further frameworks' baseline files (for the start-up check that no two outputs clash)."""
    if opts.save_baseline is None:
        return {}
    return {f"--rl-save-baseline for {key}": framework_path(opts.save_baseline, key, False) for key in opts.trainers[1:]}


def _finish_one(
    config: pytest.Config, state: RLBenchSession, key: str, report: Path | None, update_report: Any, incomplete: str | None
) -> SessionOutcome:
    opts = state.opts
    recorder = config.stash[RECORDERS_KEY].by_framework[key]
    complete_context(recorder, state)
    save = framework_path(opts.save_baseline, key, key == opts.trainers[0]) if opts.save_baseline else None
    return recorder.finish(
        state.baseline_records,
        opts.tolerance,
        report,
        save,
        update_record=lambda record: config.hook.pytest_rlbench_update_run_record(config=config, record=record),
        update_report=update_report,
        incomplete=incomplete,
    )


def finish_frameworks(config: pytest.Config, state: RLBenchSession, incomplete: str | None) -> SessionOutcome | None:
    """Compare, report and save every framework that measured something (None when none did); the
    first one's outcome carries the others' (``SessionOutcome.others``) and all files written."""
    measured = [key for key, r in config.stash[RECORDERS_KEY].by_framework.items() if r.measured_anything]
    if not measured:
        return None
    others = [_finish_one(config, state, key, None, None, incomplete) for key in measured[1:]]

    def update_report(report: dict[str, Any]) -> None:
        if others:
            own = {k: v for k, v in report.items() if k != "format_version"}
            subs = {key: _sub_report(o, incomplete) for key, o in zip(measured[1:], others, strict=True)}
            report["frameworks"] = {measured[0]: own, **subs}
            report["passed"] = report["passed"] and all(sub["passed"] for sub in subs.values())
        config.hook.pytest_rlbench_update_report(config=config, report=report)

    main = _finish_one(config, state, measured[0], state.opts.report, update_report, incomplete)
    main.others = others
    for o in others:
        main.written += o.written
        main.problems += o.problems
        main.write_failed = main.write_failed or o.write_failed
    return main


def _sub_report(outcome: SessionOutcome, incomplete: str | None) -> dict[str, Any]:
    """One further framework's report (the findings on the baselines are the first one's)."""
    report = build_report(outcome.run, outcome.results, (), {"step_breakdown": outcome.step_breakdown})
    report.pop("format_version")
    report["passed"] = report["passed"] and incomplete is None
    return report
