#!/usr/bin/env bash
# The CPU multi-rank campaign of issue 22: debug-cpu on 2 gloo ranks (timing: each layout twice,
# for the run-to-run spread) and 4 ranks (the per-axis structure), profiled (comm per mesh axis in
# each RunRecord), and one process alone. Writes RunRecords to $OUT (default
# hwmodels/data/runs/cpu-2026-12-02-campaign).
# About 6 minutes on the 2-core dev machine: gemtwin train ... --nproc N for each configuration.
set -uo pipefail
OUT=${OUT:-hwmodels/data/runs/cpu-2026-12-02-campaign}
mkdir -p "$OUT"
G=${GEMTWIN:-gemtwin}
BASE="--steps 12 --set training.global_batch=128 --set training.micro_batch=32"
two="--set hardware.num_gpus=2"
run() {  # name nproc sets...
  local name=$1 n=$2; shift 2
  echo "== $name"
  $G train debug-cpu --nproc "$n" $BASE "$@" --out "$OUT/$name.json" > "$OUT/$name.log" 2>&1
  echo "rc=$?"; tail -3 "$OUT/$name.log"
}
run r2-shard-a 2 $two --set parallelism.dense_shard=2 --set parallelism.sparse_shard=2
run r2-shard-b 2 $two --set parallelism.dense_shard=2 --set parallelism.sparse_shard=2
run r2-replicate-a 2 $two --set parallelism.dense_replicate=2 --set parallelism.sparse_shard=2
run r2-replicate-b 2 $two --set parallelism.dense_replicate=2 --set parallelism.sparse_shard=2
run r2-experts 2 $two --set parallelism.dense_shard=2 --set parallelism.sparse_shard=2 --set parallelism.expert=2
run r2-mb16 2 $two --set parallelism.dense_shard=2 --set parallelism.sparse_shard=2 --set training.micro_batch=16
run r2-sync 2 $two --set parallelism.dense_shard=2 --set parallelism.sparse_replica=2 --set parallelism.sparse_shard=1 \
  --set parallelism.sparse_strategy=replicated_sync
run r4-2x2 4 --set hardware.num_gpus=4 --set training.micro_batch=16 --set parallelism.dense_replicate=2 \
  --set parallelism.dense_shard=2 --set parallelism.expert=2 --set parallelism.sparse_shard=2 --set parallelism.sparse_replica=2
run r4-shard4 4 --set hardware.num_gpus=4 --set training.micro_batch=16 --set parallelism.dense_shard=4 \
  --set parallelism.sparse_shard=4
# one process (the whole machine, 2 threads): no collective, so these fix the kernels' scales and
# the 2-rank runs measure how much their collectives slow the compute (calibrate's sm_contention)
run r1-a 1
run r1-mb16 1 --set training.micro_batch=16
