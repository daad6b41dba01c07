#!/usr/bin/env bash
# Install everything (Chromium from Debian for the browser tests), then run the whole suite.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
if ! [ -x /usr/bin/chromium ]; then
  SUDO=""; [ "$(id -u)" = 0 ] || SUDO=sudo
  $SUDO apt-get update -q && $SUDO apt-get install -y -q chromium fonts-dejavu-core
fi
exec .venv/bin/python -m pytest "$@"
