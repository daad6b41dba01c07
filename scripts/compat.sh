#!/usr/bin/env bash
# Run the test suite against another version of torch, in a virtual environment of its own
# (.venv/compat-torch-VERSION, kept for the next run), so .venv keeps its torch.
#
#   bash scripts/compat.sh 2.14.1                   # the whole suite
#   bash scripts/compat.sh 2.14.1 -m "not browser"  # any pytest arguments after the version
#   PYTHON=python3.12 VENV=/tmp/py312 bash scripts/compat.sh 2.13.0 -m "not browser"  # another Python
set -euo pipefail
cd "$(dirname "$0")/.."
if [ $# -lt 1 ] || [[ "$1" == -* ]]; then
  echo "usage: bash scripts/compat.sh TORCH_VERSION [pytest arguments]" >&2
  exit 2
fi
version=$1
shift
export VENV=${VENV:-.venv/compat-torch-$version} TORCH=$version
bash scripts/setup.sh
exec bash scripts/test.sh "$@"
