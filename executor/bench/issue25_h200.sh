#!/usr/bin/env bash
# Two device calls on an H200 (nvidia-h200) for what issue 25 still has to show there: its targets
# are H200 figures, and every call of the sessions that built TMA loads was served on an H100.
#   bash executor/bench/issue25_h200.sh kernels   # the suite bench (the table) and tma_probe
#   bash executor/bench/issue25_h200.sh step      # gem-h200-1gpu, TMA against pointer loads, alternated
# Each step has its own time limit so that a call ends inside 600 s. Files land in $OUT.
set -uo pipefail
export PYTHONUNBUFFERED=1
case "${1:-}" in kernels|step) ;; *) echo "usage: bash executor/bench/issue25_h200.sh kernels|step" >&2; exit 2 ;; esac
OUT=${OUT:-out}; mkdir -p "$OUT"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,power.limit --format=csv | tee "$OUT/gpu.txt"
case "${1:-}" in
  kernels)
    timeout 250 python3 -m kernels.attention.bench --out "$OUT/attention_bench.json" \
      --lengths 256,512,1024,2048 --skip reference,flex --rep-ms 50 --budget-s 220 > "$OUT/attention.log" 2>&1
    echo "attention bench rc=$?"; python3 -m kernels.attention.bench --out "$OUT/attention_bench.json" --table
    timeout 300 python3 -m kernels.flash.tma_probe --out "$OUT/tma_probe.json" --budget-s 260 > "$OUT/tma_probe.log" 2>&1
    echo "tma probe rc=$?"; grep -E " (table|default|sdpa) " "$OUT/tma_probe.log" ;;
  step)
    OLD=. OLD_ARGS="--set execution.flash.tma=false" STEPS=20 ROUNDS=2 RUN_TIMEOUT=140 SKIP_TESTS=1 \
      bash executor/bench/ab_trees.sh
    for f in "$OUT"/new-*.json; do python3 executor/bench/mfu_gap.py "$f" | head -16; break; done ;;
esac
