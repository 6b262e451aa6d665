#!/usr/bin/env bash
# Issue 24's device call (nvidia-h200), from the repo root with $OUT set, in ~580 s (the 600-s call limit) on a cold machine, where the first `gemtwin train` of gem-h200-1gpu needs ~120 s:
# 1. python -m kernels.fp8block.bench: the GEMM at 8192^3 and the MLP block of gem-h100-4k's shapes,
#    bf16 against fp8_block (SKIP: the parts measured in earlier calls of the same code, merged
#    into hwmodels/data/measured/fp8_block_h200_2026-12-04.json);
# 2. gem-h200-1gpu trained STEPS steps in bf16 and with precision.mlp auto (RunRecords);
# 3. loss parity on a shrunk gem-h200-1gpu at its own settings: fp8_block against bf16.
# Knobs: SKIP (bench parts), BENCH_ARGS (more bench flags), BENCH_CAP, PRECS ("" for none), STEPS, RUN_CAP,
# PARITY=0 (no parity), PSTEPS, PARITY_CAP.
# Everything lands in $OUT/fp8.tar.gz (rewritten after each part: a call cut short keeps what finished).
set -uo pipefail
export PYTHONUNBUFFERED=1
W=$(mktemp -d); STEPS=${STEPS:-12}; PSTEPS=${PSTEPS:-30}
pack() { tar czf "$OUT/fp8.tar.gz.tmp" -C "$W" . && mv "$OUT/fp8.tar.gz.tmp" "$OUT/fp8.tar.gz"; }
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,power.limit --format=csv,noheader > "$W/gpu.txt"
timeout ${BENCH_CAP:-60} python3 -m kernels.fp8block.bench --out "$W" --skip "${SKIP:-checks,quantizer,configs,profile,table}" \
  ${BENCH_ARGS:-} > "$W/bench.log" 2>&1
grep -E "gemm 8192|mlp block|quantize defaults|bit_exact|Error" "$W/bench.log" | cut -c1-700; pack
for prec in ${PRECS-bf16 auto}; do
  timeout ${RUN_CAP:-160} python3 -m twin.cli train gem-h200-1gpu --steps "$STEPS" --out "$W/gem-$prec.json" \
    --set training.eval_batches=0 --set precision.mlp=$prec > "$W/gem-$prec.log" 2>&1
  echo "$prec rc=$? $(grep -o 'step_time_s=[0-9.]*[^;]*' "$W/gem-$prec.log")"; pack
done
[ "${PARITY:-1}" = 1 ] || exit 0
timeout ${PARITY_CAP:-200} python3 executor/bench/mxfp8_parity.py gem-h200-1gpu --low fp8_block --max-gap 0.005 \
  --steps "$PSTEPS" --tail 10 --set training.eval_batches=2 --set training.global_batch=64 --set training.micro_batch=64 \
  --set model.embeddings.sequences.0.length.max=256 --set model.embeddings.sequences.0.length.mean=192 \
  --set model.embeddings.sequences.0.tables.0.rows=1000000 \
  --out "$W/parity_gem-h200-small" > "$W/parity.log" 2>&1
grep -v "^step" "$W/parity.log" | grep -v "W1204\|dynamo" | tail -6 | cut -c1-600; pack
