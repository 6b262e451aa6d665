#!/bin/bash
# One device call (issue 6) for the MXFP8 GDPA on the flash kernels (kernels/mxfp8/NOTES.md, fifth
# session): its GPU tests, the layer side by side with the padded emulation and the bf16 GDPA at
# gem-h200-1gpu's shapes, then the MXFP8 training step. Parity is kernels/mxfp8/gpu_parity.sh (a
# call of its own: ~300 s). Run from the repo root with $OUT set; each part has its own limit.
export PYTHONUNBUFFERED=1
mkdir -p "$OUT"
timeout 120 python3 -m pytest -q -m gpu -p no:cacheprovider tests/kernels/test_mxfp8.py \
  tests/executor/test_components.py -k "triton_equals_the_padded or train_like_the_reference" \
  > "$OUT/mxfp8-gdpa-gpu-tests.log" 2>&1
echo "gpu tests rc=$?"; tail -2 "$OUT/mxfp8-gdpa-gpu-tests.log"
timeout 150 python3 -m kernels.flash.step_bench --mxfp8 --variants b64x32w4 --out "$OUT" 2>&1 | grep -v "^warm" \
  > "$OUT/mxfp8-gdpa-step-bench.log"
echo "step_bench rc=$?"; grep -i "gdpa" "$OUT/mxfp8-gdpa-step-bench.log" | tail -8
timeout 280 python3 -m twin.cli train gem-h200-1gpu --steps 20 --out "$OUT/mxfp8-train.json" \
  --set precision.attention=mxfp8 --set precision.mlp=mxfp8 2>&1 | grep -v USDT | tail -4
