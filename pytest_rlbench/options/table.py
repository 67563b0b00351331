"""The plugin's option table: each option's flag, ini name, kind, metavar and one-line help.

Data only: ``plugin.py`` registers ``OPTIONS`` with pytest (command line and ini), and
``options.parse.parse_options`` turns the raw values into ``RLBenchOptions``. Nothing here imports pytest,
torch or Ray, so ``pytest --help`` pays for none of them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from pytest_rlbench.verdict.noise import DEFAULT_CPU_TOLERANCE, DEFAULT_TOLERANCE
from trainer.config.schema import TrainerSection
from trainer.driver.ray_probe import DEFAULT_CONNECT_TIMEOUT_S as DEFAULT_TIMEOUT_S

DEFAULT_ROLLOUT = "hf"
DEFAULT_ROUNDS = 5
DEFAULT_WARMUP_ROUNDS = 1
PROGRESS_MODES: tuple[str, ...] = ("auto", "on", "off")  # --rl-progress; the first is the default

Kind = Literal["int", "float", "str", "flag", "multi"]


@dataclass(frozen=True)
class OptionSpec:
    """One plugin option: its command-line flag, ini name, kind and one-line help."""

    flag: str
    kind: Kind
    help: str
    metavar: str | None = None
    # A repeatable option whose ini entries come before the command line's instead of being
    # replaced by them (--rl-config: each override is per key, so the command line still wins).
    accumulates: bool = False

    @property
    def dest(self) -> str:
        """The argparse destination, which is also the ini name: ``--rl-nodes`` -> ``rl_nodes``."""
        name = self.flag.lstrip("-").replace("-", "_")
        return name if name.startswith("rl_") else f"rl_{name}"  # --gpu -> rl_gpu in the ini file


OPTIONS: tuple[OptionSpec, ...] = (
    OptionSpec(
        "--rl-nodes",
        "int",
        "Ray nodes the trainer spreads over; the cluster must have this many alive (default 1).",
        "N",
    ),
    OptionSpec(
        "--rl-gpus-per-node",
        "int",
        "GPUs (= workers) per node; needs --gpu (default: all GPUs of the smallest node used).",
        "N",
    ),
    OptionSpec(
        "--gpu",
        "flag",
        "Run on GPUs; fail at start-up if the cluster has fewer than asked for (default: CPU).",
    ),
    OptionSpec(
        "--rl-ray-address",
        "str",
        "Ray cluster to use, host:port (default: $RAY_ADDRESS; else a local Ray the plugin starts and stops).",
        "ADDR",
    ),
    OptionSpec(
        "--rl-model",
        "str",
        "Model preset (tiny, tiny-hd64, r1-distill-qwen-1.5b, r1-distill-qwen-7b) or a local HF model directory "
        "(default tiny; tiny-hd64 when vLLM rolls out on CPU).",
        "NAME|PATH",
    ),
    OptionSpec(
        "--rl-dataset",
        "str",
        "Parquet file in VERL's RL schema (default: a synthetic math set generated for the session).",
        "PATH",
    ),
    # The engines are not listed here: reading the registry imports torch, which every pytest start
    # (--help included) would pay. A name that is not registered is refused with the registered ones.
    OptionSpec(
        "--rl-rollout",
        "multi",
        "Rollout engine registered in trainer.rollout, e.g. fast (default " + DEFAULT_ROLLOUT + "); "
        "repeat it to compare engines: the first trains, the others join the rollout panel.",
        "ENGINE",
    ),
    OptionSpec(
        "--rl-config",
        "multi",
        "VERL-style trainer override, e.g. actor_rollout_ref.rollout.n=16 (repeatable).",
        "KEY=VALUE",
        accumulates=True,
    ),
    OptionSpec(
        "--rl-baseline",
        "multi",
        "Baseline to compare with: a stored name or a baseline file (repeatable).",
        "NAME|PATH",
    ),
    OptionSpec(
        "--rl-tolerance",
        "float",
        f"Allowed fraction of slowdown against a baseline, 0 <= t < 1 (default {DEFAULT_TOLERANCE} with --gpu, "
        f"{DEFAULT_CPU_TOLERANCE} on CPU workers).",
        "FRACTION",
    ),
    OptionSpec(
        "--rl-max-mismatch",
        "float",
        "Fail a step benchmark whose rollout_fidelity/token_mult_prob_error (mean exp|old - rollout "
        "log-prob|) exceeds F >= 1 (NeMo-RL's CI holds it below 1.1; default: no limit).",
        "F",
    ),
    OptionSpec(
        "--rl-rounds",
        "int",
        f"Timed rounds per phase benchmark; the median is compared (default {DEFAULT_ROUNDS}).",
        "N",
    ),
    OptionSpec(
        "--rl-warmup-rounds",
        "int",
        f"Untimed rounds before a phase's timed ones (default {DEFAULT_WARMUP_ROUNDS}).",
        "N",
    ),
    OptionSpec(
        "--rl-workload",
        "str",
        "Do a baseline's recorded work per GPU on the GPUs at hand (a stored name or a baseline file), "
        "so the comparison with it can be a gate; --rl-config on top turns it into a reference.",
        "NAME|PATH",
    ),
    OptionSpec(
        "--rl-trainer",
        "multi",
        "Framework whose trainer the suites run: ours (the bundled GRPO trainer) or trl (TRL's "
        "GRPOTrainer on the same model, data, reward and batch; pip install 'pytest-rlbench[trl]') (default ours); "
        "repeat it to run each in turn in one session, reported side by side.",
        "ours|trl",
    ),
    OptionSpec("--rl-report", "str", "Write the benchmark report as JSON to this file.", "PATH"),
    OptionSpec("--rl-save-baseline", "str", "Record this run as a baseline file at PATH.", "PATH"),
    OptionSpec(
        "--rl-progress",
        "str",
        "Progress bars for set-up, warm-up and each round on stderr: auto (only on a terminal), on, off "
        f"(default {PROGRESS_MODES[0]}).",
        "|".join(PROGRESS_MODES),
    ),
    OptionSpec(
        "--rl-ray-timeout", "float",
        f"Seconds the Ray cluster at the address has to answer (default {DEFAULT_TIMEOUT_S:g}).",
        "SECONDS",
    ),
    OptionSpec(
        "--rl-phase-timeout", "float",
        "Longest wait for the workers in one phase, trainer.phase_timeout_s; a hung worker then fails the "
        f"phase naming its rank, and later tests fail with one line (default {TrainerSection.phase_timeout_s:g}).", "SECONDS",
    ),
)
SPECS: dict[str, OptionSpec] = {spec.dest: spec for spec in OPTIONS}
