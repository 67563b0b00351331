"""The rollout panel: each --rl-rollout engine timed and judged on the same prompts, seed and weights.

The first engine is the session's (it trains, and the ``gen`` phase's figures are its); each further
one is built beside it in every worker (``GRPOTrainer.generate_with``). A panel round is VERL's gen
for that engine: the actor's weights into it, then rollout.n responses to the session's first prompts,
timed with ``trainer.timing.device_clock`` as every phase is. Each engine's figures are recorded as
the run's metrics under ids of their own, never over the ``gen`` phase:

    rollout_panel/<engine>/tokens_per_s           response tokens per second over all workers, per round
    rollout_panel/<engine>/<fidelity figure>      trainer/algorithms/fidelity.py's figures, from the
                                                  trainer's old_log_prob of that engine's responses

and the record's ``config.settings["rollout_panel"]`` lists the engines in the order they ran.
"""

from __future__ import annotations

import dataclasses
import statistics
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from pytest_rlbench.records.metrics import PANEL, PANEL_FIGURES, TOKENS_PER_S, panel_metric
from pytest_rlbench.session import round_timer
from pytest_rlbench.session.progress import Progress

if TYPE_CHECKING:
    from pytest_rlbench.session.recorder import BenchRecorder
    from trainer.batch import Batch
    from trainer.config import Config
    from trainer.data.loader import PromptBatch
    from trainer.driver.grpo_trainer import GRPOTrainer


def time_rounds(fn: Callable[[], Any], warmup: int, rounds: int, progress: Progress, name: str) -> tuple[list[float], Any]:
    """Each timed round's seconds after ``warmup`` untimed rounds, by the hand-timed loop ``rl_bench``
    uses too (``pytest_rlbench.session.round_timer``), and the last round's result."""
    with progress.stage(name, warmup + rounds) as stage:
        samples, results = round_timer.time_rounds(fn, warmup, rounds, stage)
    return samples, results[-1]


def engine_round(trainer: GRPOTrainer, engine: str, prompts: PromptBatch) -> Callable[[], Batch]:
    """One panel round of ``engine``: the session's own reshard and generate_sequences when it is the
    session's engine, else ``generate_with`` (which syncs that engine from the actor first). Each
    engine's start-up checks ran with the session's (``check_panel_engines``)."""
    cfg = trainer.cfg
    if engine == cfg.actor_rollout_ref.rollout.name:

        def session_gen() -> Batch:
            trainer.reshard()
            return trainer.generate_sequences(prompts)

        return session_gen
    return lambda: trainer.generate_with(engine, prompts)


def check_panel_engine(cfg: Config, engine: str) -> None:
    """The start-up checks of ``engine`` as a panel engine: the config validated with it in the session
    engine's place (``trainer.config.validate``: its name, and its class's own ``check_config``, e.g.
    vLLM installed); raises ConfigError naming the problem."""
    from trainer.config import validate

    arr = cfg.actor_rollout_ref
    rollout = dataclasses.replace(arr.rollout, name=engine)
    validate(dataclasses.replace(cfg, actor_rollout_ref=dataclasses.replace(arr, rollout=rollout)))


def check_panel_engines(cfg: Config, engines: Sequence[str]) -> None:
    """``check_panel_engine`` for each further --rl-rollout engine, at start-up (before any work)."""
    for engine in engines:
        if engine != cfg.actor_rollout_ref.rollout.name:
            check_panel_engine(cfg, engine)


def batch_fidelity(trainer: GRPOTrainer, batch: Batch) -> dict[str, float]:
    """The rollout_fidelity/* figures of ``batch`` against the trainer's old_log_prob of it, by the
    step's own path (trainer/driver/step_figures.py), keyed by the figure's name without its prefix."""
    from trainer.algorithms.fidelity import rollout_fidelity

    if batch.rollout_log_probs is None:
        return {}
    old = trainer.compute_old_log_prob(batch)
    figures = rollout_fidelity(old, batch.rollout_log_probs, batch.response_mask)
    return {name.partition("/")[2]: value for name, value in figures.items()}


def record_panel_engine(
    recorder: BenchRecorder, engine: str, seconds: list[float], response_tokens: int, fidelity: Mapping[str, float]
) -> dict[str, float]:
    """Record one engine's rounds (tokens/s per round) and fidelity figures as the run's metrics, and
    the engine in the run config's panel list; returns the figures recorded (median tokens/s)."""
    if recorder.context.config is None:
        raise RuntimeError("the run's config was never described: the rl_trainer fixture did not run")
    figures = {TOKENS_PER_S: [response_tokens / s for s in seconds], **{k: [v] for k, v in fidelity.items()}}
    for figure, values in figures.items():
        unit, higher_is_better = PANEL_FIGURES.get(figure, ("", False))
        recorder.add_metric(panel_metric(engine, figure), values, unit, higher_is_better)
    listed = recorder.context.config.settings.setdefault(PANEL, [])
    if engine not in listed:
        listed.append(engine)
    return {TOKENS_PER_S: statistics.median(figures[TOKENS_PER_S]), **fidelity}
