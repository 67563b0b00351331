"""What the suites cannot measure: the GPU's own ceilings and a rollout engine on its own.

    python benchmarks/gpu_micro.py peaks                      # copy bandwidth and bf16 matmul rate
    python benchmarks/gpu_micro.py engine --batch 128         # the fast engine alone: ms per decode step

Training phases, whole steps, GPU-count sweeps and memory options are measured by the suites
(``pytest suites/ --gpu ...``, see docs/benchmarks.md), which build the trainer the one way
``trainer.build.build_trainer`` does.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # run as a script from anywhere

DATE = time.strftime("%Y-%m-%d")


def log(*args: Any) -> None:
    print(*args, flush=True)


# ----------------------------------------------------------------------------- peaks
def peaks() -> dict[str, float]:
    """Device-to-device copy (bytes read + written per second) and an 8192^3 bf16 matmul rate."""
    import torch

    def timed(fn, reps: int) -> float:
        fn()
        torch.cuda.synchronize()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(reps):
            fn()
        end.record()
        torch.cuda.synchronize()
        return start.elapsed_time(end) / 1000 / reps

    src = torch.randn(2**30 // 2, dtype=torch.bfloat16, device="cuda")  # 1 GiB
    dst = torch.empty_like(src)
    copy_s = timed(lambda: dst.copy_(src), 20)
    a = torch.randn(8192, 8192, dtype=torch.bfloat16, device="cuda")
    b = torch.randn(8192, 8192, dtype=torch.bfloat16, device="cuda")
    mm_s = timed(lambda: a @ b, 20)
    out = {
        "device": torch.cuda.get_device_name(),
        "copy_bytes_per_s": 2 * src.numel() * 2 / copy_s,
        "bf16_matmul_flops": 2 * 8192**3 / mm_s,
    }
    log(f"peaks: {out['device']}: copy {out['copy_bytes_per_s'] / 1e12:.2f} TB/s (read + write), "
        f"bf16 matmul 8192^3 {out['bf16_matmul_flops'] / 1e12:.0f} TFLOP/s")
    return out


# ----------------------------------------------------------------------------- engine alone
def engine_bench(args: argparse.Namespace) -> dict[str, Any]:
    """The fast engine on its own (no Ray): prefill + decode of --batch rows, ignore_eos."""
    import torch

    from trainer.config import RolloutConfig
    from trainer.models.presets import build_model, load_tokenizer
    from trainer.rollout import SamplingParams, make_engine

    model = build_model(args.model, dtype=torch.bfloat16, device="cuda", seed=1)
    model.requires_grad_(False)
    tok = load_tokenizer(args.model)
    g = torch.Generator().manual_seed(0)
    prompts = [torch.randint(5, 100, (args.prompt_len,), generator=g).tolist() for _ in range(args.batch)]
    results = {}
    for name in args.engines:
        cfg = RolloutConfig(name=name, ignore_eos=True, enforce_eager=args.eager)
        engine = make_engine(name, model, tok, cfg, share_weights=True) if name != "fast" else make_engine(name, model, tok, cfg)
        times = []
        for i in range(args.reps + 1):
            torch.cuda.synchronize()
            start = time.perf_counter()
            batch = engine.generate(prompts, list(range(args.batch)), [], 1, args.response_len, SamplingParams(), seed=i)
            torch.cuda.synchronize()
            times.append(time.perf_counter() - start)
            log(f"engine {name} run {i}: {times[-1]:.3f} s, {batch.response_mask.sum().item()} tokens "
                f"{getattr(engine, 'stats', {})}")
        t = statistics.median(times[1:])
        tokens = args.batch * args.response_len
        results[name] = {"seconds": t, "tokens_per_s": tokens / t, "ms_per_step": 1000 * t / args.response_len,
                         "first_call_s": times[0], "stats": dict(getattr(engine, "stats", {}))}
        log(f"engine {name}: batch {args.batch}, prompt {args.prompt_len}, {args.response_len} new: {t:.3f} s = "
            f"{tokens / t:,.0f} tokens/s = {1000 * t / args.response_len:.2f} ms per step (incl. prefill)")
        del engine
        torch.cuda.empty_cache()
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("what", choices=["peaks", "engine"])
    parser.add_argument("--model", default="r1-distill-qwen-1.5b")
    parser.add_argument("--prompt-len", type=int, default=256)
    parser.add_argument("--response-len", type=int, default=1024)
    parser.add_argument("--batch", type=int, default=128)
    parser.add_argument("--engines", nargs="+", default=["fast"])
    parser.add_argument("--reps", type=int, default=2)
    parser.add_argument("--eager", action="store_true")
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    if args.what == "peaks":
        result: Any = peaks()
    else:
        result = engine_bench(args)
    if args.out:
        Path(args.out).write_text(json.dumps({"date": DATE, "argv": sys.argv, "result": result}, indent=1, default=str))


if __name__ == "__main__":
    main()
