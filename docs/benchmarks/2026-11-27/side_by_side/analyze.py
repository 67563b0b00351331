"""Prototype of the side-by-side passes (interleave_probe.py), read: over sessions, the cv and the
spread (largest over smallest) of each phase's level, as its median round over the passes ("raw"), and
as the median over the passes of its round over the geometric mean of its peers' rounds in the same
pass ("rel"; peers as the session's pace takes them).

    python analyze.py 'OUT_DIR/same-*.json'   (from the repository root)"""

import glob
import json
import math
import statistics
import sys

from pytest_rlbench.verdict.session_pace import pace_peers


def cv(xs: list[float]) -> float:
    return statistics.pstdev(xs) / statistics.mean(xs)


data = [json.load(open(f)) for f in sorted(glob.glob(sys.argv[1]))]
phases = [p for p in data[0] if statistics.median(data[0][p]) >= 0.05]
print(len(data), "sessions;", "phases", phases)
for p in phases:
    peers = pace_peers(p, phases)
    raw, rel = [], []
    for d in data:
        raw.append(statistics.median(d[p]))
        per = [d[p][i] / math.exp(statistics.mean(math.log(d[q][i]) for q in peers)) for i in range(len(d[p]))]
        rel.append(statistics.median(per))
    print(
        f"{p:20s} raw cv {cv(raw):5.1%} spread {max(raw) / min(raw) - 1:5.1%} | "
        f"rel cv {cv(rel):5.1%} spread {max(rel) / min(rel) - 1:5.1%}  peers {peers}"
    )
    print("   rel", " ".join(f"{x:.3f}" for x in rel))
