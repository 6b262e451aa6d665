#!/usr/bin/env bash
# One device call (nvidia-h200): how long a checkpoint of gem-h200-1gpu blocks the training loop,
# synchronous (MODE=sync: one save after the last of 30 steps: the state copied and written to
# the local disk) or asynchronous (MODE=async: saves after steps 15 and 30; the first blocks for
# the state copy only, its files written while steps 15-29 train; the second waits for that
# write first). The RunRecords (checkpoint_stall_s, the step times) and the logs go to $OUT.
# The checkpoint (~37 GB: the tables are most of it) is written under /tmp and deleted after.
set -uo pipefail
export PYTHONUNBUFFERED=1
MODE=${1:-sync}
OUT=${OUT:-out}; mkdir -p "$OUT"
DIR=/tmp/gemtwin-ckpt-$MODE
rm -rf "$DIR"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm --format=csv,noheader > "$OUT/gpu-$MODE.txt"
df -h /tmp | tail -1 > "$OUT/disk-$MODE.txt"
if [ "$MODE" = sync ]; then EVERY=0; ASYNC=false; else EVERY=15; ASYNC=true; fi
timeout 560 python3 -m twin.cli train gem-h200-1gpu --steps 30 --out "$OUT/train-$MODE.json" \
  --set training.checkpoint.dir="$DIR" --set training.checkpoint.every=$EVERY \
  --set training.checkpoint.keep=1 --set training.checkpoint.async=$ASYNC > "$OUT/train-$MODE.log" 2>&1
echo "train $MODE rc=$?"; tail -12 "$OUT/train-$MODE.log"
du -sb "$DIR"/step-* 2>/dev/null | tee "$OUT/size-$MODE.txt"
rm -rf "$DIR"
