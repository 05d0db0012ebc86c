#!/usr/bin/env bash
# Creates the project's Python virtual environment (.venv) with what the Python package builds
# and tests with, from PyPI. Idempotent: installs only what is missing.
set -euo pipefail
cd "$(dirname "$0")/.."
venv=${RETRACE_VENV:-.venv}
requirements=("scikit-build-core>=0.10" "nanobind>=2.0" "numpy>=1.24" "pytest>=7" "mypy>=1.5")
if [[ ! -x "$venv/bin/python" ]]; then
  echo "python-env: creating $venv"
  python3 -m venv "$venv"
fi
if ! "$venv/bin/python" - "${requirements[@]}" <<'PY' 2>/dev/null; then
import sys
from importlib.metadata import version
from packaging.requirements import Requirement
for spec in sys.argv[1:]:
    r = Requirement(spec)
    if not r.specifier.contains(version(r.name), prereleases=True):
        sys.exit(1)
PY
  echo "python-env: installing ${requirements[*]}"
  "$venv/bin/python" -m pip install -q --upgrade pip
  "$venv/bin/python" -m pip install -q "${requirements[@]}" packaging
fi
