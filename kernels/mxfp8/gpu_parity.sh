#!/bin/bash
# Second device call (issue 6): GPU parity at a lower dense learning rate and 60 steps (the first
# run at the scenario's 1e-3 spiked in bf16 and MXFP8 alike: kernels/mxfp8/NOTES.md).
export PYTHONUNBUFFERED=1
timeout 300 python3 -m kernels.mxfp8.parity gem-h200-1gpu --steps 60 --tail 10 \
  --set training.global_batch=64 --set training.micro_batch=64 --set training.dense_lr=0.0003 \
  --set model.embeddings.sequences.0.length.max=256 --set model.embeddings.sequences.0.length.mean=192 \
  --set model.embeddings.sequences.0.tables.0.rows=1000000 \
  --out $OUT/parity_gem-h200-small-lr3e-4 2>&1 | grep -v "^step" | grep -v "stays MXFP8" | tail -20
