#!/usr/bin/env bash
# End to end: how fast eps trains each model against the single-process
# PyTorch script a user would otherwise write, on the same data.
#
#   bench/e2e.sh [--rows N] [--models "lr wdl deepfm dlrm"] [--layouts "1 1,2 2"]
#                [--section.key=value ...]
#
# For every model (examples/<model>.ini; lr: examples/local.ini) it trains one
# epoch of the same eps-datagen data (N training rows, default 200000)
#   - through eps (scripts/run_local.sh) with each (servers, workers) of
#     --layouts (default (1, 1) and (2, 2)), the workers sharing this
#     machine's cores;
#   - with bench/reference_models.py train: one PyTorch process, the same
#     batch (1024), learning rate and model sizes, torch.set_num_threads(nproc).
# eps's samples/s is the epoch's records over the time from the epoch's start
# to its end in the master's events log (parsing, pulls, pushes and commits
# included; the data scan and the evaluation not). PyTorch's is its training
# loop's, the data already in memory; the table also compares with PyTorch
# counting the time it took to read its training rows (numpy parsing, the
# ids hashed into a vocabulary), which eps does while it trains. Prints one
# Markdown table: samples/s, ratios to PyTorch, eval AUC, the job's wall
# time, and its cost: CPU-seconds (user + system, every process of the job:
# run_local.sh's count; for PyTorch its whole process, loading included)
# per 1,000 records trained, with the ratio to PyTorch's. The goals: eps at
# (1, 1) at least as fast as PyTorch for every model, and at most 0.77x its
# CPU-seconds per record.
#
# Needs /usr/bin/python3 with torch (python3-torch); install
# libopenblas0-pthread first, or PyTorch's matrix products run on the
# reference BLAS and the comparison means nothing.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
work="${EPS_BENCH_DIR:-$(mktemp -d /tmp/eps-e2e.XXXXXX)}"
rows=200000
models="lr wdl deepfm dlrm"
layouts="1 1,2 2"
overrides=()
while [ "$#" -gt 0 ]; do
  case "$1" in
    --rows) rows="$2"; shift 2 ;;
    --models) models="$2"; shift 2 ;;
    --layouts) layouts="$2"; shift 2 ;;
    --*.*=*) overrides+=("$1"); shift ;;
    *) echo "usage: bench/e2e.sh [--rows N] [--models LIST] [--layouts \"S W,S W\"]" \
            "[--section.key=value ...]" >&2; exit 2 ;;
  esac
done
if ! /usr/bin/python3 -c 'import torch' 2>/dev/null; then
  echo "bench/e2e.sh: needs /usr/bin/python3 with torch (apt-get install python3-torch)" >&2
  exit 2
fi
if ! dpkg-query -W -f='${Status}' libopenblas0-pthread 2>/dev/null | grep -q "ok installed"; then
  echo "bench/e2e.sh: warning: libopenblas0-pthread is not installed; PyTorch runs on the" \
       "reference BLAS and will look far slower than it is" >&2
fi

cmake --build "$root/build" --target eps-master eps-server eps-worker eps-datagen eps-keygen >/dev/null
data="$work/data-$rows"
if [ ! -f "$data/truth.json" ]; then
  "$root/build/bin/eps-datagen" --rows "$rows" --seed 1 --files 4 --out "$data" >/dev/null 2>&1
fi
threads="$(nproc)"

# A value of the config's [section] key.
config_value() {
  local file="$1" section="$2" key="$3"
  awk -v s="[$section]" -v k="$key" '
    /^\[/ { in_section = ($0 == s) }
    in_section && $0 ~ "^[[:space:]]*" k "[[:space:]]*=" { sub(/^[^=]*=[[:space:]]*/, ""); print; exit }' "$file"
}

results="$work/results.jsonl"
: >"$results"
started=$(date +%s)
for model in $models; do
  config="$root/examples/$model.ini"
  [ "$model" = lr ] && config="$root/examples/local.ini"
  IFS=, read -ra layout_list <<<"$layouts"
  for layout in "${layout_list[@]}"; do
    read -r servers workers <<<"$layout"
    run="$work/$model-$servers-$workers"
    echo "e2e: $model through eps, $servers server(s) and $workers worker(s)" >&2
    EPS_RUN_DIR="$run" "$root/scripts/run_local.sh" "$config" --servers "$servers" \
      --workers "$workers" --data.train="$data/train" --data.eval="$data/eval" \
      "${overrides[@]}" >"$run.txt" 2>"$run.log"
    PYTHONPATH="$root/bench" /usr/bin/python3 - "$model" "$servers" "$workers" "$run/master" \
      "$run.txt" >>"$results" <<'PY'
import json, re, sys
from job_results import Job
model, servers, workers, master = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
job = Job(master)
out = open(sys.argv[5]).read()
wall = int(re.search(r"job finished in (\d+) s: (\d+) records", out)[1])
records = int(re.search(r"job finished in \d+ s: (\d+) records", out)[1])
cpu = float(re.search(r"^cpu_seconds +([0-9.]+)", out, re.M)[1])
print(json.dumps({"model": model, "system": f"eps ({servers}, {workers})",
                  "samples_per_s": job.samples_per_s, "auc": job.auc, "wall_s": wall,
                  "cpu_per_1k": 1000 * cpu / records}))
PY
  done
  echo "e2e: $model in PyTorch, $threads thread(s)" >&2
  torch_args=(--model "$model" --train "$data/train" --eval "$data/eval" --batch 1024 --epochs 1
              --threads "$threads" --lr "$(config_value "$config" optimizer learning_rate)")
  for key in embedding_dim mlp bottom_mlp top_mlp activation; do
    value="$(config_value "$config" model "$key")"
    [ -n "$value" ] && torch_args+=("--${key//_/-}" "$value")
  done
  # Its whole process's CPU-seconds (user + system), as the children's.
  /usr/bin/python3 -c 'import resource, subprocess, sys, time
t = time.monotonic()
out = subprocess.run(sys.argv[1:], stdout=subprocess.PIPE, check=True).stdout.decode()
r = resource.getrusage(resource.RUSAGE_CHILDREN)
print(out.strip().splitlines()[-1])
print(r.ru_utime + r.ru_stime, time.monotonic() - t)' \
    /usr/bin/python3 "$root/bench/reference_models.py" train "${torch_args[@]}" \
    2>"$work/$model.torch.log" | tail -n 2 |
    /usr/bin/python3 -c 'import json, re, sys
lines = sys.stdin.read().splitlines()
r = json.loads(lines[0])
cpu, wall = map(float, lines[1].split())
# Its log says how long reading the train and eval files took; the train
# rows share of it is what a script reading its data would add.
log = open(sys.argv[1]).read()
m = re.search(r"(\d+) train rows, (\d+) eval rows, .* loaded in ([0-9.]+) s", log)
train, evals, load = int(m[1]), int(m[2]), float(m[3])
seconds = train / r["samples_per_s"] + load * train / (train + evals)
print(json.dumps({"model": r["model"], "system": "PyTorch", "samples_per_s": r["samples_per_s"],
                  "with_loading": train / seconds, "auc": r["auc"], "wall_s": wall,
                  "cpu_per_1k": 1000 * cpu / train}))' "$work/$model.torch.log" >>"$results"
done

/usr/bin/python3 - "$results" "$rows" "$threads" "$(( $(date +%s) - started ))" <<'PY'
import json, sys
results = [json.loads(line) for line in open(sys.argv[1])]
rows, threads, seconds = sys.argv[2], sys.argv[3], sys.argv[4]
print(f"One epoch of {rows} eps-datagen rows, batch 1024, {threads} core(s); {seconds} s in all.\n")
print("| model | system | samples/s | vs PyTorch | vs PyTorch with its loading | eval AUC "
      "| wall s | CPU-s per 1k records | vs PyTorch's |")
print("| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
for model in dict.fromkeys(r["model"] for r in results):
    torch = next(r for r in results if r["model"] == model and r["system"] == "PyTorch")
    for r in (r for r in results if r["model"] == model):
        ratio = r["samples_per_s"] / torch["samples_per_s"]
        loading = f"{r['samples_per_s'] / torch['with_loading']:.2f}x"
        name = r["system"]
        if name == "PyTorch":
            name += f" ({torch['with_loading']:,.0f}/s with its loading)"
            loading = "1.00x"
        cost = r["cpu_per_1k"] / torch["cpu_per_1k"]
        print(f"| {model} | {name} | {r['samples_per_s']:,.0f} | {ratio:.2f}x | {loading} "
              f"| {r['auc']:.4f} | {r['wall_s']:.0f} | {r['cpu_per_1k']:.3f} | {cost:.2f}x |")
PY
echo "(data, logs and results in $work)" >&2
