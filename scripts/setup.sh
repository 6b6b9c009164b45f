#!/usr/bin/env bash
# Installs the Debian packages eps builds with (only those missing), then
# configures and builds it into ${EPS_BUILD_DIR:-build}.
#
#   scripts/setup.sh [cmake target ...]
#
# Sourced by scripts/test.sh and scripts/run_local.sh; safe to run again.
set -euo pipefail

EPS_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
EPS_BUILD_DIR="${EPS_BUILD_DIR:-$EPS_ROOT/build}"

PACKAGES=(
  build-essential cmake pkg-config python3
  libzmq3-dev cppzmq-dev libsodium-dev
  libprotobuf-dev protobuf-compiler
  libeigen3-dev librocksdb-dev
  libboost-program-options-dev
  libabsl-dev libspdlog-dev libcpp-httplib-dev nlohmann-json3-dev libxxhash-dev
  googletest libgtest-dev libgmock-dev libbenchmark-dev
)
# Callers add what only they need (scripts/test.sh: chromium, prometheus, ...
EXTRA_PACKAGES=(${EXTRA_PACKAGES[@]+"${EXTRA_PACKAGES[@]}"})

install_missing_packages() {
  local missing=()
  for package in "${PACKAGES[@]}" ${EXTRA_PACKAGES[@]+"${EXTRA_PACKAGES[@]}"}; do
    if ! dpkg-query -W -f='${Status}' "$package" 2>/dev/null | grep -q "ok installed"; then
      missing+=("$package")
    fi
  done
  if [ "${#missing[@]}" -eq 0 ]; then
    return 0
  fi
  echo "eps: installing ${missing[*]}" >&2
  local sudo=()
  if [ "$(id -u)" -ne 0 ]; then
    sudo=(sudo)
  fi
  "${sudo[@]}" env DEBIAN_FRONTEND=noninteractive apt-get update -qq
  "${sudo[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
    "${missing[@]}" >/dev/null
}

configure_and_build() {
  local jobs
  jobs="$(nproc)"
  mkdir -p "$EPS_BUILD_DIR"
  cmake -S "$EPS_ROOT" -B "$EPS_BUILD_DIR" -DCMAKE_BUILD_TYPE="${EPS_BUILD_TYPE:-RelWithDebInfo}" \
    ${EPS_CMAKE_ARGS:-} >"$EPS_BUILD_DIR/configure.log" 2>&1 || {
      cat "$EPS_BUILD_DIR/configure.log" >&2
      echo "eps: cmake configure failed (log above)" >&2
      return 1
    }
  local targets=()
  for target in "$@"; do
    targets+=(--target "$target")
  done
  echo "eps: building in $EPS_BUILD_DIR with $jobs jobs" >&2
  cmake --build "$EPS_BUILD_DIR" -j "$jobs" "${targets[@]}" >&2
}

if [ "${BASH_SOURCE[0]}" = "$0" ]; then
  install_missing_packages
  configure_and_build "$@"
fi
