"""GPU measurements of the bundled GRPO trainer: the real GRPOTrainer phases on a local Ray, and the
figures derived from them by pytest_rlbench.derived (MFU, tokens/s per GPU, decode bandwidth).

    python benchmarks/gpu_step.py peaks                      # copy bandwidth and bf16 matmul rate
    python benchmarks/gpu_step.py engine --batch 128         # the fast engine alone: ms per decode step
    python benchmarks/gpu_step.py step --rollout fast --gpus 1 --gpus 2 --steps 2 --out step.json
    python benchmarks/gpu_step.py step --rollout hf --gen-only ...   # one generate call of the hf engine

``step`` runs, for each --rollout and each --gpus, a trainer on the same global batch: warm-up
steps, then timed steps (or, with --gen-only, one reshard + generate_sequences). Prompts are the
synthetic set padded to exactly --prompt-len tokens (benchmarks/long_prompts.py) and
rollout.ignore_eos makes every response exactly --response-len tokens, so every run does the same
work. Every figure printed is measured here; nothing is filled in.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
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


# ----------------------------------------------------------------------------- whole steps
def overrides(args: argparse.Namespace, rollout: str, gpus: int, data: Path) -> list[str]:
    mini = args.mini_batch or args.prompts
    return [
        f"trainer.device={'cpu' if args.cpu else 'cuda'}",
        "trainer.nnodes=1",
        f"trainer.n_gpus_per_node={gpus}",
        f"actor_rollout_ref.model.path={args.model}",
        f"data.train_files=[{data}]",
        f"data.train_batch_size={args.prompts}",
        f"data.max_prompt_length={args.prompt_len}",
        f"data.max_response_length={args.response_len}",
        f"actor_rollout_ref.rollout.n={args.n}",
        f"actor_rollout_ref.rollout.name={rollout}",
        "actor_rollout_ref.rollout.ignore_eos=True",
        f"actor_rollout_ref.actor.ppo_mini_batch_size={mini}",
        "actor_rollout_ref.actor.use_kl_loss=True",
        "trainer.save_freq=-1",
        *args.set,
    ]


def make_record(name: str, trainer, timings: list[dict[str, float]], batch, gpus: int, notes: list[str]):
    from pytest_rlbench.bench import batch_tokens, describe_config
    from pytest_rlbench.record import Hardware, ModelArch, PhaseRecord, Provenance, RunRecord

    cfg = trainer.cfg
    phases = {k: PhaseRecord(seconds=[t[k] for t in timings]) for k in timings[0]}
    spec = trainer.spec
    return RunRecord(
        name=name,
        provenance=Provenance(source="benchmarks/gpu_step.py", framework="pytest-rlbench", date=DATE, notes=notes),
        hardware=Hardware(device="gpu" if cfg.trainer.device == "cuda" else "cpu", nodes=1, world_size=gpus,
                          gpus_per_node=gpus if cfg.trainer.device == "cuda" else 0,
                          gpu_model=trainer.workers.info[0]["device_name"] if cfg.trainer.device == "cuda" else None),
        model=ModelArch(name=spec.name, model_type=spec.model_type, dtype="bfloat16", **spec.arch.to_dict()),
        config=describe_config(cfg),
        tokens=batch_tokens(batch, cfg.actor_rollout_ref.rollout.n, gpus),
        phases=phases,
    )


def summarise(record) -> dict[str, Any]:
    from pytest_rlbench.derived import derive

    figures = derive(record)
    out = {}
    for key, fig in figures.items():
        out[key] = fig.value
        if fig.value is None:
            continue
        if key.startswith(("timing_s/", "tokens_per_s_per_gpu/", "mfu/", "bandwidth_util/")):
            log(f"  {key:<36} {fig.value:>14,.4g} {fig.unit}")
    return out


def step_bench(args: argparse.Namespace) -> list[dict[str, Any]]:
    import ray
    import torch

    from benchmarks.long_prompts import write_padded_parquet
    from trainer.config import build_config
    from trainer.data.source import load_train_dataset
    from trainer.driver.grpo_trainer import GRPOTrainer
    from trainer.driver.ray_local import init_local_ray
    from trainer.models.presets import load_tokenizer

    os.environ.setdefault("NCCL_NVLS_ENABLE", "0")
    work = Path(tempfile.mkdtemp(prefix="gpu_step-"))
    data = write_padded_parquet(work / f"prompts{args.prompt_len}.parquet", max(512, 4 * args.prompts), args.prompt_len, args.model)
    init_local_ray(num_cpus=os.cpu_count(), num_gpus=0 if args.cpu else torch.cuda.device_count())
    runs = []
    try:
        for rollout in args.rollout:
            for gpus in args.gpus:
                cfg = build_config(overrides(args, rollout, gpus, data) + [f"trainer.default_local_dir={work / 'ckpt'}"])
                dataset = load_train_dataset(cfg.data, load_tokenizer(args.model), work)
                start = time.perf_counter()
                trainer = GRPOTrainer(cfg, dataset)
                setup_s = time.perf_counter() - start
                log(f"== {rollout}, {gpus} GPU(s): workers up in {setup_s:.1f} s; strategy "
                    f"{trainer.workers.info[0].get('strategy')}; {trainer.workers.info[0]['device_name']}")
                try:
                    timings = []
                    if args.gen_only:
                        prompts = next(trainer.loader)
                        for i in range(args.warmup + args.steps):
                            from trainer.timing import PhaseTimer

                            timer = PhaseTimer()
                            with timer.phase("gen"):
                                with timer.phase("reshard"):
                                    trainer.reshard()
                                with timer.phase("generate_sequences"):
                                    batch = trainer.generate_sequences(prompts)
                            log(f"  gen {i}: " + ", ".join(f"{k}={v:.3f}" for k, v in timer.seconds.items()))
                            if i >= args.warmup:
                                timings.append(dict(timer.seconds))
                    else:
                        for i in range(args.warmup + args.steps):
                            result = trainer.train_step(next(trainer.loader))
                            log(f"  step {i}: " + ", ".join(f"{k}={v:.3f}" for k, v in result.timing_s.items())
                                + f"; grad_norm {result.metrics.get('actor/grad_norm', float('nan')):.3g}")
                            if i >= args.warmup:
                                timings.append(dict(result.timing_s))
                        batch = trainer.last_batch
                    notes = [f"prompts padded to {args.prompt_len} tokens", "rollout.ignore_eos=True",
                             f"overrides: {' '.join(args.set)}"]
                    record = make_record(f"{rollout}-{gpus}gpu", trainer, timings, batch, gpus, notes)
                    log(f"  {record.tokens.num_sequences} sequences, {record.tokens.prompt_tokens} prompt + "
                        f"{record.tokens.response_tokens} response tokens")
                    figures = summarise(record)
                    mem = trainer.workers.all("memory_stats") if hasattr(trainer.workers.workers[0], "memory_stats") else None
                    engine_stats = trainer.workers.all("rollout_stats")
                    log(f"  memory {mem}; engine {engine_stats}")
                    runs.append({"rollout": rollout, "gpus": gpus, "setup_s": setup_s, "timings": timings,
                                 "engine_stats": engine_stats,
                                 "figures": figures, "tokens": record.tokens.__dict__, "worker_memory": mem,
                                 "config": overrides(args, rollout, gpus, data)})
                finally:
                    trainer.shutdown()
    finally:
        ray.shutdown()
    return runs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("what", choices=["peaks", "engine", "step"])
    parser.add_argument("--model", default="r1-distill-qwen-1.5b")
    parser.add_argument("--prompts", type=int, default=16)
    parser.add_argument("--n", type=int, default=8)
    parser.add_argument("--prompt-len", type=int, default=256)
    parser.add_argument("--response-len", type=int, default=1024)
    parser.add_argument("--mini-batch", type=int, default=0, help="ppo_mini_batch_size (default: all prompts)")
    parser.add_argument("--rollout", action="append", default=None)
    parser.add_argument("--gpus", type=int, action="append", default=None)
    parser.add_argument("--steps", type=int, default=2)
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--gen-only", action="store_true")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    parser.add_argument("--batch", type=int, default=128)
    parser.add_argument("--engines", nargs="+", default=["fast"])
    parser.add_argument("--reps", type=int, default=2)
    parser.add_argument("--eager", action="store_true")
    parser.add_argument("--cpu", action="store_true", help="a CPU smoke run of the same code (step only)")
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    args.rollout = args.rollout or ["fast"]
    args.gpus = args.gpus or [1]
    if args.what == "peaks":
        result: Any = peaks()
    elif args.what == "engine":
        result = engine_bench(args)
    else:
        result = step_bench(args)
    if args.out:
        Path(args.out).write_text(json.dumps({"date": DATE, "argv": sys.argv, "result": result}, indent=1, default=str))


if __name__ == "__main__":
    main()
