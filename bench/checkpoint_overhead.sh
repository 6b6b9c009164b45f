#!/usr/bin/env bash
# What coordinated checkpoints cost a training job: the same job (2 servers,
# 2 workers, scripts/run_local.sh) without scheduled checkpoints and with
# one every --interval seconds, on the same generated data.
#
#   bench/checkpoint_overhead.sh [--config examples/dlrm.ini] [--rows 500000] [--interval 2]
#
# Prints the training time of both runs, the checkpoints written, the
# workers' pause per checkpoint (from /status), and the overhead share at
# this interval and, scaled, at the default checkpoint.interval_s (600 s):
# pause per checkpoint / interval.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
work="${EPS_BENCH_DIR:-$(mktemp -d /tmp/eps-checkpoint-bench.XXXXXX)}"
config="$root/examples/dlrm.ini"
rows=500000
interval=2
while [ "$#" -gt 0 ]; do
  case "$1" in
    --config) config="$2"; shift 2 ;;
    --rows) rows="$2"; shift 2 ;;
    --interval) interval="$2"; shift 2 ;;
    *) echo "usage: bench/checkpoint_overhead.sh [--config FILE] [--rows N] [--interval S]" >&2; exit 2 ;;
  esac
done
data="$work/data"
if [ ! -f "$data/truth.json" ]; then
  cmake --build "$root/build" --target eps-datagen >/dev/null
  "$root/build/bin/eps-datagen" --rows "$rows" --seed 1 --files 4 --out "$data" >/dev/null 2>&1
fi
run() {  # name interval
  EPS_RUN_DIR="$work/$1" "$root/scripts/run_local.sh" "$config" --data.train="$data/train" \
    --data.eval="$data/eval" --checkpoint.interval_s="$2" >"$work/$1.txt" 2>"$work/$1.log"
}
run without 604800
run with "$interval"
/usr/bin/python3 - "$work" "$interval" <<'PY'
import json, sys
work, interval = sys.argv[1], float(sys.argv[2])
def load(name):
    status = json.load(open(f"{work}/{name}/master/final_status.json"))
    # Training time: from the epoch's start to its end, in the events log.
    events = [json.loads(l) for l in open(f"{work}/{name}/master/events.jsonl")]
    start = next(e["time"] for e in events if e["event"] == "epoch_started")
    end = next(e["time"] for e in events if e["event"] == "epoch_finished")
    return status, end - start
without, t0 = load("without")
with_, t1 = load("with")
ck = with_["checkpoints"]
n = max(ck["written"], 1)
pause = ck["pause_s"] / n
print(f"| training s (no checkpoints) | training s (every {interval:g} s) | checkpoints | "
      f"pause per checkpoint | overhead at {interval:g} s | overhead at 600 s |")
print("| --- | --- | --- | --- | --- | --- |")
print(f"| {t0:.1f} | {t1:.1f} | {ck['written']} | {pause * 1000:.0f} ms "
      f"({ck['last']['bytes'] / 2**20:.0f} MiB) | {100 * pause / interval:.1f}% measured "
      f"{100 * (t1 - t0) / t0:+.1f}% | {100 * pause / 600:.3f}% |")
PY
echo "(runs in $work)" >&2
