#!/usr/bin/env bash
# One device call (nvidia-h200): the GPU tests of the TBE / prefetcher / RunRecord work, then the
# embedding bandwidth bench (executor/bench/embedding_bench.py) at gem-h200-1gpu shapes.
# AB=1 also trains gem-h200-1gpu a few steps with the Triton and the torch embedding lookups.
# Everything lands in $OUT. Usage on the device: bash executor/bench/embedding_gpu.sh
set -uo pipefail
export PYTHONUNBUFFERED=1
OUT=${OUT:-out}; mkdir -p "$OUT"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm --format=csv | tee "$OUT/gpu.txt"
timeout 300 python3 -m pytest -q -m gpu -p no:cacheprovider tests/kernels/test_embedding_tbe.py \
  tests/executor/test_data.py tests/executor/test_train.py 2>&1 | grep -v USDT | tee "$OUT/gpu_tests.txt" | tail -40
timeout 280 python3 executor/bench/embedding_bench.py --out "$OUT" 2>&1 | grep -v USDT | tee "$OUT/embedding_bench.log"
if [ "${AB:-0}" = 1 ]; then
  for k in triton torch; do
    timeout 200 python3 -m twin.cli train gem-h200-1gpu --steps "${STEPS:-12}" --set execution.embedding_kernel=$k \
      --out "$OUT/gem-1gpu-emb-$k.json" 2>&1 | grep -v USDT | tee "$OUT/gem-1gpu-emb-$k.log" | tail -5
  done
fi
