#!/usr/bin/env bash
# Issue 23's H200 evidence for the DLRM cost model, one device call (nvidia-h200):
# 1. executor/bench/lookup_sweep.py: pooled multi-hot lookups (pooling, dim, tables, batch, rows,
#    skew, dtype), forward and backward with the fused row-wise Adagrad update;
# 2. `gemtwin train dlrm-dcnv2` on one GPU at 6,912 samples a step (fp32 tables, the fused
#    update), with a profiler trace and its per-kernel table (executor/bench/trace_kernels.py).
# Everything goes into $OUT/dlrm.tar.gz (the device returns at most 8 files).
# Usage on the device: bash executor/bench/dlrm_h200.sh
set -uo pipefail
export PYTHONUNBUFFERED=1
OUT=${OUT:-out}; mkdir -p "$OUT"
W=$(mktemp -d)
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,power.limit --format=csv,noheader > "$W/gpu.txt"
timeout 330 python3 executor/bench/lookup_sweep.py --out "$W" 2>&1 | grep -v USDT | tee "$W/lookup_sweep.log" | tail -40
tar czf "$OUT/dlrm.tar.gz" -C "$W" .
ONE=(--set hardware.gpu=h200 --set hardware.num_gpus=1 --set hardware.network=h200x2-nv18
     --set parallelism.dense_replicate=1 --set parallelism.sparse_shard=1
     --set training.global_batch=6912 --set training.micro_batch=6912 --set training.eval_batches=0)
timeout 240 python3 -m twin.cli train dlrm-dcnv2 --steps "${STEPS:-30}" "${ONE[@]}" --out "$W/dlrm-1gpu.json" \
  --trace "$W/dlrm-1gpu.trace.json.gz" 2>&1 | grep -v USDT > "$W/dlrm-1gpu.log"; tail -5 "$W/dlrm-1gpu.log"
python3 executor/bench/trace_kernels.py "$W/dlrm-1gpu.trace.json.gz" --record "$W/dlrm-1gpu.json" --top 60 \
  > "$W/dlrm-1gpu.kernels.txt" 2>&1; head -45 "$W/dlrm-1gpu.kernels.txt"
rm -f "$W/dlrm-1gpu.trace.json.gz"
tar czf "$OUT/dlrm.tar.gz" -C "$W" .
