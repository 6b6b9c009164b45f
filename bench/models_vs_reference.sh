#!/usr/bin/env bash
# Accuracy of each model trained through eps (2 servers, 2 workers,
# examples/<model>.ini) against the same model trained by a single-process
# PyTorch script (bench/reference_models.py train) on the same eps-datagen
# data with the same schedule: one epoch in batches of 1024, Adagrad at the
# example config's optimizer.learning_rate on the tables and the linear
# weights, and its optimizer.mlp's type and learning rate (eps's default:
# Adam at 0.001) on the MLP layers, as a PyTorch user trains them (Adam
# with PyTorch's betas: eps's default beta1 of 0.5 answers its asynchronous
# workers, which the single process has not).
#
#   bench/models_vs_reference.sh [--rows N] [--seed S] [--models "lr wdl deepfm dlrm"]
#                                [--runs R] [--workers W] [--section.key=value ...]
#
# Prints a Markdown table: eps eval AUC (the mean of R runs, run r with
# job.seed r, and their range: initialization and asynchronous training
# vary from run to run), PyTorch eval AUC,
# the difference. Needs /usr/bin/python3 with torch.
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
    --workers) workers="$2"; shift 2 ;;
    --models) models="$2"; shift 2 ;;
    --*.*=*) overrides+=("$1"); shift ;;
    *) echo "usage: bench/models_vs_reference.sh [--rows N] [--seed S] [--runs R] [--models LIST]" >&2; exit 2 ;;
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

echo "| model | eps eval AUC (2 servers, $workers workers) | PyTorch eval AUC (1 process) | eps - PyTorch |"
echo "| --- | --- | --- | --- |"
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
  aucs=()
  for run in $(seq 1 "$runs"); do
    # Run r initializes with job.seed r (unless --job.seed=... is given).
    seed_flag=(--job.seed="$run")
    [[ " ${overrides[*]-} " == *" --job.seed="* ]] && seed_flag=()
    EPS_RUN_DIR="$work/$model-$run" "$root/scripts/run_local.sh" "$config" --workers "$workers" \
      --data.train="$data/train" --data.eval="$data/eval" ${seed_flag[@]+"${seed_flag[@]}"} \
      ${overrides[@]+"${overrides[@]}"} \
      >"$work/$model-$run.eps.txt" 2>"$work/$model-$run.eps.log"
    aucs+=("$(sed -n 's/^eval_auc *//p' "$work/$model-$run.eps.txt")")
  done
  torch_args=(--model "$model" --train "$data/train" --eval "$data/eval" --lr "$lr" --batch 1024
              --mlp-optimizer "${mlp_type:-adam}" --mlp-lr "${mlp_lr:-0.001}"
              --epochs 1 --threads "$(nproc)")
  for key in embedding_dim mlp bottom_mlp top_mlp activation; do
    value="$(config_value "$config" model "$key")"
    [ -n "$value" ] && torch_args+=("--${key//_/-}" "$value")
  done
  reference="$(/usr/bin/python3 "$root/bench/reference_models.py" train "${torch_args[@]}" 2>"$work/$model.torch.log" | tail -n 1)"
  /usr/bin/python3 - "$model" "$reference" "${aucs[@]}" <<'PY'
import json, sys
model, reference, aucs = sys.argv[1], json.loads(sys.argv[2]), [float(a) for a in sys.argv[3:]]
mean = sum(aucs) / len(aucs)
spread = f" ({min(aucs):.4f}–{max(aucs):.4f}, {len(aucs)} runs)" if len(aucs) > 1 else ""
print(f"| {model} | {mean:.4f}{spread} | {reference['auc']:.4f} | {mean - reference['auc']:+.4f} |")
PY
done
echo "(data, logs and results in $work)" >&2
