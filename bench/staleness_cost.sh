#!/usr/bin/env bash
# What bounded staleness costs and buys: each model at (servers, workers) =
# (2, 2) with worker.max_staleness 0, 1, 4 and 1024 (as good as unbounded:
# the step pipeline then holds up to 1,025 steps), one epoch of the same
# eps-datagen data, the example config otherwise.
#
#   bench/staleness_cost.sh [--rows N] [--models "wdl dlrm"] [--bounds "0 1 4 1024"]
#                           [--workers W] [--section.key=value ...]
#
# Prints a Markdown table per model and bound: training records/s (the
# epoch's records over its time in the master's events log), the ratio to
# the first bound's, the staleness the workers trained with (the largest
# p99 and max of /status workers[].dense_staleness in final_status.json),
# the seconds they waited for the bound, and eval AUC. Runs are one after
# the other on this machine: compare ratios, not absolute rates.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
work="${EPS_BENCH_DIR:-$(mktemp -d /tmp/eps-staleness.XXXXXX)}"
rows=200000
models="wdl dlrm"
bounds="0 1 4 1024"
workers=2
overrides=()
while [ "$#" -gt 0 ]; do
  case "$1" in
    --rows) rows="$2"; shift 2 ;;
    --models) models="$2"; shift 2 ;;
    --bounds) bounds="$2"; shift 2 ;;
    --workers) workers="$2"; shift 2 ;;
    --*.*=*) overrides+=("$1"); shift ;;
    *) echo "usage: bench/staleness_cost.sh [--rows N] [--models LIST] [--bounds LIST] [--workers W]" >&2
       exit 2 ;;
  esac
done

cmake --build "$root/build" --target eps-master eps-server eps-worker eps-datagen eps-keygen >/dev/null
data="$work/data-$rows"
if [ ! -f "$data/truth.json" ]; then
  "$root/build/bin/eps-datagen" --rows "$rows" --seed 1 --files 4 --out "$data" >/dev/null 2>&1
fi

echo "| model | max_staleness | records/s (2, $workers) | vs the first | p99 / max staleness trained | waited for the bound (s, all workers) | eval AUC |"
echo "| --- | ---: | ---: | ---: | --- | ---: | ---: |"
for model in $models; do
  config="$root/examples/$model.ini"
  [ "$model" = lr ] && config="$root/examples/local.ini"
  first=""
  for bound in $bounds; do
    run="$work/$model-$bound"
    echo "staleness_cost: $model at worker.max_staleness = $bound" >&2
    EPS_RUN_DIR="$run" "$root/scripts/run_local.sh" "$config" --servers 2 --workers "$workers" \
      --data.train="$data/train" --data.eval="$data/eval" --worker.max_staleness="$bound" \
      "${overrides[@]}" >"$run.txt" 2>"$run.log"
    line="$(PYTHONPATH="$root/bench" /usr/bin/python3 - "$model" "$bound" "$run/master" "$first" <<'PY'
import sys
from job_results import Job
model, bound, master, first = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4]
job = Job(master)
final, rate = job.final, job.samples_per_s
p99 = max_seen = waited = 0
for w in final.get("workers", []):
    s = w.get("dense_staleness") or {}
    p99 = max(p99, s.get("p99") or 0)
    max_seen = max(max_seen, s.get("max") or 0)
    waited += s.get("wait_s") or 0
ratio = f"{rate / float(first):.2f}x" if first else "1.00x"
print(f"{rate:.1f}\t| {model} | {bound} | {rate:,.0f} | {ratio} | {p99:g} / {max_seen:g} | "
      f"{waited:.1f} | {final['metrics']['eval_auc']:.4f} |")
PY
)"
    [ -z "$first" ] && first="${line%%$'\t'*}"
    echo "${line#*$'\t'}"
  done
done
echo "(data, logs and results in $work)" >&2
