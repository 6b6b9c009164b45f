#!/usr/bin/env bash
# What one model whatever the number of workers costs (issue 51): each model
# at (servers, workers) = (2, W) for each W, asynchronous dense steps (the
# default) against a global batch (optimizer.dense_global_batch, with
# reservations) with fresh embedding rows (worker.deterministic), one epoch
# of the same eps-datagen data, the example config otherwise. The two modes
# run back to back per cell, so a ratio compares runs minutes apart.
#
#   bench/global_batch_cost.sh [--rows N] [--models "wdl dlrm"] [--workers "2 4"]
#                              [--global-batch G] [--section.key=value ...]
#
# Prints a Markdown table per model and worker count: training records/s of
# each mode (the epoch's records over its time in the master's events log),
# the ratio global batch / asynchronous, the global batch's dropped share,
# the reads it told to wait and the reservations it gave up (/status
# global_batch), and eval AUC of each.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
work="${EPS_BENCH_DIR:-$(mktemp -d /tmp/eps-global-batch.XXXXXX)}"
rows=500000
models="wdl dlrm"
workers="2 4"
global=4096
overrides=()
while [ "$#" -gt 0 ]; do
  case "$1" in
    --rows) rows="$2"; shift 2 ;;
    --models) models="$2"; shift 2 ;;
    --workers) workers="${2//,/ }"; shift 2 ;;
    --global-batch) global="$2"; shift 2 ;;
    --*.*=*) overrides+=("$1"); shift ;;
    *) echo "usage: bench/global_batch_cost.sh [--rows N] [--models LIST] [--workers LIST] [--global-batch G]" >&2
       exit 2 ;;
  esac
done

cmake --build "$root/build" --target eps-master eps-server eps-worker eps-datagen eps-keygen >/dev/null
data="$work/data-$rows"
if [ ! -f "$data/truth.json" ]; then
  "$root/build/bin/eps-datagen" --rows "$rows" --seed 1 --files 4 --out "$data" >/dev/null 2>&1
fi

echo "| model | workers (2 servers) | records/s async | records/s global batch $global | ratio | dropped share | reads told to wait | reservations given up | eval AUC async / global batch |"
echo "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- |"
for model in $models; do
  config="$root/examples/$model.ini"
  for w in $workers; do
    for mode in async global; do
      flags=()
      [ "$mode" = global ] && flags=(--optimizer.dense_global_batch="$global" --worker.deterministic=true)
      echo "global_batch_cost: $model, $w workers, $mode" >&2
      EPS_RUN_DIR="$work/$model-$w-$mode" "$root/scripts/run_local.sh" "$config" --servers 2 \
        --workers "$w" --data.train="$data/train" --data.eval="$data/eval" \
        ${flags[@]+"${flags[@]}"} ${overrides[@]+"${overrides[@]}"} \
        >"$work/$model-$w-$mode.txt" 2>"$work/$model-$w-$mode.log"
    done
    PYTHONPATH="$root/bench" /usr/bin/python3 - "$model" "$w" "$work/$model-$w" <<'PY'
import sys
from job_results import Job
model, w, prefix = sys.argv[1:4]
sync, asyn = Job(f"{prefix}-global/master"), Job(f"{prefix}-async/master")
g = sync.final.get("global_batch") or {}
print(f"| {model} | {w} | {asyn.samples_per_s:,.0f} | {sync.samples_per_s:,.0f} | "
      f"{sync.samples_per_s / asyn.samples_per_s:.2f}x | {g.get('dropped_share', 0):.4f} | "
      f"{g.get('reads_refused', 0):,} | {g.get('reservations_expired', 0):,} | "
      f"{asyn.auc:.4f} / {sync.auc:.4f} |")
PY
  done
done
echo "(data, logs and results in $work)" >&2
