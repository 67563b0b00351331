"""Where the actor's time goes on long sequences (issue 15: training at 14-28k tokens runs at ~15% MFU).

    python benchmarks/longseq_profile.py OUT_DIR [--model r1-distill-qwen-1.5b] [--lengths 14000 14000,10000]
        [--layouts packed left-justified "padding mask"] [--checkpointing full mlp mlp/14 none] [--liger]

For each case (comma-separated row lengths: one micro-batch, right-padded to its longest row as the
trainer pads it; prompts of 148 tokens) it times, on one GPU without FSDP, the log-prob forward that
old_log_prob runs (no grad) and a forward + backward with gradient checkpointing (update_actor's
work), in three layouts: packed (use_remove_padding: the rows' real tokens end to end, one
variable-length flash-attention call; here every case is packed, where the trainer packs only
micro-batches that padding would grow by trainer.batch.PACK_MIN_PADDING), the trainer's default (rows left-justified and padded to the
longest, no attention mask: the causal kernel) and the decoder called with the batch's padding mask,
as the trainer did before. Figures: seconds, tokens/s, and TFLOP/s of model FLOPs (2N per token
forward, 6N with backward, 8N with recompute) plus causal attention FLOPs, and the peak GPU memory of
the forward + backward. --checkpointing names the gradient checkpointing of the forward + backward,
each its own row: a gradient_checkpointing_policy, optionally /LAYERS (gradient_checkpointing_layers),
or none (default: full); the TFLOP/s figure counts a full recompute's FLOPs whatever it names, so it
compares seconds, not MFU. --liger applies liger-kernel's RMSNorm, SwiGLU and RoPE as use_liger does.
With --trace it also writes the ten costliest kernels of one forward per case. Results:
OUT_DIR/longseq_profile.json.
"""

from __future__ import annotations

import argparse
import functools
import json
import time
from pathlib import Path

import torch

from trainer.algorithms.entropy import logprobs_from_hidden
from trainer.models.checkpointing import disable_gradient_checkpointing, enable_gradient_checkpointing
from trainer.models.presets import build_model
from trainer.workers.fsdp import PolicyModel

PROMPT = 148


def timed(fn, repeats: int = 3) -> float:
    fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        times.append(time.perf_counter() - start)
    return sorted(times)[len(times) // 2]


def make_batch(lengths: list[int], vocab: int, device: torch.device):
    width = max(lengths)
    ids = torch.randint(0, vocab, (len(lengths), width), device=device)
    mask = torch.zeros_like(ids)
    for i, n in enumerate(lengths):
        mask[i, :n] = 1
    positions = (mask.cumsum(-1) - 1).clamp(min=0)
    response = ids[:, PROMPT:]
    return ids, mask, positions, response


def run(policies: dict[str, PolicyModel], layout: str, ids, mask, positions, response, backward: bool) -> None:
    """One log-prob forward (and backward): the trainer's (``PolicyModel``, packed or with the rows
    left-justified) or, for comparison, the decoder called with the batch's padding mask as before."""
    with torch.set_grad_enabled(backward):
        if layout in policies:
            logp, _ = policies[layout](ids, mask, response)
        else:
            r = response.shape[1]
            lm = policies["left-justified"].lm
            hidden = lm.get_decoder()(
                input_ids=ids, attention_mask=mask, position_ids=positions, use_cache=False
            ).last_hidden_state
            logp, _ = logprobs_from_hidden(hidden[:, -r - 1 : -1], lm.get_output_embeddings().weight, response, 1.0)
        if backward:
            logp.sum().backward()


def checkpointed(lm, spec: str):
    """Checkpoint ``lm`` as ``spec`` says ('none', 'POLICY' or 'POLICY/LAYERS') and return a function that
    undoes it: the model is shared by every row."""
    if spec == "none":
        return lambda: None
    policy, _, layers = spec.partition("/")
    enable_gradient_checkpointing(lm, policy, int(layers) if layers else None)
    return functools.partial(disable_gradient_checkpointing, lm)


def top_kernels(fn) -> list[tuple[str, float]]:
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    return sorted(
        ((e.key[:120], (getattr(e, "device_time_total", 0.0) or 0.0) / 1e3) for e in prof.key_averages()),
        key=lambda kv: -kv[1],
    )[:10]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--model", default="r1-distill-qwen-1.5b")
    ap.add_argument("--lengths", nargs="+", default=["14000", "14000,10000", "27000", "27000,2500", "10000,10000,9000"])
    ap.add_argument("--layouts", nargs="+", default=["packed", "left-justified", "padding mask"])
    ap.add_argument("--checkpointing", nargs="+", default=["full"])
    ap.add_argument("--liger", action="store_true")
    ap.add_argument("--trace", action="store_true")
    args = ap.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    device = torch.device("cuda")
    lm = build_model(args.model, seed=0).to(device, torch.bfloat16)
    if args.liger:
        from trainer.models.liger import apply_liger

        apply_liger(lm)
    cfg = lm.config
    # one model: packing switches its attention function, whose unpacked calls are SDPA's as before
    policies = {"left-justified": PolicyModel(lm), "packed": PolicyModel(lm, packed=True, pack_min_padding=0.0)}
    n_params = sum(p.numel() for p in lm.parameters() if p is not lm.get_input_embeddings().weight)
    results = []
    for case in args.lengths:
        lengths = [int(x) for x in case.split(",")]
        ids, mask, positions, response = make_batch(lengths, cfg.vocab_size, device)
        tokens = sum(lengths)
        attn_flops = sum(4 * cfg.num_hidden_layers * cfg.hidden_size * n * n / 2 for n in lengths)
        for layout in args.layouts:
            forward = functools.partial(run, policies, layout, ids, mask, positions, response, backward=False)
            train = functools.partial(run, policies, layout, ids, mask, positions, response, backward=True)
            lm.eval()
            fwd = timed(forward)
            for spec in args.checkpointing:
                undo = checkpointed(lm, spec)
                lm.train()
                torch.cuda.empty_cache()
                torch.cuda.reset_peak_memory_stats()
                before = torch.cuda.memory_allocated()
                try:
                    bwd, peak = timed(train, repeats=2), torch.cuda.max_memory_allocated() - before
                except torch.OutOfMemoryError:
                    bwd = peak = None
                undo()
                lm.zero_grad(set_to_none=True)
                row = {
                    "lengths": lengths, "layout": layout, "tokens": tokens, "checkpointing": spec, "liger": args.liger,
                    "forward_s": fwd, "forward_tflops": (2 * n_params * tokens + attn_flops) / fwd / 1e12,
                    "train_s": bwd,
                    "train_tflops": bwd and (8 * n_params * tokens + 4 * attn_flops) / bwd / 1e12,
                    # gradients (bf16, one per weight) included: above the weights held before the call
                    "train_peak_gib": peak and peak / 2**30,
                }
                if args.trace:
                    row["forward_top_kernels_ms"] = top_kernels(forward)
                results.append(row)
                print(json.dumps(row), flush=True)
                torch.cuda.empty_cache()
    (out / "longseq_profile.json").write_text(json.dumps({"gpu": torch.cuda.get_device_name(), "steps": results}, indent=1))


if __name__ == "__main__":
    main()
