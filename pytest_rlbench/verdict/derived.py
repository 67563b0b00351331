"""Derived figures from raw values, for runs and baselines alike: ``derive(record)``.

Definitions follow VERL (verl/trainer/ppo/metric_utils.py for throughput and time per token,
verl/utils/flops_counter.py for model FLOPs); the families' units and token bases are in
``pytest_rlbench.records.metrics``:
- tokens_per_s_per_gpu/<phase> = tokens / (t x devices); gen counts response tokens, the others
  prompt + response tokens. tokens_per_s_per_gpu/step is VERL's perf/throughput.
- timing_per_token_ms/<phase> = t x 1000 / tokens (same token counts).
- mfu/<phase>: model FLOPs / (t x peak bf16 FLOP/s x world size), with the dense-decoder formula
  N = L (3 H I + H (q + k + v + n_h d)) + 2 V H and FLOPs(train) = 6 N sum(s_i) + 6 sum(s_i^2) d n_h L;
  old_log_prob and ref run a forward pass only (a third), update_actor a full step per PPO epoch.
  These are model FLOPs: gradient-checkpoint recomputation is not counted, as in VERL.
- checkpoint_gb_per_s_per_gpu/save_checkpoint: bytes the save wrote / (t x devices), in GB/s; the
  bytes measured (a run of ours records its checkpoint's size), else the workload's bytes per
  parameter (a published run: what VERL's default checkpoint contents hold, assumed).
- bandwidth_util/gen: bytes a decode must read / (t x peak memory bandwidth x world size). The
  approximation: every decode step of a rollout replica reads each weight matrix once (the layers and
  the LM head; the embedding lookup reads only a row per token, so it is left out), and, when
  per-sequence lengths are known, each sequence reads its KV cache once per generated token. Without
  the lengths the figure counts weights only and is a lower bound (its basis says so). Activations,
  sampling and prefill traffic are not counted. Time is generate_sequences when timed, else gen.

"devices" is the record's world size: GPUs on a GPU run, ranks on a CPU run. A figure whose raw inputs
are missing has value None and a reason; it is never filled with a guess. Where a source published no
token counts, its workload's are used (``pytest_rlbench.records.workload.workload_tokens``: sequences per
step, mean lengths, expected per-sequence lengths of its length shapes), so a baseline's MFU and
bandwidth use follow from its published times and workload; which values were assumed is listed by
the comparisons that use them.
"""

from __future__ import annotations

import statistics
import weakref
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

from pytest_rlbench.records.metrics import (
    BANDWIDTH,
    FAMILIES,
    MFU,
    RESPONSE,
    THROUGHPUT,
    TIMING,
    TIMING_PER_TOKEN,
    TOKEN_BASIS,
    WRITE_RATE,
    family_of,
)
from pytest_rlbench.records.record import (
    Hardware,
    ModelArch,
    PhaseRecord,
    RunConfig,
    RunRecord,
    TokenCounts,
)
from pytest_rlbench.records.workload import (
    decode_weight_bytes,
    kv_cache_read_bytes,
    saved_checkpoint_bytes,
    workload_tokens,
)
from pytest_rlbench.verdict.peaks import peak_bf16_flops, peak_memory_bandwidth
from trainer.models.flops import train_flops
from trainer.phases import PHASE_KEYS

# Passes over the batch, in units of a training step (forward + backward = 3 forward passes).
MFU_PASSES: dict[str, float] = {"old_log_prob": 1 / 3, "ref": 1 / 3, "update_actor": 1.0}


@dataclass(frozen=True)
class Figure:
    """One figure of a record: a measured time, a derived figure, or a custom metric."""

    metric: str  # "family/phase", e.g. "tokens_per_s_per_gpu/gen"
    value: float | None  # at the median time; None when an input is missing
    unit: str
    higher_is_better: bool
    samples: tuple[float, ...] = ()  # one per timed sample (round)
    basis: str = ""  # how it was computed
    reason: str | None = None  # why value is None

    @property
    def family(self) -> str:
        return family_of(self.metric)

    @property
    def phase(self) -> str | None:
        return self.metric.partition("/")[2] or None


@dataclass(frozen=True)
class Known:
    """A resolved input: its value and how it was found, or None and why it is unknown."""

    value: float | None
    note: str


# --- The formulas, on plain numbers. ----------------------------------------------------------------


def tokens_per_s_per_gpu(tokens: float, seconds: float, devices: int) -> float:
    return tokens / (seconds * devices)


def timing_per_token_ms(seconds: float, tokens: float) -> float:
    return seconds * 1000.0 / tokens


def mfu(flops: float, seconds: float, peak_flops: float, world_size: int) -> float:
    """Model FLOPs utilisation: achieved FLOP/s over the peak of all devices."""
    return flops / seconds / peak_flops / world_size


def write_rate_gb_per_s(bytes_written: float, seconds: float, devices: int) -> float:
    """GB (1e9 bytes) written per second per device."""
    return bytes_written / 1e9 / (seconds * devices)


def bandwidth_utilisation(bytes_read: float, seconds: float, peak_bandwidth: float, world_size: int) -> float:
    return bytes_read / seconds / peak_bandwidth / world_size


# --- Resolving raw inputs, each with how it was found or why it is missing. -------------------------


def _peak(hw: Hardware, arch: ModelArch, table: Callable[[str], float | None], what: str) -> Known:
    if hw.device != "gpu":
        return Known(None, f"a CPU run: peak {what} is tabled for GPUs only")
    if hw.gpu_model is None:
        return Known(None, "GPU model not recorded")
    if what == "bf16 FLOP/s" and arch.dtype == "float32":
        return Known(None, "the peak FLOP/s table is for bf16/fp16, the model runs in float32")
    peak = table(hw.gpu_model)
    if peak is None:
        return Known(None, f"no peak {what} known for GPU model {hw.gpu_model!r}")
    return Known(peak, f"peak {what} {peak:.4g} ({hw.gpu_model})")


def num_sequences(tok: TokenCounts, config: RunConfig) -> Known:
    """Sequences (responses) in the batch: recorded, else the length lists, else batch x n."""
    if tok.num_sequences is not None:
        return Known(tok.num_sequences, f"{tok.num_sequences} sequences")
    for lengths in (tok.response_lengths, tok.prompt_lengths):
        if lengths is not None:
            return Known(len(lengths), f"{len(lengths)} sequences")
    if config.train_batch_size is not None and config.rollout_n is not None:
        n = config.train_batch_size * config.rollout_n
        return Known(n, f"{n} sequences (train_batch_size {config.train_batch_size} x rollout_n {config.rollout_n})")
    return Known(None, "number of sequences not recorded, and train_batch_size x rollout_n not stated")


def token_total(tok: TokenCounts, config: RunConfig, part: str) -> Known:
    """Total prompt or response tokens (``part`` is "prompt" or "response")."""
    lengths: list[int] | None = getattr(tok, f"{part}_lengths")
    total: int | None = getattr(tok, f"{part}_tokens")
    mean: float | None = getattr(tok, f"{part}_length_mean")
    if lengths is not None:
        return Known(sum(lengths), f"{sum(lengths)} {part} tokens")
    if total is not None:
        return Known(total, f"{total} {part} tokens")
    if mean is None:
        return Known(None, f"{part} token counts not recorded")
    n = num_sequences(tok, config)
    if n.value is None:
        return Known(None, f"mean {part} length known, but {n.note}")
    return Known(mean * n.value, f"{n.note} x mean {part} length {mean:g}")


def tokens_processed(tok: TokenCounts, config: RunConfig, basis: str) -> Known:
    """Response tokens, or prompt + response tokens, as ``basis`` says."""
    response = token_total(tok, config, "response")
    if basis == RESPONSE:
        return response
    prompt = token_total(tok, config, "prompt")
    if response.value is None or prompt.value is None:
        return Known(None, "; ".join(k.note for k in (prompt, response) if k.value is None))
    return Known(prompt.value + response.value, f"{prompt.note} + {response.note}")


def phase_tokens(record: RunRecord, phase: str) -> TokenCounts:
    """The phase's own token counts when it ran on another batch than the step's; else the step's,
    completed from the record's workload where the source published no counts."""
    own = record.phases[phase].tokens if phase in record.phases else None
    return own if own is not None else workload_tokens(record)


# --- Figures. ------------------------------------------------------------------------------------


def _figure(metric: str, seconds: Sequence[float], fn: Callable[[float], float], basis: str) -> Figure:
    family = FAMILIES[family_of(metric)]
    samples = tuple(fn(s) for s in seconds)
    return Figure(metric, fn(statistics.median(seconds)), family.unit, family.higher_is_better, samples, basis)


def _missing(metric: str, reason: str) -> Figure:
    family = FAMILIES[family_of(metric)]
    return Figure(metric, None, family.unit, family.higher_is_better, reason=reason)


def _per_token_figure(record: RunRecord, family: str, phase: str) -> Figure:
    """tokens_per_s_per_gpu or timing_per_token_ms of a phase, over the tokens its basis counts."""
    metric = f"{family}/{phase}"
    tokens = tokens_processed(phase_tokens(record, phase), record.config, TOKEN_BASIS[phase])
    if tokens.value is None:
        return _missing(metric, tokens.note)
    n, seconds = tokens.value, record.phases[phase].seconds
    if family == TIMING_PER_TOKEN:
        if n == 0:
            return _missing(metric, "the batch has no tokens")
        return _figure(metric, seconds, lambda t: timing_per_token_ms(t, n), f"{phase} ms / {tokens.note}")
    devices = record.hardware.world_size
    basis = f"{tokens.note} / ({phase} seconds x {devices} devices)"
    return _figure(metric, seconds, lambda t: tokens_per_s_per_gpu(n, t, devices), basis)


def _utilisation(
    record: RunRecord, metric: str, phase: str, amount: float, peak: Known, fn: Callable[..., float], basis: str
) -> Figure:
    """amount / (t x peak x world size) at each timed sample: MFU (FLOPs) or bandwidth use (bytes)."""
    world, top = record.hardware.world_size, peak.value
    return _figure(
        metric,
        record.phases[phase].seconds,
        lambda t: fn(amount, t, top, world),
        f"{basis} / ({phase} seconds x {peak.note} x {world})",
    )


def _mfu(record: RunRecord, phase: str) -> Figure:
    metric = f"{MFU}/{phase}"
    tok = phase_tokens(record, phase)
    if tok.prompt_lengths is None or tok.response_lengths is None:
        return _missing(metric, "per-sequence prompt and response lengths not recorded (the attention term needs them)")
    peak = _peak(record.hardware, record.model, peak_bf16_flops, "bf16 FLOP/s")
    if peak.value is None:
        return _missing(metric, peak.note)
    lengths = [p + r for p, r in zip(tok.prompt_lengths, tok.response_lengths, strict=True)]
    passes = MFU_PASSES[phase] * (record.config.ppo_epochs if phase == "update_actor" else 1)
    flops = train_flops(record.model, lengths) * passes
    basis = f"{flops:.4g} model FLOPs over {len(lengths)} sequences"
    return _utilisation(record, metric, phase, flops, peak, mfu, basis)


def _bandwidth(record: RunRecord) -> Figure:
    metric = f"{BANDWIDTH}/gen"
    phase = "generate_sequences" if "generate_sequences" in record.phases else "gen"
    tok = phase_tokens(record, phase)
    if tok.decode_steps is None:
        return _missing(metric, "decode steps not recorded")
    peak = _peak(record.hardware, record.model, peak_memory_bandwidth, "memory bandwidth")
    if peak.value is None:
        return _missing(metric, peak.note)
    read = decode_weight_bytes(record.model) * tok.decode_steps
    basis = f"weights x {tok.decode_steps} decode steps"
    if tok.prompt_lengths is not None and tok.response_lengths is not None:
        read += kv_cache_read_bytes(record.model, tok.prompt_lengths, tok.response_lengths)
        basis += " + KV-cache reads"
    else:
        basis += " (lower bound: KV-cache reads not counted, sequence lengths not recorded)"
    return _utilisation(record, metric, phase, read, peak, bandwidth_utilisation, basis)


def _write_rate(record: RunRecord) -> Figure:
    """save_checkpoint's GB written per second per device: its bytes (measured, or the workload's bytes
    per parameter: ``saved_checkpoint_bytes``) over its seconds and the record's devices."""
    metric = f"{WRITE_RATE}/save_checkpoint"
    written, note = saved_checkpoint_bytes(record)
    if written is None:
        return _missing(metric, note)
    devices = record.hardware.world_size
    basis = f"{note} / (save_checkpoint seconds x {devices} devices)"
    return _figure(
        metric, record.phases["save_checkpoint"].seconds, lambda t: write_rate_gb_per_s(written, t, devices), basis
    )


def _per_round(record: RunRecord, phase: str, make: Callable[[RunRecord], Figure]) -> Figure:
    """``make``'s figure; where each round worked on its own batch (``round_tokens``), each round's
    figure over its own tokens, and their median."""
    timed = record.phases[phase]
    rounds = timed.round_tokens
    if not rounds or len(rounds) != len(timed.seconds):
        return make(record)
    figures = [
        make(replace(record, phases={**record.phases, phase: PhaseRecord(seconds=[t], tokens=tok)}))
        for t, tok in zip(timed.seconds, rounds, strict=True)
    ]
    if any(f.value is None for f in figures):
        return figures[0]
    samples = tuple(f.value for f in figures if f.value is not None)
    basis = f"{figures[0].basis}, each round over its own batch"
    return replace(figures[0], value=statistics.median(samples), samples=samples, basis=basis)


def phase_figures(record: RunRecord, phase: str) -> list[Figure]:
    """The derived figures of one timed phase, in the families' order (bandwidth use comes with gen)."""
    out = [
        _per_round(record, phase, lambda r, f=family: _per_token_figure(r, f, phase))
        for family in (THROUGHPUT, TIMING_PER_TOKEN)
        if phase in FAMILIES[family].phases
    ]
    if phase in FAMILIES[MFU].phases:
        out.append(_per_round(record, phase, lambda r: _mfu(r, phase)))
    if phase in FAMILIES[WRITE_RATE].phases:
        out.append(_write_rate(record))
    return out


_DERIVED: dict[int, dict[str, Figure]] = {}  # id(record) -> its figures, while the record lives


def derive(record: RunRecord) -> dict[str, Figure]:
    """Every figure of a record, keyed by metric id: the measured times (timing_s/<phase>), the
    derived figures above for each timed phase, and the record's custom metrics.

    Values are at the median time; ``samples`` hold one value per timed sample. Computed once per
    record object (the gates, the comparison and every report read the same figures); a record is not
    changed once made (``BenchRecorder.build_record`` makes a new one each time).
    """
    key = id(record)
    if key not in _DERIVED:
        _DERIVED[key] = _derive(record)
        weakref.finalize(record, _DERIVED.pop, key, None)
    return dict(_DERIVED[key])


def _derive(record: RunRecord) -> dict[str, Figure]:
    figures: dict[str, Figure] = {}
    timed = [p for p in PHASE_KEYS if p in record.phases]
    for phase in timed:
        figures[f"{TIMING}/{phase}"] = _figure(f"{TIMING}/{phase}", record.phases[phase].seconds, lambda t: t, "measured")
    for phase in timed:
        figures.update((f.metric, f) for f in phase_figures(record, phase))
    if "gen" in record.phases or "generate_sequences" in record.phases:
        phase = "generate_sequences" if "generate_sequences" in record.phases else "gen"
        figures[f"{BANDWIDTH}/gen"] = _per_round(record, phase, _bandwidth)
    for name, metric in record.metrics.items():
        values = metric.value
        figures[name] = Figure(
            name, statistics.median(values), metric.unit, metric.higher_is_better, tuple(values), "measured"
        )
    return figures
