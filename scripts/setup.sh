#!/usr/bin/env bash
# Installs the Debian packages retrace builds with. Idempotent: installs only what is missing.
set -euo pipefail
packages=(
  build-essential cmake ninja-build pkg-config
  libfmt-dev libspdlog-dev libeigen3-dev libopenblas-dev libdnnl-dev
  libgtest-dev libgmock-dev libbenchmark-dev libcli11-dev nlohmann-json3-dev python3 python3-dev python3-venv
  libopenmpi-dev openmpi-bin
)
# `setup.sh --bench` adds what `make bench` needs on top: gnuplot for the chart, libtorch for
# the bench's libtorch mode.
if [[ "${1:-}" == "--bench" ]]; then packages+=(gnuplot-nox libtorch-dev); fi
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]} == 0)); then
  exit 0
fi
echo "setup: installing ${missing[*]}"
sudo_cmd=()
if [[ $(id -u) -ne 0 ]]; then sudo_cmd=(sudo); fi
export DEBIAN_FRONTEND=noninteractive
"${sudo_cmd[@]}" apt-get update -qq
"${sudo_cmd[@]}" apt-get install -y -qq --no-install-recommends "${missing[@]}"
