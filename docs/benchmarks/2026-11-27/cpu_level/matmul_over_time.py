"""A fixed CPU workload timed every 0.3 s: how much this machine's own speed moves over time.

python matmul_over_time.py THREADS SECONDS"""

import statistics
import sys
import time

import torch

torch.set_num_threads(int(sys.argv[1]) if len(sys.argv) > 1 else 2)
a = torch.randn(256, 256)


def work() -> float:
    start = time.perf_counter()
    for _ in range(200):
        a @ a
    return time.perf_counter() - start


xs = []
end = time.time() + float(sys.argv[2] if len(sys.argv) > 2 else 150)
while time.time() < end:
    xs.append(work())
    time.sleep(0.3)
s = sorted(xs)
print(len(xs), f"min {s[0]:.4f} med {statistics.median(xs):.4f} max {s[-1]:.4f}")
windows = [statistics.median(xs[i : i + 20]) for i in range(0, len(xs) - 19, 20)]  # ~8 s each
print("window medians:", " ".join(f"{v:.4f}" for v in windows))
