#!/usr/bin/env bash
# Builds and runs Weft's test suite: the command the README gives and CI runs.
#   ./test.sh            every test, the long layout matrix and resume scenarios too (what CI runs)
#   ./test.sh --quick    everything except the tests labelled `long` (a faster inner loop)
#   WEFT_SANITIZE=address ./test.sh   the same suite under a sanitizer (own build dir)
set -euo pipefail
cd "$(dirname "$0")"
label_args=()
case "${1:-}" in
  --quick) label_args=(-LE long) ;;
  ""|--all) ;;
  *) echo "test.sh: unknown option '$1' (expected --quick)" >&2; exit 2 ;;
esac
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

# OMP/BLAS threads per test process: keep parallel ctest from oversubscribing 2 cores.
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
cd "$build"
ctest --output-on-failure -j "$jobs" "${label_args[@]}"
