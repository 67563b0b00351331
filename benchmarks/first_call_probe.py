"""What a training phase's first call pays that later calls do not: attention's per-shape set-up (issue 31).

    python benchmarks/first_call_probe.py OUT.json [--model r1-distill-qwen-7b] [--tokens 30000] [--shapes 4]
                                                   [--padded cudnn flash efficient]

A step's micro-batches pack rows of new lengths each step, so a cost paid once per new shape recurs in
every step of a run, while one paid once per process (a kernel's compilation) does not. For ``--shapes``
draws of packed rows (lognormal lengths, mean 10,426 tokens, cut to ``--tokens`` in all, as the 7B
replay's micro-batches), this times one layer's packed causal attention (trainer/models/packed_attention.py,
the model's heads) forward and forward + backward, twice on each shape: the first call on a shape
against the second. Then the same for liger-kernel's RMSNorm and SwiGLU, which the actor runs with
``use_liger``. With ``--padded``, the same for the padded rows' attention (the actor's path where
packing does not pay, or without ``use_remove_padding``): F.scaled_dot_product_attention, causal, no
mask, grouped-query (as transformers' sdpa attention calls it), under each backend named, on one or
two rows padded to a drawn length: cuDNN's attention builds an execution plan for each new shape.
GPU only; bf16.
"""

from __future__ import annotations

import argparse
import functools
import json
import time
from pathlib import Path

import torch


def timed(fn) -> float:
    torch.cuda.synchronize()
    start = time.perf_counter()
    fn()
    torch.cuda.synchronize()
    return time.perf_counter() - start


def twice(fn) -> list[float]:
    """Seconds of a first call and of a second one on the same inputs."""
    return [timed(fn), timed(fn)]


def attention(q, k, v, cu, max_len: int, backward: bool) -> None:
    from trainer.models.packed_attention import _varlen_causal

    with torch.set_grad_enabled(backward):
        out = _varlen_causal(q, k, v, cu, max_len, q.shape[-1] ** -0.5)
    if backward:
        out.sum().backward()


def padded_attention(q, k, v, backend, backward: bool) -> None:
    from torch.nn.attention import sdpa_kernel

    with torch.set_grad_enabled(backward), sdpa_kernel([backend]):
        out = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
    if backward:
        out.sum().backward()


def liger_pair(fn, *inputs) -> None:
    fn(*inputs).sum().backward()


def packed_lengths(tokens: int, gen: torch.Generator) -> list[int]:
    """Row lengths, lognormal (mean 10,426, sigma 0.5) cut at 27,798, until ``tokens`` are filled."""
    out: list[int] = []
    while sum(out) < tokens:
        draw = float(torch.empty(1).log_normal_(mean=9.127, std=0.5, generator=gen))
        out.append(max(16, min(int(draw), 27_798, tokens - sum(out))))
    return out


def padded_rows(args, heads: int, kv: int, d: int, dev: torch.device, dt: torch.dtype) -> list[dict]:
    """For each drawn shape (1 or 2 rows of one drawn length), each backend's first and second call."""
    from torch.nn.attention import SDPBackend

    backends = {"cudnn": SDPBackend.CUDNN_ATTENTION, "flash": SDPBackend.FLASH_ATTENTION,
                "efficient": SDPBackend.EFFICIENT_ATTENTION, "math": SDPBackend.MATH}
    gen = torch.Generator().manual_seed(1)
    rows_out = []
    for shape in range(args.shapes):
        length = packed_lengths(27_798, gen)[0]  # one draw of the length law, at most 27,798 tokens
        rows = 1 + shape % 2
        q = torch.randn(rows, heads, length, d, device=dev, dtype=dt, requires_grad=True)
        k = torch.randn(rows, kv, length, d, device=dev, dtype=dt, requires_grad=True)
        v = torch.randn(rows, kv, length, d, device=dev, dtype=dt, requires_grad=True)
        for name in args.padded:
            row: dict = {"shape": shape, "rows": rows, "length": length, "backend": name}
            try:
                row["forward_s"] = twice(functools.partial(padded_attention, q, k, v, backends[name], False))
                row["forward_backward_s"] = twice(functools.partial(padded_attention, q, k, v, backends[name], True))
            except RuntimeError as exc:  # a backend that cannot take this call says so
                row["error"] = str(exc).splitlines()[0][:200]
            rows_out.append(row)
            print(json.dumps(row), flush=True)
    return rows_out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("out")
    ap.add_argument("--model", default="r1-distill-qwen-7b")
    ap.add_argument("--tokens", type=int, default=30_000)
    ap.add_argument("--shapes", type=int, default=4)
    ap.add_argument("--padded", nargs="*", default=[], choices=["cudnn", "flash", "efficient", "math"],
                    help="also time the padded rows' attention under these SDPA backends")
    args = ap.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("first_call_probe.py needs a CUDA GPU")
    from trainer.models.presets import preset_config

    cfg = preset_config(args.model)
    heads, kv, d = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.hidden_size // cfg.num_attention_heads
    dev, dt = torch.device("cuda"), torch.bfloat16
    gen = torch.Generator().manual_seed(0)
    result: dict = {"gpu": torch.cuda.get_device_name(), "model": args.model, "attention": [], "liger": []}
    for shape in range(args.shapes):
        lengths = packed_lengths(args.tokens, gen)
        total = sum(lengths)
        cu = torch.tensor([0] + torch.tensor(lengths).cumsum(0).tolist(), dtype=torch.int32, device=dev)
        q = torch.randn(total, heads, d, device=dev, dtype=dt, requires_grad=True)
        k = torch.randn(total, kv, d, device=dev, dtype=dt, requires_grad=True)
        v = torch.randn(total, kv, d, device=dev, dtype=dt, requires_grad=True)

        row = {"shape": shape, "rows": len(lengths), "tokens": total, "max_len": max(lengths),
               "forward_s": twice(functools.partial(attention, q, k, v, cu, max(lengths), False)),
               "forward_backward_s": twice(functools.partial(attention, q, k, v, cu, max(lengths), True))}
        result["attention"].append(row)
        print(json.dumps(row), flush=True)
    result["padded"] = padded_rows(args, heads, kv, d, dev, dt) if args.padded else []
    try:
        from liger_kernel.transformers.functional import liger_rms_norm, liger_swiglu
    except ImportError as exc:
        result["liger"] = f"not run: {exc}"
    else:
        hidden, inter = cfg.hidden_size, cfg.intermediate_size
        w = torch.ones(hidden, device=dev, dtype=dt, requires_grad=True)
        for tokens in (args.tokens - 1234, args.tokens - 4321, args.tokens - 17):
            x = torch.randn(tokens, hidden, device=dev, dtype=dt, requires_grad=True)
            a = torch.randn(tokens, inter, device=dev, dtype=dt, requires_grad=True)
            b = torch.randn(tokens, inter, device=dev, dtype=dt, requires_grad=True)

            row = {"tokens": tokens, "rms_norm_s": twice(functools.partial(liger_pair, liger_rms_norm, x, w, 1e-6)),
                   "swiglu_s": twice(functools.partial(liger_pair, liger_swiglu, a, b))}
            result["liger"].append(row)
            print(json.dumps(row), flush=True)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
