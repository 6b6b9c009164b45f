#!/usr/bin/env bash
# What CURVE costs: eps's training rate with security.mode = curve (the
# default) against off, for each model at 1 server and 1 worker, on the same
# eps-datagen data, alternating the modes `--reps` times each. A third mode,
# nocheck, is curve with master.eval_check_records = 0: the master's sampled
# check of evaluation commits against the model is what curve's evaluation
# rate pays over it (the receipts proving training pushes cannot be turned
# off; build/bench/ps_bench's BM_PushReceipt gives their cost per push).
#
#   bench/security_overhead.sh [--rows N] [--reps R] [--models "lr dlrm"] [--section.key=value ...]
#
# The rate is the epoch's records over the time from its start to its end in
# the master's events log (bench/e2e.sh's measure); the evaluation's rate,
# its records over its time likewise. Prints one Markdown table: the median
# rates of each mode and curve's ratios. Goals: curve less than 10% slower
# than off; the evaluation check under 2% of the job's time.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
work="${EPS_BENCH_DIR:-$(mktemp -d /tmp/eps-security.XXXXXX)}"
rows=200000
reps=3
models="lr dlrm"
overrides=()
while [ "$#" -gt 0 ]; do
  case "$1" in
    --rows) rows="$2"; shift 2 ;;
    --reps) reps="$2"; shift 2 ;;
    --models) models="$2"; shift 2 ;;
    --*.*=*) overrides+=("$1"); shift ;;
    *) echo "usage: bench/security_overhead.sh [--rows N] [--reps R] [--models LIST]" >&2; exit 2 ;;
  esac
done

cmake --build "$root/build" --target eps-master eps-server eps-worker eps-datagen eps-keygen >/dev/null
data="$work/data-$rows"
if [ ! -f "$data/truth.json" ]; then
  "$root/build/bin/eps-datagen" --rows "$rows" --seed 1 --files 4 --out "$data" >/dev/null 2>&1
fi

results="$work/results.jsonl"
: >"$results"
for model in $models; do
  config="$root/examples/$model.ini"
  [ "$model" = lr ] && config="$root/examples/local.ini"
  for rep in $(seq "$reps"); do
    for mode in curve nocheck off; do
      run="$work/$model-$mode-$rep"
      echo "security: $model, mode $mode, run $rep of $reps" >&2
      mode_flag=()
      [ "$mode" = off ] && mode_flag=(--security.mode=off)
      [ "$mode" = nocheck ] && mode_flag=(--master.eval_check_records=0)
      EPS_RUN_DIR="$run" "$root/scripts/run_local.sh" "$config" --servers 1 --workers 1 \
        --data.train="$data/train" --data.eval="$data/eval" "${mode_flag[@]}" \
        "${overrides[@]}" >"$run.txt" 2>"$run.log"
      PYTHONPATH="$root/bench" /usr/bin/python3 - "$model" "$mode" "$run/master" >>"$results" <<'PY'
import json, sys
from job_results import Job
model, mode, master = sys.argv[1:4]
job = Job(master)
evaluated = job.event("evaluation_finished")
eval_start = job.event("evaluation_started")["time"]
print(json.dumps({"model": model, "mode": mode, "samples_per_s": job.samples_per_s,
                  "eval_per_s": evaluated["records"] / (evaluated["time"] - eval_start),
                  "job_s": evaluated["time"] - job.event("job_started")["time"],
                  "auc": job.auc}))
PY
    done
  done
done

/usr/bin/python3 - "$results" "$rows" "$reps" <<'PY'
import json, statistics, sys
results = [json.loads(line) for line in open(sys.argv[1])]
rows, reps = sys.argv[2], sys.argv[3]
print(f"One epoch of {rows} eps-datagen rows, 1 server and 1 worker, median of {reps} run(s) "
      "per mode, the modes alternating.\n")
print("| model | train samples/s curve / nocheck / off | curve / off | eval records/s curve / nocheck | check's share of the job's time | eval AUC curve / off |")
print("| --- | ---: | ---: | ---: | ---: | ---: |")
for model in dict.fromkeys(r["model"] for r in results):
    def median(key, mode):
        return statistics.median(r[key] for r in results if r["model"] == model and r["mode"] == mode)
    rate = {m: median("samples_per_s", m) for m in ("curve", "nocheck", "off")}
    evals = {m: median("eval_per_s", m) for m in ("curve", "nocheck")}
    job_s = {m: median("job_s", m) for m in ("curve", "nocheck")}
    auc = {m: median("auc", m) for m in ("curve", "off")}
    print(f"| {model} | {rate['curve']:,.0f} / {rate['nocheck']:,.0f} / {rate['off']:,.0f} | "
          f"{rate['curve'] / rate['off']:.3f} | {evals['curve']:,.0f} / {evals['nocheck']:,.0f} | "
          f"{(job_s['curve'] - job_s['nocheck']) / job_s['nocheck']:+.1%} | "
          f"{auc['curve']:.4f} / {auc['off']:.4f} |")
PY
