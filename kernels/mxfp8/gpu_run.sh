#!/bin/bash
# The one device call of kernels/mxfp8 (issue 6): bench (checks + timings) then the GPU parity run.
# Run from the repo root with $OUT set; each part has its own time limit so both leave results.
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,power.draw,temperature.gpu --format=csv > $OUT/nvidia_smi.txt 2>&1
timeout 185 python3 -m kernels.mxfp8.bench --out $OUT 2>&1 | tee $OUT/bench_log.txt
timeout 150 python3 executor/bench/mxfp8_parity.py gem-h200-1gpu --steps 30 --tail 5 \
  --set training.global_batch=64 --set training.micro_batch=64 \
  --set model.embeddings.sequences.0.length.max=256 --set model.embeddings.sequences.0.length.mean=192 \
  --set model.embeddings.sequences.0.tables.0.rows=1000000 \
  --out $OUT/parity_gem-h200-small 2>&1 | grep -v "^step" | tail -40 | tee $OUT/parity_log.txt
ls -la $OUT
