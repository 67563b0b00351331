"""The GPU test test_attention_chunks_are_chosen_for_the_rows_still_running's engine run on the CPU,
with the GPU's chunk rule switched on and each decode step's (slots, attention length, chunks) key
recorded (on a CPU the engine has no split kernel and no CUDA graphs, so it keeps no keys itself).
Run from the repository root, beside the tests' fixtures (tests/conftest.py):
    cp THIS_FILE tests/test_keys_sim_tmp.py && python -m pytest -q -s -p no:cacheprovider tests/test_keys_sim_tmp.py; rm tests/test_keys_sim_tmp.py
Output: cpu_compaction_keys.txt beside this file."""
import math

import torch

from trainer.config import RolloutConfig
from trainer.config.schema import TargetLengthsConfig
from trainer.models.presets import build_model
from trainer.rollout import FastRolloutEngine, SamplingParams

SEED = 11  # the test's


def rule(rows, kv_heads, attn_len, programs):  # trainer.kernels.triton_decode_attention.split_count (no Triton here)
    return max(1, min(programs // max(1, rows * kv_heads), math.ceil(attn_len / 256), 128))


def test_keys(tok, prompts, liven):
    model = liven(build_model("tiny", seed=0)).to(torch.bfloat16)
    config = RolloutConfig(name="fast", target_lengths=TargetLengthsConfig(distribution="lognormal", mean=300.0, sigma=1.0))
    engine = FastRolloutEngine(model, tok, config, check_every=8)
    engine._split_count, engine.skip_ended_rows, engine.compact_rows = rule, True, True
    for programs in (192, 396, 264):
        engine._attention_programs = programs
        keys, step = [], engine._decode_step

        def recorded(view, attn_len, sampling, splits=0, keys=keys, step=step):
            keys.append((view.batch, attn_len, splits))
            return step(view, attn_len, sampling, splits)

        engine._decode_step = recorded
        engine.generate(prompts, list(range(len(prompts))), [], 8, 1500, SamplingParams(), SEED)
        engine._decode_step = step
        met = list(dict.fromkeys(keys))
        by_slots = {k: rule(k[0], 2, k[1], programs) for k in met}
        print(f"programs {programs}: keys past the slots' count {[k for k in met if k[2] > by_slots[k]]}; "
              f"first keys of 64 slots {[k for k in met if k[0] == 64][:2]}; {len(met)} keys")
