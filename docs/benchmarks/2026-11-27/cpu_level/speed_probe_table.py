"""Per phase, over sessions run with ``-p speed_probe`` (PROBE_OUT=DIR/probe-N.json, --rl-report=DIR/s-N.json):
the correlation of the phase's median with the probe timed around its test, and the spread with and
without dividing by the probe.

python speed_probe_table.py DIR"""

import glob
import json
import math
import statistics
import sys

PHASES = ["generate_sequences", "gen", "old_log_prob", "ref", "update_actor", "step"]
out = sys.argv[1]
rows = []
for f in sorted(glob.glob(f"{out}/s-*.json"), key=lambda x: int(x.rsplit("-", 1)[1].split(".")[0])):
    n = f.rsplit("-", 1)[1].split(".")[0]
    report = json.load(open(f))
    probes = {name: (before + after) / 2 for name, before, after in json.load(open(f"{out}/probe-{n}.json"))}
    rows.append(({p: statistics.median(report["phases"][p]["seconds"]["samples"]) for p in PHASES},
                 {p: probes[f"test_{p}"] for p in PHASES}))
print(len(rows), "sessions")
for p in PHASES:
    t, pb = [r[0][p] for r in rows], [r[1][p] for r in rows]
    lt, lp = [math.log(x) for x in t], [math.log(x) for x in pb]
    mt, mp = statistics.mean(lt), statistics.mean(lp)
    cov = sum((a - mt) * (b - mp) for a, b in zip(lt, lp, strict=True))
    r = cov / math.sqrt(sum((a - mt) ** 2 for a in lt) * sum((b - mp) ** 2 for b in lp))
    paced = [x / y for x, y in zip(t, pb, strict=True)]
    print(f"{p:20s} r={r:+.2f}  time cv {statistics.pstdev(t) / statistics.mean(t):5.1%}  "
          f"divided by the probe cv {statistics.pstdev(paced) / statistics.mean(paced):5.1%}")
