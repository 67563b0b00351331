"""The decode step's layer matmuls as one chain, with and without programmatic dependent launch (PDL):
tried against cuBLAS, and not worth building into the engine.

    python benchmarks/pdl_matmul_chain.py OUT.json [--model r1-distill-qwen-1.5b] [--tp 1] [--rows 4 64]

Why (issue 31): at 4-64 rows a decode step's q/k/v and o matmuls read their weights at 37-63% of the
bandwidth, and a split-K kernel did not help (benchmarks/split_matmul.py): each small matmul pays a
few microseconds of start-up and first-load latency whatever its tiling. Hopper's programmatic
dependent launch lets a kernel start while the one before it is still running, up to a
``griddepcontrol.wait``; the weights depend on no earlier kernel, so a matmul can load its first
weight tile before that wait and only its input after it. This script measures what that gives
before anything in the engine changes.

Per step and layer the chain is the lean forward's matmuls (trainer/rollout/lean_decoder.py) fed
one into the next: fused q/k/v (with its bias), o on the q part, fused gate/up, down on the gate
part, the next layer's q/k/v on the result (no norms, attention or activation: their kernels would
need PDL too, and are not what is measured). Three variants, each one CUDA graph of every layer,
replayed 20 times after 3 warm-ups, median:

- ``cublas``: F.linear, as the engine runs them;
- ``triton``: ``chain_matmul`` below, launched plainly;
- ``triton_pdl``: the same kernel launched with PDL: it loads its first weight tile, waits for the
  previous kernel, lets the next one start, then reads its input; ``triton_pdl_late`` lets the next
  one start only after its store, ``triton_pdl_exit`` when it ends.

The Triton tile of each matmul is the fastest of ``TILES`` for that variant, timed as the same matmul
over every layer; each PDL chain also runs with the plain kernel's tiles, and must then give the
plain Triton chain's output bit for bit (the same sums): a missing wait would read a half-written
input, and the script records whether they match. Random bf16 weights scaled by 1/sqrt(in
features). GPU only (sm_90 or newer for PDL).

What was measured (one H200, 2026-11-29; docs/benchmarks.md, "PDL for the decode step's matmuls"):
at 4 rows the best PDL chain (the next kernel let start late or at exit) was 2% faster than cuBLAS's
at the 1.5B and 5% at the 7B's tensor-parallel member; at 16 and 64 rows cuBLAS's was the fastest,
by 5-17%. Letting the next kernel start early made the chain 30-40% slower than the kernel launched
plainly. The fastest chain read the weights at 47% of the H200's 4.8 TB/s at the 1.5B and 67% at the
7B member: what is lost is inside each small matmul, not between them. The engine keeps cuBLAS; the
script stays to re-measure on other GPUs.
"""

from __future__ import annotations

import argparse
import functools
import json
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

from trainer.models.presets import preset_config
from trainer.rollout.lean_decoder import lean_shape

sys.path.insert(0, str(Path(__file__).resolve().parent))
from decode_kernels_tune import graph_ms  # noqa: E402

TILES = [  # (block_n, block_k, num_warps, num_stages)
    (16, 128, 4, 4), (16, 256, 4, 4), (16, 512, 4, 3), (32, 128, 4, 4), (32, 256, 4, 4), (64, 128, 4, 4),
    (64, 256, 4, 3), (128, 128, 8, 3),
]
TRIGGERS = ("early", "late", "exit")
VARIANTS = ("cublas", "triton", "triton_pdl", "triton_pdl_late", "triton_pdl_exit")


@triton.jit
def _chain_matmul_kernel(
    x_ptr, w_ptr, b_ptr, out_ptr, M, N, K, s_xm, s_wn, s_om,
    HAS_BIAS: tl.constexpr, USE_GDC: tl.constexpr, TRIGGER: tl.constexpr, UPCAST: tl.constexpr,
    PRECISION: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
):
    # one program: out[:, cols] = x @ W[cols, :]^T (+ b[cols]) over all of K; x [M, K], W [N, K], unit K strides
    cols = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)  # [BN]
    rows = tl.arange(0, BLOCK_M)  # [BM]
    ks = tl.arange(0, BLOCK_K)  # [BK]
    col_in = cols < N
    # the first weight tile depends on no earlier kernel: under PDL it loads while that kernel ends
    w = tl.load(w_ptr + ks[:, None] + cols[None, :] * s_wn, mask=(ks[:, None] < K) & col_in[None, :], other=0.0)  # [BK, BN]
    if USE_GDC:
        tl.extra.cuda.gdc_wait()  # the previous kernel has ended and its output (x) is visible
        if TRIGGER == "early":
            tl.extra.cuda.gdc_launch_dependents()  # the next kernel may start loading its own weights
    x = tl.load(x_ptr + rows[:, None] * s_xm + ks[None, :], mask=(rows[:, None] < M) & (ks[None, :] < K), other=0.0)  # [BM, BK]
    if UPCAST:  # Triton's interpreter multiplies bf16 tiles wrongly; their float32 products are exact
        x, w = x.to(tl.float32), w.to(tl.float32)
    acc = tl.dot(x, w, input_precision=PRECISION)  # [BM, BN] float32
    for k0 in range(BLOCK_K, K, BLOCK_K):
        k = k0 + ks
        w = tl.load(w_ptr + k[:, None] + cols[None, :] * s_wn, mask=(k[:, None] < K) & col_in[None, :], other=0.0)
        x = tl.load(x_ptr + rows[:, None] * s_xm + k[None, :], mask=(rows[:, None] < M) & (k[None, :] < K), other=0.0)
        if UPCAST:
            x, w = x.to(tl.float32), w.to(tl.float32)
        acc += tl.dot(x, w, input_precision=PRECISION)
    if HAS_BIAS:
        acc += tl.load(b_ptr + cols, mask=col_in, other=0.0).to(tl.float32)[None, :]
    tl.store(out_ptr + rows[:, None] * s_om + cols[None, :], acc.to(out_ptr.dtype.element_ty),
             mask=(rows[:, None] < M) & col_in[None, :])
    if USE_GDC and TRIGGER == "late":
        tl.extra.cuda.gdc_launch_dependents()


def chain_matmul(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, tile: tuple[int, int, int, int],
                 pdl: bool = False, trigger: str = "early", interpreted: bool = False) -> torch.Tensor:
    """F.linear(x, weight, bias) for a few rows (x [rows <= 128, K], unit stride along K; weight [N, K]
    contiguous) in one launch; ``pdl`` launches it as a programmatic dependent of the kernel before,
    and ``trigger`` says when it lets the next one start: "early" (once its input is there), "late"
    (after its store) or "exit" (when it ends)."""
    if trigger not in TRIGGERS:
        raise ValueError(f"chain_matmul: trigger {trigger!r}; valid: {', '.join(TRIGGERS)}")
    rows, k = x.shape
    n = weight.shape[0]
    if x.stride(1) != 1 or weight.stride(1) != 1 or weight.shape[1] != k or rows > 128:
        raise ValueError(f"chain_matmul: x {tuple(x.shape)} strides {x.stride()}, weight {tuple(weight.shape)} "
                         f"strides {weight.stride()}: needs rows <= 128 and unit strides along K")
    block_n, block_k, warps, stages = tile
    out = torch.empty((rows, n), dtype=x.dtype, device=x.device)
    options = {} if interpreted else dict(num_warps=warps, num_stages=stages, launch_pdl=pdl)
    _chain_matmul_kernel[(triton.cdiv(n, block_n),)](
        x, weight, bias if bias is not None else out, out, rows, n, k, x.stride(0), weight.stride(0), out.stride(0),
        HAS_BIAS=bias is not None, USE_GDC=pdl, TRIGGER=trigger, UPCAST=interpreted and x.dtype != torch.float32,
        PRECISION="ieee" if x.dtype == torch.float32 or interpreted else "tf32",  # float32 inputs: no TF32 rounding
        BLOCK_M=max(16, triton.next_power_of_2(rows)), BLOCK_N=block_n, BLOCK_K=block_k, **options,
    )
    return out


class LayerWeights:
    """Every layer's q/k/v, o, gate/up and down weights at the model's (or one decode-group GPU's) shapes."""

    def __init__(self, shape, device: str = "cuda", seed: int = 0):
        gen = torch.Generator(device=device).manual_seed(seed)
        layers, h, inter = shape.num_layers, shape.hidden, shape.intermediate
        self.q_size, self.inter = shape.q_size, inter
        self.dims = {"qkv": (shape.q_size + 2 * shape.kv_size, h), "o": (h, shape.q_size),
                     "gate_up": (2 * inter, h), "down": (h, inter)}
        self.w = {name: torch.randn(layers, n, k, generator=gen, device=device, dtype=torch.bfloat16) * k ** -0.5
                  for name, (n, k) in self.dims.items()}
        self.qkv_bias = (torch.randn(layers, self.dims["qkv"][0], generator=gen, device=device, dtype=torch.bfloat16)
                         if shape.qkv_bias else None)
        self.layers = layers

    def bias(self, name: str, layer: int) -> torch.Tensor | None:
        return self.qkv_bias[layer] if name == "qkv" and self.qkv_bias is not None else None

    def bytes(self, names=("qkv", "o", "gate_up", "down")) -> int:
        total = sum(self.w[n].numel() * self.w[n].element_size() for n in names)
        if "qkv" in names and self.qkv_bias is not None:
            total += self.qkv_bias.numel() * self.qkv_bias.element_size()
        return total


def matmul_fn(variant: str, tiles: dict):
    """The (x, weight, bias, name) -> out of one variant; ``tiles`` names each matmul's Triton tile."""
    if variant == "cublas":
        return lambda x, w, b, name: F.linear(x, w, b)
    pdl = variant.startswith("triton_pdl")
    trigger = variant.rsplit("_", 1)[1] if variant.count("_") == 2 else "early"
    return lambda x, w, b, name: chain_matmul(x, w, b, tiles[name], pdl=pdl, trigger=trigger)


def run_chain(weights: LayerWeights, x: torch.Tensor, matmul, out: list) -> None:
    """One decode step's matmuls over every layer, each fed the one before; the last output into ``out``."""
    for layer in range(weights.layers):
        qkv = matmul(x, weights.w["qkv"][layer], weights.bias("qkv", layer), "qkv")  # [rows, q+2kv]
        o = matmul(qkv[:, :weights.q_size], weights.w["o"][layer], None, "o")  # [rows, hidden]
        gate_up = matmul(o, weights.w["gate_up"][layer], None, "gate_up")  # [rows, 2 inter]
        x = matmul(gate_up[:, :weights.inter], weights.w["down"][layer], None, "down")  # [rows, hidden]
    out[:] = [x]


def repeat_one(weights: LayerWeights, name: str, x: torch.Tensor, matmul) -> None:
    """One matmul over every layer's weights, the same input each time (the tile sweep)."""
    for layer in range(weights.layers):
        matmul(x, weights.w[name][layer], weights.bias(name, layer), name)


def sweep_tiles(weights: LayerWeights, rows: int, log) -> tuple[dict, list[dict]]:
    """Each variant's fastest tile for each matmul, and every timing behind the choice."""
    best: dict = {v: {} for v in VARIANTS if v != "cublas"}
    records = []
    for name, (_n, k) in weights.dims.items():
        x = torch.randn(rows, k, device="cuda", dtype=torch.bfloat16)
        layer_bytes = weights.bytes((name,))
        ms = graph_ms(functools.partial(repeat_one, weights, name, x, matmul_fn("cublas", {})))
        records.append({"rows": rows, "matmul": name, "variant": "cublas", "ms": ms, "tb_per_s": layer_bytes / ms / 1e9})
        log(records[-1])
        for variant in best:
            for tile in TILES:
                try:
                    ms = graph_ms(functools.partial(repeat_one, weights, name, x, matmul_fn(variant, {name: tile})))
                except Exception as exc:  # a tile this GPU cannot run: recorded, not fatal
                    records.append({"rows": rows, "matmul": name, "variant": variant, "tile": tile, "error": str(exc)[:300]})
                    log(records[-1])
                    continue
                records.append({"rows": rows, "matmul": name, "variant": variant, "tile": tile, "ms": ms,
                                "tb_per_s": layer_bytes / ms / 1e9})
                log(records[-1])
                if name not in best[variant] or ms < best[variant][name][1]:
                    best[variant][name] = (tile, ms)
    return {v: {n: t for n, (t, _) in b.items()} for v, b in best.items()}, records


def chain_rows(weights: LayerWeights, rows: int, log) -> dict:
    tiles, sweep = sweep_tiles(weights, rows, log)
    x = torch.randn(rows, weights.dims["qkv"][1], device="cuda", dtype=torch.bfloat16)
    step_bytes = weights.bytes()
    result = {"rows": rows, "tiles": {v: {n: list(t) for n, t in ts.items()} for v, ts in tiles.items()},
              "weight_bytes": step_bytes, "sweep": sweep, "chain": {}}
    outputs = {}
    runs = [(v, v, tiles.get(v, {})) for v in VARIANTS]
    runs += [(f"{v} (triton's tiles)", v, tiles["triton"]) for v in VARIANTS if v.startswith("triton_pdl")]
    for label, variant, chosen in runs:
        out: list = []
        body = functools.partial(run_chain, weights, x, matmul_fn(variant, chosen), out)
        try:
            ms = graph_ms(body)
        except Exception as exc:
            result["chain"][label] = {"error": str(exc)[:300]}
            log({"rows": rows, "chain": label, "error": str(exc)[:300]})
            continue
        body()  # eagerly once more: the output compared below
        torch.cuda.synchronize()
        outputs[label] = out[0].float()
        result["chain"][label] = {"ms": ms, "tb_per_s": step_bytes / ms / 1e9}
        log({"rows": rows, "chain": label, **result["chain"][label]})
    # a PDL chain with the plain kernel's tiles does the same sums: any other bits mean a missed wait
    result["pdl_same_bits"] = {label: bool(torch.equal(outputs["triton"], out)) for label, out in outputs.items()
                               if "triton's tiles" in label and "triton" in outputs}
    if "cublas" in outputs and "triton" in outputs:
        scale = outputs["cublas"].abs().max().item()
        result["triton_vs_cublas_max_rel"] = (outputs["triton"] - outputs["cublas"]).abs().max().item() / scale
    return result


def add_decode_shape_options(ap: argparse.ArgumentParser, rows: list[int]) -> None:
    """The options of a decode-step probe: OUT, --model, --tp, --rows (this script's and decode_mlp_probe.py's)."""
    ap.add_argument("out", type=Path, help="write the figures here (JSON)")
    ap.add_argument("--model", default="r1-distill-qwen-1.5b", help="a trainer preset (trainer/models/presets.py)")
    ap.add_argument("--tp", type=int, default=1, help="one GPU's shapes in a decode group of this many")
    ap.add_argument("--rows", type=int, nargs="+", default=rows, help="rows decoding (at most 128)")


def decode_shape(args: argparse.Namespace, script: str):
    """The LeanShape the options name, once the GPU and the row counts are checked."""
    if not torch.cuda.is_available():
        raise SystemExit(f"{script} needs a CUDA GPU")
    if max(args.rows) > 128 or min(args.rows) < 1:
        raise SystemExit(f"--rows {args.rows}: each must be 1-128")
    return lean_shape(preset_config(args.model)).sharded(args.tp)


def timed_log():
    """print(record) as JSON, with the seconds since this call."""
    started = time.time()

    def log(record: dict) -> None:
        print(f"[{time.time() - started:6.1f} s] {json.dumps(record)}", flush=True)

    return log


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    add_decode_shape_options(ap, rows=[4, 64])
    args = ap.parse_args()
    weights = LayerWeights(decode_shape(args, "pdl_matmul_chain.py"))
    log = timed_log()

    report = {"model": args.model, "tp": args.tp, "gpu": torch.cuda.get_device_name(),
              "capability": list(torch.cuda.get_device_capability()), "triton": triton.__version__,
              "torch": torch.__version__, "results": []}
    for rows in args.rows:
        report["results"].append(chain_rows(weights, rows, log))
        args.out.write_text(json.dumps(report, indent=1))  # kept after each row count: nothing lost on a timeout
    for res in report["results"]:
        chain = res["chain"]
        line = ", ".join(f"{v} {c['ms']:.3f} ms ({c['tb_per_s']:.2f} TB/s)" for v, c in chain.items() if "ms" in c)
        print(f"{res['rows']} rows, {res['weight_bytes'] / 1e9:.2f} GB of weights a step: {line}; "
              f"PDL output same bits: {res.get('pdl_same_bits')}")


if __name__ == "__main__":
    main()
