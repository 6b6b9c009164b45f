#!/usr/bin/env bash
# Makes tests/testdata/master_state_v1.tar.gz: the --data-dir of a master of
# the format before the master rewrite, holding a job stopped by SIGTERM
# mid-epoch (resumable, only checkpoint 0). tests/integration/state_compat_test.cc
# resumes it with the current master. See tests/testdata/README.md.
#
#   tests/testdata/make_master_state_v1.sh OLD_BIN_DIR [OUT.tar.gz]
#
# OLD_BIN_DIR holds eps-master, eps-server, eps-worker and eps-datagen built
# from the old code. Needs curl and jq. Writes the job's data to
# /tmp/eps-fixture-v1/data (its absolute path is part of the job's config
# fingerprint, so the test regenerates it there) and scratch files to a
# temporary directory, which it removes.
set -euo pipefail

OLD="${1:?usage: $0 OLD_BIN_DIR [OUT.tar.gz]}"
OUT="${2:-$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/master_state_v1.tar.gz}"
DATA=/tmp/eps-fixture-v1/data
# Keep these in step with state_compat_test.cc.
ROWS=10000
SEED=7

WORK="$(mktemp -d /tmp/eps-make-fixture-XXXXXX)"
PIDS=()
cleanup() {
  for pid in "${PIDS[@]}"; do kill -9 "$pid" 2>/dev/null || true; done
  for pid in "${PIDS[@]}"; do wait "$pid" 2>/dev/null || true; done
  rm -rf "$WORK"
}
trap cleanup EXIT

if [ ! -f "$DATA/train/part-00000.txt" ]; then
  "$OLD/eps-datagen" --rows "$ROWS" --out "$DATA" --seed "$SEED" --files 1
fi
(cd "$DATA" && sha256sum train/part-00000.txt eval/part-00000.txt)

cat >"$WORK/job.ini" <<EOF
[job]
name = compat
epochs = 1
progress_interval_s = 1
[data]
train = $DATA/train
eval = $DATA/eval
shard_records = 2000
[ps]
num_servers = 1
partitions = 16
[worker]
batch_size = 256
master_wait_s = 60
max_records_per_s = 2000
[master]
heartbeat_ms = 200
lease_ms = 2000
[checkpoint]
interval_s = 3600
EOF

M="$WORK/master"
"$OLD/eps-master" --config "$WORK/job.ini" --port 0 --http-port 0 --data-dir "$M" \
  >"$WORK/master.log" 2>&1 &
MASTER=$!
PIDS+=("$MASTER")
for _ in $(seq 200); do
  [ -s "$M/master.json" ] && jq -e .rpc "$M/master.json" >/dev/null 2>&1 && break
  sleep 0.05
done
RPC="$(jq -r .rpc "$M/master.json")"
HTTP="$(jq -r .http "$M/master.json")"
"$OLD/eps-server" --config "$WORK/job.ini" --master "$RPC" --data-dir "$WORK/server" \
  >"$WORK/server.log" 2>&1 &
PIDS+=("$!")
"$OLD/eps-worker" --config "$WORK/job.ini" --master "$RPC" --device cpu \
  >"$WORK/worker.log" 2>&1 &
PIDS+=("$!")

# Mid-epoch: at least one shard done and the next one under way.
for _ in $(seq 600); do
  if curl -sf "${HTTP%/}/status" |
    jq -e '.state == "running" and .records_trained >= 3000' >/dev/null 2>&1; then
    break
  fi
  sleep 0.05
done
curl -sf "${HTTP%/}/status" | jq -c '{state, phase, records_trained, shards, checkpoints}'

kill -TERM "$MASTER"
set +e
wait "$MASTER"
echo "old master exited $?"
set -e
for pid in "${PIDS[@]}"; do kill -9 "$pid" 2>/dev/null || true; done

jq -e '.resumable == true' "$M/final_status.json" >/dev/null
jq -c '{state, resumable, error, records_trained, shards}' "$M/final_status.json"

# RocksDB's info logs are not part of the database.
rm -f "$M"/state/LOG "$M"/state/LOG.old.*
tar czf "$OUT" -C "$M" --owner=0 --group=0 --numeric-owner --sort=name \
  state events.jsonl final_status.json master.json
ls -l "$OUT"
tar tzvf "$OUT"
