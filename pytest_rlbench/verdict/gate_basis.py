"""Which gate a run and a published baseline allow when they ran on different machines: per-GPU
throughput on the same GPU model, hardware-normalised efficiency on another, or none.

Both need the run's recorded workload to match the baseline's per GPU
(``pytest_rlbench.records.workload.workload_matches``) and both sides to be GPU runs that name their GPU.
GPU names are compared by model (``gpu_family``: "NVIDIA H100 80GB HBM3" and "H100" are one model);
where a name leaves out what a figure needs (the variant, for peak memory bandwidth) the reading
taken is returned as an assumption, to be listed beside the verdicts. A GPU model that the baseline's
workload assumes (a published run that does not state its GPUs) is listed here too, once, with how the
gate reads it (``records.workload_format.assumptions`` leaves it to this module).
"""

from __future__ import annotations

from dataclasses import replace

from pytest_rlbench.records.metrics import BANDWIDTH, MFU, THROUGHPUT, TIMING, WRITE_RATE
from pytest_rlbench.records.record import RunRecord
from pytest_rlbench.records.workload import decode_replicas, workload_matches
from pytest_rlbench.records.workload_format import ASSUMED, Workload
from pytest_rlbench.verdict.peaks import PEAK_BF16_FLOPS, peak_memory_bandwidth

# What a gate compares (BaselineComparison.basis).
SAME_MACHINE = "same work on the same hardware"
PER_GPU = "same per-GPU work on the same GPU model: per-GPU throughput"
EFFICIENCY = "same per-GPU work on another GPU model: hardware-normalised efficiency"
# (gated families, families listed beside) of each gate. One measurement gets one verdict: a phase's
# time and its throughput are one measurement, so one of them is judged and the other listed beside.
# save_checkpoint's GB/s per GPU is judged by both per-GPU gates: its pace is the host's storage, which a
# GPU model does not set; only where the two saves are the same work (records.workload
# save_work_differences), else it is listed and the gate says why (checkpoint_size_note).
BASIS_FAMILIES: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {
    SAME_MACHINE: ((TIMING,), (THROUGHPUT, WRITE_RATE)),
    PER_GPU: ((THROUGHPUT, WRITE_RATE), (TIMING,)),
    EFFICIENCY: ((MFU, BANDWIDTH, WRITE_RATE), (TIMING, THROUGHPUT)),
}
# A GPU model named without its variant, read as the variant its peak memory bandwidth is taken from:
# 8-GPU H100 servers (HGX) carry the SXM part.
ASSUMED_VARIANTS: dict[str, str] = {"h100": "H100 SXM"}


def normalise_gpu(name: str | None) -> str | None:
    """A GPU name as the same-machine gate compares it: spaces collapsed, case and "NVIDIA " aside."""
    if name is None:
        return None
    text = " ".join(name.split()).casefold()
    return text.removeprefix("nvidia ")


def gpu_family(name: str | None) -> str | None:
    """The GPU model a name stands for, variant aside: "NVIDIA H100 80GB HBM3" and "H100" are "h100"."""
    text = normalise_gpu(name)
    if text is None:
        return None
    return next((key.casefold() for key, _ in PEAK_BF16_FLOPS if key.casefold() in text), text)


def with_assumed_gpu(record: RunRecord) -> RunRecord:
    """The record with its workload's assumed GPU model as its hardware's, where the hardware section
    names none (a published run that does not state its GPUs); unchanged otherwise."""
    w = record.workload
    if record.hardware.gpu_model is not None or w is None or w.gpu_model is None:
        return record
    return replace(record, hardware=replace(record.hardware, gpu_model=w.gpu_model.value))


def _assumed_gpu(workload: Workload | None, gpu_model: str | None) -> str | None:
    """ "hardware.gpu_model = 'H100' (why)" where the workload assumed the GPU model the gate reads
    (``with_assumed_gpu``); None otherwise."""
    item = workload.gpu_model if workload is not None else None
    if item is None or item.source != ASSUMED or item.value != gpu_model:
        return None
    return f"hardware.gpu_model = {item.value!r}" + (f" ({item.why})" if item.why else "")


def _gpu_problems(run: RunRecord, baseline: RunRecord) -> list[str]:
    """Why a per-GPU gate cannot judge the two records' hardware: a CPU side or an unnamed GPU."""
    out = []
    for who, record in (("run", run), ("baseline", baseline)):
        if record.hardware.device != "gpu":
            out.append(f"hardware.device: the {who} is not a GPU run")
        elif record.hardware.gpu_model is None:
            out.append(f"hardware.gpu_model: not stated in the {who}")
    return out


def per_gpu_gate(run: RunRecord, baseline: RunRecord) -> tuple[str | None, list[str]]:
    """(PER_GPU or EFFICIENCY, []) when the run did the baseline's per-GPU work on a named GPU model;
    (None, why not) otherwise."""
    problems = workload_matches(run, baseline) + _gpu_problems(run, baseline)
    if problems:
        return None, problems
    same = gpu_family(run.hardware.gpu_model) == gpu_family(baseline.hardware.gpu_model)
    return (PER_GPU if same else EFFICIENCY), []


def hardware_assumptions(run: RunRecord, baseline: RunRecord, basis: str) -> tuple[RunRecord, list[str]]:
    """The baseline as the gate reads its GPU, and the readings assumed: a name without its variant, and
    a model the workload assumed (one line for the GPU: the model, then how it is read)."""
    ours, theirs = run.hardware.gpu_model, baseline.hardware.gpu_model
    readings = []
    if basis == PER_GPU and normalise_gpu(ours) != normalise_gpu(theirs):
        readings.append(f"read as the run's {ours!r} (its variant is not stated)")
    variant = ASSUMED_VARIANTS.get(gpu_family(theirs) or "")
    if basis == EFFICIENCY and variant and theirs and peak_memory_bandwidth(theirs) is None:
        readings.append(f"taken as {variant!r} for its peak memory bandwidth")
        baseline = replace(baseline, hardware=replace(baseline.hardware, gpu_model=variant))
    assumed = _assumed_gpu(baseline.workload, theirs)
    out = []
    if assumed is not None:
        out.append(", ".join([assumed, *readings]))
    elif readings:
        out.append(f"hardware.gpu_model: the baseline's {theirs!r} " + " and ".join(readings))
    replicas = decode_replicas(baseline)[1]
    if basis == EFFICIENCY and replicas and baseline.tokens.decode_steps is None:
        out.append(replicas)  # the decode steps, hence the weight reads, of its gen
    return baseline, out
