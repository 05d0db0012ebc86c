#!/usr/bin/env bash
# Creates the virtual environment of `make bench`'s peers (.venv-peers): ONNX Runtime, onnx, diffusers,
# PyTorch (for torch.compile), numpy and matplotlib (the chart), from PyPI. Idempotent: installs only what is missing.
# Exits non-zero, saying why, when they cannot be installed; `make bench` then skips the peers.
set -euo pipefail
cd "$(dirname "$0")/.."
venv=${RETRACE_PEERS_VENV:-.venv-peers}
if [[ ! -x "$venv/bin/python" ]]; then
  echo "peers-env: creating $venv"
  python3 -m venv "$venv"
fi
if ! "$venv/bin/python" -c "import numpy, onnx, onnxruntime, torch, matplotlib, diffusers, safetensors" 2>/dev/null; then
  echo "peers-env: installing numpy, onnx, onnxruntime, torch, matplotlib, diffusers, safetensors into $venv (PyTorch is large)"
  "$venv/bin/python" -m pip install -q --upgrade pip
  "$venv/bin/python" -m pip install -q numpy onnx onnxruntime torch matplotlib diffusers safetensors
fi
"$venv/bin/python" -c "import numpy, onnx, onnxruntime, torch; print('peers-env: onnxruntime', onnxruntime.__version__, '/ torch', torch.__version__)"
