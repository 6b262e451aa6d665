#!/usr/bin/env bash
# One device call (nvidia-h200) for issue 7's MFU work: the executor's GPU tests, then
# `gemtwin train gem-h200-1gpu` in the configurations named on the command line (default: the
# reference attention, the Triton kernels, the Triton kernels + torch.compile), each with a
# profiler trace and op table, then a side-by-side summary (step time, MFU, op classes).
# Usage on the device: bash executor/bench/mfu_session.sh [name:"train options" ...]
# A/B options side by side, e.g. "eager:--set execution.cuda_graphs=false --set execution.token_bucket=0"
# "graphs:" (the default) or "proc:--set execution.data_processes=true"; leading VAR=value words set
# that run's environment (launcher or torch variables only: execution choices are --set), e.g.
# "s20-torch:--set execution.ffn_kernel=torch" "s20:". SCENARIO (default gem-h200-1gpu) names the scenario.
# Env: STEPS (12), RUN_TIMEOUT (300 s per run), TRACE (the config whose profiler trace is kept:
# default the last), TESTS (pytest node ids of the GPU tests; default the executor's), SKIP_TESTS=1.
set -uo pipefail
export PYTHONUNBUFFERED=1
OUT=${OUT:-out}; mkdir -p "$OUT"
STEPS=${STEPS:-12}
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,power.limit --format=csv | tee "$OUT/gpu.txt"
if [ "${SKIP_TESTS:-0}" != 1 ]; then
  # shellcheck disable=SC2086
  timeout 170 python3 -m pytest -q -m gpu -p no:cacheprovider ${TESTS:-tests/executor/test_components.py \
    tests/executor/test_train.py} > "$OUT/gpu_tests.log" 2>&1
  echo "gpu tests rc=$?"; tail -5 "$OUT/gpu_tests.log"
fi
configs=("$@")
[ ${#configs[@]} -eq 0 ] && configs=("reference:--set execution.attention_kernel=reference --set execution.compile=false"
                                     "triton:--set execution.attention_kernel=triton --set execution.compile=false"
                                     "compiled:--set execution.attention_kernel=triton --set execution.compile=true")
last=${configs[-1]}; TRACE=${TRACE:-${last%%:*}}
for c in "${configs[@]}"; do
  name=${c%%:*}; opts=${c#*:}
  trace=(); [ "$name" = "$TRACE" ] && trace=(--trace "$OUT/$name.trace.json.gz")
  envs=(); args=()  # leading VAR=value words set the environment of this config's run only
  # shellcheck disable=SC2086
  for w in $opts; do
    if [ ${#args[@]} -eq 0 ] && [[ $w =~ ^[A-Z_][A-Z0-9_]*= ]]; then envs+=("$w"); else args+=("$w"); fi
  done
  timeout "${RUN_TIMEOUT:-300}" env "${envs[@]}" python3 -m twin.cli train "${SCENARIO:-gem-h200-1gpu}" --steps "$STEPS" \
    --out "$OUT/$name.json" "${trace[@]}" "${args[@]}" 2>&1 | grep -v USDT | sed "s/^/[$name] /" >> "$OUT/runs.log"
  echo "$name rc=${PIPESTATUS[0]}"; tail -2 "$OUT/runs.log"
done
python3 - "$OUT" <<'PY'
import json, sys
from pathlib import Path
rows = []
for p in sorted(Path(sys.argv[1]).glob("*.json")):
    r = json.loads(p.read_text())
    if "step_time_s" not in r:
        continue
    busy = sum(r["op_class_time_s"].values())
    mfu = f"{r['mfu']:.1%}" if r.get("mfu") is not None else "n/a"
    print(f"{p.stem:>12}: step {r['step_time_s']*1e3:7.1f} ms  MFU {mfu}  kernels busy {busy*1e3:6.1f} ms  "
          f"peak mem {(r.get('peak_memory_bytes') or 0)/2**30:.1f} GiB  attention {r.get('attention_kernel')} compiled {r.get('compiled')} "
          f"cuda graphs {r.get('cuda_graphs')} ({r.get('graph_replays')} replays) bucket {r.get('token_bucket')}")
    print("              steps (ms): " + " ".join(f"{s['step_time_s']*1e3:.0f}" for s in r["steps"])
          + f"  | loss {r['steps'][0]['loss']:.3f} -> {r['steps'][-1]['loss']:.3f}, eval AUC "
          + " ".join(f"{k[4:]} {v:.3f}" for k, v in r["metrics"].items() if k.startswith("auc_")))
    print("              " + "  ".join(f"{k} {v*1e3:.1f}" for k, v in r["op_class_time_s"].items()) + " (ms/step)")
    print("              " + "  ".join(f"{k} {v*1e3:.1f}" for k, v in r["kernel_time_s"].items()))
PY
