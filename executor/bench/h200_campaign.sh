#!/usr/bin/env bash
# Issue 22's H200 campaign, one device call (nvidia-h200): `gemtwin train` of each run named in
# executor/bench/h200_campaign.txt (default scenario gem-h200-1gpu, compiled, CUDA graphs, no
# held-out evaluation), one process each, RunRecords and logs to $OUT, until the call's time is
# spent. Afterwards, here: gemtwin calibrate on the `fit` runs, gemtwin validate on the `held`
# ones (hwmodels/data/runs/h200-2026-12-02e-campaign/README.md).
# Usage on the device: bash executor/bench/h200_campaign.sh [NAME...]   (default: every run)
# The records and logs go into $OUT/campaign.tar.gz (rewritten after every run: a call cut short
# still brings back what finished; the device returns at most 8 files).
# Env: SCENARIO (gem-h200-1gpu), LIST (the runs' file), STEPS (25), BUDGET (seconds for the whole call, 560), RUN_CAP (longest one run, 170 s),
# EST (a run's expected length: no run starts with less than this left, 80 s).
set -uo pipefail
export PYTHONUNBUFFERED=1
OUT=${OUT:-out}; mkdir -p "$OUT"
STEPS=${STEPS:-25}; BUDGET=${BUDGET:-560}; RUN_CAP=${RUN_CAP:-170}; EST=${EST:-80}
LIST=${LIST:-executor/bench/h200_campaign.txt}; SCENARIO=${SCENARIO:-gem-h200-1gpu}
RUNS=$(mktemp -d)
start=$(date +%s)
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,power.limit --format=csv,noheader > "$RUNS/gpu.txt"
want=" $* "
while read -r name role rest; do
  case "$name" in \#*|"") continue;; esac
  [ $# -gt 0 ] && [[ "$want" != *" $name "* ]] && continue
  left=$(( BUDGET - ($(date +%s) - start) ))
  if [ "$left" -lt "$EST" ]; then echo "skip $name: ${left}s left" | tee -a "$RUNS/campaign.log"; continue; fi
  sets=(--set training.eval_batches=0)
  for a in $rest; do sets+=(--set "$a"); done
  cli=(python3 -m twin.cli)
  [ "$role" = drift ] && cli=(python3 -m executor.bench.drift_kernel)
  t0=$(date +%s)
  timeout "$(( left < RUN_CAP ? left : RUN_CAP ))" "${cli[@]}" train "$SCENARIO" --steps "$STEPS" \
    --out "$RUNS/$name.json" "${sets[@]}" 2>&1 | grep -v USDT > "$RUNS/$name.log"
  rc=${PIPESTATUS[0]}
  echo "$name $role rc=$rc wall=$(( $(date +%s) - t0 ))s $(grep -o 'step_time_s=[0-9.]*[^;]*' "$RUNS/$name.log")" \
    | tee -a "$RUNS/campaign.log"
  tar czf "$OUT/campaign.tar.gz.tmp" -C "$RUNS" . && mv "$OUT/campaign.tar.gz.tmp" "$OUT/campaign.tar.gz"
done < "$LIST"
