"""Probe: the device counts read from the profiler's raw events against key_averages(), and how long each takes."""
import os
import time

import torch
import torch.distributed as dist
from torch.profiler import ProfilerActivity, profile

from trainer.config import RolloutConfig
from trainer.models.presets import build_model
from trainer.models.tokenizer import build_tokenizer
from trainer.rollout import FastRolloutEngine, SamplingParams
from trainer.work_counts import DeviceType, device_counts, profiled_events

os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT="29533")
dist.init_process_group("nccl", rank=0, world_size=1)


def both(label, fn):
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    t0 = time.perf_counter()
    raw = device_counts(profiled_events(prof))
    t1 = time.perf_counter()
    avg = device_counts((e.key, e.device_type == DeviceType.CUDA, e.count) for e in prof.key_averages())
    t2 = time.perf_counter()
    print(f"{label}: raw {t1 - t0:.2f} s, key_averages {t2 - t1:.2f} s, equal {raw == avg}\n  raw {raw}\n  avg {avg}", flush=True)


tok = build_tokenizer()
small = build_model("tiny", seed=0).to("cuda", torch.bfloat16)
prompts = [tok.encode(t) for t in ["What is 2+3?", "Hi", "Compute 17*4 please", "x"]]
engine = FastRolloutEngine(small, tok, RolloutConfig(name="fast"))
gen = lambda: engine.generate(prompts, [0, 1, 2, 3], [], 4, 512, SamplingParams(), 1)  # noqa: E731
gen()
both("tiny decode, up to 512 steps x 16 rows, graphs", gen)

model = build_model("r1-distill-qwen-1.5b", dtype=torch.bfloat16, device="cuda", seed=0)
ids = torch.randint(0, 1000, (8, 1280), device="cuda")


def train():
    for _ in range(2):
        loss = model(input_ids=ids).logits.float().mean()
        loss.backward()
    t = torch.ones(1024, device="cuda")
    dist.all_reduce(t)
    t.sum().item()


train()
both("1.5B forward+backward x2 at 8 x 1280, one all_reduce", train)
dist.destroy_process_group()
