"""Times the decode step's MLP over every layer: the engine's four kernels against fused Triton ones.

    python benchmarks/decode_mlp_probe.py OUT.json [--model r1-distill-qwen-1.5b] [--rows 4 16 64]
        [--variants engine gate_up_silu+cublas gate_up_silu+down_tiles atomic barrier]

Why (issue 31): see benchmarks/decode_mlp.py. Each variant is one CUDA graph of the MLP of every
layer (distinct weights per layer, as in a step: none stays in L2), the same input rows each time,
median of 20 replays (decode_kernels_tune.graph_ms); every Triton variant with the fastest of its
tiles. Variants:

- ``engine``: cuBLAS's gate/up, the engine's SiLU kernel (silu_mul), cuBLAS's down: the fast
  engine's fused step today (trainer/rollout/lean_decoder.py);
- ``gate_up_silu+cublas``: gate/up and SiLU in one Triton kernel, then cuBLAS's down;
- ``gate_up_silu+down_tiles``: the same, then down in one Triton kernel with no split (two launches);
- ``atomic``: one kernel adding each chunk's product into a float32 buffer with atomics, and a
  rounding kernel (its bits vary from run to run: timing only);
- ``barrier``: one kernel with a barrier across its grid (deterministic).

Each variant's output is compared with the engine's and with the float64 MLP rounded where the
engine rounds (``decode_mlp.reference_mlp``); both go in the report. GPU only.
"""

from __future__ import annotations

import argparse
import functools
import json
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent))
import decode_mlp  # noqa: E402
from decode_kernels_tune import graph_ms  # noqa: E402
from pdl_matmul_chain import add_decode_shape_options, decode_shape, timed_log  # noqa: E402

VARIANTS = ("engine", "gate_up_silu+cublas", "gate_up_silu+down_tiles", "atomic", "barrier")
GATE_UP_TILES = [  # (block_c, block_k, num_warps, num_stages)
    (32, 128, 4, 4), (64, 128, 4, 3), (64, 64, 4, 4), (32, 256, 4, 3), (128, 64, 4, 3), (64, 128, 8, 3),
]
DOWN_TILES = [(16, 256, 4, 3), (32, 256, 4, 3), (32, 128, 4, 4), (64, 128, 4, 3), (16, 512, 4, 3)]  # block_n, block_k, ...
ATOMIC_TILES = [  # (block_c, block_k, block_n, num_warps, num_stages)
    (32, 128, 128, 4, 3), (64, 128, 128, 4, 3), (64, 128, 256, 8, 3), (128, 64, 128, 4, 3), (32, 256, 256, 4, 3),
]
BARRIER_TILES = [  # (block_c, block_k, block_n, block_kd, num_warps, num_stages)
    (64, 128, 16, 256, 4, 3), (64, 128, 32, 256, 4, 3), (32, 128, 16, 256, 4, 3), (64, 64, 16, 512, 4, 3),
]


class MlpWeights:
    """Every layer's gate/up [2 I, hidden] and down [hidden, I], stored transposed as the engine stores them."""

    def __init__(self, shape, seed: int = 0):
        gen = torch.Generator(device="cuda").manual_seed(seed)
        L, h, inter = shape.num_layers, shape.hidden, shape.intermediate
        self.layers, self.hidden, self.inter = L, h, inter
        self.gate_up = (torch.randn(L, h, 2 * inter, generator=gen, device="cuda", dtype=torch.bfloat16) * h ** -0.5).transpose(1, 2)
        self.down = (torch.randn(L, inter, h, generator=gen, device="cuda", dtype=torch.bfloat16) * inter ** -0.5).transpose(1, 2)

    def bytes(self) -> int:
        return (self.gate_up.numel() + self.down.numel()) * 2


def mlp_fn(variant: str, tile: tuple, weights: MlpWeights, rows: int):
    """(x, layer) -> the MLP's output for one variant and tile; scratch buffers made here, once."""
    from trainer.kernels.triton_decode_fused import silu_mul

    if variant == "engine":
        return lambda x, layer: F.linear(silu_mul(F.linear(x, weights.gate_up[layer])), weights.down[layer])
    if variant == "gate_up_silu+cublas":
        c, k, warps, stages = tile
        return lambda x, layer: F.linear(
            decode_mlp.gate_up_silu(x, weights.gate_up[layer], c, k, warps, stages), weights.down[layer])
    if variant == "gate_up_silu+down_tiles":
        (c, k, warps, stages), (n, kd, dwarps, dstages) = tile
        return lambda x, layer: decode_mlp.down_tiles(
            decode_mlp.gate_up_silu(x, weights.gate_up[layer], c, k, warps, stages), weights.down[layer], n, kd,
            dwarps, dstages)
    if variant == "atomic":
        c, k, n, warps, stages = tile
        acc = torch.zeros(rows * weights.hidden, dtype=torch.float32, device="cuda")
        return lambda x, layer: decode_mlp.mlp_atomic(x, weights.gate_up[layer], weights.down[layer], acc, c, k, n,
                                                      warps, stages)
    if variant == "barrier":
        c, k, n, kd, warps, stages = tile
        inter = torch.empty(rows, weights.inter, dtype=torch.bfloat16, device="cuda")
        sync = torch.zeros(2, dtype=torch.int32, device="cuda")
        programs = torch.cuda.get_device_properties(0).multi_processor_count
        return lambda x, layer: decode_mlp.mlp_barrier(x, weights.gate_up[layer], weights.down[layer], inter, sync,
                                                       programs, c, k, n, kd, warps, stages)
    raise ValueError(f"unknown variant {variant!r}; valid: {', '.join(VARIANTS)}")


def every_layer(weights: MlpWeights, x: torch.Tensor, mlp, out: list) -> None:
    for layer in range(weights.layers):
        y = mlp(x, layer)
    out[:] = [y]


def time_variant(weights: MlpWeights, x: torch.Tensor, variant: str, tile, log) -> dict:
    out: list = []
    record = {"rows": x.shape[0], "variant": variant, "tile": tile}
    try:
        body = functools.partial(every_layer, weights, x, mlp_fn(variant, tile, weights, x.shape[0]), out)
        ms = graph_ms(body)
        body()
        torch.cuda.synchronize()
    except Exception as exc:  # a tile this GPU cannot run: recorded, not fatal
        record["error"] = str(exc)[:300]
        log(record)
        return record
    last = weights.layers - 1
    record.update(ms=ms, tb_per_s=weights.bytes() / ms / 1e9, us_per_layer=1000 * ms / weights.layers)
    record["output"] = out[0]
    reference = decode_mlp.reference_mlp(x, weights.gate_up[last], weights.down[last]).float()
    scale = reference.abs().max().item()
    record["max_rel_vs_reference"] = (out[0].float() - reference).abs().max().item() / scale
    record["share_differing_from_reference"] = (out[0].float() != reference).float().mean().item()
    log({k: v for k, v in record.items() if k != "output"})
    return record


def probe_rows(weights: MlpWeights, rows: int, variants: list[str], log) -> dict:
    x = torch.randn(rows, weights.hidden, device="cuda", dtype=torch.bfloat16)
    best: dict = {}
    records = []
    candidates = {
        "engine": [None],
        "gate_up_silu+cublas": GATE_UP_TILES,
        "atomic": ATOMIC_TILES,
        "barrier": BARRIER_TILES,
    }
    for variant in variants:
        if variant == "gate_up_silu+down_tiles":
            continue  # after gate_up_silu's best tile is known
        for tile in candidates[variant]:
            record = time_variant(weights, x, variant, tile, log)
            records.append(record)
            if "ms" in record and (variant not in best or record["ms"] < best[variant]["ms"]):
                best[variant] = record
    if "gate_up_silu+down_tiles" in variants:
        first = best.get("gate_up_silu+cublas", {}).get("tile", GATE_UP_TILES[1])
        for tile in DOWN_TILES:
            record = time_variant(weights, x, "gate_up_silu+down_tiles", (first, tile), log)
            records.append(record)
            if "ms" in record and ("gate_up_silu+down_tiles" not in best or record["ms"] < best["gate_up_silu+down_tiles"]["ms"]):
                best["gate_up_silu+down_tiles"] = record
    engine = best.get("engine", {}).get("output")
    summary = {}
    for variant, record in best.items():
        summary[variant] = {k: record[k] for k in ("tile", "ms", "tb_per_s", "us_per_layer", "max_rel_vs_reference",
                                                   "share_differing_from_reference")}
        if engine is not None:
            summary[variant]["share_differing_from_engine"] = (record["output"] != engine).float().mean().item()
    for record in records:
        record.pop("output", None)
    return {"rows": rows, "best": summary, "records": records}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    add_decode_shape_options(ap, rows=[4, 16, 64])
    ap.add_argument("--variants", nargs="+", default=list(VARIANTS), choices=VARIANTS)
    args = ap.parse_args()
    weights = MlpWeights(decode_shape(args, "decode_mlp_probe.py"))
    log = timed_log()

    report = {"model": args.model, "tp": args.tp, "gpu": torch.cuda.get_device_name(), "weight_bytes": weights.bytes(),
              "layers": weights.layers, "torch": torch.__version__, "results": []}
    for rows in args.rows:
        report["results"].append(probe_rows(weights, rows, args.variants, log))
        args.out.write_text(json.dumps(report, indent=1))  # kept after each row count: nothing lost on a timeout
    for result in report["results"]:
        for variant, best in result["best"].items():
            print(f"rows {result['rows']:3d}  {variant:26s} {best['us_per_layer']:6.1f} us/layer "
                  f"{best['tb_per_s']:5.2f} TB/s  tile {best['tile']}  vs engine: "
                  f"{best.get('share_differing_from_engine', float('nan')):.4f} of values differ")


if __name__ == "__main__":
    main()
