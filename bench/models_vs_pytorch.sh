#!/usr/bin/env bash
# Training speed of the model math on the CPU: forward + backward samples/s
# of each model in eps (build/bench/model_bench) beside the same model in
# PyTorch (bench/reference_models.py speed), same batch shape, same threads,
# one after the other on this machine.
#
#   bench/models_vs_pytorch.sh [--threads N] [--batch B] [--models "lr wdl deepfm dlrm"]
#
# Prints one table row per model: eps samples/s, PyTorch samples/s, ratio.
# Needs /usr/bin/python3 with torch (and libopenblas0-pthread, without which
# Debian's torch multiplies matrices with the reference BLAS).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
threads="$(nproc)"
batch=1024
models="lr wdl deepfm dlrm"
while [ "$#" -gt 0 ]; do
  case "$1" in
    --threads) threads="$2"; shift 2 ;;
    --batch) batch="$2"; shift 2 ;;
    --models) models="$2"; shift 2 ;;
    *) echo "usage: bench/models_vs_pytorch.sh [--threads N] [--batch B] [--models LIST]" >&2; exit 2 ;;
  esac
done
build="${EPS_BUILD_DIR:-$root/build}"
cmake --build "$build" --target model_bench -j"$(nproc)" >/dev/null

printf '%-8s %8s %8s %16s %16s %8s\n' model batch threads "eps samples/s" "torch samples/s" ratio
for model in $models; do
  eps_rate="$("$build/bench/model_bench" --threads="$threads" --batch="$batch" --benchmark_filter="^$model/" \
    --benchmark_format=json 2>/dev/null |
    /usr/bin/python3 -c 'import json,sys; print(json.load(sys.stdin)["benchmarks"][0]["items_per_second"])')"
  torch_rate="$(/usr/bin/python3 "$root/bench/reference_models.py" speed --model "$model" \
    --batch "$batch" --threads "$threads" --seconds 5 |
    /usr/bin/python3 -c 'import json,sys; print(json.loads(sys.stdin.read().strip().splitlines()[-1])["samples_per_s"])')"
  /usr/bin/python3 -c "
e, t = $eps_rate, $torch_rate
print(f'%-8s %8d %8d %16.0f %16.0f %7.2fx' % ('$model', $batch, $threads, e, t, e / t))"
done
