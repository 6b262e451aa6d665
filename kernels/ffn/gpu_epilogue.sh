#!/usr/bin/env bash
# Issue 25's cuBLASLt GELU-epilogue call (one GPU), from the repo root with $OUT set:
# 1. build the extension (kernels/ffn/gelu_epilogue.cpp) and run its GPU test;
# 2. python -m kernels.ffn.bench_epilogue: the FFN against the Triton path, every bias-gradient placement;
# 3. gem-h200-1gpu trained STEPS steps as it is (exact GELU, the Triton op) and with
#    model.sequence.ffn_activation=gelu_tanh (auto: the cuBLASLt epilogues), side by side (PRECS="" skips it).
# Knobs: BUILD_CAP, BENCH_CAP, RUN_CAP, STEPS.
set -uo pipefail
export PYTHONUNBUFFERED=1 TORCH_EXTENSIONS_DIR=${TORCH_EXTENSIONS_DIR:-/tmp/torch_ext}
STEPS=${STEPS:-12}
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,power.limit --format=csv,noheader | tee "$OUT/gpu.txt"
timeout ${BUILD_CAP:-240} python3 -c "import time; t = time.time(); from kernels.ffn.epilogue import _lib; _lib(); print(f'built in {time.time() - t:.0f} s')" 2>&1 | tail -15 | tee "$OUT/build.log"
timeout 120 python3 -m pytest -q -p no:cacheprovider -m gpu tests/kernels/test_ffn_epilogue.py 2>&1 | tail -4 | tee "$OUT/test.log"
timeout ${BENCH_CAP:-240} python3 -m kernels.ffn.bench_epilogue --out "$OUT" 2>&1 | tail -8 | cut -c1-1500 | tee "$OUT/bench.log"
for act in ${ACTS-gelu gelu_tanh}; do
  timeout ${RUN_CAP:-200} python3 -m twin.cli train gem-h200-1gpu --steps "$STEPS" --out "$OUT/gem-$act.json" \
    --set training.eval_batches=0 --set model.sequence.ffn_activation=$act > "$OUT/gem-$act.log" 2>&1
  echo "$act rc=$? $(grep -o 'step_time_s=[0-9.]*[^;]*' "$OUT/gem-$act.log")"
done
