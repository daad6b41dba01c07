#!/usr/bin/env bash
# Install what the selected tests need, then run them: bash scripts/test.sh [pytest arguments]
#
#   bash scripts/test.sh                      # the whole suite
#   bash scripts/test.sh -m "not browser"     # without Chromium
#   bash scripts/test.sh tests/test_capture.py -k leaf
#
# The setup is skipped when .venv is up to date with pyproject.toml; Chromium (for
# tests/test_browser.py only) is installed with apt-get where there is one.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${VENV:-.venv}
# The shared scenario corpora live next to the checkout (../shared); tests/conftest.py leaves
# them out quietly when they are missing, so say it here, once. CI must run them.
if ! [ -d ../shared/scenarios ]; then
  if [[ "${CI:-}" =~ ^(1|true|True|TRUE|yes)$ ]]; then
    echo "error: CI must run the shared scenario corpus, but ../shared/scenarios does not exist." >&2
    exit 1
  fi
  echo "note: ../shared/scenarios not found: the shared scenario corpora (../shared/scenarios, ../shared/scenarios-errors) are not run, only tests/scenarios/."
fi
bash scripts/setup.sh
CHROMIUM=${CHROMIUM:-/usr/bin/chromium}  # where tests/test_browser.py looks for it

# Are the browser tests selected? Not when the marker expression excludes them or when the
# paths given do not include them (pytest would only skip a missing browser, or fail in CI).
browser=yes paths=no prev=""
for arg in "$@"; do
  if [ "$prev" = "-m" ] && [[ "$arg" == *"not browser"* ]]; then browser=no; fi
  if [[ "$arg" != -* ]] && [ "$prev" != "-m" ] && [ "$prev" != "-k" ] && [ -e "${arg%%::*}" ]; then
    [ "$paths" = no ] && { paths=yes; [ "$browser" = yes ] && browser=maybe; }
    case "$(realpath "${arg%%::*}")" in
      "$PWD"|"$PWD/tests"|*test_browser.py) [ "$browser" = maybe ] && browser=yes ;;
    esac
  fi
  prev=$arg
done
[ "$browser" = maybe ] && browser=no

if [ "$browser" = yes ] && ! [ -x "$CHROMIUM" ]; then
  if command -v apt-get >/dev/null; then
    SUDO=""; [ "$(id -u)" = 0 ] || SUDO=sudo
    echo "Installing Chromium for the browser tests (apt-get) ..."
    $SUDO apt-get update -q && $SUDO apt-get install -y -q chromium fonts-dejavu-core
  else
    echo "The browser tests need Chromium at $CHROMIUM, and this system has no apt-get to install it." >&2
    echo "Install Chromium with your package manager (and link it there), or leave those tests out:" >&2
    echo "    bash scripts/test.sh -m \"not browser\"" >&2
  fi
fi

exec "$VENV/bin/python" -m pytest "$@"
