#!/usr/bin/env bash
# Install everything (.venv), then open the quickstart notebook in JupyterLab.
#
#   bash scripts/demo.sh                      # any jupyter-lab arguments may follow
#   VENV=~/env SETUP=no bash scripts/demo.sh  # use an environment you installed yourself
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${VENV:-.venv}
NOTEBOOK=01_quickstart.ipynb
[ "${SETUP:-yes}" = no ] || bash scripts/setup.sh
args=()
# Containers, Binder-like images and CI machines run as root, where Jupyter refuses to start
# without this flag.
[ "$(id -u)" = 0 ] && args+=(--allow-root)
echo "Starting JupyterLab on notebooks/ with $NOTEBOOK open (Ctrl-C stops it). Where no browser opens"
echo "by itself, open the http://...?token=... link it prints below: it goes to the notebook."
# The notebook is the server's default page, not a file argument: with a file, the link Jupyter
# prints opens the Launcher, and only a browser Jupyter opens itself shows the notebook.
exec "$VENV/bin/jupyter" lab --ServerApp.root_dir=notebooks "--LabApp.default_url=/lab/tree/$NOTEBOOK" \
  ${args[@]+"${args[@]}"} "$@"
