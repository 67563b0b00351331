"""Where a fast-engine decode step's time goes, by batch rows and context length (issue 15's profile).

    python benchmarks/decode_profile.py OUT_DIR [--model r1-distill-qwen-1.5b] [--rows 64 16 4 1]
                                                [--context 1024 8192 16384 27648] [--trace-rows 64 1]
                                                [--attention split sdpa] [--fusion fused fused-rope-apart eager]
                                                [--attention-alone] [--tp 1] [--replayed-traces]

For each (rows, context) it times the engine's captured decode step (CUDA graph replays, device
synchronised, median of 20 after 5 warm-up) over a cache whose first ``context`` slots are visible,
with random weights of the model preset, and writes the bandwidth the step would need at the roofline
(weights + the rows' K and V read once), once per attention kernel (``split``: the engine's
split-cache Triton kernel; ``sdpa``: torch's scaled_dot_product_attention) and per treatment of the
elementwise work between the matmuls (``fused``: the Triton kernels of
trainer/kernels/triton_decode_fused.py, with RoPE and the cache write inside the split attention
kernel (with sdpa they stay a kernel of their own); ``fused-rope-apart``: the same with them a
kernel of their own; ``eager``: torch's ops, as on CPU). With ``--trace-rows`` it
also profiles one eager step per row count at the longest context (torch.profiler) and writes the
time per kernel family (matmul, attention, sampling, the rest) and the kernels (memsets included)
launched per step (a captured step replays the same ones). With ``--ended E...`` it also times, for
each rows count, the step with E of its rows ended (as between two compactions), with their K/V read
and with them skipped by the attention kernel (``skip_ended_rows``). With ``--attention-alone`` it then profiles
the captured step itself and times the split attention kernel alone (``decode_attention``, without
RoPE) over every layer: on the engine's
cache with the engine's arguments, without them, and on a fresh cache of the context's size (which
told an argument's cost from the step's). Besides the median of single replays, each row has
``burst_step_ms``: 50 replays back to back over one synchronisation, divided by 50, as generation
replays them. GPU only. Results: OUT_DIR/decode_profile.json.

The issue-15 shape (16 prompts x 8 responses, prompt 256 + response 1024), fused against eager:
    python benchmarks/decode_profile.py OUT --rows 128 --context 1280 --attention split --trace-rows 128
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import torch

from trainer.models.presets import build_model, load_tokenizer, preset_config
from trainer.rollout import FastRolloutEngine, SamplingParams
from trainer.rollout.decode_buffers import DecodeBuffers
from trainer.rollout.lean_decoder import lean_shape

HBM_BYTES_PER_S = {"H100": 3.35e12, "H200": 4.8e12}


def roofline_bytes(engine: FastRolloutEngine, rows: int, context: int) -> int:
    w = engine.weights
    weight_bytes = sum(
        t.numel() * t.element_size() for t in (w.qkv, w.o, w.gate_up, w.down, w.lm_head)
    )
    s = engine.shape
    kv_bytes = 2 * s.num_layers * rows * s.num_kv_heads * context * s.head_dim * w.qkv.element_size()
    return weight_bytes + kv_bytes


def kernel_family(name: str) -> str:
    n = name.lower()
    if "attention" in n or "fmha" in n or "flash" in n or "sdpa" in n or "attn" in n or "partial" in n or "merge" in n:
        return "attention"
    if "gemm" in n or "gemv" in n or "cutlass" in n or "nvjet" in n or "cublas" in n:
        return "matmul"
    if "race" in n or "keyed" in n:
        return "sampling"
    return "other"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--model", default="r1-distill-qwen-1.5b")
    ap.add_argument("--rows", type=int, nargs="+", default=[64, 16, 4, 1])
    ap.add_argument("--context", type=int, nargs="+", default=[1024, 8192, 16384, 27648])
    ap.add_argument("--trace-rows", type=int, nargs="*", default=[64, 1])
    ap.add_argument("--attention", nargs="+", default=["split", "sdpa"], choices=["split", "sdpa"])
    ap.add_argument("--fusion", nargs="+", default=["fused", "eager"], choices=["fused", "fused-rope-apart", "eager"])
    ap.add_argument("--ended", type=int, nargs="*", default=[],
                    help="for each rows count, also time the step with this many of its rows ended (between two "
                         "compactions), their K/V read and skipped (the engine's skip_ended_rows)")
    ap.add_argument("--tp", type=int, default=1,
                    help="one GPU's part of a decode group of this size: the model's query and key/value heads and "
                         "MLP width over T (LeanShape.sharded), the embedding and LM head whole, as each member "
                         "holds them; the step then does a member's work without the group's sums")
    ap.add_argument("--replayed-traces", action="store_true",
                    help="with --trace-rows: also profile one captured step and write its kernels in order "
                         "(OUT_DIR/replayed-VARIANT-ROWS.json.gz: name, start and duration in microseconds)")
    ap.add_argument("--attention-alone", action="store_true",
                    help="with --trace-rows: also profile the captured step, and time the attention kernel alone "
                         "over every layer on the engine's own cache and on a fresh one of the context's size")
    args = ap.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    device = torch.device("cuda")
    gpu = torch.cuda.get_device_name()
    peak = next((v for k, v in HBM_BYTES_PER_S.items() if k in gpu), None)
    model = (build_model(args.model, seed=0) if args.tp == 1 else member_model(args.model, args.tp, device)).to(device, torch.bfloat16)
    tokenizer = load_tokenizer(args.model)
    sampling = SamplingParams(temperature=0.6)
    results, traces = [], {}
    for attention in args.attention:
        for fusion in args.fusion:
            engine = FastRolloutEngine(model, tokenizer, split_attention=attention == "split",
                                       fused_decode=fusion != "eager", rope_in_attention=fusion == "fused")
            profile_engine(engine, {"attention": attention, "fusion": fusion}, args, sampling, peak, results, traces)
            del engine
            torch.cuda.empty_cache()
    (out / "decode_profile.json").write_text(json.dumps({"gpu": gpu, "model": args.model, "tp": args.tp, "steps": results,
                                                          "traces": traces}, indent=1))


def member_model(name: str, tp: int, device: torch.device) -> torch.nn.Module:
    """A preset with one decode-group member's share of the heads and MLP width (random weights): its
    decode step reads and computes what a member's does, without the all-reduces."""
    from transformers import AutoModelForCausalLM

    config = preset_config(name)
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    shape = lean_shape(config).sharded(tp)  # ValueError where the model does not split over tp
    config.head_dim = head_dim
    config.num_attention_heads, config.num_key_value_heads = shape.num_heads, shape.num_kv_heads
    config.intermediate_size = shape.intermediate
    torch.manual_seed(0)
    with torch.device(device):
        return AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)


def kernel_sequence(prof) -> list[tuple[str, float, float]]:
    """Every GPU kernel and memory operation of a profile in start order: (name, start us, duration us)."""
    events = [e for e in prof.events() if e.device_type.name == "CUDA"]
    events.sort(key=lambda e: e.time_range.start)
    t0 = events[0].time_range.start if events else 0
    return [(e.name, e.time_range.start - t0, e.time_range.end - e.time_range.start) for e in events]


def kernel_times(prof) -> dict:
    """GPU time per kernel family, kernels launched, and the 12 costliest kernels, from a torch profile."""
    families: dict[str, float] = {}
    kernels = 0
    for evt in prof.key_averages():
        us = getattr(evt, "device_time_total", None) or getattr(evt, "cuda_time_total", 0.0)
        if us and evt.device_type.name == "CUDA":
            families[kernel_family(evt.key)] = families.get(kernel_family(evt.key), 0.0) + us / 1e3
            kernels += evt.count
    top = sorted(
        ((e.key, (getattr(e, "device_time_total", None) or 0.0) / 1e3) for e in prof.key_averages()),
        key=lambda kv: -kv[1],
    )[:12]
    return {"kernels_per_step": kernels, "ms_by_family": families, "top_kernels_ms": top}


def attention_alone(engine, buf, context: int, attn_len: int) -> dict:
    """The decode attention kernel over every layer, one CUDA graph, three ways: on the engine's cache
    with the engine's arguments (the prompt rows' shared slots, the write slot), on the engine's cache
    with neither, and on a fresh cache of exactly ``context`` slots (decode_kernels_tune.py's set-up)."""
    from decode_kernels_tune import graph_ms  # benchmarks/ is on the path: this script runs from there

    from trainer.kernels.triton_decode_attention import decode_attention

    s = engine.shape
    q = torch.randn(s.num_layers, buf.batch, s.num_kv_heads, s.group, s.head_dim, device=buf.cache_k.device,
                    dtype=buf.cache_k.dtype)
    kv_bytes = 2 * s.num_layers * buf.batch * s.num_kv_heads * context * s.head_dim * buf.cache_k.element_size()

    def engine_cache(shared: bool) -> None:
        extra = dict(kv_rows=buf.prompt_rows, shared_slots=buf.prompt_width, last_slot=buf.write_slot) if shared else {}
        for layer in range(s.num_layers):
            decode_attention(q[layer], buf.cache_k[layer], buf.cache_v[layer], buf.attn_bias, attn_len, **extra)

    out = {"context": context, "attn_len": attn_len, "cache_slots": buf.slots}
    for name, body in (("engine_cache_engine_args", lambda: engine_cache(True)),
                       ("engine_cache_plain", lambda: engine_cache(False))):
        ms = graph_ms(body)
        out[name] = {"ms": ms, "gb_per_s": kv_bytes / ms / 1e6}
    k = torch.randn(s.num_layers, buf.batch, s.num_kv_heads, context, s.head_dim, device=q.device, dtype=q.dtype)
    v = torch.randn_like(k)
    bias = torch.zeros(buf.batch, context, device=q.device, dtype=q.dtype)

    def fresh() -> None:
        for layer in range(s.num_layers):
            decode_attention(q[layer], k[layer], v[layer], bias, context)

    ms = graph_ms(fresh)
    out["fresh_cache"] = {"ms": ms, "gb_per_s": kv_bytes / ms / 1e6}
    return out


def time_step(engine, buf, attn_len: int, context: int, sampling, running: int | None = None) -> tuple[float, float]:
    """Median seconds of one captured step (20 after 5 warm-ups, each synchronised) writing slot
    context - 1, and ms a step over 50 replayed back to back, as generation replays them. ``running``:
    the rows the engine is told still run (its attention chunks are chosen for them)."""
    for _ in range(5):
        engine._step(buf, attn_len, sampling, running)  # eager once, then captured
        buf.step.zero_()
        buf.write_slot.fill_(context - 1)
    times = []
    for _ in range(20):
        buf.step.zero_()
        buf.write_slot.fill_(context - 1)
        torch.cuda.synchronize()
        start = time.perf_counter()
        engine._step(buf, attn_len, sampling, running)
        torch.cuda.synchronize()
        times.append(time.perf_counter() - start)
    burst = 50
    buf.step.zero_()
    # the burst writes slots context - 50 to context - 1: inside the attention length, as in the engine
    buf.write_slot.fill_(max(0, context - burst))
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(burst):
        engine._step(buf, attn_len, sampling, running)
    torch.cuda.synchronize()
    return statistics.median(times), (time.perf_counter() - start) / burst * 1e3


def time_ended_rows(engine, buf, attn_len: int, context: int, sampling, labels, ended: int, peak) -> dict:
    """The step with its last ``ended`` rows ended (as between two compactions), their K/V read
    (skip_ended_rows off), skipped with the attention's chunks chosen for every slot's row
    (``skipped_all_slots``), and skipped with them chosen for the rows running, as the engine does
    (``skipped``): the roofline counts the running rows' K/V only."""
    row = {**labels, "rows": buf.batch, "ended_rows": ended, "context": context}
    need = roofline_bytes(engine, buf.batch - ended, context)
    for key, skip, running in (("read", False, None), ("skipped_all_slots", True, None),
                               ("skipped", True, buf.batch - ended)):
        engine.skip_ended_rows = skip
        engine._graphs.clear()  # the flag is captured in the graphs
        engine._warmed.clear()
        buf.finished.zero_()
        buf.finished[buf.batch - ended:] = True
        seconds, burst_ms = time_step(engine, buf, attn_len, context, sampling, running)
        row[f"{key}_step_ms"], row[f"{key}_burst_step_ms"] = seconds * 1e3, burst_ms
        row[f"{key}_bandwidth_use"] = (need / seconds / peak) if peak else None
    buf.finished.zero_()
    engine.skip_ended_rows = True
    engine._graphs.clear()
    engine._warmed.clear()
    return row


def profile_engine(engine, labels, args, sampling, peak, results, traces) -> None:
    variant = "-".join(labels.values())
    device = engine.device
    width = 128
    max_new = max(args.context)
    for rows in sorted(args.rows, reverse=True):
        buf = DecodeBuffers(engine.weights, rows, width, max_new, engine.stop_token_ids, engine.pad_token_id)
        buf.reset(torch.ones(rows, width, device=device), torch.arange(rows, device=device), 0)
        for context in args.context:
            buf.attn_bias[:, :context] = 0.0
            buf.write_slot.fill_(context - 1)
            attn_len = min(buf.slots, -(-context // 128) * 128)
            seconds, burst_ms = time_step(engine, buf, attn_len, context, sampling)
            need = roofline_bytes(engine, rows, context)
            row = {**labels, "rows": rows, "context": context, "step_ms": seconds * 1e3, "burst_step_ms": burst_ms,
                   "bytes": need, "bandwidth_use": (need / seconds / peak) if peak else None}
            results.append(row)
            print(json.dumps(row), flush=True)
            for ended in (e for e in args.ended if 0 < e < rows):
                results.append(time_ended_rows(engine, buf, attn_len, context, sampling, labels, ended, peak))
                print(json.dumps(results[-1]), flush=True)
        if rows in args.trace_rows:
            from torch.profiler import ProfilerActivity, profile

            context = max(args.context)
            attn_len = min(buf.slots, -(-context // 128) * 128)
            buf.write_slot.fill_(context - 1)
            with profile(activities=[ProfilerActivity.CUDA]) as prof:
                engine._decode_step(buf, attn_len, sampling)
                torch.cuda.synchronize()
            traces[f"{variant}-{rows}"] = {"context": context, **kernel_times(prof)}
            print(json.dumps({"trace": f"{variant}-{rows}", **traces[f"{variant}-{rows}"]}), flush=True)
            if args.replayed_traces:
                import gzip

                buf.write_slot.fill_(context - 1)
                with profile(activities=[ProfilerActivity.CUDA]) as prof:  # the captured step, as generation runs it
                    engine._step(buf, attn_len, sampling)
                    torch.cuda.synchronize()
                sequence = kernel_sequence(prof)
                with gzip.open(Path(args.out) / f"replayed-{variant}-{rows}.json.gz", "wt") as fh:
                    json.dump({"rows": rows, "context": context, "kernels": sequence}, fh)
                span = sequence[-1][1] + sequence[-1][2] if sequence else 0.0
                busy = sum(d for _, _, d in sequence)
                print(json.dumps({"replayed": f"{variant}-{rows}", "kernels": len(sequence), "span_us": span,
                                  "busy_us": busy}), flush=True)
            if args.attention_alone and labels["attention"] == "split":
                buf.write_slot.fill_(context - 1)
                with profile(activities=[ProfilerActivity.CUDA]) as prof:  # the captured step, as generation runs it
                    engine._step(buf, attn_len, sampling)
                    torch.cuda.synchronize()
                traces[f"{variant}-{rows}-replayed"] = {"context": context, **kernel_times(prof)}
                print(json.dumps({"trace": f"{variant}-{rows}-replayed", **traces[f"{variant}-{rows}-replayed"]}), flush=True)
                traces[f"{variant}-{rows}-attention-alone"] = attention_alone(engine, buf, context, attn_len)
                print(json.dumps({"attention_alone": traces[f"{variant}-{rows}-attention-alone"]}), flush=True)
        engine.release()
        del buf
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
