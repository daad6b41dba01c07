#!/usr/bin/env bash
# Install everything (.venv), then open the quickstart notebook in JupyterLab.
#
#   bash scripts/demo.sh                      # any jupyter-lab arguments may follow
#   VENV=~/env SETUP=no bash scripts/demo.sh  # use an environment you installed yourself
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${VENV:-.venv}
[ "${SETUP:-yes}" = no ] || bash scripts/setup.sh
args=()
# Containers, Binder-like images and CI machines run as root, where Jupyter refuses to start
# without this flag.
[ "$(id -u)" = 0 ] && args+=(--allow-root)
exec "$VENV/bin/jupyter" lab notebooks/01_quickstart.ipynb ${args[@]+"${args[@]}"} "$@"
