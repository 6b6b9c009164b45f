#!/usr/bin/env bash
# Accuracy of each model trained through eps (2 servers, each of a list of
# worker counts, examples/<model>.ini) against the same model trained by a single-process
# PyTorch script (bench/reference_models.py train) on the same eps-datagen
# data with the same schedule: one epoch in batches of 1024, Adagrad at the
# example config's optimizer.learning_rate on the tables and the linear
# weights, and its optimizer.mlp's type and learning rate (eps's default:
# Adam at 0.001) on the MLP layers, as a PyTorch user trains them (Adam
# with PyTorch's betas: eps's default beta1 of 0.5 answers its asynchronous
# workers, which the single process has not).
#
#   bench/models_vs_reference.sh [--rows N] [--seed S] [--models "lr wdl deepfm dlrm"]
#                                [--runs R] [--workers "1 2 4 8"] [--section.key=value ...]
#
# Prints a Markdown table, a row per model: PyTorch eval AUC, then per
# worker count (--workers, a list; default 2) eps eval AUC (the mean of R
# runs, run r with job.seed r, and their range: initialization and
# asynchronous training vary from run to run) and its difference from
# PyTorch, and the spread of those means across the worker counts (the
# figure issue 51 asks to be flat). E.g. sync against async:
#   bench/models_vs_reference.sh --workers "1 2 4" --models dlrm
#   bench/models_vs_reference.sh --workers "1 2 4" --models dlrm \
#     --optimizer.dense_global_batch=4096 --worker.deterministic=true
# Needs /usr/bin/python3 with torch.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
work="${EPS_BENCH_DIR:-$(mktemp -d /tmp/eps-models-bench.XXXXXX)}"
rows=500000
seed=1
runs=1
workers=2
models="lr wdl deepfm dlrm"
overrides=()
while [ "$#" -gt 0 ]; do
  case "$1" in
    --rows) rows="$2"; shift 2 ;;
    --seed) seed="$2"; shift 2 ;;
    --runs) runs="$2"; shift 2 ;;
    --workers) workers="${2//,/ }"; shift 2 ;;
    --models) models="$2"; shift 2 ;;
    --*.*=*) overrides+=("$1"); shift ;;
    *) echo "usage: bench/models_vs_reference.sh [--rows N] [--seed S] [--runs R] [--workers LIST] [--models LIST]" >&2; exit 2 ;;
  esac
done

data="$work/data-$rows-$seed"
if [ ! -f "$data/truth.json" ]; then
  "$root/build/bin/eps-datagen" --rows "$rows" --seed "$seed" --files 4 --out "$data" >/dev/null 2>&1 ||
    { cmake --build "$root/build" --target eps-datagen >/dev/null && \
      "$root/build/bin/eps-datagen" --rows "$rows" --seed "$seed" --files 4 --out "$data" >/dev/null; }
fi

# A value of the example config's [section] key.
config_value() {
  local file="$1" section="$2" key="$3"
  awk -v s="[$section]" -v k="$key" '
    /^\[/ { in_section = ($0 == s) }
    in_section && $0 ~ "^[[:space:]]*" k "[[:space:]]*=" { sub(/^[^=]*=[[:space:]]*/, ""); print; exit }' "$file"
}

header="| model | PyTorch eval AUC (1 process) |"
rule="| --- | ---: |"
for w in $workers; do
  header+=" eps, $w worker(s) (2 servers) |"
  rule+=" ---: |"
done
echo "$header spread across worker counts |"
echo "$rule ---: |"
for model in $models; do
  config="$root/examples/$model.ini"
  [ "$model" = lr ] && config="$root/examples/local.ini"
  lr="$(config_value "$config" optimizer learning_rate)"
  # optimizer.mlp: "type=T,learning_rate=R"; eps's default when absent,
  # the section's (Adagrad at lr) when empty.
  if awk '/^\[/ { in_section = ($0 == "[optimizer]") }
         in_section && /^[[:space:]]*mlp[[:space:]]*=/ { found = 1 }
         END { exit !found }' "$config"; then
    mlp="$(config_value "$config" optimizer mlp)"
  else
    mlp="type=adam,learning_rate=0.001,beta1=0.5"
  fi
  # The same overrides reach the reference.
  for override in ${overrides[@]+"${overrides[@]}"}; do
    case "$override" in
      --optimizer.learning_rate=*) lr="${override#*=}" ;;
      --optimizer.mlp=*) mlp="${override#*=}" ;;
    esac
  done
  mlp_type="$(sed -n 's/.*type *= *\([a-z]*\).*/\1/p' <<<"$mlp")"
  mlp_lr="$(sed -n 's/.*learning_rate *= *\([0-9.eE+-]*\).*/\1/p' <<<"$mlp")"
  [ -z "$mlp" ] && { mlp_type=adagrad; mlp_lr="$lr"; }
  # Per worker count, its runs' AUCs joined by commas; the counts by spaces.
  by_workers=()
  for w in $workers; do
    aucs=""
    for run in $(seq 1 "$runs"); do
      # Run r initializes with job.seed r (unless --job.seed=... is given).
      seed_flag=(--job.seed="$run")
      [[ " ${overrides[*]-} " == *" --job.seed="* ]] && seed_flag=()
      name="$model-w$w-$run"
      EPS_RUN_DIR="$work/$name" "$root/scripts/run_local.sh" "$config" --workers "$w" \
        --data.train="$data/train" --data.eval="$data/eval" ${seed_flag[@]+"${seed_flag[@]}"} \
        ${overrides[@]+"${overrides[@]}"} \
        >"$work/$name.eps.txt" 2>"$work/$name.eps.log"
      auc="$(sed -n 's/^eval_auc *//p' "$work/$name.eps.txt")"
      [ -n "$auc" ] || { echo "$name: no eval AUC; see $work/$name.eps.log" >&2; exit 1; }
      aucs+="${aucs:+,}$auc"
    done
    by_workers+=("$aucs")
  done
  torch_args=(--model "$model" --train "$data/train" --eval "$data/eval" --lr "$lr" --batch 1024
              --mlp-optimizer "${mlp_type:-adam}" --mlp-lr "${mlp_lr:-0.001}"
              --epochs 1 --threads "$(nproc)")
  for key in embedding_dim mlp bottom_mlp top_mlp activation; do
    value="$(config_value "$config" model "$key")"
    [ -n "$value" ] && torch_args+=("--${key//_/-}" "$value")
  done
  reference="$(/usr/bin/python3 "$root/bench/reference_models.py" train "${torch_args[@]}" 2>"$work/$model.torch.log" | tail -n 1)"
  /usr/bin/python3 - "$model" "$reference" "${by_workers[@]}" <<'PY'
import json, sys
model, reference = sys.argv[1], json.loads(sys.argv[2])["auc"]
cells, means = [], []
for joined in sys.argv[3:]:
    aucs = [float(a) for a in joined.split(",")]
    mean = sum(aucs) / len(aucs)
    means.append(mean)
    runs = f", {min(aucs):.4f}–{max(aucs):.4f} in {len(aucs)} runs" if len(aucs) > 1 else ""
    cells.append(f"{mean:.4f} ({mean - reference:+.4f}{runs})")
print(f"| {model} | {reference:.4f} | " + " | ".join(cells) + f" | {max(means) - min(means):.4f} |")
PY
done
echo "(data, logs and results in $work)" >&2
