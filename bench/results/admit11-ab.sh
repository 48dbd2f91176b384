#!/bin/bash
# A = main (git archive at /tmp/admit11-base), B = admit11 worktree; alternated A B, 3 pairs
PY=/work/main/.venv/bin/python
WT=/work/wt-admit11
BASE=/tmp/admit11-base
RES=$WT/bench/results
for pair in 1 2 3; do
  for side in before after; do
    if [ $side = before ]; then T=$BASE; else T=$WT; fi
    echo "== pair $pair $side $(date +%T) load $(cut -d' ' -f1-3 /proc/loadavg)"
    cd $T
    PYTHONPATH=$T $PY -m bench.admit_cpu --runs 5 --label admit11-$side 2>&1 | tail -2
    PYTHONPATH=$T $PY -m bench.round_cpu --runs 5 --label admit11-$side 2>&1 | tail -2
    PYTHONPATH=$T $PY $WT/bench/ingest_cpu.py --runs 5 --label admit11-$side 2>&1 | tail -2
    PYTHONPATH=$T $PY $WT/bench/changelog_cpu.py --runs 3 --label admit11-$side 2>&1 | tail -2
    PYTHONPATH=$T $PY -m bench.run --systems qlayer --measures throughput --messages 100000 --no-chart --out $RES/admit11-e2e-$side-$pair.json 2>&1 | tail -4
  done
done
# base runs wrote admit/round results under the base tree: bring them over
cp $BASE/bench/results/admit-cpu-admit11-* $BASE/bench/results/round-cpu-admit11-* $RES/ 2>/dev/null
echo done $(date +%T)
