"""Per phase, the session medians of plain sessions and of sessions under `setarch x86_64 -R`.

python aslr_table.py DIR   (DIR holding plain-N.json and norand-N.json reports)"""

import glob
import json
import statistics
import sys

PHASES = ["generate_sequences", "gen", "old_log_prob", "ref", "update_actor", "step"]
out = sys.argv[1]
for mode in ("plain", "norand"):
    rows = []
    for f in sorted(glob.glob(f"{out}/{mode}-*.json"), key=lambda x: int(x.rsplit("-", 1)[1].split(".")[0])):
        report = json.load(open(f))
        rows.append([statistics.median(report["phases"][p]["seconds"]["samples"]) for p in PHASES])
    print(mode, len(rows), "sessions")
    for r in rows:
        print("   ", " ".join(f"{v:7.3f}" for v in r))
    columns = list(zip(*rows, strict=True))
    print("  spread max/min-1:", " ".join(f"{max(c) / min(c) - 1:6.1%}" for c in columns))
    print("  cv:              ", " ".join(f"{statistics.pstdev(c) / statistics.mean(c):6.1%}" for c in columns))
