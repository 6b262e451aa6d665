#!/usr/bin/env bash
# Issue 24's one device call (nvidia-h200), from the repo root with $OUT set:
# 1. python -m kernels.fp8block.bench: checks, the GEMM at 8192^3, the quantizer, the MLP block of
#    gem-h100-4k's shapes (bf16 against fp8_block, fused and not), its kernel profile, the threshold
#    table (the launch-config sweep, `configs`, was measured in an earlier call of the same code and is
#    merged from there: SKIP=configs);
# 2. gem-h200-1gpu trained 25 steps in bf16, with precision.mlp auto, and fp8_block on every eligible
#    layer (RunRecords);
# 3. loss parity on a shrunk gem-h200-1gpu at its own settings: fp8_block against bf16, 60 steps.
# Everything lands in $OUT/fp8.tar.gz (rewritten after each part: a call cut short keeps what finished).
set -uo pipefail
export PYTHONUNBUFFERED=1
W=$(mktemp -d)
pack() { tar czf "$OUT/fp8.tar.gz.tmp" -C "$W" . && mv "$OUT/fp8.tar.gz.tmp" "$OUT/fp8.tar.gz"; }
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,power.limit --format=csv,noheader > "$W/gpu.txt"
timeout 150 python3 -m kernels.fp8block.bench --out "$W" --skip "${SKIP:-configs}" > "$W/bench.log" 2>&1
grep -E "gemm 8192|mlp block:" "$W/bench.log" | cut -c1-600; pack
for prec in bf16 auto fp8_block; do
  timeout 110 python3 -m twin.cli train gem-h200-1gpu --steps 25 --out "$W/gem-$prec.json" \
    --set training.eval_batches=0 --set precision.mlp=$prec 2>&1 | grep -v USDT > "$W/gem-$prec.log"
  echo "$prec rc=${PIPESTATUS[0]} $(grep -o 'step_time_s=[0-9.]*[^;]*' "$W/gem-$prec.log")"
  grep -E "fp8_block (auto|guard)|cuda graphs" "$W/gem-$prec.log" | head -40 > "$W/gem-$prec.decisions.txt"; pack
done
timeout 200 python3 executor/bench/mxfp8_parity.py gem-h200-1gpu --low fp8_block --max-gap 0.005 --steps 60 --tail 10 \
  --set training.global_batch=64 --set training.micro_batch=64 \
  --set model.embeddings.sequences.0.length.max=256 --set model.embeddings.sequences.0.length.mean=192 \
  --set model.embeddings.sequences.0.tables.0.rows=1000000 \
  --out "$W/parity_gem-h200-small" 2>&1 | grep -v "^step" | tail -30 > "$W/parity.log"
tail -3 "$W/parity.log" | cut -c1-400; pack
ls -la "$W"
