#!/usr/bin/env bash
# Compares eps's LR (2 servers, 2 workers, examples/local.ini) with a careful
# single-machine PyTorch LR (bench/reference_lr.py: sparse Adagrad, one
# epoch, batch 1024, best of several learning rates) on the same files.
#
#   bench/lr_vs_reference.sh --train FILES --eval FILES [--section.key=value ...]
#   bench/lr_vs_reference.sh --generate "ROWS:SEED ROWS:SEED ..."
#
# Prints one table row per data set: eps eval AUC, reference best AUC (and
# its learning rate), the difference. Needs /usr/bin/python3 with torch.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
work="${EPS_BENCH_DIR:-$(mktemp -d /tmp/eps-lr-bench.XXXXXX)}"
train=""
eval=""
generate=""
overrides=()
while [ "$#" -gt 0 ]; do
  case "$1" in
    --train) train="$2"; shift 2 ;;
    --eval) eval="$2"; shift 2 ;;
    --generate) generate="$2"; shift 2 ;;
    --*.*=*) overrides+=("$1"); shift ;;
    *) echo "usage: bench/lr_vs_reference.sh (--train F --eval F | --generate 'ROWS:SEED ...')" >&2; exit 2 ;;
  esac
done

run_one() {
  local name="$1" train_files="$2" eval_files="$3"
  EPS_RUN_DIR="$work/$name" "$root/scripts/run_local.sh" "$root/examples/local.ini" \
    --data.train="$train_files" --data.eval="$eval_files" "${overrides[@]}" >"$work/$name.eps.txt" 2>"$work/$name.eps.log"
  local eps_auc
  eps_auc="$(sed -n 's/^eval_auc *//p' "$work/$name.eps.txt")"
  local best
  best="$(/usr/bin/python3 "$root/bench/reference_lr.py" --train "$train_files" --eval "$eval_files" 2>/dev/null | tail -n 1)"
  /usr/bin/python3 - "$name" "$eps_auc" "$best" <<'PY'
import json, sys
name, eps_auc, best = sys.argv[1], float(sys.argv[2]), json.loads(sys.argv[3])["best"]
print(f"| {name} | {eps_auc:.4f} | {best['eval_auc']:.4f} (lr {best['lr']}) | {eps_auc - best['eval_auc']:+.4f} |")
PY
}

echo "| data | eps LR eval AUC | reference LR eval AUC | eps - reference |"
echo "| --- | --- | --- | --- |"
if [ -n "$train" ]; then
  run_one "given" "$train" "$eval"
fi
for spec in $generate; do
  rows="${spec%%:*}"
  seed="${spec##*:}"
  data="$work/data-$rows-$seed"
  "$root/build/bin/eps-datagen" --rows "$rows" --seed "$seed" --files 4 --out "$data" >/dev/null 2>&1
  run_one "datagen rows=$rows seed=$seed" "$data/train" "$data/eval"
done
echo "(work files in $work)" >&2
