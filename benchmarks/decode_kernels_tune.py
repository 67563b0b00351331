"""The decode step's two big costs, timed alone with their choices: the split-cache attention kernel's
tile and launch, and the layer matmuls' cuBLAS back end and weight layout (issue 15).

    python benchmarks/decode_kernels_tune.py OUT.json [--model r1-distill-qwen-1.5b]
        [--shapes 128x768 128x1280 64x8192 16x27648 1x27648] [--matmul-rows 128 64]
        [--attention-splits rule 1 2 4] [--merge-blocks 16 64] [--split-matmul-rows 128 64] [--tp 1] [--split-sweep 4x27648 ...]

Attention is timed at each tile of ATTENTION_CHOICES, at the kernel's own split count (``"splits":
"rule"``; ``rule_splits`` says how many that was) and at 1, 2 and 4 chunks a row (``--attention-splits``); ``--split-sweep`` times the engine's launch at every chunk
count of SWEEP_SPLITS for each ROWSxCONTEXT and prints its rule's time against the best count's.
Each figure is one CUDA graph of the op over every layer (as a decode step runs it: each layer's own
weights or cache, so nothing is served from L2), replayed 20 times after 3 warm-ups, median, with the
bytes it must read at least (a layer's weights; the rows' K and V over the visible slots) over the
time. Random values in bf16 at the model's shapes (with ``--tp T``, one GPU's part of a decode group of
T: the engine's tensor-parallel shapes, the LM head whole); GPU only.
"""

from __future__ import annotations

import argparse
import functools
import json
import statistics
from collections.abc import Callable
from pathlib import Path

import torch
import torch.nn.functional as F

from trainer.kernels.triton_decode_attention import decode_attention, default_programs, split_count
from trainer.models.presets import preset_config
from trainer.rollout.lean_decoder import lean_shape

ATTENTION_CHOICES = [  # (block_n, num_warps, num_stages)
    (64, 4, 3), (64, 4, 4), (64, 8, 3), (128, 4, 3), (128, 8, 3), (128, 8, 4), (32, 4, 3), (32, 2, 4),
    (32, 4, 4), (32, 4, 2), (32, 8, 4), (64, 4, 2), (16, 4, 4), (16, 4, 6),
]


def graph_ms(body: Callable[[], None], replays: int = 20) -> float:
    """Median ms of one replay of a CUDA graph of ``body`` (captured after 3 eager warm-ups)."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(3):
            body()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        body()
    times = []
    for _ in range(replays + 3):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times[3:])


def attention_inputs(shape, rows: int, context: int):
    """Random bf16 queries [layers, rows, KV heads, group, d], every layer's K and V cache over
    ``context`` slots, a bias of zeros, and the bytes of K and V."""
    layers, kv, group, d = shape.num_layers, shape.num_kv_heads, shape.group, shape.head_dim
    q = torch.randn(layers, rows, kv, group, d, device="cuda", dtype=torch.bfloat16)
    k = torch.randn(layers, rows, kv, context, d, device="cuda", dtype=torch.bfloat16)
    v = torch.randn_like(k)
    bias = torch.zeros(rows, context, device="cuda", dtype=torch.bfloat16)
    return q, k, v, bias, 2 * k.numel() * k.element_size()


def attention_rows(shape, rows: int, context: int, split_options: tuple[int | None, ...] = (None, 1, 2, 4)) -> list[dict]:
    q, k, v, bias, kv_bytes = attention_inputs(shape, rows, context)
    kv = shape.num_kv_heads
    out = []
    for block_n, warps, stages in ATTENTION_CHOICES:
        for splits in split_options:  # None: the kernel's own split_count; else that many chunks a row
            body = functools.partial(_attention_layers, q, k, v, bias, context,
                                     dict(splits=splits, block_n=block_n, num_warps=warps, num_stages=stages))
            try:
                ms = graph_ms(body)
            except Exception as exc:  # a launch this GPU cannot run (shared memory): recorded, not fatal
                out.append({"block_n": block_n, "num_warps": warps, "num_stages": stages, "error": str(exc)[:200]})
                continue
            out.append({"rows": rows, "context": context, "block_n": block_n, "num_warps": warps,
                        "num_stages": stages, "splits": "rule" if splits is None else splits,
                        "rule_splits": split_count(rows, kv, context, default_programs(q.device)), "ms": ms,
                        "gb_per_s": kv_bytes / ms / 1e6})
            print(json.dumps(out[-1]), flush=True)
    del q, k, v, body
    torch.cuda.empty_cache()
    return out


def merge_rows(shape, rows: int, context: int, merge_blocks: list[int]) -> list[dict]:
    """The engine's launch (its tile, its rule's chunk count) with the merge kernel reading each of
    ``merge_blocks`` chunks at a time: the merge's loop trips against the size of its loads."""
    q, k, v, bias, kv_bytes = attention_inputs(shape, rows, context)
    kv = shape.num_kv_heads
    want = decode_attention(q[0], k[0], v[0], bias, context)
    out = []
    for block in merge_blocks:
        got = decode_attention(q[0], k[0], v[0], bias, context, merge_block=block)
        ms = graph_ms(functools.partial(_attention_layers, q, k, v, bias, context, dict(merge_block=block)))
        out.append({"rows": rows, "context": context, "merge_block": block,
                    "rule_splits": split_count(rows, kv, context, default_programs(q.device)), "ms": ms,
                    "gb_per_s": kv_bytes / ms / 1e6, "max_abs_diff": (got.float() - want.float()).abs().max().item()})
        print(json.dumps(out[-1]), flush=True)
    del q, k, v
    torch.cuda.empty_cache()
    return out


SWEEP_SPLITS = [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 16, 18, 20, 22, 24, 28, 32, 36, 40, 48, 56, 64]


def split_sweep(shape, shapes: list[tuple[int, int]]) -> list[dict]:
    """The engine's attention launch (its tiles) at every chunk count of SWEEP_SPLITS that keeps the grid
    under 8 programs an SM and a chunk at least one tile of 128 slots, for each (rows, context): where the
    kernel's own rule (split_count) stands against the best count. One cache of the largest shape,
    sliced for each (the engine's own layout: a prefix of the slots, all rows' strides)."""
    from trainer.kernels import sm_count

    layers, kv, group, d = shape.num_layers, shape.num_kv_heads, shape.group, shape.head_dim
    most_rows, most_slots = max(r for r, _ in shapes), max(c for _, c in shapes)
    k = torch.randn(layers, most_rows, kv, most_slots, d, device="cuda", dtype=torch.bfloat16)
    v = torch.randn_like(k)
    q = torch.randn(layers, most_rows, kv, group, d, device="cuda", dtype=torch.bfloat16)
    bias = torch.zeros(most_rows, most_slots, device="cuda", dtype=torch.bfloat16)
    sms = sm_count(torch.device("cuda"))
    out = []
    for rows, context in shapes:
        kv_bytes = 2 * layers * rows * kv * context * d * k.element_size()
        rule = split_count(rows, kv, context, default_programs(q.device))
        counts = sorted({rule, *(s for s in SWEEP_SPLITS if rows * kv * s <= 8 * sms and context // s >= 128)})
        for splits in counts:
            body = functools.partial(_attention_layers, q[:, :rows], k[:, :rows], v[:, :rows], bias[:rows], context,
                                     dict(splits=splits))
            ms = graph_ms(body)
            out.append({"rows": rows, "context": context, "splits": splits, "rule": splits == rule,
                        "programs": rows * kv * splits, "ms": ms, "gb_per_s": kv_bytes / ms / 1e6})
        best = min((e for e in out if e["rows"] == rows and e["context"] == context), key=lambda e: e["ms"])
        ruled = next(e for e in out if e["rows"] == rows and e["context"] == context and e["rule"])
        print(json.dumps({"rows": rows, "context": context, "rule_splits": rule, "rule_ms": ruled["ms"],
                          "best_splits": best["splits"], "best_ms": best["ms"],
                          "rule_over_best": ruled["ms"] / best["ms"]}), flush=True)
    del q, k, v
    torch.cuda.empty_cache()
    return out


def _attention_layers(q, k, v, bias, context: int, options: dict) -> None:
    for layer in range(q.shape[0]):
        decode_attention(q[layer], k[layer], v[layer], bias, context, **options)


def _matmul_layers(x, weights, pretransposed: bool) -> None:
    for i in range(weights.shape[0]):
        torch.mm(x, weights[i]) if pretransposed else F.linear(x, weights[i])


def layer_matmuls(shape) -> list[tuple[str, int, int, int]]:
    """The decode step's matmuls as (name, out features N, in features K, how many a step): the lean
    forward's fused q/k/v, o, fused gate/up and down once per layer, the LM head once."""
    h, inter, layers = shape.hidden, shape.intermediate, shape.num_layers
    return [("qkv", shape.q_size + 2 * shape.kv_size, h, layers), ("o", h, shape.q_size, layers),
            ("gate_up", 2 * inter, h, layers), ("down", h, inter, layers), ("lm_head", shape.vocab, h, 1)]


def matmul_rows(shape, rows: int) -> list[dict]:
    out = []
    for name, n, k, count in layer_matmuls(shape):
        w = torch.randn(count, n, k, device="cuda", dtype=torch.bfloat16)
        wt = w.transpose(1, 2).contiguous()  # [count, k, n]
        x = torch.randn(rows, k, device="cuda", dtype=torch.bfloat16)
        weight_bytes = w.numel() * w.element_size()
        for library in ("cublas", "cublaslt"):
            torch.backends.cuda.preferred_blas_library(library)
            for layout in ("linear", "pretransposed"):
                pre = layout == "pretransposed"
                ms = graph_ms(functools.partial(_matmul_layers, x, wt if pre else w, pre))
                out.append({"rows": rows, "matmul": name, "library": library, "layout": layout, "ms": ms,
                            "gb_per_s": weight_bytes / ms / 1e6})
                print(json.dumps(out[-1]), flush=True)
        torch.backends.cuda.preferred_blas_library("cublas")
        del w, wt
    torch.cuda.empty_cache()
    return out


SPLIT_TILES = [  # (block_n, block_k, num_warps, num_stages) of the split-K decode matmul
    (32, 128, 4, 4), (64, 64, 4, 4), (64, 128, 4, 4), (64, 128, 4, 3), (128, 64, 4, 4), (128, 64, 8, 4),
    (128, 128, 8, 3), (256, 64, 8, 3),
]
SPLITS = [1, 2, 3, 4, 6, 8, 12, 16]


def _engine_layout_layers(matmul, x, weights, bias) -> None:
    """``matmul(x, W, b)`` over every layer's weights, stored [in, out] and passed as the [out, in] view
    (LeanWeights' layout on CUDA)."""
    for i in range(weights.shape[0]):
        matmul(x, weights[i].T, None if bias is None else bias[i])


def split_matmul_rows(shape, rows: int) -> list[dict]:
    """The engine's matmuls (weights stored [in, out], F.linear on the [out, in] view) by cuBLAS and by
    the split-K Triton kernel at every tile and split that keeps the grid under 16 programs an SM."""
    from split_matmul import (  # benchmarks/ is on the path: this script runs from there
        SplitPlan,
        split_matmul,
    )

    from trainer.kernels import sm_count

    sms = sm_count(torch.device("cuda"))
    block_m = max(16, min(128, 1 << (rows - 1).bit_length()))
    out = []
    for name, n, k, count in layer_matmuls(shape):
        wt = torch.randn(count, k, n, device="cuda", dtype=torch.bfloat16)  # [count, in, out], as LeanWeights
        bias = torch.randn(count, n, device="cuda", dtype=torch.bfloat16) if name == "qkv" and shape.qkv_bias else None
        x = torch.randn(rows, k, device="cuda", dtype=torch.bfloat16)
        weight_bytes = wt.numel() * wt.element_size()
        want = F.linear(x, wt[0].T, None if bias is None else bias[0]).float()
        ms = graph_ms(functools.partial(_engine_layout_layers, F.linear, x, wt, bias))
        out.append({"rows": rows, "matmul": name, "kernel": "cublas", "ms": ms, "gb_per_s": weight_bytes / ms / 1e6})
        print(json.dumps(out[-1]), flush=True)
        for block_n, block_k, warps, stages in SPLIT_TILES:
            for split in SPLITS:
                plan = SplitPlan(block_m, block_n, block_k, split, warps, stages)
                if split > 1 and plan.programs(rows, n) > 16 * sms or k // split < block_k:
                    continue
                entry = {"rows": rows, "matmul": name, "kernel": "split", "block_n": block_n, "block_k": block_k,
                         "num_warps": warps, "num_stages": stages, "split": split, "programs": plan.programs(rows, n)}
                try:
                    got = split_matmul(x, wt[0].T, None if bias is None else bias[0], plan).float()
                    entry["max_abs_diff"] = (got - want).abs().max().item()
                    ms = graph_ms(functools.partial(_engine_layout_layers, functools.partial(split_matmul, plan=plan),
                                                    x, wt, bias))
                except Exception as exc:  # a tile this GPU cannot run (shared memory): recorded, not fatal
                    entry["error"] = str(exc)[:200]
                    out.append(entry)
                    continue
                entry.update(ms=ms, gb_per_s=weight_bytes / ms / 1e6)
                out.append(entry)
        best = min((e for e in out if e["matmul"] == name and e.get("kernel") == "split" and "ms" in e),
                   key=lambda e: e["ms"], default=None)
        print(json.dumps({"best_split": best}), flush=True)
        del wt, bias
    torch.cuda.empty_cache()
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("out")
    ap.add_argument("--model", default="r1-distill-qwen-1.5b")
    ap.add_argument("--shapes", nargs="*", default=["128x768", "128x1280", "64x8192", "16x27648", "1x27648"])
    ap.add_argument("--attention-splits", nargs="*", default=["rule", "1", "2", "4"],
                    help="the chunk counts each --shapes tile is timed at ('rule': the kernel's own split_count)")
    ap.add_argument("--merge-blocks", type=int, nargs="*", default=[],
                    help="at each --shapes, time the engine's launch with the merge reading this many chunks at a time")
    ap.add_argument("--matmul-rows", type=int, nargs="*", default=[128, 64])
    ap.add_argument("--split-matmul-rows", type=int, nargs="*", default=[],
                    help="time the split-K Triton matmul against cuBLAS at these row counts")
    ap.add_argument("--tp", type=int, default=1,
                    help="one GPU's part of a decode group of this size (LeanShape.sharded; the LM head stays whole, as the engine holds it)")
    ap.add_argument("--split-sweep", nargs="*", default=[], metavar="ROWSxCONTEXT",
                    help="time the attention kernel at every chunk count for these shapes (see split_sweep)")
    args = ap.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("decode_kernels_tune.py needs a CUDA GPU")
    shape = lean_shape(preset_config(args.model)).sharded(args.tp)
    results = {"gpu": torch.cuda.get_device_name(), "model": args.model, "tp": args.tp, "attention": [], "merge": [],
               "matmul": [], "split_matmul": [], "split_sweep": []}
    for spec in args.shapes:
        rows, context = (int(x) for x in spec.split("x"))
        splits = tuple(None if x == "rule" else int(x) for x in args.attention_splits)
        results["attention"] += attention_rows(shape, rows, context, splits)
        if args.merge_blocks:
            results["merge"] += merge_rows(shape, rows, context, args.merge_blocks)
    for rows in args.matmul_rows:
        results["matmul"] += matmul_rows(shape, rows)
    for rows in args.split_matmul_rows:
        results["split_matmul"] += split_matmul_rows(shape, rows)
    if args.split_sweep:
        results["split_sweep"] = split_sweep(shape, [tuple(int(x) for x in spec.split("x")) for spec in args.split_sweep])
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
