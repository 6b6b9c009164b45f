#!/usr/bin/env bash
# Builds eps with AddressSanitizer and UndefinedBehaviorSanitizer (clang,
# with the fuzz targets as libFuzzer binaries; CUDA off) into
# ${EPS_BUILD_DIR:-build-sanitize} and runs tests there.
#
#   scripts/sanitize.sh              every unit test (label `sanitize`), then
#                                    the elastic and recovery integration tests
#   scripts/sanitize.sh -L fuzz      each fuzz target for 60 s (fuzz/)
#   scripts/sanitize.sh [ctest arguments...]
#
# Any finding fails its test: UBSan does not recover, ASan stops at the
# first error, LeakSanitizer reports at exit. Child processes (the
# integration tests' eps binaries) inherit the options.
set -euo pipefail
EPS_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
export EPS_BUILD_DIR="${EPS_BUILD_DIR:-$EPS_ROOT/build-sanitize}"
EXTRA_PACKAGES=(clang)
source "$EPS_ROOT/scripts/setup.sh"

export CC="${CC:-clang}" CXX="${CXX:-clang++}"
EPS_CMAKE_ARGS="${EPS_CMAKE_ARGS:-} -DEPS_SANITIZE=address,undefined -DEPS_FUZZ=ON"
EPS_CMAKE_ARGS+=" -DEPS_WITH_CUDA=OFF -DEPS_BUILD_BENCH=OFF"
install_missing_packages
configure_and_build

# detect_leaks: LeakSanitizer at exit. No suppressions: it has reported no
# leak so far, in eps or in the Debian libraries (protobuf, abseil, RocksDB,
# ZeroMQ); add one only for a leak inside such a library, never ours.
export ASAN_OPTIONS="${ASAN_OPTIONS:-detect_leaks=1:strict_init_order=1:check_initialization_order=1}"
export UBSAN_OPTIONS="${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}"
ctest_args=(--test-dir "$EPS_BUILD_DIR" --output-on-failure -j "$(nproc)" --timeout 900)
echo "eps: running sanitized tests" >&2
if [ "$#" -gt 0 ]; then
  exec ctest "${ctest_args[@]}" "$@"
fi
# The unit tests carry the label; the two integration tests are named.
status=0
ctest "${ctest_args[@]}" -L '^sanitize$' || status=$?
ctest "${ctest_args[@]}" -R '^(elastic_test|recovery_test)[.]' || status=$?
exit "$status"
