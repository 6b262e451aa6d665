#!/usr/bin/env bash
# One device call (nvidia-h200) for what the kernels of issues 5 and 7 still had to show on a GPU:
# the block-local attention path (checks + timing vs the FA2 path), the GPU tests of the flash
# core, block path, TBE, prefetcher and trainer, the embedding bandwidth bench, and the attention
# suite benchmark (all lengths with FlexAttention and the reference, then the lognormal case in
# its own process). Each step has its own time limit so that the call ends inside 600 s.
set -uo pipefail
export PYTHONUNBUFFERED=1
OUT=${OUT:-out}; mkdir -p "$OUT"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm --format=csv | tee "$OUT/gpu.txt"
timeout 140 python3 -m kernels.flash.gpu_check --only block --budget-s 110 > "$OUT/block.log" 2>&1
echo "block check rc=$?"; tail -30 "$OUT/block.log"
timeout 100 python3 -m pytest -q -m gpu -p no:cacheprovider tests/kernels/test_flash_core.py \
  tests/kernels/test_flash_block.py tests/kernels/test_embedding_tbe.py tests/executor/test_data.py \
  tests/executor/test_train.py > "$OUT/gpu_tests.log" 2>&1
echo "gpu tests rc=$?"; tail -15 "$OUT/gpu_tests.log"
timeout 90 python3 executor/bench/embedding_bench.py --out "$OUT" > "$OUT/embedding.log" 2>&1
echo "embedding bench rc=$?"; tail -25 "$OUT/embedding.log"
timeout 190 python3 -m kernels.attention.bench --out "$OUT/attention_bench.json" \
  --lengths 256,512,1024,2048 --rep-ms 50 --budget-s 160 > "$OUT/attention.log" 2>&1
echo "attention bench rc=$?"
timeout 60 python3 -m kernels.attention.bench --out "$OUT/attention_bench.json" --append \
  --lengths lognormal --rep-ms 50 --budget-s 45 >> "$OUT/attention.log" 2>&1
echo "lognormal rc=$?"; python3 -m kernels.attention.bench --out "$OUT/attention_bench.json" --table
