"""Probe: what a counted round costs on a GPU, by counter, and whether the one dispatch mode
(OpAndFlopCounter) counts what OpCounter stacked over FlopCounterMode counted. Two workloads of
step16x8's kind on the 1.5B preset with liger-kernel's fused RMSNorm, SwiGLU and RoPE: a training
forward and backward of micro-batches 8 x 1280 (update_actor's), and the fast engine's CUDA-graph
decode of 128 rows (16 prompts x 8) of 256 prompt tokens for 256 steps (generation's)."""
import os
import time

import torch
import torch.distributed as dist
from torch.profiler import ProfilerActivity, profile
from torch.utils.flop_counter import FlopCounterMode

from trainer.config import RolloutConfig
from trainer.models.liger import apply_liger
from trainer.models.presets import build_model
from trainer.models.tokenizer import build_tokenizer
from trainer.rollout import FastRolloutEngine, SamplingParams
from trainer.work_counts import (
    OpAndFlopCounter,
    OpCounter,
    attention_flop_formulas,
    device_counts,
    profiled_events,
)

os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT="29533")
dist.init_process_group("nccl", rank=0, world_size=1)


def timed(fn):
    torch.cuda.synchronize()
    t = time.perf_counter()
    fn()
    torch.cuda.synchronize()
    return time.perf_counter() - t


def variants(label, fn):
    fn()
    plain = min(timed(fn) for _ in range(2))
    print(f"{label}: plain {plain:.2f} s", flush=True)
    out = {}

    def one():
        c = OpAndFlopCounter(attention_flop_formulas())
        with c:
            fn()
        out["one"] = (c.ops, int(c.flops))

    def stacked():
        f, o = FlopCounterMode(display=False, custom_mapping=attention_flop_formulas()), OpCounter()
        with f, o:
            fn()
        out["stacked"] = (o.ops, int(f.get_total_flops()))

    def profiled(activities, key):
        def run():
            t0 = time.perf_counter()
            with profile(activities=activities) as prof:
                fn()
                torch.cuda.synchronize()
            t1 = time.perf_counter()
            out[key] = device_counts(profiled_events(prof))
            out[key + "_read"] = (t1 - t0, time.perf_counter() - t1)
        return run

    def full_new():
        c = OpAndFlopCounter(attention_flop_formulas())
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof, c:
            fn()
            torch.cuda.synchronize()
        out["full_new"] = (c.ops, int(c.flops), device_counts(profiled_events(prof)))

    def full_old():
        f, o = FlopCounterMode(display=False, custom_mapping=attention_flop_formulas()), OpCounter()
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof, f, o:
            fn()
            torch.cuda.synchronize()
        out["full_old"] = (o.ops, int(f.get_total_flops()), device_counts(profiled_events(prof)))

    for name, run in [("one mode", one), ("stacked modes", stacked),
                      ("profiler cpu+cuda", profiled([ProfilerActivity.CPU, ProfilerActivity.CUDA], "prof")),
                      ("profiler cuda only", profiled([ProfilerActivity.CUDA], "prof_cuda")),
                      ("count_work now (one mode + profiler)", full_new),
                      ("count_work before (stacked + profiler)", full_old)]:
        s = timed(run)
        print(f"  {name}: {s:.2f} s ({s / plain:.1f}x plain)", flush=True)
    print(f"  ops, flops: one {out['one']} stacked {out['stacked']} equal {out['one'] == out['stacked']}")
    print(f"  profiler cpu+cuda: {out['prof']} (profile {out['prof_read'][0]:.2f} s, read {out['prof_read'][1]:.2f} s)")
    print(f"  profiler cuda only: {out['prof_cuda']} equal {out['prof'] == out['prof_cuda']}")
    print(f"  full now {out['full_new']}\n  full before {out['full_old']}", flush=True)


model = build_model("r1-distill-qwen-1.5b", dtype=torch.bfloat16, device="cuda", seed=0)
apply_liger(model)
ids = torch.randint(0, 1000, (8, 1280), device="cuda")


def train():
    for _ in range(2):
        loss = model(input_ids=ids).logits.float().mean()
        loss.backward()
    t = torch.ones(1024, device="cuda")
    dist.all_reduce(t)
    t.sum().item()


variants("1.5B+liger forward+backward x2 at 8 x 1280, one all_reduce", train)
model.zero_grad(set_to_none=True)
tok = build_tokenizer()
prompts = [torch.randint(10, 1000, (256,)).tolist() for _ in range(16)]
with torch.no_grad():
    engine = FastRolloutEngine(model, tok, RolloutConfig(name="fast", ignore_eos=True))
    gen = lambda: engine.generate(prompts, list(range(16)), [], 8, 256, SamplingParams(), 1)  # noqa: E731
    variants("1.5B decode, 16 prompts x 8 of 256 tokens, 256 steps, graphs", gen)
dist.destroy_process_group()
