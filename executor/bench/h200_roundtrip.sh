#!/usr/bin/env bash
# One device call (nvidia-h200): train the default scenario and two held-out variants on one H200,
# RunRecords and logs to $OUT. Afterwards, here: gemtwin calibrate (on the first) and
# gemtwin validate (on the others). Usage on the device: bash executor/bench/h200_roundtrip.sh
set -uo pipefail
export PYTHONUNBUFFERED=1
OUT=${OUT:-out}; mkdir -p "$OUT"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,power.limit --format=csv | tee "$OUT/gpu.txt"
steps=${STEPS:-20}
# execution.compile=false: each compiled run spends ~130-150 s compiling (hwmodels/data/runs/h200-2026-11-30-executor),
# which three runs cannot afford in one 600 s call; TRAIN_OPTS adds options to every run
run() {
  local name=$1; shift
  # shellcheck disable=SC2086
  timeout 170 python3 -m twin.cli train gem-h200-1gpu --steps "$steps" --out "$OUT/$name.json" --set execution.compile=false \
    ${TRAIN_OPTS:-} "$@" 2>&1 \
    | grep -v USDT | tee "$OUT/$name.log"
}
run h200-gem-1gpu
run h200-gem-1gpu-mb128 --set training.micro_batch=128 --set training.global_batch=128
run h200-gem-1gpu-seq2 --set model.sequence.num_layers=2
# Where device time goes, by kernel-launching op (a check on executor/profiling.py's classes).
python3 - <<'PY' 2>&1 | grep -v USDT | tee "$OUT/top_ops.txt"
import torch, scenarios
from executor.model import build_model, compute_loss
from executor.data import SyntheticData
from torch.profiler import profile, ProfilerActivity
s = scenarios.load("gem-h200-1gpu", ["training.micro_batch=128", "training.global_batch=128"])
with torch.device("cuda"):
    m = build_model(s)
b = next(SyntheticData(s, 0)).to("cuda")
for i in range(3):
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) if i == 2 else torch.no_grad() as p:
        with torch.enable_grad():
            logits, aux = m(b); compute_loss(logits, b.labels, aux).backward()
        torch.cuda.synchronize()
print(p.key_averages().table(sort_by="self_device_time_total", row_limit=30, max_name_column_width=60))
PY
