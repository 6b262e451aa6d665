#!/usr/bin/env bash
# Issue 23's H200 evidence for the host's share of an eager DLRM step, one device call (nvidia-h200):
# `gemtwin train dlrm-dcnv2` on one GPU, eager (execution.compile=false, execution.cuda_graphs=false),
# as TorchRec's 2022 example ran (PyTorch eager around table-batched lookups), at 2,048 and 8,192
# samples a step (and 512: the host alone); then bf16 tables with CUDA graphs at 6,912 (built in
# bf16: the tables no longer pass through fp32). Each run's
# RunRecord holds the step time (host-bound when eager) and the kernels' time by op class.
# Everything goes into $OUT/dlrm_host.tar.gz. Usage on the device: bash executor/bench/dlrm_host_h200.sh
set -uo pipefail
export PYTHONUNBUFFERED=1
OUT=${OUT:-out}; mkdir -p "$OUT"
W=$(mktemp -d)
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,power.limit --format=csv,noheader > "$W/gpu.txt"
ONE=(--set hardware.gpu=h200 --set hardware.num_gpus=1 --set hardware.network=h200x2-nv18
     --set parallelism.dense_replicate=1 --set parallelism.sparse_shard=1 --set training.eval_batches=0)
EAGER=(--set execution.compile=false --set execution.cuda_graphs=false)
run() {  # name steps sets...
  local name=$1 steps=$2; shift 2
  timeout 200 python3 -m twin.cli train dlrm-dcnv2 --steps "$steps" "${ONE[@]}" "$@" --out "$W/$name.json" \
    2>&1 | grep -v USDT > "$W/$name.log"; tail -3 "$W/$name.log"
  tar czf "$OUT/dlrm_host.tar.gz" -C "$W" .
}
run eager-b512 30 "${EAGER[@]}" --set training.global_batch=512 --set training.micro_batch=512
run eager-b2048 30 "${EAGER[@]}" --set training.global_batch=2048 --set training.micro_batch=2048
run eager-b8192 30 "${EAGER[@]}" --set training.global_batch=8192 --set training.micro_batch=8192
run graphs-b6912-bf16 30 --set training.global_batch=6912 --set training.micro_batch=6912 --set precision.embeddings=bf16
