"""The demo notebooks run top to bottom in a real kernel and show what their prose promises.

Policy: notebooks are committed without outputs; this test executes them (nbclient) and checks
every %%autograd cell's widget and every `diagnosis:KIND` tag against what was displayed.
"""
import pathlib

import nbformat
import pytest
from nbclient import NotebookClient

pytestmark = pytest.mark.notebooks

NOTEBOOKS = sorted((pathlib.Path(__file__).resolve().parent.parent / "notebooks").glob("*.ipynb"))
WIDGET = "application/vnd.jupyter.widget-view+json"


def test_the_demos_exist():
    numbers = [p.stem[:2] for p in NOTEBOOKS]
    assert len(set(numbers)) == len(numbers), "one notebook per number"
    assert {"01", "02", "03", "04", "05", "06", "07", "08", "09"} <= set(numbers)


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_committed_without_outputs(path):
    nb = nbformat.read(path, as_version=4)
    for cell in nb.cells:
        if cell.cell_type == "code":
            assert cell.outputs == [] and cell.execution_count is None, "clear the outputs of %s" % path.name


def execute(path):
    nb = nbformat.read(path, as_version=4)
    client = NotebookClient(nb, kernel_name="python3", timeout=300, store_widget_state=True,
                            resources={"metadata": {"path": str(path.parent)}})
    client.execute()
    return nb


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_notebook_runs_and_diagnoses(path):
    nb = execute(path)
    checked = 0
    for cell in nb.cells:
        if cell.cell_type != "code":
            continue
        tags = cell.metadata.get("tags", [])
        errors = [o for o in cell.outputs if o.output_type == "error"]
        if "raises-exception" in tags:
            assert errors, "this cell should raise:\n" + cell.source
        else:
            assert not errors, "unexpected error in:\n%s\n%s" % (cell.source, errors[0].evalue if errors else "")
        shown = [o for o in cell.outputs if o.output_type in ("display_data", "execute_result")]
        widgets = [o for o in shown if WIDGET in o.data]
        statics = [o for o in shown if "image/png" in o.data and "text/html" in o.data]
        quiet = cell.source.startswith("%%autograd") and " -q" in cell.source.splitlines()[0]
        # A cell with nothing to check (no autograd graph, or an error no autograd problem explains)
        # gets the magic's one line instead of the widget (magic._nothing_to_show).
        one_line = [o.data["text/plain"] for o in shown if set(o.data) == {"text/plain"}
                    and o.data["text/plain"].startswith("jupyter-autograd: ") and "\n" not in o.data["text/plain"]]
        if cell.source.startswith("%%autograd") and not quiet:
            if one_line:
                assert not widgets and not statics and len(one_line) == 1, (one_line, widgets)
                if not errors:
                    assert "nothing to check" in one_line[0], one_line
            else:
                assert widgets, "no widget under:\n" + cell.source
                assert statics, "no static picture under:\n" + cell.source
        for tag in tags:
            if not tag.startswith("diagnosis:"):
                continue
            kind = tag.split(":", 1)[1]
            reports = [o.data.get("text/plain", "") for o in statics]
            printed = "".join(o.get("text", "") for o in cell.outputs if o.output_type == "stream")
            if kind == "none":
                assert (quiet and not widgets) or one_line or (reports and all(
                    r.startswith("jupyter-autograd: no problems found") for r in reports)), reports
            else:
                assert any(r.startswith("jupyter-autograd: 1 problem") and "[%s]" % kind in r for r in reports) \
                    or printed.startswith(kind), "expected %s in:\n%s%s" % (kind, reports, printed)
            checked += 1
    assert checked >= 2, "every demo shows at least two diagnosed cells"
    if any(c.source.startswith("%%autograd") for c in nb.cells if c.cell_type == "code"):
        state = nb.metadata.get("widgets", {}).get("application/vnd.jupyter.widget-state+json", {})
        assert state.get("state"), "the widget state was not saved in the notebook"
