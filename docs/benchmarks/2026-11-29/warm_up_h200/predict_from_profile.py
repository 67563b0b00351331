"""Gen predicted from the member step's profile (run from the repository root):
    python docs/benchmarks/2026-11-29/warm_up_h200/predict_from_profile.py docs/benchmarks/2026-11-29/warm_up_h200/member_profile_call1.json
Each decode step t of a group's rows costs the profiled step (burst ms) at the rows still alive and
the context 150 + t, interpolated linearly over the profile's rows and contexts (below 4 rows: 4)."""
import json
import sys

import numpy as np

sys.path.insert(0, "benchmarks")
import gen_call_probe  # noqa: E402

grid = {(s["rows"], s["context"]): s["burst_step_ms"] for s in json.load(open(sys.argv[1]))["steps"]}
rows_g, ctx_g = sorted({r for r, _ in grid}), sorted({c for _, c in grid})


def step_ms(rows: int, ctx: int) -> float:
    rows, ctx = max(rows, rows_g[0]), min(max(ctx, ctx_g[0]), ctx_g[-1])
    return float(np.interp(rows, rows_g, [np.interp(ctx, ctx_g, [grid[(r, c)] for c in ctx_g]) for r in rows_g]))


for group in (0, 1):
    lengths = np.array(gen_call_probe.group_rows("verl-7b", 4, group, 2))
    total = sum(step_ms(int((lengths >= t).sum()), 150 + t) for t in range(1, lengths.max() + 1))
    print(f"group {group}: {len(lengths)} rows, {lengths.sum()} tokens, longest {lengths.max()}: steps sum {total / 1e3:.1f} s")
