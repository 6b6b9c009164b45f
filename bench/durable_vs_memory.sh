#!/usr/bin/env bash
# What the store of record costs: LR (examples/local.ini) at 1 server and 1
# worker on generated data, trained by a durable server (RocksDB under
# --data-dir, the default) and by one that keeps its rows in memory only
# (scripts/run_local.sh --servers-in-memory), one after the other, in one run.
#
#   bench/durable_vs_memory.sh [--rows "1000000 4000000"] [--reps N] [--section.key=value ...]
#
# For every row count (eps-datagen, seed 1) it trains one epoch each way,
# `reps` times alternating (default 1), and prints one Markdown table: the
# median records/s of each (the epoch's records over its time in the events
# log, as bench/e2e.sh), their ratio, the distinct ids the table ends with,
# and eval AUC. The goal (issue 35): the durable server at least 0.8x.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
work="${EPS_BENCH_DIR:-$(mktemp -d /tmp/eps-durable.XXXXXX)}"
row_counts="1000000 4000000"
reps=1
overrides=()
while [ "$#" -gt 0 ]; do
  case "$1" in
    --rows) row_counts="$2"; shift 2 ;;
    --reps) reps="$2"; shift 2 ;;
    --*.*=*) overrides+=("$1"); shift ;;
    *) echo "usage: bench/durable_vs_memory.sh [--rows LIST] [--reps N] [--section.key=value ...]" >&2
       exit 2 ;;
  esac
done

cmake --build "$root/build" --target eps-master eps-server eps-worker eps-datagen eps-keygen >/dev/null
results="$work/results.jsonl"
: >"$results"
started=$(date +%s)
for rows in $row_counts; do
  data="$work/data-$rows"
  if [ ! -f "$data/truth.json" ]; then
    echo "durable_vs_memory: generating $rows rows" >&2
    "$root/build/bin/eps-datagen" --rows "$rows" --seed 1 --files 4 --out "$data" >/dev/null 2>&1
  fi
  for rep in $(seq 1 "$reps"); do
    for store in durable memory; do
      run="$work/$rows-$store-$rep"
      flags=()
      [ "$store" = memory ] && flags=(--servers-in-memory)
      echo "durable_vs_memory: $rows rows, $store server, run $rep" >&2
      EPS_RUN_DIR="$run" "$root/scripts/run_local.sh" "$root/examples/local.ini" --servers 1 \
        --workers 1 "${flags[@]}" --data.train="$data/train" --data.eval="$data/eval" \
        "${overrides[@]}" >"$run.txt" 2>"$run.log" ||
        { echo "durable_vs_memory: the $store run failed; see $run.log and $run/logs" >&2; exit 1; }
      PYTHONPATH="$root/bench" /usr/bin/python3 - "$rows" "$store" "$run/master" >>"$results" <<'PY'
import json, sys
from job_results import Job
rows, store, master = int(sys.argv[1]), sys.argv[2], sys.argv[3]
job = Job(master)
print(json.dumps({"rows": rows, "store": store, "records_per_s": job.samples_per_s,
                  "ids": sum(s["rows"] for s in job.final["servers"]), "auc": job.auc}))
PY
    done
  done
done

/usr/bin/python3 - "$results" "$reps" "$(( $(date +%s) - started ))" <<'PY'
import json, statistics, sys
results = [json.loads(line) for line in open(sys.argv[1])]
reps, seconds = sys.argv[2], sys.argv[3]
print(f"LR, 1 server and 1 worker, median of {reps} run(s) each; {seconds} s in all.\n")
print("| rows | ids in the table | durable records/s | memory-only records/s | durable / memory | eval AUC durable / memory |")
print("| ---: | ---: | ---: | ---: | ---: | --- |")
for rows in dict.fromkeys(r["rows"] for r in results):
    of = lambda store: [r for r in results if r["rows"] == rows and r["store"] == store]
    durable, memory = of("durable"), of("memory")
    d = statistics.median(r["records_per_s"] for r in durable)
    m = statistics.median(r["records_per_s"] for r in memory)
    # The memory-only server holds every id (a durable one may have evicted).
    auc = lambda runs: statistics.median(r["auc"] for r in runs)
    print(f"| {rows:,} | {memory[0]['ids']:,} | {d:,.0f} | {m:,.0f} | {d / m:.2f}x "
          f"| {auc(durable):.4f} / {auc(memory):.4f} |")
PY
echo "(data, logs and results in $work)" >&2
