#!/usr/bin/env bash
# What CURVE costs: eps's training rate with security.mode = curve (the
# default) against off, for each model at 1 server and 1 worker, on the same
# eps-datagen data, alternating the two modes `--reps` times each.
#
#   bench/security_overhead.sh [--rows N] [--reps R] [--models "lr dlrm"] [--section.key=value ...]
#
# The rate is the epoch's records over the time from its start to its end in
# the master's events log (bench/e2e.sh's measure). Prints one Markdown
# table: the median samples/s of each mode and curve's ratio to off. Goal:
# curve less than 10% slower.
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
    for mode in curve off; do
      run="$work/$model-$mode-$rep"
      echo "security: $model, mode $mode, run $rep of $reps" >&2
      mode_flag=()
      [ "$mode" = off ] && mode_flag=(--security.mode=off)
      EPS_RUN_DIR="$run" "$root/scripts/run_local.sh" "$config" --servers 1 --workers 1 \
        --data.train="$data/train" --data.eval="$data/eval" "${mode_flag[@]}" \
        "${overrides[@]}" >"$run.txt" 2>"$run.log"
      /usr/bin/python3 - "$model" "$mode" "$run/master" >>"$results" <<'PY'
import json, sys
model, mode, master = sys.argv[1:4]
events = [json.loads(line) for line in open(f"{master}/events.jsonl")]
start = next(e["time"] for e in events if e["event"] == "epoch_started")
end = next(e["time"] for e in events if e["event"] == "epoch_finished")
final = json.load(open(f"{master}/final_status.json"))
print(json.dumps({"model": model, "mode": mode,
                  "samples_per_s": final["records_per_epoch"] / (end - start),
                  "auc": final["metrics"]["eval_auc"]}))
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
print("| model | curve samples/s | off samples/s | curve / off | eval AUC curve / off |")
print("| --- | ---: | ---: | ---: | ---: |")
for model in dict.fromkeys(r["model"] for r in results):
    rate = {m: statistics.median(r["samples_per_s"] for r in results
                                 if r["model"] == model and r["mode"] == m)
            for m in ("curve", "off")}
    auc = {m: statistics.median(r["auc"] for r in results
                                if r["model"] == model and r["mode"] == m)
           for m in ("curve", "off")}
    print(f"| {model} | {rate['curve']:,.0f} | {rate['off']:,.0f} | "
          f"{rate['curve'] / rate['off']:.3f} | {auc['curve']:.4f} / {auc['off']:.4f} |")
PY
