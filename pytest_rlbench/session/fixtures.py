"""The session's resources (cluster, trainer config, model, data set) and the fixtures that hand
them to tests.

``RLBenchSession`` builds each resource once, on first use, and turns every way it can fail into a
``SetupError`` whose message names the option, file or path at fault. The plugin asks it for the
resources the collected tests use before the first test runs (``prepare``), so a bad cluster, model
or data set ends the session at once instead of failing test after test; the fixtures then only
return what is already built.
"""

from __future__ import annotations

import copy
import os
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from pytest_rlbench.options.parsed import RLBenchOptions
from pytest_rlbench.options.replay import session_replay_notes
from pytest_rlbench.options.trainer_config import build_trainer_config
from pytest_rlbench.records.baselines import PUBLISHED_BASELINES, load_baseline
from pytest_rlbench.records.record import BaselineError, RunRecord, record_from_dict
from pytest_rlbench.session.cluster import (
    ClusterError,
    ClusterInfo,
    RayConnection,
    check_cluster,
    precheck_embedded,
)
from pytest_rlbench.session.progress import Progress, progress_for
from pytest_rlbench.session.resources import RLDataset, RLModel, SetupError, check_model_weights

if TYPE_CHECKING:
    from trainer.config import Config

# The fixtures this module provides, and the resources each one needs built before tests run.
# A fixture that depends on one of these (rl_trainer takes rl_cluster, ...) inherits its needs,
# because pytest lists a test's fixtures with all their dependencies.
FIXTURE_NEEDS: dict[str, tuple[str, ...]] = {
    "rl_cluster": ("cluster",),
    "rl_config": ("config",),
    "rl_model": ("model",),
    "rl_dataset": ("model", "config", "dataset"),
    "rl_trainer": ("model", "config", "dataset", "cluster"),
    "rl_prompts": ("model", "config", "dataset", "cluster"),
    "rl_batch": ("model", "config", "dataset", "cluster"),
    "rl_bench": ("model", "config"),
}


def rl_fixtures_used(items: Sequence[pytest.Item]) -> set[str]:
    """The plugin's fixtures that the selected tests use (with everything they depend on)."""
    used: set[str] = set()
    for item in items:
        used.update(name for name in getattr(item, "fixturenames", ()) if name in FIXTURE_NEEDS)
    return used


class RLBenchSession:
    """One benchmark session's resources, each built once on first use."""

    def __init__(self, config: pytest.Config, opts: RLBenchOptions) -> None:
        self.config = config
        self.opts = opts
        self.connection: RayConnection | None = None
        self._cluster: ClusterInfo | None = None
        self._trainer_config: Config | None = None
        self._provisional_config: Config | None = (
            None  # with --gpu alone, until the cluster gives the GPU count
        )
        self._names_checked = False  # the config's registry names (trainer_config)
        self._model: RLModel | None = None
        self._dataset: RLDataset | None = None
        self._workdir: Path | None = None
        self.replay_notes: list[str] = []  # --rl-workload: what was replayed and what was set on top
        self.config_notes: list[str] = []  # VERL keys set that change nothing here
        self.baseline_records: list[RunRecord] = []  # load_baselines
        self.gating = False  # whether a baseline can gate (load_baselines)

    # ------------------------------------------------------------------ start-up checks
    def prepare(self, fixturenames: set[str]) -> list[str]:
        """Build what tests using ``fixturenames`` need, cheapest first; return the resources built.

        Raises SetupError on the first resource that cannot be built."""
        needs = {need for name in fixturenames for need in FIXTURE_NEEDS.get(name, ())}
        ray = "starting Ray" if self.opts.embedded else "connecting to Ray"
        order = [
            ("model", "loading the model", self.model),
            ("dataset", "building the data set", self.dataset),
            ("config", "checking the trainer config", self.trainer_config),
            ("cluster", ray, self.cluster),
        ]
        steps = [(name, what, build) for name, what, build in order if name in needs]
        cfg = self._trainer_config or self._provisional_config
        if "dataset" in needs and cfg is not None:  # before the model and tokenizer load: against its rows
            try:
                self.check_sizes(cfg, self._rows_bound(cfg), None if self._trainer_config is None else -1)
            except SetupError:
                if self._rows_readable(cfg):
                    raise  # else the data set's own check names what is wrong with its rows first
        with self.progress().stage("set-up", len(steps)) as stage:
            for _, what, build in steps:
                stage.step(what)
                build()
                stage.done()
        return [name for name, _, _ in steps]

    def progress(self) -> Progress:
        """The session's progress bars (--rl-progress)."""
        return progress_for(self.config, self.opts.progress)

    # ------------------------------------------------------------------ resources
    def cluster(self) -> ClusterInfo:
        """Connect to (or start) Ray and check it has what the options ask for."""
        if self._cluster is not None:
            return self._cluster
        opts = self.opts
        nodes_source, gpus_source = opts.source_of("rl_nodes"), opts.source_of("rl_gpus_per_node")
        if opts.embedded:
            from pytest_rlbench.session.cluster import local_gpu_count

            visible = local_gpu_count() if opts.gpu else 0
            problem = precheck_embedded(
                opts.nodes, opts.gpu, opts.gpus_per_node, visible, nodes_source, gpus_source
            )
            if problem:
                raise SetupError(problem)
        try:
            num_cpus = self._embedded_cpus() if opts.embedded else None
            self.connection = RayConnection.open(
                opts.ray_address,
                num_cpus,
                opts.ray_address_source,
                opts.ray_timeout,
                opts.source_of("rl_ray_timeout"),
            )
            info = self.connection.describe()
        except ClusterError as exc:
            raise SetupError(str(exc)) from exc
        problem = check_cluster(info, opts.nodes, opts.gpu, opts.gpus_per_node, nodes_source, gpus_source)
        if problem:
            raise SetupError(problem)
        self._cluster = info
        return info

    def _embedded_cpus(self) -> int:
        # Every trainer worker holds one Ray CPU: a local Ray must have room for all of them even on
        # a machine with fewer cores (CPU workers per node come from trainer.n_gpus_per_node).
        workers = self.trainer_config().trainer.n_gpus_per_node if not self.opts.gpu else 1
        return max(os.cpu_count() or 1, workers)

    def workdir(self) -> Path:
        """The session's temporary directory for generated files (pytest's basetemp)."""
        if self._workdir is None:
            factory = getattr(self.config, "_tmp_path_factory", None)  # what tmp_path_factory returns
            self._workdir = (
                factory.mktemp("rlbench") if factory else Path(tempfile.mkdtemp(prefix="rlbench-"))
            )
        return self._workdir

    def build_config(self) -> None:
        """Build and check the trainer config at configure, so that a bad one is a usage error before
        anything starts: its values, the names it sets away from the defaults (an engine's own checks,
        vLLM installed among them, included; reading a registry imports torch, which a config of
        defaults leaves out) and its batch sizes, all of them together. With --gpu alone the cluster
        tells the GPU count: the checks run with one GPU per node standing in, the world size's one
        waits for the cluster, and ``trainer_config`` builds the config once the cluster is there."""
        from trainer.config import ConfigError, batch_size_problems, check_names_of, names_set

        provisional = self.opts.gpu and self.opts.gpus_per_node is None
        source = self.opts.source_of("rl_config")
        try:
            cfg = self._provisional_config_built() if provisional else self._built_config(gpus_per_node=None)
            check_names_of(cfg, names_set(cfg))  # the default names are valid: no registry read for them
            if self.opts.rollout_panel:
                from pytest_rlbench.session.rollout_panel import check_panel_engines

                check_panel_engines(cfg, self.opts.rollout_panel)
        except ConfigError as exc:
            raise pytest.UsageError(
                f"pytest-rlbench: the trainer config from the --rl-* options and {source} is invalid: {exc}"
            ) from None
        workers = None if provisional else cfg.world_size
        if batch_size_problems(cfg, workers=workers):  # with the data set's size where it is cheap to know
            try:
                self.check_sizes(cfg, self._rows_bound(cfg), workers)
            except SetupError as exc:
                raise pytest.UsageError(f"pytest-rlbench: {exc}") from None
        if provisional:
            self._provisional_config = cfg
        else:
            self._trainer_config = cfg

    def check_sizes(
        self, cfg: Config, prompts: int | None, workers: int | None = -1, usable: bool = False
    ) -> None:
        """Raise SetupError listing every batch-size relation ``cfg`` violates, with values that fit
        (trainer.config.batch_size_problems), against the data set's ``prompts`` (its usable prompts
        when ``usable``, else its rows, an upper bound; None: not known) and ``workers`` (-1: the
        config's world size; None: not known yet)."""
        from trainer.config import batch_size_problems

        unit = "usable prompt(s)" if usable else "row(s), at most one prompt each"
        sizes = batch_size_problems(cfg, prompts, self.dataset_source(cfg), workers, unit)
        if sizes:
            raise SetupError(f"{sizes.message()}\n(each is set with --rl-config KEY=VALUE)")

    def dataset_source(self, cfg: Config) -> str:
        """How messages name the data set: the option that gave it, or the synthetic set, and its path."""
        source = self.opts.source_of("rl_dataset") if self.opts.dataset else "the synthetic data set"
        return f"{source} at {cfg.data.train_files[0]!r}" if cfg.data.train_files else source

    def _rows_readable(self, cfg: Config) -> bool:
        """Whether the data set's rows hold what the trainer reads (the synthetic set's do)."""
        from trainer.data.validate import validate_parquet

        return self.opts.dataset is None or not validate_parquet(Path(cfg.data.train_files[0]), strict=False)

    def _rows_bound(self, cfg: Config) -> int | None:
        """The data set's rows, read cheaply (the synthetic set's size, a parquet file's footer), an upper
        bound of its usable prompts; None where the file cannot tell (its check names the problem)."""
        if self.opts.dataset is None:
            return cfg.data.synthetic_size
        try:
            import pyarrow.parquet as pq

            return int(pq.ParquetFile(cfg.data.train_files[0]).metadata.num_rows)
        except Exception:  # noqa: BLE001  (not parquet, unreadable: the data set's own check says why)
            return None

    def _provisional_config_built(self) -> Config:
        """The config checked at configure with --gpu alone: one GPU per node stands in for the count
        the cluster gives later, or, for a config that needs more (a replayed workload that does not
        divide over one GPU: the 7B run's 32 sequences per GPU are 2 prompts, not 4 PPO mini-batches;
        a decode group of rollout.tensor_model_parallel_size GPUs), the fewest it holds on. The real
        count is checked once the cluster is there (``trainer_config``)."""
        from trainer.config import ConfigError

        try:
            cfg = self._built_config(gpus_per_node=None)
        except ConfigError as first:
            if self.opts.workload_record is None:
                raise
            for stand_in in (2, 4, 8):
                try:
                    return self._built_config(gpus_per_node=stand_in)
                except ConfigError:
                    continue
            raise first from None
        group = cfg.actor_rollout_ref.rollout.tensor_model_parallel_size
        if group > 1 and cfg.trainer.n_gpus_per_node % group:  # a decode group's GPUs stand in
            return self._built_config(gpus_per_node=group)
        return cfg

    def _built_config(self, gpus_per_node: int | None) -> Config:
        """The session's defaults (synthetic data file and checkpoint dir in the session's temp dir, the
        cluster's GPUs per node), the options and the --rl-config overrides; then the
        pytest_rlbench_update_config hook, whose changes are checked too. Names held in registries are
        checked by ``trainer_config`` (reading a registry imports torch: plain test runs skip it), the
        batch sizes by ``build_config`` and ``check_sizes``, with the data set's size."""
        from trainer.config import validate

        cfg = build_trainer_config(
            self.opts,
            gpus_per_node=gpus_per_node,
            workdir=self.workdir(),
            check_names=False,
            check_sizes=False,
        )
        self.config.hook.pytest_rlbench_update_config(config=self.config, rl_config=cfg)
        return validate(cfg, check_names=False, check_sizes=False)

    def trainer_config(self) -> Config:
        """The session's trainer config (built at configure, or here once the cluster gives the GPU
        count), its registry names and every --rl-rollout engine checked on first use."""
        from pytest_rlbench.session.rollout_panel import check_panel_engines
        from trainer.config import ConfigError, settings_without_effect, validate

        if self._trainer_config is not None and self._names_checked:
            return self._trainer_config
        try:
            if self._trainer_config is None:
                from pytest_rlbench.session.cluster import resolve_gpus_per_node

                gpus = resolve_gpus_per_node(self.cluster(), self.opts.nodes)
                self._trainer_config = self._built_config(gpus_per_node=gpus)
            cfg = validate(self._trainer_config)
            check_panel_engines(cfg, self.opts.rollout_panel)  # before any work
        except ConfigError as exc:
            raise SetupError(f"the trainer config is invalid: {exc}") from exc
        # what the summary says of the config (the sessions that use it: reading the engine's traits
        # imports torch, which plain test runs with the plugin loaded do not pay)
        self.replay_notes = session_replay_notes(self.opts, cfg)
        self.config_notes = [f"rlbench: {line}" for line in settings_without_effect(cfg)]
        if self.rounds()[1] == 0:
            why = (
                "--benchmark-disable"
                if self.opts.warmup_rounds
                else f"{self.opts.source_of('rl_warmup_rounds')} 0"
            )
            self.config_notes.append(f"rlbench: {first_call_note(why)}")
        self._names_checked = True
        return cfg

    def _write_synthetic_set(self, cfg: Config) -> None:
        """Write (once) the synthetic set at data.train_files[0]; the model's tokenizer pads its
        prompts when data.synthetic_prompt_length asks for exact lengths."""
        from trainer.data.source import write_synthetic_set

        path = Path(cfg.data.train_files[0])
        if not path.exists():
            write_synthetic_set(cfg.data, path, self.model().tokenizer)

    def rounds(self) -> tuple[int, int]:
        """(timed rounds, warm-up rounds) each phase runs: the options', or one timed round and no warm-up
        under --benchmark-disable (pytest-benchmark times nothing then; rl_bench times one call)."""
        if self.config.getoption("benchmark_disable", default=False):
            return 1, 0
        return self.opts.rounds, self.opts.warmup_rounds

    def model(self) -> RLModel:
        """The model's spec and tokenizer; a directory must hold a readable config and weights."""
        if self._model is not None:
            return self._model
        from trainer.models.presets import ModelError, is_preset, load_tokenizer, model_spec

        # The config's model: --rl-model's, or the one a replayed workload (--rl-workload) asks for.
        name = self.trainer_config().actor_rollout_ref.model.path
        try:
            spec = model_spec(name)
            if not is_preset(name):
                check_model_weights(Path(name))
            tokenizer = load_tokenizer(name)
        except (ModelError, SetupError, OSError, ValueError) as exc:
            given = "rl_model" in self.opts.sources or not self.opts.workload
            source = self.opts.source_of("rl_model" if given else "rl_workload")
            raise SetupError(f"{source}: {exc}") from exc
        layers = self.trainer_config().actor_rollout_ref.model.gradient_checkpointing_layers
        if layers is not None:  # the model's depth is known here, before any worker starts
            from trainer.models.checkpointing import check_layer_count

            try:
                check_layer_count(layers, spec.arch.num_layers, spec.model_type)
            except ValueError as exc:
                raise SetupError(f"{self.opts.source_of('rl_config')}: {exc}") from exc
        self._model = RLModel(name, spec, tokenizer)
        return self._model

    def dataset(self) -> RLDataset:
        """The data set, validated whole and loaded with the model's tokenizer and the data.* keys."""
        if self._dataset is not None:
            return self._dataset
        from trainer.data.source import load_train_dataset

        cfg = self.trainer_config()
        tokenizer = self.model().tokenizer
        if self.opts.dataset is None:  # the synthetic set, at the path the session default gave
            self._write_synthetic_set(cfg)
        path = Path(cfg.data.train_files[0])
        source = self.opts.source_of("rl_dataset") if self.opts.dataset else "the synthetic data set"
        try:
            prompts = load_train_dataset(cfg.data, tokenizer, self.workdir())
        except (OSError, ValueError) as exc:  # DatasetError and PromptTooLongError are ValueErrors
            raise SetupError(f"{source}: {exc}") from exc
        self.check_sizes(cfg, len(prompts), usable=True)  # a step must fill its batch from what loaded
        self._dataset = RLDataset(path, synthetic=self.opts.dataset is None, prompts=prompts)
        return self._dataset

    def load_baselines(self) -> None:
        """Every baseline the session compares with, loaded once (at configure: a bad one is a usage
        error before any test runs): --rl-baseline's (loaded with the options), then those that the
        pytest_rlbench_baselines hooks add (called once), then the replayed one; with none of these,
        the published runs, as references. Gates and reports read ``baseline_records``."""
        records = list(self.opts.baseline_records)
        for added in self.config.hook.pytest_rlbench_baselines(config=self.config):
            for entry in added or []:
                try:
                    if isinstance(entry, dict):
                        records.append(
                            record_from_dict(entry, source="a baseline from pytest_rlbench_baselines")
                        )
                    else:
                        records.append(load_baseline(entry))
                except BaselineError as exc:
                    raise pytest.UsageError(f"pytest-rlbench: --rl-baseline {exc}") from None
        # a baseline given or added, or a replayed one, can gate; the published runs alone cannot
        self.gating = bool(records) or self.opts.workload_record is not None
        if not records:
            records = [load_baseline(name) for name in PUBLISHED_BASELINES]
        if self.opts.workload_record is not None:
            records.append(self.opts.workload_record)
        self.baseline_records = []
        for record in records:  # a name given twice is compared with once (the first)
            if all(r.name != record.name for r in self.baseline_records):
                self.baseline_records.append(record)

    def close(self) -> None:
        if self.connection is not None:
            self.connection.close()


def first_call_note(why: str) -> str:
    """What a session without warm-up rounds times (``why``: the option that says so): each phase's
    first call, with what one-time costs the workers' set-up does not take."""
    return (
        f"{why}: each phase's timed rounds start with its first call in this session. On GPU each of the "
        "bundled trainer's workers, at set-up and outside every phase, compiles the fast engine's and the training "
        "phases' kernels, builds cuDNN's attention plans for every width of a long packed row (where rows can be "
        "that long), and pins host "
        "memory for offloaded optimizer state (the set-up line; other frameworks' trainers do as they do); what a "
        "first call still meets stays in its phase, such as AdamW creating its moments at the first optimizer "
        "step, and so does what every step pays for new row lengths, such as cuDNN's attention planning each new "
        "shape of padded rows (docs/benchmarks.md)"
    )


SESSION_KEY = pytest.StashKey[RLBenchSession]()


def get_session(config: pytest.Config) -> RLBenchSession:
    """The session's resources (set up by the plugin's pytest_configure)."""
    try:
        return config.stash[SESSION_KEY]
    except KeyError:
        raise RuntimeError(
            "pytest-rlbench is not configured: is the plugin loaded (-p no:rlbench)?"
        ) from None


class SessionUsageError(pytest.exit.Exception):  # type: ignore[name-defined,misc]
    """A usage error found once tests run (a resource a test asks for by name, which the start-up check
    could not see): it ends the session as ``pytest.exit`` does, and the plugin's fault handling turns
    it into the one ``ERROR: pytest-rlbench: ...`` line of a start-up error, exit 4
    (``session.faults.FaultHandling.pytest_runtestloop``)."""

    def __init__(self, message: str) -> None:
        super().__init__(f"pytest-rlbench: {message}", returncode=pytest.ExitCode.USAGE_ERROR)


def _built(config: pytest.Config, what: str) -> Any:
    """A resource for a fixture; a failure here (the start-up check did not cover it) ends the session."""
    session = get_session(config)
    try:
        return getattr(session, what)()
    except SetupError as exc:
        raise SessionUsageError(str(exc)) from None


# ----------------------------------------------------------------------------- fixtures
@pytest.fixture(scope="session")
def rl_options(pytestconfig: pytest.Config) -> RLBenchOptions:
    """The parsed --rl-* options."""
    return get_session(pytestconfig).opts


@pytest.fixture(scope="session")
def rl_cluster(pytestconfig: pytest.Config) -> ClusterInfo:
    """The Ray cluster (connected, checked against --rl-nodes and --gpu): address, nodes, GPUs."""
    return _built(pytestconfig, "cluster")


@pytest.fixture(scope="session")
def rl_config(pytestconfig: pytest.Config) -> Config:
    """A copy of the session's trainer config (trainer.config.Config); change it freely."""
    return copy.deepcopy(_built(pytestconfig, "trainer_config"))


@pytest.fixture(scope="session")
def rl_model(pytestconfig: pytest.Config) -> RLModel:
    """The model under test: spec, tokenizer, parameter count, FLOPs per token; ``build()`` loads it."""
    return _built(pytestconfig, "model")


@pytest.fixture(scope="session")
def rl_dataset(pytestconfig: pytest.Config, rl_model: RLModel, rl_config: Config) -> RLDataset:
    """The training data set: its parquet path and the prompts loaded with the model's tokenizer."""
    return _built(pytestconfig, "dataset")
