#!/usr/bin/env bash
# Issue 25's cuBLASLt GELU-epilogue call (one GPU), from the repo root with $OUT set: build the
# extension (kernels/ffn/gelu_epilogue.cpp), its GPU test, then python -m kernels.ffn.bench_epilogue.
set -uo pipefail
export PYTHONUNBUFFERED=1 TORCH_EXTENSIONS_DIR=${TORCH_EXTENSIONS_DIR:-/tmp/torch_ext}
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,power.limit --format=csv,noheader | tee "$OUT/gpu.txt"
timeout ${BUILD_CAP:-240} python3 -c "import time; t = time.time(); from kernels.ffn.epilogue import _lib; _lib(); print(f'built in {time.time() - t:.0f} s')" 2>&1 | tail -15 | tee "$OUT/build.log"
timeout 120 python3 -m pytest -q -p no:cacheprovider -m gpu tests/kernels/test_ffn_epilogue.py 2>&1 | tail -4 | tee "$OUT/test.log"
timeout ${BENCH_CAP:-240} python3 -m kernels.ffn.bench_epilogue --out "$OUT" 2>&1 | tail -8 | cut -c1-1500 | tee "$OUT/bench.log"
