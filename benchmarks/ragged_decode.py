"""A replay's generation stretch by stretch (issue 31): time per decode step by rows still running,
against the memory-bandwidth bound of the same decode.

    RLBENCH_DECODE_TRACE=DIR bash benchmarks/gpu_suites.sh OUT replay-gen   # a trace line per generate call
    python benchmarks/ragged_decode.py DIR --gpu "H100 SXM" [--json OUT.json]

The traces come from the fast engine (trainer/rollout/decode_trace.py): each row's target length, the
bytes a decode step reads of the weights and of one cached token's K/V, and the wall seconds of each
stretch between the decode loop's host checks. The bound: decode step i (the token after the first,
which the prefill samples) reads the weights once and, for each row whose target is past i, the K/V
of its prompt and of its i tokens so far; at the GPU's peak bandwidth, nothing else. Rows alive at a
step are exact (from the targets); a stretch is filed under the rows alive at its start. The bound
over every slot decoded also counts the K/V of the ended rows the engine's compaction still carries
(it compacts to a few sizes, so some ended rows keep being decoded until the next size): what the
decode would read if their attention read their caches, which it does not (their programs skip).
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

from pytest_rlbench.verdict.peaks import peak_memory_bandwidth

BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512)  # rows alive, up to and including


def alive_at(targets: list[int], step: int) -> int:
    """Rows still decoding at decode step ``step`` (1-based): those whose target is past it."""
    return sum(t > step for t in targets)


def step_bytes(trace: dict, step: int, alive: int) -> int:
    """What decode step ``step`` must read with ``alive`` rows running: weights, and each row's K/V."""
    return trace["weight_bytes"] + alive * (trace["prompt_slots"] + step) * trace["kv_bytes_per_token"]


def bucket_of(rows: int) -> int:
    return next((b for b in BUCKETS if rows <= b), rows)


def outlier_excess(stretches: list[dict]) -> tuple[int, float]:
    """(stretches, seconds) past twice the median time per step of the stretches decoding as many
    slots: what CUDA-graph captures (one per new slot count and attention length) and host stalls
    added to the decode, beyond the pace of its other stretches."""
    by_slots: dict[int, list[float]] = {}
    for s in stretches:
        by_slots.setdefault(s["slots"], []).append(s["seconds"] / (s["last"] - s["first"] + 1))
    count, excess = 0, 0.0
    for s in stretches:
        steps = s["last"] - s["first"] + 1
        typical = statistics.median(by_slots[s["slots"]])
        if s["seconds"] > 2 * typical * steps:
            count, excess = count + 1, excess + s["seconds"] - typical * steps
    return count, excess


def analyse(trace: dict, bandwidth: float) -> dict:
    """The trace's measured seconds and its bound, whole and by rows alive, and its tail."""
    targets = trace["targets"]
    by_bucket: dict[int, dict[str, float]] = {}
    total_bound = weights_bound = slots_bound = 0.0
    for s in trace["stretches"]:
        row = by_bucket.setdefault(bucket_of(s["running"]), {"steps": 0, "seconds": 0.0, "bound_s": 0.0})
        bound = 0.0
        for step in range(s["first"], s["last"] + 1):
            alive = alive_at(targets, step) if targets is not None else s["running"]
            bound += step_bytes(trace, step, alive) / bandwidth
            slots_bound += step_bytes(trace, step, s["slots"]) / bandwidth  # the compacted batch's reads
        row["steps"] += s["last"] - s["first"] + 1
        row["seconds"] += s["seconds"]
        row["bound_s"] += bound
        total_bound += bound
        weights_bound += (s["last"] - s["first"] + 1) * trace["weight_bytes"] / bandwidth
    measured = sum(s["seconds"] for s in trace["stretches"])
    outliers, excess = outlier_excess(trace["stretches"])
    tail = [r for b, r in by_bucket.items() if b <= 8]
    return {
        "rows": trace["rows"],
        "decode_steps": sum(r["steps"] for r in by_bucket.values()),
        "longest_target": max(targets) if targets else None,
        "response_tokens": sum(targets) if targets else None,
        "measured_s": measured,
        "outlier_stretches": outliers,
        "outlier_excess_s": excess,
        "bound_s": total_bound,
        "bound_weights_s": weights_bound,
        "bound_kv_s": total_bound - weights_bound,
        # the same bound if the ended rows the compaction keeps read their K/V too (they skip it)
        "bound_decoded_slots_s": slots_bound,
        "tail_steps": sum(r["steps"] for r in tail),
        "tail_s": sum(r["seconds"] for r in tail),
        "tail_bound_s": sum(r["bound_s"] for r in tail),
        "by_rows_alive": {str(b): by_bucket[b] for b in sorted(by_bucket)},
    }


def table(result: dict) -> list[str]:
    lines = [
        f"{result['rows']} rows, {result['decode_steps']:,} decode steps, longest target {result['longest_target']}: "
        f"decode {result['measured_s']:.1f} s, bound {result['bound_s']:.1f} s "
        f"(weights {result['bound_weights_s']:.1f} s + K/V {result['bound_kv_s']:.1f} s), "
        f"{result['bound_s'] / result['measured_s']:.0%} of the bound's pace; "
        f"{result['bound_decoded_slots_s']:.1f} s if every slot decoded read its K/V (ended rows skip theirs)",
        f"tail (8 rows or fewer alive): {result['tail_steps']:,} steps, {result['tail_s']:.1f} s "
        f"(bound {result['tail_bound_s']:.1f} s)",
        f"outliers (graph captures, stalls): {result['outlier_stretches']} stretches, "
        f"{result['outlier_excess_s']:.1f} s past their slot count's pace",
        "rows alive (up to) | steps | seconds | ms/step | bound ms/step | bound / measured",
    ]
    for bucket, r in result["by_rows_alive"].items():
        lines.append(
            f"{bucket:>6} | {r['steps']:>6,} | {r['seconds']:8.2f} | {1e3 * r['seconds'] / r['steps']:7.3f} | "
            f"{1e3 * r['bound_s'] / r['steps']:7.3f} | {r['bound_s'] / r['seconds']:.0%}"
        )
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("traces", type=Path, help="the RLBENCH_DECODE_TRACE directory (decode-*.jsonl)")
    parser.add_argument("--gpu", default="H100 SXM", help="GPU model whose peak bandwidth bounds the decode")
    parser.add_argument("--json", type=Path, help="write the analysis here")
    args = parser.parse_args()
    bandwidth = peak_memory_bandwidth(args.gpu)
    if bandwidth is None:
        parser.error(f"--gpu {args.gpu!r}: no peak memory bandwidth known for it (pytest_rlbench/verdict/peaks.py)")
    files = sorted(args.traces.glob("decode-*.jsonl"))
    if not files:
        parser.error(f"{args.traces}: no decode-*.jsonl trace (set RLBENCH_DECODE_TRACE for the run)")
    results = []
    for path in files:
        for number, line in enumerate(path.read_text().splitlines(), 1):
            result = {"file": path.name, "call": number, **analyse(json.loads(line), bandwidth)}
            results.append(result)
            print(f"== {path.name}, generate call {number}")
            print("\n".join(table(result)))
    if args.json:
        args.json.write_text(json.dumps({"gpu": args.gpu, "bandwidth": bandwidth, "calls": results}, indent=1))


if __name__ == "__main__":
    main()
