"""The benchmark fixtures: a warmed-up batch and ``rl_bench`` (the trainer under test is
``pytest_rlbench/frameworks/fixture.py``'s ``rl_trainer``), and how a run is described.

``rl_bench`` is pytest-benchmark's ``benchmark`` in pedantic mode (fixed rounds after warm-up
rounds, one call per round) whose timer is ``trainer.timing.device_clock``: the device is drained
whenever the clock is read, so a round's time is the phase's wall time including its asynchronous
GPU work, and pytest-benchmark's statistics are the figures compared. Each test's rounds are recorded
under the phase key of its ``rl_phase`` marker for the session's comparison with baselines; the phase
is judged once the session's other phases are timed too, by the gate test made for the benchmark
(``pytest_rlbench.session.gate_items``), which fails with the verdict's message on a regression.
"""

from __future__ import annotations

import dataclasses
import math
import os
import statistics
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import pytest

from pytest_rlbench.markers import missing_phase_mark, phase_of
from pytest_rlbench.records.record import Hardware, ModelArch, RunConfig, TokenCounts
from pytest_rlbench.records.workload import run_workload
from pytest_rlbench.records.workload_format import Workload
from pytest_rlbench.records.workload_replay import GPUS_PER_SHARE, SLOWEST_OF
from pytest_rlbench.session.cluster import ClusterInfo
from pytest_rlbench.session.fixtures import RLBenchSession, get_session
from pytest_rlbench.session.gpu_watch import GpuWatch, machine_label
from pytest_rlbench.session.progress import Progress, Stage, round_label
from pytest_rlbench.session.recorder import BenchRecorder, get_recorder, local_hardware, mismatch_failure
from pytest_rlbench.session.resources import RLModel
from pytest_rlbench.session.round_timer import time_rounds
from pytest_rlbench.verdict.judge import (
    DEVICE_KINDS,
    FLOPS,
    GPU_HOST_DRIFT_LIMIT,
    OPS,
    ROUND_WORK,
    WORK,
    work_metric,
)
from pytest_rlbench.verdict.machine_load import MachineWatch
from pytest_rlbench.verdict.noise import GPU_SIDE_BY_SIDE_MAX_ROUND_S
from pytest_rlbench.verdict.retiming import reads_side_by_side, side_by_side_rounds

if TYPE_CHECKING:
    from trainer.batch import Batch
    from trainer.config import Config
    from trainer.data.loader import PromptBatch
    from trainer.driver.grpo_trainer import GRPOTrainer, StepResult
    from trainer.driver.step_figures import BatchTokens
    from trainer.work_counts import WorkCounts

# Per benchmark node id, on CPU workers only: its phase's rounds timed again, as its benchmark timed
# them (a gate asks for them, pytest_rlbench.session.gate_items).
RETIMERS_KEY = pytest.StashKey[dict[str, Callable[[], list[float]]]]()
# One round of a benchmark's phase, by its node id (CPU workers, and on GPUs the phases that wait on the
# host): a side-by-side pass's (gate_items).
ROUND_TIMERS_KEY = pytest.StashKey[dict[str, Callable[[], float]]]()


class RoundWatch(Protocol):
    """What the machine did beside a phase's rounds, for its verdict: started before the first round,
    told where each round begins and ends, stopped after the last; its run metrics then
    (``MachineWatch``: the CPU others used; ``GpuWatch``: the GPUs' clocks, power and processes)."""

    def start(self) -> None: ...
    def mark_start(self) -> None: ...
    def mark_end(self) -> None: ...
    def stop(self) -> None: ...
    def metrics(self, phase: str, warmup: int) -> list[tuple[str, list[float], str]]: ...


def token_counts(tokens: BatchTokens | TokenCounts | None) -> TokenCounts | None:
    """The record's TokenCounts of what the trainer counted (trainer.driver.step_figures.BatchTokens)."""
    if tokens is None or isinstance(tokens, TokenCounts):
        return tokens
    return TokenCounts(**dataclasses.asdict(tokens))


def saved_bytes(result: Any) -> float | None:
    """The bytes a save wrote, from the checkpoint directory it returned; None where it returned no such
    directory (another framework's save)."""
    from trainer.driver.checkpoint import MANIFEST, checkpoint_bytes  # imports torch: only here

    if not isinstance(result, str | Path) or not (Path(result) / MANIFEST).is_file():
        return None
    return float(checkpoint_bytes(result))


def describe_hardware(cluster: ClusterInfo, cfg: Config, workers: list[dict[str, Any]]) -> Hardware:
    on_gpu = cfg.trainer.device == "cuda"
    # The workers' own view names the GPU exactly ("NVIDIA H100 80GB HBM3"); Ray's is coarser ("H100").
    names = sorted({w.get("device_name") for w in workers if w.get("device_name") not in (None, "cpu")})
    gpu_model = names[0] if names else (cluster.gpu_models[0] if cluster.gpu_models else None)
    return Hardware(
        device="gpu" if on_gpu else "cpu",
        nodes=cfg.trainer.nnodes,
        world_size=cfg.world_size,
        gpus_per_node=cfg.trainer.n_gpus_per_node if on_gpu else 0,
        gpu_model=gpu_model if on_gpu else None,
        cpu_model=cluster.cpu_model,
        cpus_per_node=int(min(n.cpus for n in cluster.nodes)) if cluster.nodes else None,
        machine=machine_label([w["gpu_uuid"] for w in workers if w.get("gpu_uuid")]) if on_gpu else None,
    )


def describe_model(model: RLModel, cfg: Config) -> ModelArch:
    from trainer.models.presets import resolve_dtype

    dtype = resolve_dtype(cfg.actor_rollout_ref.actor.fsdp_config.model_dtype, cfg.trainer.device)
    arch = model.spec.arch.to_dict()
    return ModelArch(
        name=model.name_or_path, model_type=model.spec.model_type, dtype=str(dtype).removeprefix("torch."), **arch
    )


def dataset_label(cfg: Config) -> str:
    """The data set as a record names it: the user's file, or the synthetic set by what defines it
    (not by the session's temp path, which differs in every session)."""
    from pytest_rlbench.records.workload import is_synthetic

    if not is_synthetic(cfg.data):
        return cfg.data.train_files[0]
    data = cfg.data
    return (
        f"synthetic (size {data.synthetic_size}, difficulty {data.synthetic_difficulty}, seed {data.seed}, "
        f"prompt length {data.synthetic_prompt_length or 'natural'})"
    )


def describe_config(cfg: Config, rounds: int | None = None, warmup_rounds: int | None = None) -> RunConfig:
    """The run's config as a record states it; ``rounds`` and ``warmup_rounds`` (the session's options,
    where known) say whether a phase's figure includes its first call's one-time costs."""
    from trainer.rollout import engine_class
    from trainer.rollout.tensor_parallel import decode_group_size

    arr = cfg.actor_rollout_ref
    sizes_by_fraction = engine_class(arr.rollout.name).uses_memory_fraction
    return RunConfig(
        algorithm=cfg.algorithm.adv_estimator,
        train_batch_size=cfg.data.train_batch_size,
        rollout_n=arr.rollout.n,
        max_prompt_length=cfg.data.max_prompt_length,
        max_response_length=cfg.data.max_response_length,
        ppo_epochs=arr.actor.ppo_epochs,
        # rollout_tp: the workers that decoded one share together (tensor-parallel), where more than one
        parallelism={"dp": cfg.world_size, **({"rollout_tp": tp} if (tp := decode_group_size(cfg)) > 1 else {})},
        settings={
            "rollout": arr.rollout.name,
            "ignore_eos": arr.rollout.ignore_eos,
            "temperature": arr.rollout.temperature,
            "strategy": arr.actor.strategy,
            "ppo_mini_batch_size": arr.actor.ppo_mini_batch_size,
            "use_kl_loss": arr.actor.use_kl_loss,
            "use_dynamic_bsz": arr.actor.use_dynamic_bsz,
            "gradient_checkpointing": arr.model.enable_gradient_checkpointing,
            **({"gradient_checkpointing_policy": arr.model.gradient_checkpointing_policy}
               if arr.model.enable_gradient_checkpointing else {}),
            **({"gradient_checkpointing_layers": arr.model.gradient_checkpointing_layers}
               if arr.model.enable_gradient_checkpointing and arr.model.gradient_checkpointing_layers else {}),
            # kernels and layouts that change how, not what, the step computes: recorded where on
            **({"use_liger": True} if arr.model.use_liger else {}),
            **({"use_remove_padding": True} if arr.model.use_remove_padding else {}),
            # generated the slowest of this many shares of the drawn lengths (a replay's; the gate reads it)
            **({SLOWEST_OF: arr.rollout.target_lengths.slowest_of} if arr.rollout.target_lengths.slowest_of else {}),
            **({GPUS_PER_SHARE: arr.rollout.target_lengths.gpus_per_share}
               if arr.rollout.target_lengths.slowest_of and arr.rollout.target_lengths.gpus_per_share > 1 else {}),
            "param_offload": arr.actor.fsdp_config.param_offload,
            "optimizer_offload": arr.actor.fsdp_config.optimizer_offload,
            "dataset": dataset_label(cfg),
            **({"rounds": rounds} if rounds is not None else {}),
            **({"warmup_rounds": warmup_rounds} if warmup_rounds is not None else {}),
            # what sizes an engine that reserves a memory fraction (vLLM; on CPU a fraction of host memory)
            **({"gpu_memory_utilization": arr.rollout.gpu_memory_utilization} if sizes_by_fraction else {}),
        },
    )


def describe_workload(cfg: Config, model: ModelArch) -> Workload:
    """The run's own workload, every value as configured (pytest_rlbench.records.workload.run_workload)."""
    from trainer.rollout.tensor_parallel import decode_group_size  # imports torch: not at configure

    return run_workload(cfg, model, cfg.world_size, rollout_tp=decode_group_size(cfg))


def complete_context(recorder: BenchRecorder, state: RLBenchSession) -> None:
    """Describe what the trainer fixtures did not (a run of rl_bench alone): this machine's CPU, and the
    model and config the session's options name."""
    ctx = recorder.context
    if ctx.hardware is None:  # no cluster was used: a CPU run on this machine
        from pytest_rlbench.session.cluster import cpu_model

        ctx.hardware = local_hardware(cpu_model(), os.cpu_count())
    if ctx.model is None:
        ctx.model = describe_model(state.model(), state.trainer_config())
    if ctx.config is None:
        ctx.config = describe_config(state.trainer_config(), *state.rounds())


# ----------------------------------------------------------------------------- fixtures
# rl_trainer, one framework at a time, is pytest_rlbench/frameworks/fixture.py's.


@dataclass
class WarmStep:
    """The prompts of one full training step run before any benchmark, and the batch it produced
    (every phase's inputs filled in: responses, scores, log-probs, advantages)."""

    prompts: PromptBatch
    batch: Batch
    result: StepResult
    tokens: TokenCounts


@pytest.fixture(scope="session")
def rl_prompts(rl_trainer: GRPOTrainer) -> PromptBatch:
    """The session's first batch of prompts: what the generation benchmarks sample from and what the
    warm-up step (``rl_batch``) trains on. Generation alone (``-k gen``) needs no training step."""
    return next(rl_trainer.loader)


@pytest.fixture(scope="session")
def rl_batch(pytestconfig: pytest.Config, rl_trainer: GRPOTrainer, rl_prompts: PromptBatch) -> WarmStep:
    """One untimed training step (warm-up: kernels, caches, allocator) and the batch it produced."""
    prompts = rl_prompts
    with get_session(pytestconfig).progress().stage("warm-up: one untimed training step"):
        result = rl_trainer.train_step(prompts)
    tokens = token_counts(result.tokens)
    get_recorder(pytestconfig).context.tokens = tokens
    return WarmStep(prompts, rl_trainer.last_batch, result, tokens)


class PhaseBench:
    """Times one phase: ``rl_bench(fn, setup=None, tokens=None, breakdown=None)`` runs warm-up rounds,
    then timed rounds through pytest-benchmark with the device-synchronised clock; returns the last
    round's result.

    tokens: the work a round does, when it is not the warm step's batch: token counts, or a function
    of a round's result that returns them (``rl_trainer.batch_tokens`` for a generation, ``lambda r:
    r.tokens`` for a whole step); a function is asked for every timed round, and each round's figures
    are then taken over its own work.
    breakdown: a function of each timed round's result that returns its seconds by phase key (a whole
    step's ``result.timing_s``); the report keeps one breakdown per round.
    A round that returns a StepResult also hands its figures (``result.metrics``, the rollout_fidelity/*
    ones among them) to the recorder; one above ``max_mismatch`` (--rl-max-mismatch) fails the test.
    With ``watch_machine`` (the embedded Ray: ``watches_machine``) the CPU that other processes used and the
    hypervisor took beside the rounds is recorded too (``machine/other_cores/<phase>`` and
    ``machine/steal_cores/<phase>``, pytest_rlbench.verdict.machine_load): what tells CPU contention apart.
    With ``keep_retimer`` (CPU workers) how to time the phase again is kept for its gate
    (``RETIMERS_KEY``); on GPUs no gate times a phase's rounds again. A phase that ``keeps_round_timer``
    says so of (its key and median round) keeps how to time one more round (``ROUND_TIMERS_KEY``) for the
    session's side-by-side passes (``side_by_side_rule``): none where the session makes no gate, every
    phase on CPU workers, on GPUs those short enough to wait on the host; a GPU phase of seconds keeps
    nothing a round's call holds alive.
    With ``count_work`` (``work_counter``: the trainer's, else this process's) one more round, untimed,
    counts the work the phase dispatched (``work/ops/<phase>``, ``work/flops/<phase>``)."""

    def __init__(
        self,
        benchmark: Any,
        recorder: BenchRecorder,
        item: pytest.Item,
        rounds: int,
        warmup: int,
        max_mismatch: float | None = None,
        progress: Progress | None = None,
        watch_machine: bool = False,
        keep_retimer: bool = False,
        keeps_round_timer: Callable[[str, float], bool] | None = None,
        watch_gpus: bool = False,
        count_work: Callable[[Callable[[], Any]], tuple[Any, WorkCounts]] | None = None,
    ) -> None:
        self.count_work = count_work  # counts the work of one untimed round (None: not counted)
        self.max_mismatch = max_mismatch
        self.watch_machine = watch_machine  # record the CPU used beside the rounds
        self.keep_retimer = keep_retimer
        self.keeps_round_timer = keeps_round_timer  # (phase, median round s) -> kept for side by side
        self.watch_gpus = watch_gpus  # read the workers' GPUs' clocks each round (NVML)
        self.benchmark = benchmark
        self.progress = progress or Progress(enabled=False, terminal=False)
        self.recorder = recorder
        self.item = item
        self.rounds = rounds
        self.warmup = warmup
        self.samples: list[float] = []

    def _watches(self) -> list[RoundWatch]:
        """The watches of this phase's rounds: the CPU beside them, the GPUs the workers run on."""
        watches: list[RoundWatch] = [MachineWatch()] if self.watch_machine else []
        gpus = self.recorder.context.gpus if self.watch_gpus else []  # set where the trainer was made
        if gpus:
            watches.append(GpuWatch([u for u, _ in gpus], {p for _, p in gpus}))
        return watches

    @property
    def phase(self) -> str:
        phase = phase_of(self.item)  # its key was checked at collection (pytest_rlbench.markers)
        if phase is None:
            raise pytest.UsageError(missing_phase_mark(self.item))
        return phase

    def __call__(
        self,
        fn: Callable[[], Any],
        setup: Callable[[], Any] | None = None,
        tokens: BatchTokens | TokenCounts | Callable[[Any], BatchTokens | TokenCounts] | None = None,
        breakdown: Callable[[Any], dict[str, float]] | None = None,
    ) -> Any:
        from trainer.timing import device_clock

        phase = self.phase
        warmup, rounds = (0, 1) if self.benchmark.disabled else (self.warmup, self.rounds)
        watches = self._watches()
        results: list[Any] = []
        saves: list[float | None] = []  # each round's checkpoint bytes, read after it, outside its time

        def prepare() -> None:
            stage.step(round_label(len(results), warmup, rounds))  # outside the timed call
            if setup is not None:
                setup()
            device_clock()  # drain what setup queued before the round's clock starts
            for watch in watches:
                watch.mark_start()

        def round_() -> Any:
            results.append(fn())
            return results[-1]

        def finish_round() -> None:
            for watch in watches:
                watch.mark_end()
            if phase == "save_checkpoint":
                saves.append(saved_bytes(results[-1]))
            stage.done()

        with self.progress.stage(phase, warmup + rounds) as stage:
            for watch in watches:
                watch.start()
            if self.benchmark.disabled:  # --benchmark-disable: pytest-benchmark times nothing; time it here
                self.samples, results = time_rounds(fn, 0, 1, stage, setup)
            else:
                self.benchmark._timer = device_clock  # pytest-benchmark reads the clock around each call
                self.benchmark.pedantic(
                    round_, setup=prepare, teardown=finish_round, rounds=self.rounds, warmup_rounds=self.warmup
                )
                self.samples = list(self.benchmark.stats.stats.data)
            for watch in watches:
                watch.stop()
        result = results[-1]
        timed = results[-len(self.samples) :]  # warm-up rounds come first
        per_round = None
        if callable(tokens):  # each round's own work: a generation's responses, a step's new batch
            per_round = [token_counts(tokens(r)) for r in timed]
            counts = per_round[-1]
            self.recorder.record(phase, self.samples, self.item.nodeid, counts, round_tokens=per_round)
        else:
            counts = token_counts(tokens)
            self.recorder.record(phase, self.samples, self.item.nodeid, counts)
        if breakdown is not None:
            self.recorder.add_step_breakdown([breakdown(r) for r in timed], self.item.nodeid, per_round)
        for watch in watches:
            for metric, values, unit in watch.metrics(phase, warmup):
                self.recorder.add_metric(metric, values, unit, higher_is_better=False)
        if self.count_work is not None:
            self._count(phase, fn, setup, tokens if callable(tokens) else None)
        if self.keep_retimer:
            self._keep_retimer(phase, fn, setup, warmup, rounds)
        if self.samples and self.keeps_round_timer is not None and self.keeps_round_timer(
            phase, statistics.median(self.samples)
        ):
            self._keep_round_timer(phase, fn, setup)
        if phase == "save_checkpoint":  # a save benchmarked on its own: its checkpoint's bytes, as a step reports them
            read = saves[-len(self.samples):] if len(saves) >= len(self.samples) else [saved_bytes(r) for r in timed]
            self.recorder.add_checkpoint_bytes([size for size in read if size is not None])
        step_figures = [r.metrics for r in timed if isinstance(getattr(r, "metrics", None), dict)]
        self.recorder.add_step_metrics(step_figures)
        problem = mismatch_failure(step_figures, self.max_mismatch)
        if problem is not None:
            pytest.fail(problem, pytrace=False)
        self._describe(phase, counts)
        return result

    def _count(
        self, phase: str, fn: Callable[[], Any], setup: Callable[[], Any] | None,
        tokens: Callable[[Any], BatchTokens | TokenCounts] | None,
    ) -> None:
        """One more round, untimed, under the work counters (``trainer.work_counts``): the ATen ops
        and FLOPs the phase dispatched, recorded as ``work/ops/<phase>`` and ``work/flops/<phase>``,
        and on GPUs what it asked of them (``work/launches/<phase>``, ... : judge.DEVICE_KINDS)
        (evidence for its verdict: ``pytest_rlbench.verdict.judge.WorkEvidence``). A phase that
        dispatched no op (a sleep) records nothing. A phase whose rounds do work of their own (``tokens``
        a function: a generation, the step) records what the counted round did too
        (``work/response_tokens/<phase>``, ``work/decode_steps/<phase>``: judge.ROUND_WORK): counts of
        rounds that sampled other lengths cannot decide."""
        assert self.count_work is not None
        with self.progress.stage(f"{phase}: counting its work (untimed)", 1) as stage:
            if setup is not None:
                setup()
            result, work = self.count_work(fn)
            stage.done()
        done = token_counts(tokens(result)) if tokens is not None and work.ops else None
        for kind in ROUND_WORK if done is not None else ():
            value = getattr(done, kind)
            if value is not None:
                unit = ROUND_WORK[kind][1]
                self.recorder.add_metric(work_metric(kind, phase), [value], unit, higher_is_better=False)
        if work.ops:
            self.recorder.add_metric(work_metric(OPS, phase), [work.ops], "ops", higher_is_better=False)
            self.recorder.add_metric(work_metric(FLOPS, phase), [work.flops], "FLOP", higher_is_better=False)
        if work.on_device:  # what the phase asked of the GPU (a CPU run has no such counts)
            for kind in DEVICE_KINDS:
                self.recorder.add_metric(work_metric(kind, phase), [getattr(work, kind)], "", higher_is_better=False)

    def _keep_retimer(
        self, phase: str, fn: Callable[[], Any], setup: Callable[[], Any] | None, warmup: int, rounds: int
    ) -> None:
        """Keep how to time this phase again (the same call, set-up and rounds) for its gate."""

        def retime() -> list[float]:
            with self.progress.stage(f"{phase}: timed again", warmup + rounds) as stage:
                return time_rounds(fn, warmup, rounds, stage, setup)[0]

        self.item.config.stash.setdefault(RETIMERS_KEY, {})[self.item.nodeid] = retime

    def _keep_round_timer(self, phase: str, fn: Callable[[], Any], setup: Callable[[], Any] | None) -> None:
        """Keep how to time one round of this phase, for the session's side-by-side passes."""

        def one_round() -> float:  # a round of a side-by-side pass (gate_items, which shows its progress)
            return time_rounds(fn, 0, 1, Stage(None, phase), setup)[0][0]

        self.item.config.stash.setdefault(ROUND_TIMERS_KEY, {})[self.item.nodeid] = one_round

    def _describe(self, phase: str, counts: TokenCounts | None) -> None:
        """Token counts and derived figures of this phase in pytest-benchmark's extra_info."""
        info = self.benchmark.extra_info
        info["phase"] = phase
        info["rounds_s"] = self.samples
        if counts is not None:
            info["tokens"] = {"prompt": counts.prompt_tokens, "response": counts.response_tokens}
        info.update(self.recorder.phase_figures(phase))


@pytest.fixture
def rl_bench(request: pytest.FixtureRequest, benchmark: Any, pytestconfig: pytest.Config) -> PhaseBench:
    """Time a phase (see PhaseBench); the test must carry ``@pytest.mark.rl_phase(KEY)``."""
    state, recorder = get_session(pytestconfig), get_recorder(pytestconfig)
    opts = state.opts
    return PhaseBench(
        benchmark, recorder, request.node, opts.rounds, opts.warmup_rounds, opts.max_mismatch,
        state.progress(), watch_machine=watches_machine(opts), keep_retimer=not opts.gpu,
        keeps_round_timer=side_by_side_rule(state),
        watch_gpus=opts.gpu,
        count_work=work_counter(request) if counts_matter(state) else None,
    )


def side_by_side_limit(gpu: bool) -> float:
    """The longest median round (seconds) of a phase timed in the session's side-by-side passes: any on
    CPU workers; on GPUs ``noise.GPU_SIDE_BY_SIDE_MAX_ROUND_S``, phases that wait on the host."""
    return GPU_SIDE_BY_SIDE_MAX_ROUND_S if gpu else math.inf


def side_by_side_rule(state: RLBenchSession) -> Callable[[str, float], bool]:
    """Which phases keep a round timer for the session's side-by-side passes, from the phase's key and
    its median round: none where the session makes no gate (it neither gates nor saves a baseline);
    those under ``side_by_side_limit``; and on GPUs also a phase that a GPU baseline of the session timed
    side by side, up to ``GPU_HOST_DRIFT_LIMIT`` times its rounds there (slower fails whatever its peers
    did), so that a phase the change or a slow host pushed past the limit does not turn the passes off
    (``gate_items.side_by_side_benches``: on GPUs every phase or none)."""
    opts = state.opts
    if not (state.gating or opts.save_baseline is not None):
        return lambda phase, median: False
    limit = side_by_side_limit(opts.gpu)
    theirs: dict[str, float] = {}  # a phase's longest median round side by side in a GPU baseline
    for record in (b for b in state.baseline_records if opts.gpu and reads_side_by_side(b, gpu=True)):
        for phase, rounds in side_by_side_rounds(record).items():
            theirs[phase] = max(theirs.get(phase, 0.0), statistics.median(rounds))
    return lambda phase, median: median < max(limit, GPU_HOST_DRIFT_LIMIT * theirs.get(phase, 0.0))


def watches_machine(opts: Any) -> bool:
    """Whether a phase records the CPU used beside its rounds: wherever the session's processes are this
    machine's (the embedded Ray), on CPU workers and on GPUs alike. On GPUs the host still launches the
    kernels and runs reward and adv: four gate16x8 sessions sharing one host's CPUs ran reward at 89-238
    ms against 42 ms alone and failed unchanged code, without a word on the contention."""
    return bool(opts.embedded)


def counts_matter(state: RLBenchSession) -> bool:
    """Whether a phase's work is counted (one more round, untimed): where a verdict can use it. On CPU
    workers, when saving or gating against a baseline; on GPUs, when saving one, or gating against one
    that has counts (a session's, not a published run's), and never in a replay (--rl-workload): the
    extra round of a long GPU phase (a 27k-token generation, millions of kernels for the profiler) is
    not paid for counts no verdict reads."""
    opts = state.opts
    if not opts.gpu:
        return bool(opts.save_baseline or opts.baselines)
    if getattr(opts, "workload_record", None) is not None:
        return False
    has_counts = any(any(m.startswith(f"{WORK}/") for m in record.metrics) for record in state.baseline_records)
    return bool(opts.save_baseline) or (state.gating and has_counts)


def work_counter(request: pytest.FixtureRequest) -> Callable[[Callable[[], Any]], tuple[Any, WorkCounts]]:
    """How the test's phase counts its work: the trainer's own ``count_work`` where the test uses one
    that has it (the bundled trainer counts its workers too), else what this process dispatches."""
    from trainer.work_counts import count_work

    trainer = request.getfixturevalue("rl_trainer") if "rl_trainer" in request.fixturenames else None
    return getattr(trainer, "count_work", None) or count_work

