#!/usr/bin/env bash
# Create a virtual environment with everything the demo and the tests need. Safe to run again:
# it does nothing when the environment was already set up from this very pyproject.toml.
#
#   bash scripts/setup.sh              # .venv with torch 2.13.0
#   VENV=DIR TORCH=2.14.1 bash scripts/setup.sh   # another one (scripts/compat.sh does this)
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
VENV=${VENV:-.venv}
TORCH=${TORCH:-2.13.0}
STAMP="$VENV/.jupyter-autograd-setup"
want="$(cat pyproject.toml scripts/setup.sh | sha256sum | cut -c1-16) torch==$TORCH"
if [ -x "$VENV/bin/python" ] && [ -f "$STAMP" ] && [ "$(cat "$STAMP")" = "$want" ]; then
  exit 0  # up to date; delete $STAMP to force a new setup
fi
# pip runs quietly, for minutes on a first run: say what it is doing.
say() { echo "setup ($VENV): $*"; }
say "installing what the demo and the tests need, in 3 steps (a few minutes the first time; a later run checks in a second)"
[ -x "$VENV/bin/python" ] || "$PYTHON" -m venv "$VENV"
# torch first, pinned: pip takes a CPU wheel where one is offered (the local one here, or
# --index-url https://download.pytorch.org/whl/cpu); any looser torch requirement would pull
# several GB of CUDA packages. The constraint keeps the next install from replacing it.
constraint=$(mktemp)
trap 'rm -f "$constraint"' EXIT
echo "torch==$TORCH" > "$constraint"
say "1/3 torch $TORCH ..."
"$VENV/bin/python" -m pip install -q "torch==$TORCH" 2>&1 | grep -v "is ignored" || true
# The project's own dependencies without torch (so a torch outside the declared range can be
# tried), then the project itself in editable mode.
"$VENV/bin/python" - > "${constraint}.reqs" <<'PY'
import re
try:
    import tomllib
except ImportError:  # Python 3.10: pip carries a copy
    from pip._vendor import tomli as tomllib
with open("pyproject.toml", "rb") as f:
    project = tomllib.load(f)["project"]
deps = project["dependencies"] + project["optional-dependencies"]["test"] + project["optional-dependencies"]["bench"]
print("\n".join(d for d in deps if re.split(r"[\s<>=!~\[;]", d, maxsplit=1)[0] != "torch"))
PY
say "2/3 JupyterLab, ipywidgets, matplotlib and the test tools ..."
"$VENV/bin/python" -m pip install -q -c "$constraint" -r "${constraint}.reqs" 2>&1 | grep -v "is ignored" || true
rm -f "${constraint}.reqs"
say "3/3 jupyter-autograd itself (editable) ..."
"$VENV/bin/python" -m pip install -q --no-deps -e . 2>&1 | grep -v "is ignored" || true
"$VENV/bin/python" -c "import torch, jupyter_autograd, jupyterlab, playwright; print('torch', torch.__version__)"
echo "$want" > "$STAMP"
say "done in ${SECONDS}s"
