#!/usr/bin/env bash
# Here (no GPU): fit the twin on the H200 campaign's `fit` runs and check it on the `held` ones and
# on the drift run (executor/bench/h200_campaign.txt); writes the calibration and the tables.
# Usage: bash executor/bench/h200_campaign_fit.sh [RUNS_DIR]   (default: the committed campaign)
set -uo pipefail
D=${1:-hwmodels/data/runs/h200-2026-12-02e-campaign}
LIST=executor/bench/h200_campaign.txt
CAL=hwmodels/data/calibrations/h200-campaign.yaml
GEMTWIN=${GEMTWIN:-gemtwin}
runs() { awk -v role="$1" -v d="$D" '$1 !~ /^#/ && $2 == role {print d "/" $1 ".json"}' "$LIST"; }
# shellcheck disable=SC2046
COLUMNS=150 $GEMTWIN calibrate $(runs fit) -o "$CAL" --notes "gem-h200-1gpu and 7 variants on one H200 \
(compiled, CUDA graphs; executor/bench/h200_campaign.sh, $D); held out: the runs marked held in $LIST" \
  | tee "$D/calibrate.txt"
# shellcheck disable=SC2046
COLUMNS=150 $GEMTWIN validate $(runs fit) $(runs held) --calibration "$CAL" --png "$D/validate.png" \
  | tee "$D/validate.txt"
# shellcheck disable=SC2046
COLUMNS=150 $GEMTWIN validate $(runs drift) --calibration "$CAL" --fail-above 10 2>&1 | tee "$D/drift.txt"
echo "drift check exit status: ${PIPESTATUS[0]} (1: drift found)" | tee -a "$D/drift.txt"
