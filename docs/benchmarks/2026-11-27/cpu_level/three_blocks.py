"""Per phase, over sessions that saved a baseline (3 blocks each: the benchmark and two re-timings):
the spread across sessions of the first block's median, of the median of the 3 blocks, and within one.

python three_blocks.py 'DIR/b-*.json'   (run from the repository root)"""

import glob
import statistics
import sys

from pytest_rlbench.records.record import load_record
from pytest_rlbench.verdict.retiming import retimed_blocks

PHASES = ["generate_sequences", "gen", "old_log_prob", "ref", "update_actor", "step"]


def cv(xs: list[float]) -> float:
    return statistics.pstdev(xs) / statistics.mean(xs)


files = sorted(glob.glob(sys.argv[1]), key=lambda x: int(x.rsplit("-", 1)[1].split(".")[0]))
records = [load_record(f) for f in files]
print(len(records), "sessions")
for phase in PHASES:
    medians = [
        [statistics.median(b) for b in [tuple(r.phases[phase].seconds), *retimed_blocks(r, phase)]] for r in records
    ]
    first = [m[0] for m in medians]
    of_three = [statistics.median(m) for m in medians]
    within = statistics.mean(cv(m) for m in medians)
    print(
        f"{phase:20s} first block cv {cv(first):5.1%} spread {max(first) / min(first) - 1:5.1%} | "
        f"median of 3 cv {cv(of_three):5.1%} spread {max(of_three) / min(of_three) - 1:5.1%} | "
        f"within-session cv {within:5.1%}"
    )
