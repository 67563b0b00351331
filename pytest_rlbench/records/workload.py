"""A record's workload put to use: a run's own (``run_workload``), whether two records did the same
per-GPU work (``workload_matches``), and the token counts a workload implies (``workload_tokens``).
The trainer settings that replay a baseline per GPU are ``pytest_rlbench.records.workload_replay``'s.

Per GPU: a replay on W GPUs runs sequences_per_gpu x W sequences a step, with the baseline's length
distributions and algorithm settings, so that each GPU does the baseline's per-GPU work. How the
source split its work (parallelism) is not part of it. Pure functions over records and configs: no
torch (the model presets are read only when a preset is looked up).
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import fields, replace
from pathlib import Path
from typing import Any

from pytest_rlbench.records.length_shapes import CONSTANT, LOGNORMAL, NATURAL, expected_lengths
from pytest_rlbench.records.record import DTYPE_BYTES, ModelArch, RunRecord, TokenCounts
from pytest_rlbench.records.workload_format import (
    MEMORY_PLACEMENT,
    PUBLISHED,
    LengthDistribution,
    Sourced,
    Workload,
)
from pytest_rlbench.records.workload_replay import (
    NO_TARGET,
    TARGET_LENGTHS,
    decode_replicas,
    expected_shares,
    run_shares,
)
from trainer.models.flops import (
    DecoderArch,
    decode_weight_values,
    kv_positions_read,
    kv_values_per_position,
    parameter_count,
)
from trainer.phases import CHECKPOINT_BYTES

SYNTHETIC_FILE = "synthetic_math.parquet"  # in the session's temp dir when --rl-dataset is not given

# The model fields two records must share to have done the same work: the cost-defining ones, and the dtype.
MODEL_KEYS: tuple[str, ...] = (*(f.name for f in fields(DecoderArch)), "dtype")


def is_synthetic(data: Any) -> bool:
    """Whether a config's data set (``trainer.config.DataConfig``) is the generated synthetic one: none
    given, or the session's own file."""
    return not data.train_files or Path(data.train_files[0]).name == SYNTHETIC_FILE


# --- A run's own workload: all published (configured or measured). ----------------------------------


def _known(value: Any, why: str | None = None) -> Sourced:
    return Sourced(value, PUBLISHED, why)


def _prompt_distribution(cfg: Any) -> LengthDistribution:
    length = getattr(cfg.data, "synthetic_prompt_length", None)
    cap = _known(cfg.data.max_prompt_length)
    if length and is_synthetic(cfg.data):  # only the synthetic set is padded to the length
        return LengthDistribution(
            _known(float(length)), cap, _known(CONSTANT, "data.synthetic_prompt_length")
        )
    return LengthDistribution(
        _known(None, "see $.tokens"), cap, _known(NATURAL, "the data set's own prompts")
    )


def _response_distribution(cfg: Any) -> LengthDistribution:
    rollout, cap = cfg.actor_rollout_ref.rollout, cfg.data.max_response_length
    target = getattr(rollout, "target_lengths", None)
    shape = getattr(target, "distribution", NO_TARGET)
    if shape == NO_TARGET and rollout.ignore_eos:
        return LengthDistribution(
            _known(float(cap)), _known(cap), _known(CONSTANT, "ignore_eos: every row at the cap")
        )
    if shape == NO_TARGET:
        return LengthDistribution(_known(None, "see $.tokens"), _known(cap), _known(NATURAL, "stops at EOS"))
    where = f"{TARGET_LENGTHS}.distribution"
    sigma = _known(float(target.sigma)) if shape == LOGNORMAL else None
    return LengthDistribution(_known(float(target.mean)), _known(cap), _known(shape, where), sigma)


def run_workload(cfg: Any, model: ModelArch, world_size: int, *, rollout_tp: int) -> Workload:
    """The workload a trainer config (trainer.config.Config) does on ``world_size`` GPUs or ranks,
    ``rollout_tp`` of them decoding each share together (the config's tensor-parallel size where its
    engine honours it, else 1: a size the engine ignores split nothing)."""
    arr = cfg.actor_rollout_ref
    actor, rollout = arr.actor, arr.rollout
    sequences = cfg.data.train_batch_size * rollout.n
    per_gpu = sequences // world_size if sequences % world_size == 0 else sequences / world_size
    return Workload(
        architecture=_known(model.name),
        dtype=_known(model.dtype),
        sequences_per_step=_known(sequences),
        sequences_per_gpu=_known(per_gpu),
        samples_per_prompt=_known(rollout.n),
        prompt_length=_prompt_distribution(cfg),
        response_length=_response_distribution(cfg),
        use_kl_loss=_known(actor.use_kl_loss),
        kl_loss_type=_known(actor.kl_loss_type),
        ppo_epochs=_known(actor.ppo_epochs),
        ppo_mini_batches=_known(max(1, cfg.data.train_batch_size // actor.ppo_mini_batch_size)),
        use_dynamic_bsz=_known(actor.use_dynamic_bsz),
        ppo_max_token_len_per_gpu=_known(actor.ppo_max_token_len_per_gpu),
        log_prob_max_token_len_per_gpu=_known(arr.ref.log_prob_max_token_len_per_gpu),
        gradient_checkpointing=_known(arr.model.enable_gradient_checkpointing),
        param_offload=_known(actor.fsdp_config.param_offload),
        optimizer_offload=_known(actor.fsdp_config.optimizer_offload),
        temperature=_known(float(rollout.temperature)),
        parallelism=_known(
            {
                "dp": world_size,
                "rollout_tp": rollout_tp,
                "sp": actor.ulysses_sequence_parallel_size,
            }
        ),
    )


# --- Same per-GPU work? ------------------------------------------------------------------------------


def model_differences(run: ModelArch, baseline: ModelArch) -> list[str]:
    """One entry naming the differing cost-defining fields, or none."""
    differ = [k for k in MODEL_KEYS if getattr(run, k) != getattr(baseline, k)]
    if not differ:
        return []
    return [f"model: run {run.name!r}, baseline {baseline.name!r} (differ in {', '.join(differ)})"]


def _length_key(dist: LengthDistribution) -> dict[str, Any]:
    """What fixes the work of a length distribution: whole-token mean and cap, shape, sigma."""
    mean = dist.mean.value
    return {
        "mean": None if mean is None else round(mean),
        "max": dist.max.value,
        "shape": dist.shape.value,
        "sigma": None if dist.sigma is None else round(dist.sigma.value, 6),
    }


def placement_differences(run: RunRecord, baseline: RunRecord) -> list[str]:
    """Each memory placement (``MEMORY_PLACEMENT``) in which the run differs from the baseline."""
    if run.workload is None or baseline.workload is None:
        return []
    out = []
    for key in MEMORY_PLACEMENT:
        ours, theirs = getattr(run.workload, key).value, getattr(baseline.workload, key).value
        if ours != theirs:
            out.append(f"{key}: run {ours!r}, baseline {theirs!r} (memory placement, not work)")
    return out


def _moves_optimizer_state(record: RunRecord) -> bool:
    """Whether this trainer moved the record's AdamW moments between host and GPU in update_actor:
    optimizer_offload without param_offload (under which AdamW steps on the host), sharded by FSDP
    (the GPU default, ``strategy`` auto)."""
    w = record.workload
    return (
        w is not None
        and bool(w.optimizer_offload.value)
        and not w.param_offload.value
        and record.config.settings.get("strategy", "auto") in ("auto", "fsdp2")
    )


def offload_sharding_note(run: RunRecord, baseline: RunRecord) -> list[str]:
    """The line a per-GPU gate adds where the run moved its sharded optimizer state between host and
    GPU (optimizer_offload) on fewer GPUs than a baseline that offloaded it too: FSDP shards the state
    over every GPU, so each of the run's GPUs copies a larger share of it than each of the baseline's."""
    theirs = baseline.workload
    if not _moves_optimizer_state(run) or theirs is None or not theirs.optimizer_offload.value:
        return []
    ran, published = run.hardware.world_size, baseline.hardware.world_size
    if ran >= published:
        return []
    return [
        f"offload_sharding: the optimizer state waits on the host (optimizer_offload), sharded over every GPU: "
        f"each of this run's GPUs copies 1/{ran} of AdamW's moments to the GPU and back in each update_actor "
        f"call, where each of the baseline's copied 1/{published} (both once per call, as VERL does): "
        f"{published / ran:g}x the bytes per GPU (memory placement, not the per-GPU math), so update_actor "
        f"and the step read slower than like for like"
    ]


# Two saves are the same work when each GPU wrote the same bytes, within this, and as many GPUs
# shared a node's storage: otherwise save_checkpoint is listed, not judged (a save's fixed costs weigh
# on the smaller one, a node's storage on the larger; which dominates is not known).
SAVE_BYTES_MATCH = 0.01


def _saves(run: RunRecord, baseline: RunRecord) -> tuple[tuple[float, str], tuple[float, str]] | None:
    """Both records' (bytes one save wrote, how that is known), where both timed save_checkpoint and
    both sizes are known; else None."""
    if "save_checkpoint" not in run.phases or "save_checkpoint" not in baseline.phases:
        return None
    ours, theirs = saved_checkpoint_bytes(run), saved_checkpoint_bytes(baseline)
    if ours[0] is None or theirs[0] is None:
        return None
    return (ours[0], ours[1]), (theirs[0], theirs[1])


def save_work_differences(run: RunRecord, baseline: RunRecord) -> list[str]:
    """How the two records' saves differ in work (bytes per GPU, GPUs a node), in words; empty where
    both timed save_checkpoint with the same work, or either lacks its bytes (its figure says so)."""
    saves = _saves(run, baseline)
    return [] if saves is None else _differences(run, baseline, saves[0][0], saves[1][0])


def _differences(run: RunRecord, baseline: RunRecord, ours: float, theirs: float) -> list[str]:
    per_gpu = ours / run.hardware.world_size, theirs / baseline.hardware.world_size
    out = []
    if abs(per_gpu[0] - per_gpu[1]) > SAVE_BYTES_MATCH * per_gpu[1]:
        out.append(f"bytes per GPU: run {per_gpu[0] / 1e9:.2f} GB, baseline {per_gpu[1] / 1e9:.2f} GB")
    nodes = run.hardware.gpus_per_node, baseline.hardware.gpus_per_node
    if run.hardware.device == "gpu" and nodes[0] != nodes[1]:
        out.append(f"GPUs sharing a node's storage: run {nodes[0]}, baseline {nodes[1]}")
    return out


def checkpoint_size_note(run: RunRecord, baseline: RunRecord) -> list[str]:
    """The line a per-GPU gate adds where the two saves differ in work (``save_work_differences``): each
    side's bytes per GPU and a node, bytes a parameter and how they are known, and that
    save_checkpoint is therefore listed, not judged."""
    saves = _saves(run, baseline)
    if saves is None:
        return []
    (ours, how_ours), (theirs, how_theirs) = saves
    differences = _differences(run, baseline, ours, theirs)
    if not differences:
        return []

    def sizes(record: RunRecord, written: float) -> str:
        hw = record.hardware
        gpus = hw.gpus_per_node or hw.world_size
        per_parameter = written / parameter_count(record.model)
        return f"{written / hw.world_size / 1e9:.2f} GB on each of {hw.world_size} GPUs ({gpus} a node: " \
               f"{written / hw.world_size * gpus / 1e9:.1f} GB a node; {per_parameter:.1f} bytes a parameter)"

    return [
        f"checkpoint_size: save_checkpoint is listed, not judged: the saves are other work "
        f"({'; '.join(differences)}). This run wrote {sizes(run, ours)}, {how_ours}; the baseline "
        f"{sizes(baseline, theirs)}, {how_theirs}. A save's fixed costs weigh more on the smaller, a "
        f"node's storage shared by more bytes on the larger"
    ]


def _work_values(w: Workload) -> dict[str, Any]:
    """The per-GPU work of a workload, flat: what two records must share for a per-GPU gate (memory
    placement and parallelism aside)."""
    values: dict[str, Any] = {
        "sequences_per_gpu": w.sequences_per_gpu.value,
        "samples_per_prompt": w.samples_per_prompt.value,
        **{f"prompt_length.{k}": v for k, v in _length_key(w.prompt_length).items()},
        **{f"response_length.{k}": v for k, v in _length_key(w.response_length).items()},
        "use_kl_loss": w.use_kl_loss.value,
        "ppo_epochs": w.ppo_epochs.value,
        "ppo_mini_batches": w.ppo_mini_batches.value,
        "use_dynamic_bsz": w.use_dynamic_bsz.value,
        "gradient_checkpointing": w.gradient_checkpointing.value,
        "temperature": w.temperature.value,
    }
    if w.use_kl_loss.value:
        values["kl_loss_type"] = w.kl_loss_type.value
    if w.use_dynamic_bsz.value:  # the token budgets only matter with dynamic batches
        values["ppo_max_token_len_per_gpu"] = w.ppo_max_token_len_per_gpu.value
        values["log_prob_max_token_len_per_gpu"] = w.log_prob_max_token_len_per_gpu.value
    return values


def workload_matches(run: RunRecord, baseline: RunRecord) -> list[str]:
    """How the run's per-GPU work differs from the baseline's; empty: the same per-GPU work.

    Compared: the model (its numbers and dtype) and every workload value but the totals over all GPUs,
    the parallelism and the model's name. A "natural" length distribution never matches: its work is
    whatever the model generated.
    """
    missing = [
        f"workload: not recorded in the {who}"
        for who, r in (("run", run), ("baseline", baseline))
        if r.workload is None
    ]
    if run.workload is None or baseline.workload is None:
        return missing
    out = model_differences(run.model, baseline.model)
    ours, theirs = _work_values(run.workload), _work_values(baseline.workload)
    for key in dict.fromkeys([*theirs, *ours]):
        a, b = ours.get(key), theirs.get(key)
        if a != b:
            out.append(f"workload.{key}: run {a!r}, baseline {b!r}")
    for who, w in (("run", run.workload), ("baseline", baseline.workload)):
        if NATURAL in (w.prompt_length.shape.value, w.response_length.shape.value):
            out.append(
                f"workload: the {who}'s lengths are natural (not fixed), so its work is not known in advance"
            )
    ran, expected = run_shares(run), expected_shares(baseline, run.hardware.world_size)
    if ran != expected:
        # which rows each GPU generated: the baseline's time was its slowest share's
        out.append(
            f"workload: {TARGET_LENGTHS}.slowest_of: run {_shares_value(ran)}, a replay of the baseline sets "
            f"{_shares_value(expected)} ({_shares_text(expected[0])}; 0: each GPU generates its own share)"
        )
    return out


def _shares_value(shares: tuple[int, int]) -> str:
    return f"{shares[0]} (gpus_per_share {shares[1]})"


def _shares_text(shares: int) -> str:
    if not shares:
        return "its GPUs' own shares"
    return f"its generation waited for the slowest of {shares} shares, so a replay on fewer GPUs generates the slowest ones"


# --- The token counts a workload implies. ----------------------------------------------------------


def decode_weight_bytes(arch: ModelArch) -> int:
    """Bytes of weights one decode step reads: the layers' matrices and the LM head (not the embedding)."""
    return decode_weight_values(arch) * DTYPE_BYTES[arch.dtype]


def kv_cache_read_bytes(arch: ModelArch, prompt_lengths: Sequence[int], response_lengths: Sequence[int]) -> int:
    """KV-cache bytes read while generating: sequence i reads p_i + t cached positions at its step t."""
    return kv_positions_read(prompt_lengths, response_lengths) * kv_values_per_position(arch) * DTYPE_BYTES[arch.dtype]


def saved_checkpoint_bytes(record: RunRecord) -> tuple[float | None, str]:
    """(bytes one save wrote, all files together; how that is known): measured where the record has
    them (``CHECKPOINT_BYTES``, the median over its saves), else its workload's bytes per parameter x
    the model's parameters, else None and why."""
    measured = record.metrics.get(CHECKPOINT_BYTES)
    if measured is not None and measured.value:
        return statistics.median(measured.value), "bytes written (measured)"
    per_parameter = record.workload.checkpoint_bytes_per_parameter if record.workload is not None else None
    if per_parameter is None:
        return None, "the bytes a save wrote are not recorded"
    count = parameter_count(record.model)
    origin = "" if per_parameter.source == PUBLISHED else f" ({per_parameter.source})"
    return per_parameter.value * count, f"{per_parameter.value:g} bytes per parameter{origin} x {count:,} parameters"


def workload_tokens(record: RunRecord) -> TokenCounts:
    """The record's step token counts, with what they lack filled in from its workload: the number of
    sequences, mean lengths, expected per-sequence lengths (``length_shapes.expected_lengths``) and
    decode steps (each rollout replica decodes up to the longest response). Unchanged without a
    workload, or where the record has the counts."""
    tok, w = record.tokens, record.workload
    if w is None:
        return tok
    n = tok.num_sequences or w.sequences_per_step.value
    filled: dict[str, Any] = {"num_sequences": n}
    for part, dist in (("prompt", w.prompt_length), ("response", w.response_length)):
        mean = getattr(tok, f"{part}_length_mean") or dist.mean.value
        filled[f"{part}_length_mean"] = mean
        has_counts = getattr(tok, f"{part}_lengths") is not None or getattr(tok, f"{part}_tokens") is not None
        if not has_counts and mean is not None and dist.shape.value != NATURAL:
            sigma = dist.sigma.value if dist.sigma is not None else None
            filled[f"{part}_lengths"] = expected_lengths(dist.shape.value, mean, n, dist.max.value, sigma)
    if "prompt_lengths" not in filled or "response_lengths" not in filled:  # the lists come in pairs
        filled.pop("prompt_lengths", None)
        filled.pop("response_lengths", None)
    elif tok.decode_steps is None:
        filled["decode_steps"] = decode_replicas(record)[0] * max(filled["response_lengths"])
    return replace(tok, **{k: v for k, v in filled.items() if getattr(tok, k) is None})
