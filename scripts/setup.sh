#!/usr/bin/env bash
# Create .venv with everything the demo and the tests need. Safe to run again.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
[ -x .venv/bin/python ] || "$PYTHON" -m venv .venv
# torch first, pinned: it takes the local CPU wheel; any other torch requirement would pull
# several GB of CUDA packages.
.venv/bin/python -m pip install -q torch==2.13.0 2>&1 | grep -v "is ignored" || true
.venv/bin/python -m pip install -q -e ".[test,bench]" 2>&1 | grep -v "is ignored" || true
.venv/bin/python -c "import torch, jupyter_autograd, jupyterlab, playwright; print('torch', torch.__version__)"
