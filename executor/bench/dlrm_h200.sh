#!/usr/bin/env bash
# Issue 23's H200 evidence for the DLRM cost model, one device call (nvidia-h200):
# 1. executor/bench/lookup_sweep.py: pooled multi-hot lookups (pooling, dim, tables, batch, rows,
#    skew, dtype), forward and backward with the fused row-wise Adagrad update;
# 2. `gemtwin train dlrm-dcnv2` on one GPU at 6,912 samples a step (fp32 tables, the fused
#    update), with a profiler trace and its per-kernel table (executor/bench/trace_kernels.py);
#    then the same with bf16 tables.
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
# the default (fp32 tables), then 16-bit tables (precision.embeddings=bf16)
for v in "1gpu:" "1gpu-bf16:--set precision.embeddings=bf16"; do
  name=dlrm-${v%%:*}; extra=(${v#*:})
  timeout 240 python3 -m twin.cli train dlrm-dcnv2 --steps "${STEPS:-30}" "${ONE[@]}" "${extra[@]}" --out "$W/$name.json" \
    --trace "$W/$name.trace.json.gz" 2>&1 | grep -v USDT > "$W/$name.log"; tail -5 "$W/$name.log"
  python3 executor/bench/trace_kernels.py "$W/$name.trace.json.gz" --record "$W/$name.json" --top 60 \
    > "$W/$name.kernels.txt" 2>&1; head -30 "$W/$name.kernels.txt"
  rm -f "$W/$name.trace.json.gz"
  tar czf "$OUT/dlrm.tar.gz" -C "$W" .
done
