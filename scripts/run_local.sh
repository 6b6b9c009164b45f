#!/usr/bin/env bash
# Runs a whole eps job on this machine: master, servers and workers on
# loopback. Waits for the job and prints its final metrics.
#
#   scripts/run_local.sh [JOB.ini] [--servers N] [--workers M] [--rows R]
#                        [--servers-in-memory] [--section.key=value ...]
#
# With no JOB.ini it runs examples/local.ini. For a config in examples/ (no
# JOB.ini included) it first generates Criteo-format data with a planted
# model (eps-datagen, R training rows, default 500000) and trains on it.
# --section.key=value options go to every process, overriding the config
# file (e.g. --data.train=DIR --data.eval=DIR to train on your data). Logs
# and data go to ${EPS_RUN_DIR:-./eps-run}. Every process is stopped when
# the script exits, however it exits. --servers-in-memory starts the servers
# without --data-dir: their parameters live in memory only and a crash
# loses them (for measuring what the store of record costs).
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/setup.sh"

usage() {
  echo "usage: scripts/run_local.sh [JOB.ini] [--servers N] [--workers M] [--rows R]" \
    "[--servers-in-memory] [--section.key=value ...]" >&2
  exit 2
}

config=""
overrides=()
servers=2
workers=2
rows=500000
servers_in_memory=false
while [ "$#" -gt 0 ]; do
  case "$1" in
    --servers) [ "$#" -ge 2 ] || usage; servers="$2"; shift 2 ;;
    --workers) [ "$#" -ge 2 ] || usage; workers="$2"; shift 2 ;;
    --rows) [ "$#" -ge 2 ] || usage; rows="$2"; shift 2 ;;
    --servers=*) servers="${1#*=}"; shift ;;
    --workers=*) workers="${1#*=}"; shift ;;
    --rows=*) rows="${1#*=}"; shift ;;
    --servers-in-memory) servers_in_memory=true; shift ;;
    -h|--help) usage ;;
    --*.*=*) overrides+=("$1"); shift ;;
    -*) echo "run_local.sh: unknown option $1" >&2; usage ;;
    *) [ -z "$config" ] || usage; config="$1"; shift ;;
  esac
done
for value in "$servers" "$workers" "$rows"; do
  [[ "$value" =~ ^[1-9][0-9]*$ ]] || { echo "run_local.sh: '$value' is not a positive number" >&2; exit 2; }
done
if [ -n "$config" ] && [ ! -f "$config" ]; then
  echo "run_local.sh: config file '$config' not found" >&2
  exit 2
fi

install_missing_packages
configure_and_build eps-master eps-server eps-worker eps-datagen eps-keygen
bin="$EPS_BUILD_DIR/bin"

run_dir="$(realpath -m "${EPS_RUN_DIR:-./eps-run}")"
mkdir -p "$run_dir/logs"
# A new job: the master's state and the servers' parameters start empty.
rm -rf "$run_dir/master" "$run_dir"/server-*

extra=(--ps.num_servers="$servers")
# The example configs train on generated data unless told otherwise.
generate=false
if [ -z "$config" ]; then
  config="$EPS_ROOT/examples/local.ini"
  generate=true
elif [ "$(realpath "$(dirname "$config")")" = "$(realpath "$EPS_ROOT/examples")" ]; then
  generate=true
fi
for override in "${overrides[@]}"; do
  case "$override" in --data.train=*) generate=false ;; esac
done
if [ "$generate" = true ]; then
  data="$run_dir/data"
  if [ ! -f "$data/truth.json" ] || [ "$(cat "$data/.rows" 2>/dev/null)" != "$rows" ]; then
    echo "eps: generating $rows training rows into $data" >&2
    rm -rf "$data"
    "$bin/eps-datagen" --rows "$rows" --out "$data" --seed 1 --files 4
    echo "$rows" >"$data/.rows"
  fi
  extra+=(--data.train="$data/train" --data.eval="$data/eval")
fi
# Keys for this run: every process authenticates its peers (CURVE), and
# POST /checkpoint needs the token in $run_dir/keys/http_token. A config or
# command line that sets [security] itself decides instead.
if ! grep -qE '^[[:space:]]*\[security\]' "$config" &&
  [[ " ${overrides[*]} " != *" --security."* ]]; then
  rm -rf "$run_dir/keys"
  "$bin/eps-keygen" --out "$run_dir/keys" >/dev/null
  extra+=(--security.keys_dir="$run_dir/keys")
fi
extra+=("${overrides[@]}")

pids=()
cleanup() {
  for pid in "${pids[@]}"; do
    kill "$pid" 2>/dev/null || true
  done
  sleep 0.5
  for pid in "${pids[@]}"; do
    kill -9 "$pid" 2>/dev/null || true
  done
}
trap cleanup EXIT

# CPU-seconds (user + system) of the children of this shell it reaped so far
# (bash's `times`, second line: "0m12.345s 0m1.234s"). `times` runs in this
# shell, not in a $(...) subshell, whose children are its own.
children_cpu_s() {
  times >"$run_dir/.times"
  awk 'NR == 2 { split($1, u, /[ms]/); split($2, s, /[ms]/)
                 printf "%.2f\n", u[1] * 60 + u[2] + s[1] * 60 + s[2] }' "$run_dir/.times"
}
children_cpu_s >"$run_dir/.cpu_before"
cpu_before=$(cat "$run_dir/.cpu_before")
started=$(date +%s)
"$bin/eps-master" --config "$config" --port 0 --http-port 0 --data-dir "$run_dir/master" \
  "${extra[@]}" >"$run_dir/logs/master.log" 2>&1 &
master_pid=$!
pids+=("$master_pid")
for _ in $(seq 100); do
  [ -f "$run_dir/master/master.json" ] && break
  if ! kill -0 "$master_pid" 2>/dev/null; then
    cat "$run_dir/logs/master.log" >&2
    exit 1
  fi
  sleep 0.1
done
endpoint="$(sed -n 's/.*"rpc": *"\([^"]*\)".*/\1/p' "$run_dir/master/master.json")"
http="$(sed -n 's/.*"http": *"\([^"]*\)".*/\1/p' "$run_dir/master/master.json")"
echo "eps: master at $endpoint; status page at $http/ (JSON at /status, metrics at /metrics); logs in $run_dir/logs" >&2

for i in $(seq 0 $((servers - 1))); do
  server_dir=(--data-dir "$run_dir/server-$i")
  [ "$servers_in_memory" = true ] && server_dir=()
  "$bin/eps-server" --config "$config" --master "$endpoint" "${server_dir[@]}" \
    "${extra[@]}" >"$run_dir/logs/server-$i.log" 2>&1 &
  pids+=($!)
done
# Workers share this machine's CPUs for their model math: each is told how
# many run here and, unless worker.compute_threads says otherwise, takes its
# part of the CPUs it may use (affinity and cgroup quota, core/cpu_budget.h;
# the first lines of its log say what it chose and why).
for i in $(seq 0 $((workers - 1))); do
  EPS_WORKERS_ON_HOST="$workers" "$bin/eps-worker" --config "$config" --master "$endpoint" \
    "${extra[@]}" >"$run_dir/logs/worker-$i.log" 2>&1 &
  pids+=($!)
done

# Follow the master's progress lines while the job runs.
tail -n +1 -f "$run_dir/logs/master.log" --pid "$master_pid" >&2 &
# While the job runs, each process's CPU-seconds so far, read from /proc
# every 0.5 s (bash reaps its children as they exit, taking their /proc
# entries with them): the split by process below misses each one's last
# half second; the total does not.
ticks=$(getconf CLK_TCK)
declare -A cpu_of
while kill -0 "$master_pid" 2>/dev/null; do
  for pid in "${pids[@]}"; do
    # `read`, not a command: what this loop runs counts in the total.
    read -r -a stat 2>/dev/null <"/proc/$pid/stat" && cpu_of[$pid]=$((stat[13] + stat[14]))
  done
  sleep 0.5
done
status=0
wait "$master_pid" || status=$?
sleep 0.2
for pid in "${pids[@]:1}"; do
  wait "$pid" 2>/dev/null || true
done
elapsed=$(( $(date +%s) - started ))
# Every process of the job was reaped above: the build, the data and the
# keys before it are not counted.
children_cpu_s >"$run_dir/.cpu_after"
cpu_s=$(awk -v a="$cpu_before" -v b="$(cat "$run_dir/.cpu_after")" 'BEGIN { printf "%.2f", b - a }')
# The sampled split: pids[0] is the master, then the servers, then the workers.
cpu_sum() {
  local sum=0 pid
  for pid in "$@"; do sum=$((sum + ${cpu_of[$pid]:-0})); done
  awk -v s="$sum" -v t="$ticks" 'BEGIN { printf "%.2f", s / t }'
}
cpu_master=$(cpu_sum "${pids[0]}")
cpu_servers=$(cpu_sum "${pids[@]:1:servers}")
cpu_workers=$(cpu_sum "${pids[@]:$((1 + servers))}")

final="$run_dir/master/final_status.json"
if [ "$status" -ne 0 ] || [ ! -f "$final" ]; then
  echo "eps: the job failed (master exit code $status); see $run_dir/logs" >&2
  exit 1
fi
python3 - "$final" "${data:-}" "$elapsed" "$cpu_s" "$cpu_master" "$cpu_servers" "$cpu_workers" \
  <<'PY'
import json, os, sys
final = json.load(open(sys.argv[1]))
m = final["metrics"]
fmt = lambda v: "n/a" if v is None else f"{v:.5f}"
records, cpu = final["records_trained"], float(sys.argv[4])
print(f"eps: job {final['state']} in {sys.argv[3]} s: {records} records trained")
master, servers, workers = map(float, sys.argv[5:8])
print(f"cpu_seconds  {cpu:.2f} (every process of the job, user + system; "
      f"{1000 * cpu / max(records, 1):.4f} per 1,000 records trained; sampled every 0.5 s: "
      f"workers {workers:.2f}, servers {servers:.2f}, master {master:.2f})")
print(f"eval_auc     {fmt(m['eval_auc'])}")
print(f"eval_logloss {fmt(m['eval_logloss'])}")
print(f"train_loss   {fmt(m['train_loss'])}")
truth = os.path.join(sys.argv[2], "truth.json") if sys.argv[2] else ""
if truth and os.path.exists(truth):
    t = json.load(open(truth))
    print(f"planted model optimum: auc {t['optimal_auc']:.5f}, logloss {t['optimal_logloss']:.5f}")
PY
