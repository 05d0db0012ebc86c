#!/usr/bin/env bash
# scripts/gpu-deps.sh — downloads the Debian packages retrace builds with into .gpu-deps/
# (ignored by git), for a GPU machine that has a CUDA toolkit, CMake, Ninja and a C++ compiler but
# no package registry. scripts/gpu-check.sh unpacks them into a private prefix when the folder
# is there (and uses the machine's own packages otherwise). Run it on a Debian 12 machine.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
dest="$root/.gpu-deps"
packages=(
  libfmt-dev libfmt9 libeigen3-dev libopenblas-dev libopenblas-pthread-dev libopenblas0-pthread
  libgtest-dev libgmock-dev libbenchmark-dev libbenchmark1debian libcli11-dev nlohmann-json3-dev
)
mkdir -p "$dest"
cd "$dest"
apt-get download "${packages[@]}"
du -sh "$dest"
