#!/usr/bin/env bash
# Issue 25 item 4 ("go beyond"): dlrm-dcnv2 on one GPU at 6,912 samples a step, the code before the
# DCN's element-wise part was compiled (A: a copy of that tree in .ab/old, carried to the device) and
# this tree (B), alternated A B A B, then B's per-kernel table. TABLES=bf16 on an 80-GB card (the
# fp32 tables need 108 GB). One device call, from the repo root:
#   git archive <old commit> executor kernels scenarios twin hwmodels pyproject.toml | tar x -C .ab/old
#   run: bash executor/bench/dcn_ab.sh   (carry .ab and .whl)
set -uo pipefail
export PYTHONUNBUFFERED=1
OUT=${OUT:-out}; mkdir -p "$OUT"
ROOT=$PWD
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,power.limit --format=csv,noheader | tee "$OUT/gpu.txt"
ONE=(--set hardware.num_gpus=1 --set hardware.network=h200x2-nv18
     --set parallelism.dense_replicate=1 --set parallelism.sparse_shard=1
     --set training.global_batch=6912 --set training.micro_batch=6912 --set training.eval_batches=0
     --set precision.embeddings=${TABLES:-fp32})
run() {  # run NAME DIR [extra --set ...]
  local name=$1 dir=$2; shift 2
  (cd "$dir" && timeout 200 python3 -m twin.cli train dlrm-dcnv2 --steps "${STEPS:-30}" "${ONE[@]}" "$@" \
     --out "$OUT/$name.json" ${TRACE:+--trace "$OUT/$name.trace.json.gz"}) 2>&1 | grep -v USDT > "$OUT/$name.log"
  echo "$name rc=${PIPESTATUS[0]} $(grep -o 'step_time_s=[0-9.]*' "$OUT/$name.log")"
}
run a1 "$ROOT/.ab/old"; run b1 "$ROOT"; run a2 "$ROOT/.ab/old"; run b2 "$ROOT"
TRACE=1 run b-trace "$ROOT"
python3 executor/bench/trace_kernels.py "$OUT/b-trace.trace.json.gz" --record "$OUT/b-trace.json" --top 40 \
  > "$OUT/b-trace.kernels.txt" 2>&1; head -25 "$OUT/b-trace.kernels.txt"; rm -f "$OUT/b-trace.trace.json.gz"
