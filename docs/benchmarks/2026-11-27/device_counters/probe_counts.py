"""Probe: what trainer.work_counts' device counters see on a GPU (fast engine with graphs, eager, a matmul)."""
import torch

from trainer.config import RolloutConfig
from trainer.config.schema import TargetLengthsConfig
from trainer.models.presets import build_model
from trainer.models.tokenizer import build_tokenizer
from trainer.rollout import FastRolloutEngine, SamplingParams
from trainer.work_counts import count_work

tok = build_tokenizer()
model = build_model("tiny", seed=0).to("cuda", torch.bfloat16)
prompts = [tok.encode(t) for t in ["What is 2+3?", "Hi", "Compute 17*4 please", "x"]]
for eager in (False, True):
    cfg = RolloutConfig(name="fast", enforce_eager=eager,
                        target_lengths=TargetLengthsConfig(distribution="lognormal", mean=100.0, sigma=1.0))
    engine = FastRolloutEngine(model, tok, cfg)
    engine.generate(prompts, [0, 1, 2, 3], [], 4, 300, SamplingParams(), 1)  # captures
    for i in range(2):
        _, w = count_work(lambda e=engine: e.generate(prompts, [0, 1, 2, 3], [], 4, 300, SamplingParams(), 1))
        print("eager" if eager else "graphs", i, w, flush=True)
a = torch.randn(512, 512, device="cuda")
print("matmul x3 + item", count_work(lambda: [(a @ a).sum().item() for _ in range(3)])[1])
