#!/usr/bin/env bash
# Install everything, then open the quickstart notebook in JupyterLab.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
exec .venv/bin/jupyter lab notebooks/01_quickstart.ipynb "$@"
