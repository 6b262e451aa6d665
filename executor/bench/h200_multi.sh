#!/usr/bin/env bash
# Issues 28 and 29 on a lent multi-GPU H200 machine (nvidia-h200-x2, -x4 or -x8), one device call
# per PART, each within the 600-s call limit. From the repo root with $OUT set, after the staged
# wheels are on PYTHONPATH (pydantic, simpy: the executor and the sweep's zero-CTA path read the
# Scenario). N = the GPUs the machine has; SCEN = gem-h200-${N}gpu.
#   PART=sweep  hwmodels/bench/nccl_sweep.py over all N GPUs: all-gather, reduce-scatter,
#               all-reduce, all-to-all, 64 KiB .. 1 GiB, SM kernels against the zero-CTA path, each
#               with the matmul-overlap probe; NCCL_DEBUG=INFO logs kept and the lines naming the
#               path (copy engine, CTAs, symmetric registration) counted in nccl_paths.txt.
#   PART=train  gemtwin train SCEN --nproc N for the variants whose predictions were committed
#               before (hwmodels/data/predictions/SCEN/predictions.json: bundled, replicated_sync,
#               sm_free, and plan_best.yaml where the planner ran), STEPS (30) steps each, RunRecords
#               with their profiler summaries; VARIANTS picks (default all: two calls of ~4 runs each
#               if a cold run takes ~120 s: VARIANTS="bundled sm_free", then "replicated_sync plan_best").
#   PART=fault  a fault: an uninterrupted run of 40 steps checkpointing every 10, then the same run
#               whose rank 1 is killed (SIGKILL) after the step-20 checkpoint, restarted once by the
#               launcher from it (--max-restarts 1); fault.txt compares the losses after the resume
#               with the uninterrupted run's.
# Everything lands in $OUT/multi-$PART.tar.gz (rewritten after each piece: a call cut short keeps
# what finished). Then: gemtwin validate on the RunRecords, gemtwin calibrate with them (issue 28/29 item 4).
set -uo pipefail
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
PART=${PART:-sweep}
N=$(nvidia-smi --query-gpu=name --format=csv,noheader | wc -l)
SCEN=${SCEN:-gem-h200-${N}gpu}
PRED=hwmodels/data/predictions/$SCEN
W=$(mktemp -d)
pack() { tar czf "$OUT/multi-$PART.tar.gz.tmp" -C "$W" . && mv "$OUT/multi-$PART.tar.gz.tmp" "$OUT/multi-$PART.tar.gz"; }
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,power.limit --format=csv,noheader > "$W/gpu.txt"
nvidia-smi topo -m > "$W/topo.txt" 2>&1
echo "$N GPUs, scenario $SCEN, part $PART"

case $PART in
sweep)
  NCCL_DEBUG=INFO NCCL_DEBUG_FILE="$W/nccl.%h.%p.log" timeout ${SWEEP_CAP:-500} python3 -m hwmodels.bench.nccl_sweep \
    --nproc "$N" --paths sm,zero_cta --kinds all_gather,reduce_scatter,all_reduce,all_to_all --min-bytes 65536 \
    --overlap --out "$W/nccl_sweep_${N}xh200.json" > "$W/sweep.log" 2>&1
  echo "sweep rc=$?"; tail -40 "$W/sweep.log"
  grep -h -i -E "copy ?engine|\bCE\b|cta|symmetric|register|NVLS|fall" "$W"/nccl.*.log 2>/dev/null \
    | sed -E 's/^[^ ]+ [^ ]+ //' | sort | uniq -c | sort -rn | head -60 > "$W/nccl_paths.txt"
  head -20 "$W/nccl_paths.txt"; pack ;;
train)
  for name in ${VARIANTS:-bundled replicated_sync sm_free plan_best}; do
    if [ "$name" = plan_best ]; then
      [ -f "$PRED/plan_best.yaml" ] || { echo "no $PRED/plan_best.yaml"; continue; }
      target=$PRED/plan_best.yaml; sets=()
    else
      target=$SCEN
      mapfile -t sets < <(python3 -c "import json,sys; [print('--set\n' + s) for s in json.load(open('$PRED/predictions.json'))['variants']['$name']['sets']]")
    fi
    log=$W/$name.log
    [ "$name" = sm_free ] && export NCCL_DEBUG=INFO NCCL_DEBUG_FILE="$W/nccl-sm_free.%h.%p.log"
    timeout ${RUN_CAP:-280} python3 -m twin.cli train "$target" --nproc "$N" --steps "${STEPS:-30}" "${sets[@]}" \
      --set training.eval_batches=0 --out "$W/$name.json" --trace "$W/$name.trace.json.gz" > "$log" 2>&1
    echo "$name rc=$? $(grep -o 'step_time_s=[0-9.]*[^;]*' "$log" | tail -1)"; tail -3 "$log"
    unset NCCL_DEBUG NCCL_DEBUG_FILE
    rm -f "$W/$name.trace.json.gz"  # the op table next to it stays
    pack
  done
  grep -h -i -E "copy ?engine|\bCE\b|cta" "$W"/nccl-sm_free.*.log 2>/dev/null | sed -E 's/^[^ ]+ [^ ]+ //' \
    | sort | uniq -c | sort -rn | head -40 > "$W/nccl_paths_sm_free.txt"; pack ;;
fault)
  common=(--nproc "$N" --steps 40 --set training.eval_batches=0 --set training.checkpoint.every=10
          --set training.checkpoint.keep=2)
  timeout 270 python3 -m twin.cli train "$SCEN" "${common[@]}" --set training.checkpoint.dir=/tmp/ck-ref \
    --out "$W/fault-ref.json" > "$W/fault-ref.log" 2>&1
  echo "uninterrupted rc=$?"; tail -2 "$W/fault-ref.log"; pack
  rm -rf /tmp/ck-ref /tmp/ck-kill
  ( # kill rank 1 (its worker's LOCAL_RANK) once the step-20 checkpoint is committed
    until [ -d /tmp/ck-kill/step-00000020 ]; do sleep 0.5; done; sleep 5
    for p in $(pgrep -f multiprocessing); do
      if tr '\0' '\n' < /proc/$p/environ 2>/dev/null | grep -qx "LOCAL_RANK=1"; then
        echo "killing pid $p (LOCAL_RANK=1) at $(date +%T)"; kill -9 "$p"; break; fi
    done ) > "$W/fault-kill.txt" 2>&1 &
  timeout 300 python3 -m twin.cli train "$SCEN" "${common[@]}" --set training.checkpoint.dir=/tmp/ck-kill \
    --max-restarts 1 --out "$W/fault-kill.json" > "$W/fault-kill.log" 2>&1
  echo "killed-and-resumed rc=$?"; cat "$W/fault-kill.txt"; tail -3 "$W/fault-kill.log"
  python3 - "$W" > "$W/fault.txt" <<'EOF'
import json, sys
w = sys.argv[1]
ref = {s["step"]: s["loss"] for s in json.load(open(f"{w}/fault-ref.json"))["steps"]}
got = {s["step"]: s["loss"] for s in json.load(open(f"{w}/fault-kill.json"))["steps"]}
both = sorted(set(ref) & set(got))
rel = [abs(got[k] - ref[k]) / abs(ref[k]) for k in both]
print(f"steps in both: {both[0] if both else '-'}..{both[-1] if both else '-'} ({len(both)}); "
      f"max relative loss difference {max(rel) if rel else float('nan'):.2e} (bf16 noise: ~1e-2)")
for k in both:
    print(k, ref[k], got[k])
EOF
  head -3 "$W/fault.txt"; rm -rf /tmp/ck-ref /tmp/ck-kill; pack ;;
*) echo "PART=$PART: use sweep, train or fault"; exit 2 ;;
esac
