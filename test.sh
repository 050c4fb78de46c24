#!/usr/bin/env bash
# Builds and runs Weft's test suite: the command the README gives and CI runs.
#   ./test.sh            the bounded suite (everything except tests labelled `long`)
#   ./test.sh --all      every test, the long scenarios too
#   WEFT_SANITIZE=address ./test.sh   the same suite under a sanitizer (own build dir)
set -euo pipefail
cd "$(dirname "$0")"
./setup.sh --deps

build=build
extra=()
if [ -n "${WEFT_SANITIZE:-}" ]; then
  build="build-$WEFT_SANITIZE"
  extra+=(-DWEFT_SANITIZE="$WEFT_SANITIZE" -DCMAKE_BUILD_TYPE=RelWithDebInfo)
fi
jobs=$(nproc)
cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DWEFT_BUILD_BENCH=OFF "${extra[@]}"
cmake --build "$build" -j "$jobs"

label_args=(-LE long)
[ "${1:-}" = "--all" ] && label_args=()
# OMP/BLAS threads per test process: keep parallel ctest from oversubscribing 2 cores.
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
cd "$build"
ctest --output-on-failure -j "$jobs" "${label_args[@]}"
