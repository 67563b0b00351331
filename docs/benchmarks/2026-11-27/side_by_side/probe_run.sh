#!/usr/bin/env bash
# Ten default CPU sessions (pytest suites/), each followed by 12 passes of one round of every phase in
# turn (interleave_probe.py); sessions 03, 06, 08 and 10 with old_log_prob 25% slower by a sleep
# (benchmarks/gate_slow_phase.py). Run from the repository root:
#   bash docs/benchmarks/2026-11-27/side_by_side/probe_run.sh OUT_DIR
#   python docs/benchmarks/2026-11-27/side_by_side/analyze.py 'OUT_DIR/same-*.json'
set -u
out=${1:?usage: probe_run.sh OUT_DIR}; mkdir -p "$out"
export PYTHONPATH="$PWD/docs/benchmarks/2026-11-27/side_by_side:$PWD/benchmarks:$PWD"
for i in 01 02 03 04 05 06 07 08 09 10; do
  case $i in 03|06|08|10) extra=(-p gate_slow_phase); tag=slow;; *) extra=(); tag=same;; esac
  GATE_SLOW_METHOD=compute_old_log_prob GATE_SLOWDOWN=0.25 PROBE_OUT="$out/$tag-$i.json" \
    timeout 600 pytest suites/ -q -p no:cacheprovider -p interleave_probe "${extra[@]}" > "$out/$tag-$i.log" 2>&1
  echo "$i $tag rc $?"
done
