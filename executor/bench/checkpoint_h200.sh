#!/usr/bin/env bash
# One device call (nvidia-h200): how long a checkpoint of gem-h200-1gpu blocks the training loop,
# synchronous (MODE=sync: one save after the last of 30 steps: the state copied and written to
# the local disk) or asynchronous (MODE=async: saves after steps 1300 and 2600; the first blocks
# for allocating the pinned host buffers and the copy, its files written while steps 1300-2599
# train, ~74 s, about the disk's write time; the second copies into the same buffers). The
# RunRecords (checkpoint_stall_s, the step times) and the logs go to $OUT. A checkpoint is ~37 GB
# (the tables are most of it) and the machine's disk holds one: in async mode the first one is
# deleted here once the second starts (the run itself keeps the newest committed one, keep 1).
set -uo pipefail
export PYTHONUNBUFFERED=1
MODE=${1:-sync}
OUT=${OUT:-out}; mkdir -p "$OUT"
DIR=/tmp/gemtwin-ckpt-$MODE
rm -rf "$DIR"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm --format=csv,noheader > "$OUT/gpu-$MODE.txt"
df -h /tmp | tail -1 > "$OUT/disk-$MODE.txt"
if [ "$MODE" = sync ]; then STEPS=30; EVERY=0; ASYNC=false; else STEPS=2600; EVERY=1300; ASYNC=true; fi
if [ "$MODE" = async ]; then  # room for the second save: the disk holds one checkpoint
  ( until [ -d "$DIR/step-00002600.partial" ]; do sleep 0.2; done; rm -rf "$DIR/step-00001300" ) &
fi
timeout 560 python3 -m twin.cli train gem-h200-1gpu --steps $STEPS --out "$OUT/train-$MODE.json" \
  --set training.checkpoint.dir="$DIR" --set training.checkpoint.every=$EVERY \
  --set training.checkpoint.keep=1 --set training.checkpoint.async=$ASYNC > "$OUT/train-$MODE.log" 2>&1
echo "train $MODE rc=$?"; tail -12 "$OUT/train-$MODE.log"
du -sb "$DIR"/step-* 2>/dev/null | tee "$OUT/size-$MODE.txt"
rm -rf "$DIR"
