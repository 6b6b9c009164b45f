#!/usr/bin/env bash
# What moving partitions costs a training job (docs/design.md 2.20): the job
# of --config (DLRM by default) with 2 workers (scripts/run_local.sh), and
# the eval AUC it ends with. Two scenarios, after --warmup seconds of
# training:
#   drain-join (default): on 2 servers, server 0 is drained (POST
#     /servers/0/drain: its partitions move live to server 1, and it leaves
#     the job); then a fresh server joins and half the partitions move to it.
#   grow (issue 18's): on 1 server, 2 fresh servers join (the partitions
#     balance over 3), then server 0 is drained: the job ends on 2.
#
#   bench/partition_moves.sh [--config examples/dlrm.ini] [--rows 2000000]
#                            [--partitions 64] [--warmup 10] [--reference]
#                            [--scenario drain-join|grow] [--max-auc-gap G]
#
# --reference also trains the same job on 2 fixed servers and prints both
# eval AUCs; with --max-auc-gap, exits 1 when they differ by more than G.
# Prints, for each rebalance: the moves, rows and MiB moved, the moving
# rate (rows/s and MB/s over the moves' own time), the longest time any key
# was refused, and the job's training rate while the moves ran against the
# --warmup seconds before the first (the master's progress samples, one a
# second).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
work="${EPS_BENCH_DIR:-$(mktemp -d /tmp/eps-moves-bench.XXXXXX)}"
config="$root/examples/dlrm.ini"
rows=2000000
partitions=64
warmup=10
reference=false
scenario=drain-join
max_gap=""
while [ "$#" -gt 0 ]; do
  case "$1" in
    --config) config="$2"; shift 2 ;;
    --rows) rows="$2"; shift 2 ;;
    --partitions) partitions="$2"; shift 2 ;;
    --warmup) warmup="$2"; shift 2 ;;
    --reference) reference=true; shift ;;
    --scenario) scenario="$2"; shift 2 ;;
    --max-auc-gap) max_gap="$2"; reference=true; shift 2 ;;
    *) echo "usage: bench/partition_moves.sh [--config FILE] [--rows N] [--partitions P]" \
         "[--warmup S] [--reference] [--scenario drain-join|grow] [--max-auc-gap G]" >&2
       exit 2 ;;
  esac
done
case "$scenario" in
  drain-join) first_servers=2 ;;
  grow) first_servers=1 ;;
  *) echo "--scenario: drain-join or grow, not $scenario" >&2; exit 2 ;;
esac
data="$work/data"
if [ ! -f "$data/truth.json" ]; then
  cmake --build "$root/build" --target eps-datagen eps-server >/dev/null
  "$root/build/bin/eps-datagen" --rows "$rows" --seed 1 --files 4 --out "$data" >/dev/null 2>&1
fi
run="$work/run"
# A run's files of an earlier bench in the same EPS_BENCH_DIR (its
# master.json) would mislead this one.
rm -rf "$run" "$work/reference"
common=(--data.train="$data/train" --data.eval="$data/eval" --ps.partitions="$partitions"
        --job.progress_interval_s=1)
EPS_RUN_DIR="$run" "$root/scripts/run_local.sh" --servers "$first_servers" "$config" \
  "${common[@]}" >"$work/job.txt" 2>"$work/job.log" &
job=$!
joined=()
trap 'kill $job 2>/dev/null || true; [ "${#joined[@]}" = 0 ] || kill -9 "${joined[@]}" 2>/dev/null || true' EXIT

# The status as JSON, or nothing while the master is not up.
status() { curl -sf --max-time 5 "$http/status" || true; }
field() { /usr/bin/python3 -c "import json,sys; s=json.load(sys.stdin); print($1)"; }
for _ in $(seq 600); do
  [ -f "$run/master/master.json" ] && break
  sleep 0.5
done
http="$(sed -n 's/.*"http": *"\([^"]*\)".*/\1/p' "$run/master/master.json")"
endpoint="$(sed -n 's/.*"rpc": *"\([^"]*\)".*/\1/p' "$run/master/master.json")"
for _ in $(seq 600); do
  [ "$(status | field 's["phase"]' 2>/dev/null)" = training ] && break
  kill -0 "$job" 2>/dev/null || break
  sleep 0.5
done
sleep "$warmup"
# Server ids as /status lists them, e.g. [0, 1].
ids() { status | field '[s["id"] for s in s["servers"]]' 2>/dev/null; }
# Waits (at most 10 minutes) until `ids` prints $1 and no move is queued
# or in progress.
await() {
  for _ in $(seq 1200); do
    [ "$(ids)" = "$1" ] &&
      [ "$(status | field 'int(s["moves"]["in_progress"] is None and s["moves"]["queued"] == 0)' \
           2>/dev/null)" = 1 ] && return 0
    kill -0 "$job" 2>/dev/null || return 0
    sleep 0.5
  done
}
join() {
  # A join is an operator's act: the job's HTTP token admits it (docs/security.md).
  EPS_LAUNCH_SECRET_FILE="$run/keys/http_token" "$root/build/bin/eps-server" --config "$config" --master "$endpoint" \
    --data-dir "$run/server-joined-$1" --ps.num_servers="$first_servers" \
    --security.keys_dir="$run/keys" "${common[@]}" >"$run/logs/server-joined-$1.log" 2>&1 &
  joined+=($!)
}
drain() {
  echo "draining ps[0]" >&2
  date +%s.%N >"$work/drain_at"
  curl -sf --max-time 30 -X POST -H "Authorization: Bearer $(cat "$run/keys/http_token")" \
    "$http/servers/0/drain" >&2
  echo >&2
}
if [ "$scenario" = grow ]; then
  echo "2 servers join" >&2
  join 1
  join 2
  await "[0, 1, 2]"
  drain
  await "[1, 2]"
else
  drain
  await "[1]"
  echo "ps[0] left; a server joins" >&2
  join 1
fi
while kill -0 "$job" 2>/dev/null; do sleep 1; done
wait "$job" 2>/dev/null || true
grep -q '^eps: job finished' "$work/job.txt" ||
  { echo "the job failed: see $work/job.log and $run/logs" >&2; exit 1; }
/usr/bin/python3 - "$run/master/events.jsonl" "$warmup" "$scenario" "$work/drain_at" <<'PY'
import json, sys
events = [json.loads(line) for line in open(sys.argv[1])]
warmup = float(sys.argv[2])
scenario = sys.argv[3]
asked_drain = float(open(sys.argv[4]).read())
samples = [(e["time"], e["records_trained"]) for e in events if e["event"] == "progress"
           and e["phase"] == "training"]

def trained_at(t):
    """Records trained at time t, interpolated between progress samples."""
    before = [s for s in samples if s[0] <= t]
    after = [s for s in samples if s[0] >= t]
    if not before or not after:
        return None
    (t0, r0), (t1, r1) = before[-1], after[0]
    return r0 if t1 == t0 else r0 + (r1 - r0) * (t - t0) / (t1 - t0)

def rate(start, end):
    a, b = trained_at(start), trained_at(end)
    return None if a is None or b is None or end <= start else (b - a) / (end - start)

first_move = next(e["time"] for e in events if e["event"] == "partition_move_started")
join_at = next((e["time"] for e in events if e["event"] == "server_joined"), float("inf"))
if scenario == "grow":
    phases = [("2 join 1 -> 3", join_at, asked_drain), ("drain 3 -> 2", asked_drain, float("inf"))]
else:
    phases = [("drain 2 -> 1", asked_drain, join_at), ("join 1 -> 2", join_at, float("inf"))]
base = rate(max(samples[0][0], first_move - warmup), first_move) if samples else None
print("| rebalance | moves | rows | MiB | moving s | rows/s | MB/s | longest refused ms "
      "| records/s before | records/s during | ratio |")
print("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
for name, start, end in phases:
    moved = [e for e in events if e["event"] == "partition_moved" and start <= e["time"] < end]
    if not moved:
        print(f"| {name} | 0 (the job ended first: try more --rows) | | | | | | | | | |")
        continue
    rows = sum(e["rows"] for e in moved)
    size = sum(e["bytes"] for e in moved)
    took = sum(e["took_ms"] for e in moved) / 1000
    longest = max(e["unavailable_ms"] for e in moved)
    first = min(e["time"] - e["took_ms"] / 1000 for e in moved)
    last = max(e["time"] for e in moved)
    # While the job trained (a drain may go on into the evaluation).
    during = rate(first, min(last, samples[-1][0])) if samples else None
    fmt = lambda v: "n/a" if v is None else f"{v:,.0f}"
    ratio = "n/a" if base in (None, 0) or during is None else f"{during / base:.2f}"
    print(f"| {name} | {len(moved)} | {rows:,} | {size / 2**20:.1f} | {took:.2f} | "
          f"{rows / took:,.0f} | {size / took / 1e6:.1f} | {longest:.1f} | {fmt(base)} | "
          f"{fmt(during)} | {ratio} |")
PY
auc() { sed -n 's/^eval_auc *//p' "$1"; }
if [ "$reference" = true ]; then
  EPS_RUN_DIR="$work/reference" "$root/scripts/run_local.sh" "$config" "${common[@]}" \
    >"$work/reference.txt" 2>"$work/reference.log"
  moved_auc="$(auc "$work/job.txt")"
  fixed_auc="$(auc "$work/reference.txt")"
  echo "eval AUC with the moves $moved_auc, on 2 fixed servers $fixed_auc"
  if [ -n "$max_gap" ] && ! /usr/bin/python3 -c \
      "import sys; sys.exit(abs($moved_auc - $fixed_auc) > $max_gap)"; then
    echo "the AUCs differ by more than $max_gap" >&2
    exit 1
  fi
else
  echo "eval AUC with the moves $(auc "$work/job.txt")"
fi
echo "(runs in $work)" >&2
