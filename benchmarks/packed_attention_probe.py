"""Times the training phases' attention over packed rows: torch's varlen flash kernel against cuDNN's.

    python benchmarks/packed_attention_probe.py OUT.json [--shapes 15000,14000 27648 ...] [--heads 12 2 128]

Why (issue 31): at the 1.5B replay's rows (14-28k tokens) causal attention is about a third of the
training phases' FLOPs, and the trainer runs it two ways (trainer/models/packed_attention.py,
trainer.batch.PACK_MIN_PADDING): packed micro-batches through ``torch.nn.attention.varlen`` (torch's
FlashAttention 2), the others padded to their longest row through SDPA, where cuDNN's kernel runs.
cuDNN also takes packed rows (``aten::_cudnn_attention_forward`` given cumulative lengths, the path
torch's nested tensors use). For each shape (a micro-batch's row lengths, comma-separated) this times:

- ``flash_varlen``: the trainer's packed call (``packed_attention._varlen_causal``);
- ``cudnn_packed``: cuDNN over the same packed rows, K and V at their own head count (grouped-query),
  and ``cudnn_packed_repeat`` with K and V repeated to the query heads (in torch 2.11 on an H200 both
  gave wrong gradients past the first row and faulted at 27,648 tokens: docs/benchmarks.md);
- ``cudnn_padded``: SDPA's cuDNN kernel on the rows padded to the longest, as the trainer's padded
  layout runs them (the padding's work included, the copies to and from it not);
- ``cudnn_rows``: SDPA's cuDNN kernel one row at a time, each row's tail padded to a multiple of
  ``--bucket`` tokens, so that rows of nearby lengths share one execution plan (causal attention:
  a real token never reads the padding after it, whose outputs are dropped).

Each backend runs in a process of its own (``--backends NAME``; the default runs each in turn as a
child process), so a backend that faults the GPU or fills cuDNN's plan cache leaves the others' figures
as they would be alone.

Each: the first call's seconds (a new shape: cuDNN builds an execution plan per shape), then the
median of the timed calls, forward alone (old_log_prob's and ref's work) and forward + backward
(update_actor's); TFLOP/s counts the causal attention's FLOPs over the real tokens (forward 2 s^2 d h
per row, backward 2.5 times that), the same for every backend. Each backend's output and gradients
are compared with the flash kernel's, and on a small shape with a float32 reference. A run of
``--new-shapes`` distinct random micro-batches times what each backend pays when every call is a new
shape, as in a step. Results: OUT.json, rewritten after each shape. GPU only.
"""

from __future__ import annotations

import argparse
import functools
import json
import random
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
import first_call_probe  # noqa: E402  (benchmarks/, this script's folder)
from pdl_matmul_chain import timed_log  # noqa: E402

from trainer.models.packed_attention import _varlen_causal  # noqa: E402

DEFAULT_SHAPES = ["15000,14000", "27648", "27000,2500", "10000,10000,9000", "16000,8000", "4000,3000,3000,2000"]


def causal_flops(lengths: list[int], heads: int, head_dim: int) -> float:
    """Forward FLOPs of causal attention over these rows: QK^T and PV over half of each s x s."""
    return sum(2.0 * s * s * head_dim * heads for s in lengths)


def cu_seqlens(lengths: list[int], dtype: torch.dtype) -> torch.Tensor:
    bounds = [0]
    for s in lengths:
        bounds.append(bounds[-1] + s)
    return torch.tensor(bounds, dtype=dtype, device="cuda")


def flash_varlen(q, k, v, lengths, scale):
    return _varlen_causal(q, k, v, cu_seqlens(lengths, torch.int32), max(lengths), scale)


def cudnn_packed(q, k, v, lengths, scale, repeat: bool = False):
    if repeat and k.shape[1] != q.shape[1]:
        group = q.shape[1] // k.shape[1]
        k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
    cu = cu_seqlens(lengths, torch.int32)
    out = torch.ops.aten._cudnn_attention_forward(
        q, k, v, None, cu, cu, max(lengths), max(lengths), True, 0.0, True, False, scale=scale)
    return out[0]  # [T, H, D]


def cudnn_padded(q, k, v, lengths, scale):
    """Rows padded to the longest, [B, H, S, D], through SDPA's cuDNN kernel; back to packed rows."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    width, rows = max(lengths), len(lengths)

    def pad(t):
        out = t.new_zeros(rows, width, t.shape[1], t.shape[2])
        start = 0
        for i, s in enumerate(lengths):
            out[i, :s] = t[start:start + s]
            start += s
        return out.transpose(1, 2)  # [B, H, S, D]

    qp, kp, vp = pad(q), pad(k), pad(v)
    with sdpa_kernel([SDPBackend.CUDNN_ATTENTION]):
        out = F.scaled_dot_product_attention(qp, kp, vp, is_causal=True, scale=scale, enable_gqa=True)
    return torch.cat([out[i, :, :s].transpose(0, 1) for i, s in enumerate(lengths)])


def cudnn_rows(q, k, v, lengths, scale, bucket: int = 256):
    """Each row alone through SDPA's cuDNN kernel, [1, H, L, D] with L its length rounded up to
    ``bucket`` (zeros after its tokens); back to packed rows."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    outs, start = [], 0
    for s in lengths:
        width = -(-s // bucket) * bucket
        rows = [F.pad(t[start:start + s], (0, 0, 0, 0, 0, width - s)).transpose(0, 1).unsqueeze(0)  # [1, H, L, D]
                for t in (q, k, v)]
        with sdpa_kernel([SDPBackend.CUDNN_ATTENTION]):
            out = F.scaled_dot_product_attention(*rows, is_causal=True, scale=scale, enable_gqa=True)
        outs.append(out[0, :, :s].transpose(0, 1))
        start += s
    return torch.cat(outs)


def padded_attention_only(q, k, v, lengths, scale):
    """A callable running SDPA alone on already padded tensors, for cudnn_padded's timing."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    width, rows = max(lengths), len(lengths)
    qp = q.new_zeros(rows, q.shape[1], width, q.shape[2]).requires_grad_(q.requires_grad)
    kp = k.new_zeros(rows, k.shape[1], width, k.shape[2]).normal_().requires_grad_(k.requires_grad)
    vp = v.new_zeros(rows, v.shape[1], width, v.shape[2]).normal_().requires_grad_(v.requires_grad)
    with torch.no_grad():
        qp.normal_()

    def call():
        with sdpa_kernel([SDPBackend.CUDNN_ATTENTION]):
            return F.scaled_dot_product_attention(qp, kp, vp, is_causal=True, scale=scale, enable_gqa=True)

    return call


def timed(fn, calls: int) -> list[float]:
    out = []
    for _ in range(calls):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        torch.cuda.synchronize()
        out.append(start.elapsed_time(end) / 1e3)
    return out


def inputs(lengths, heads, kv_heads, head_dim, seed=0, grad=False):
    gen = torch.Generator(device="cuda").manual_seed(seed)
    total = sum(lengths)
    q, k, v = (torch.randn(total, h, head_dim, generator=gen, device="cuda", dtype=torch.bfloat16)
               for h in (heads, kv_heads, kv_heads))
    return [t.requires_grad_(grad) for t in (q, k, v)]


def compare(a: torch.Tensor, b: torch.Tensor) -> dict:
    diff = (a.float() - b.float())
    return {"max_abs": float(diff.abs().max()), "rel_fro": float(diff.norm() / b.float().norm().clamp_min(1e-30))}


def reference_fp32(q, k, v, lengths, scale):
    """Per-row causal attention (SDPA's math, in q's dtype: float32 here), K and V repeated to the
    query heads."""
    group = q.shape[1] // k.shape[1]
    out, start = [], 0
    for s in lengths:
        rows = [t[start:start + s].transpose(0, 1) for t in (q, k, v)]
        rows[1], rows[2] = (r.repeat_interleave(group, dim=0) for r in rows[1:])
        from torch.nn.attention import SDPBackend, sdpa_kernel

        with sdpa_kernel([SDPBackend.MATH]):
            out.append(F.scaled_dot_product_attention(*rows, is_causal=True, scale=scale).transpose(0, 1))
        start += s
    return torch.cat(out)


BACKENDS = {
    "flash_varlen": flash_varlen,
    "cudnn_packed": cudnn_packed,
    "cudnn_packed_repeat": lambda q, k, v, lengths, scale: cudnn_packed(q, k, v, lengths, scale, repeat=True),
    "cudnn_padded": cudnn_padded,
    "cudnn_rows": cudnn_rows,
}


def time_backend(name, fn, q, k, v, lengths, scale, grad_out, calls) -> tuple[dict, torch.Tensor, list]:
    """One backend at one shape: (figures, its forward output, its gradients of q, k, v)."""
    fwd_flops = causal_flops(lengths, q.shape[1], q.shape[2])
    result: dict = {}

    def forward():
        return fn(q, k, v, lengths, scale)

    with torch.no_grad():
        result["first_forward_s"] = first_call_probe.timed(forward)  # wall seconds, the device synchronised
        if name == "cudnn_padded":  # the padded layout's own kernel time, without the copies
            call = padded_attention_only(q.detach(), k.detach(), v.detach(), lengths, scale)
            fwd = timed(call, calls)
        else:
            fwd = timed(forward, calls)
        output = forward()
    result["forward_s"] = statistics.median(fwd)
    result["forward_tflops"] = fwd_flops / result["forward_s"] / 1e12
    for t in (q, k, v):
        t.grad = None
    forward().backward(grad_out)
    grads = [t.grad.clone() for t in (q, k, v)]
    if name == "cudnn_padded":
        call = padded_attention_only(q.detach().requires_grad_(), k.detach().requires_grad_(),
                                        v.detach().requires_grad_(), lengths, scale)
        padded_grad = torch.randn_like(call())

        def train_once():
            call().backward(padded_grad)
    else:
        def train_once():
            forward().backward(grad_out)
    result["forward_backward_s"] = statistics.median(timed(train_once, calls))
    result["forward_backward_tflops"] = 3.5 * fwd_flops / result["forward_backward_s"] / 1e12
    return result, output, grads


def probe_shape(name, lengths, heads, kv_heads, head_dim, calls, log) -> dict:
    """One backend at one shape, its output and gradients compared with the flash kernel's (run after
    the timings: the flash kernel has no plans to build, so it changes nothing the timings saw)."""
    scale = head_dim ** -0.5
    row: dict = {"lengths": lengths, "tokens": sum(lengths), "forward_tflop": causal_flops(lengths, heads, head_dim) / 1e12}
    q, k, v = inputs(lengths, heads, kv_heads, head_dim, grad=True)
    grad_out = torch.randn_like(q)
    try:
        figures, output, grads = time_backend(name, BACKENDS[name], q, k, v, lengths, scale, grad_out, 3 if name == "cudnn_packed" else calls)
        row.update(figures)
        if name != "flash_varlen":
            for t in (q, k, v):
                t.grad = None
            flash = flash_varlen(q, k, v, lengths, scale)
            flash.backward(grad_out)
            row["output_vs_flash"] = compare(output, flash)
            row["grads_vs_flash"] = [compare(a, t.grad) for a, t in zip(grads, (q, k, v), strict=True)]
    except Exception as exc:  # a backend this torch or cuDNN refuses: say why
        row["error"] = f"{type(exc).__name__}: {str(exc)[:400]}"
    log({"backend": name, **row})
    return row


def probe_accuracy(names, heads, kv_heads, head_dim) -> dict:
    """Each backend's output and gradients of q, k, v against float32 attention on a small packed batch
    (three rows: a gradient that goes to the wrong row shows in the second and third)."""
    lengths = [700, 300, 129]
    scale = head_dim ** -0.5
    q, k, v = inputs(lengths, heads, kv_heads, head_dim, seed=1, grad=True)
    grad_out = torch.randn_like(q)
    leaves = [t.detach().float().requires_grad_() for t in (q, k, v)]
    ref = reference_fp32(*leaves, lengths, scale)
    ref.backward(grad_out.float())
    out = {}
    for name in names:
        try:
            for t in (q, k, v):
                t.grad = None
            result = BACKENDS[name](q, k, v, lengths, scale)
            result.backward(grad_out)
            out[name] = {"output": compare(result, ref),
                         "grads": [compare(t.grad, leaf.grad) for t, leaf in zip((q, k, v), leaves, strict=True)]}
        except Exception as exc:
            out[name] = {"error": f"{type(exc).__name__}: {str(exc)[:400]}"}
    return out


def new_shapes(names, count, heads, kv_heads, head_dim, budget, seed, log) -> dict:
    """Each backend's total seconds over ``count`` distinct micro-batches (1-3 rows of random lengths
    under ``budget`` tokens), forward + backward, each shape met once: the plan builds included."""
    rnd = random.Random(seed)
    shapes = []
    for _ in range(count):
        rows = rnd.choice([1, 2, 2, 3])
        lengths = [rnd.randint(1500, budget // rows) for _ in range(rows)]
        shapes.append(lengths)
    scale = head_dim ** -0.5
    totals = {}
    for name in names:
        fn = BACKENDS[name]
        try:
            torch.cuda.synchronize()
            started = time.perf_counter()
            for i, lengths in enumerate(shapes):
                q, k, v = inputs(lengths, heads, kv_heads, head_dim, seed=100 + i, grad=True)
                fn(q, k, v, lengths, scale).backward(torch.ones_like(q))
            torch.cuda.synchronize()
            totals[name] = time.perf_counter() - started
        except Exception as exc:
            totals[name] = f"{type(exc).__name__}: {str(exc)[:300]}"
    result = {"shapes": shapes, "seconds": totals}
    log({"new_shapes": count, "seconds": totals})
    return result


def run_backend(name: str, args, log) -> dict:
    heads, kv_heads, head_dim = args.heads
    report: dict = {"accuracy_vs_fp32": probe_accuracy([name], heads, kv_heads, head_dim)[name], "shapes": []}
    log({"backend": name, "accuracy_vs_fp32": report["accuracy_vs_fp32"]})
    if "error" in report["accuracy_vs_fp32"]:
        return report
    for spec in args.shapes:
        report["shapes"].append(probe_shape(name, [int(s) for s in spec.split(",")], heads, kv_heads, head_dim,
                                            args.calls, log))
    if args.new_shapes:
        report["new_shapes"] = new_shapes([name], args.new_shapes, heads, kv_heads, head_dim, args.budget, 0, log)
    return report


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("out", type=Path)
    ap.add_argument("--backends", nargs="+", default=list(BACKENDS), choices=list(BACKENDS))
    ap.add_argument("--shapes", nargs="+", default=DEFAULT_SHAPES, help="row lengths of one micro-batch, comma-separated")
    ap.add_argument("--heads", nargs=3, type=int, default=[12, 2, 128], metavar=("Q", "KV", "D"),
                    help="query heads, K/V heads, head dim (default: the 1.5B's)")
    ap.add_argument("--calls", type=int, default=7, help="timed calls per figure (median)")
    ap.add_argument("--new-shapes", type=int, default=24, help="distinct micro-batches for the plan-cost run (0: skip)")
    ap.add_argument("--budget", type=int, default=30000, help="tokens per micro-batch in the plan-cost run")
    ap.add_argument("--bucket", type=int, default=256, help="cudnn_rows: each row's length rounded up to this")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)  # one backend, in this process
    args = ap.parse_args()
    if not torch.cuda.is_available():
        sys.exit("packed_attention_probe.py: needs a CUDA GPU")
    BACKENDS["cudnn_rows"] = functools.partial(cudnn_rows, bucket=args.bucket)
    log = timed_log()
    if args.child:
        args.out.write_text(json.dumps(run_backend(args.backends[0], args, log), indent=1))
        return
    report: dict = {"device": torch.cuda.get_device_name(), "torch": torch.__version__,
                    "cudnn": torch.backends.cudnn.version(), "heads": args.heads, "calls": args.calls,
                    "bucket": args.bucket, "backends": {}}
    for name in args.backends:  # each in a process of its own
        part = args.out.with_suffix(f".{name}.json")
        command = [sys.executable, __file__, str(part), "--child", "--backends", name, "--shapes", *args.shapes,
                   "--heads", *map(str, args.heads), "--calls", str(args.calls), "--new-shapes", str(args.new_shapes),
                   "--budget", str(args.budget), "--bucket", str(args.bucket)]
        rc = subprocess.run(command).returncode
        report["backends"][name] = json.loads(part.read_text()) if part.exists() else {"error": f"exit status {rc}"}
        if part.exists():
            part.unlink()
        args.out.write_text(json.dumps(report, indent=1))  # kept after each backend: nothing lost on a timeout


if __name__ == "__main__":
    main()
