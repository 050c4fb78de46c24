#!/usr/bin/env bash
# Installs every Debian package Weft needs (non-interactive, idempotent), then
# configures and builds a Release tree in ./build.
#   ./setup.sh          packages + build
#   ./setup.sh --deps   packages only (used by test.sh)
set -euo pipefail
cd "$(dirname "$0")"

PACKAGES=(
  build-essential cmake ninja-build ccache pkg-config git
  libopenblas-openmp-dev        # CPU GEMM (OpenMP flavour: nests in our parallel loops)
  libyaml-cpp-dev               # the YAML job spec
  libboost-dev                  # Boost.Asio for the rendezvous store, Boost.Beast for etcd HTTP (header-only)
  libssl-dev                    # OpenSSL libcrypto: HMAC-SHA256 for the store's job-token handshake
  nlohmann-json3-dev            # JSON for the etcd store's requests (header-only; HTTP is Boost.Beast)
  etcd-server etcd-client       # the etcd rendezvous backend's tests start real etcd members
  libgtest-dev libgmock-dev     # tests
  libopenmpi-dev openmpi-bin    # MPI backend and mpirun-launched tests
  libgloo-dev                   # Gloo CPU collectives
  libisal-dev                   # ISA-L erasure coding for snapshots
  fortunes                      # a real English text corpus for the main job (/usr/share/games/fortunes)
  python3                       # small tools (loss-curve comparison)
)

missing=()
for p in "${PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  echo "setup: installing ${missing[*]}"
  SUDO=""; [ "$(id -u)" = 0 ] || SUDO="sudo"
  export DEBIAN_FRONTEND=noninteractive
  $SUDO apt-get update -qq
  $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
else
  echo "setup: all ${#PACKAGES[@]} packages present"
fi
[ "${1:-}" = "--deps" ] && exit 0

cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release
cmake --build build --target weft
echo
echo "setup: done. Train the main job with:"
echo "  ./build/launch/weft train --config configs/gpt-small.yaml"
