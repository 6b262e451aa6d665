#!/usr/bin/env bash
# One device call: the same `gemtwin train` on two source trees, side by side, alternating
# (old, new, old, new, ...) so that drift in clocks or temperature falls on both; then the GPU
# tests of the new tree, and a table of step time and MFU per run with the new/old ratio.
#
# Usage on the device, from the repository root (the new tree):
#   OLD=.ab/old bash executor/bench/ab_trees.sh
# where .ab/old holds the old tree (here: `git archive <commit> | tar -x -C .ab/old`, with
# /.ab/ in .git/info/exclude and `carry: [".ab", ".whl"]`).
# Env: OLD (.ab/old), SCENARIO (gem-h200-1gpu), STEPS (30), ROUNDS (2), RUN_TIMEOUT (170 s),
# OLD_ARGS / NEW_ARGS (extra train options of each side, e.g. the same choice spelt as the old
# flags and as --set execution.x=y), TESTS (pytest paths of the GPU tests; SKIP_TESTS=1 skips).
set -uo pipefail
export PYTHONUNBUFFERED=1
OUT=${OUT:-out}; mkdir -p "$OUT"; OUT=$(cd "$OUT" && pwd)
OLD=${OLD:-.ab/old}; SCENARIO=${SCENARIO:-gem-h200-1gpu}; STEPS=${STEPS:-30}; ROUNDS=${ROUNDS:-2}
NEW=$(pwd)
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,power.limit --format=csv | tee "$OUT/gpu.txt"
run() {  # side, round
  local dir=$NEW args=${NEW_ARGS:-}
  [ "$1" = old ] && dir=$OLD && args=${OLD_ARGS:-}
  # shellcheck disable=SC2086
  (cd "$dir" && timeout "${RUN_TIMEOUT:-170}" python3 -m twin.cli train "$SCENARIO" --steps "$STEPS" \
    --out "$OUT/$1-$2.json" $args) 2>&1 | grep -v USDT | sed "s/^/[$1-$2] /" >> "$OUT/runs.log"
  echo "$1-$2 rc=${PIPESTATUS[0]}"; tail -1 "$OUT/runs.log"
}
for r in $(seq 1 "$ROUNDS"); do run old "$r"; run new "$r"; done
if [ "${SKIP_TESTS:-0}" != 1 ]; then
  # shellcheck disable=SC2086
  timeout 200 python3 -m pytest -q -m gpu -p no:cacheprovider ${TESTS:-tests/executor tests/kernels} \
    > "$OUT/gpu_tests.log" 2>&1
  echo "gpu tests rc=$?"; tail -3 "$OUT/gpu_tests.log"
fi
python3 - "$OUT" <<'PY'
import json, statistics, sys
from pathlib import Path
runs = {p.stem: json.loads(p.read_text()) for p in sorted(Path(sys.argv[1]).glob("*-*.json"))}
side = {"old": [], "new": []}
for name, r in runs.items():
    steps = sorted(s["step_time_s"] for s in r["steps"])
    side[name.split("-")[0]].append(r["step_time_s"])
    print(f"{name:>6}: step {r['step_time_s']*1e3:6.2f} ms  MFU {r['mfu']:.1%}  steps p10-p90 "
          f"{steps[len(steps)//10]*1e3:.2f}-{steps[len(steps)*9//10]*1e3:.2f} ms  loss "
          f"{r['steps'][0]['loss']:.4f} -> {r['steps'][-1]['loss']:.4f}")
if side["old"] and side["new"]:
    o, n = statistics.median(side["old"]), statistics.median(side["new"])
    print(f"median step: old {o*1e3:.2f} ms, new {n*1e3:.2f} ms, new/old {n/o:.4f}; "
          f"spread old {(max(side['old'])-min(side['old']))*1e3:.2f} ms, new {(max(side['new'])-min(side['new']))*1e3:.2f} ms")
PY
