"""%%autograd in a real ipykernel: the kernel's own event loop runs a top-level `await`, an
error or an interrupt fails the cell so that "Run All" stops, as it does without the magic."""
import os
import pathlib
import re
import time

import pytest
from jupyter_client.manager import start_new_kernel

ROOT = pathlib.Path(__file__).resolve().parent.parent
ANSI = re.compile(r"\x1b\[[0-9;]*m")


@pytest.fixture(scope="module")
def kernel():
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])))
    manager, client = start_new_kernel(kernel_name="python3", env=env, startup_timeout=120)
    try:
        reply, messages = execute(client, "%load_ext jupyter_autograd\nimport jupyter_autograd\njupyter_autograd.__file__")
        assert reply["status"] == "ok" and str(ROOT) in results(messages)[0]  # this checkout, not another
        yield manager, client
    finally:
        client.stop_channels()
        manager.shutdown_kernel(now=True)


def execute(client, code, timeout=120):
    messages = []
    reply = client.execute_interactive(code, timeout=timeout, output_hook=messages.append)
    return reply["content"], messages


def results(messages):
    return [m["content"]["data"]["text/plain"] for m in messages if m["msg_type"] == "execute_result"]


def frames(reply):
    lines = ANSI.sub("", "\n".join(reply.get("traceback", []))).splitlines()
    return [re.sub(r"In\[\d+\]", "In[N]", line) for line in lines if line.startswith(("Cell In[", "File "))]


def test_top_level_await_runs_in_the_kernels_loop(kernel):
    _, client = kernel
    body = ("import asyncio\nloop = asyncio.get_running_loop()\nfuture = loop.create_future()\n"
            "loop.call_later(0.05, future.set_result, 41)\n(await future) + 1\n")
    plain, plain_messages = execute(client, "# plain\n" + body)
    magic, magic_messages = execute(client, "%%autograd -q\n" + body)
    assert plain["status"] == magic["status"] == "ok"
    assert results(plain_messages) == results(magic_messages) == ["42"]


def test_an_error_fails_the_cell_with_the_same_traceback(kernel):
    _, client = kernel
    body = "import torch\nt = torch.ones(2, 2)\nt @ torch.ones(3)\n"
    plain, _ = execute(client, "# plain\n" + body)
    magic, magic_messages = execute(client, "%%autograd -q\n" + body)
    assert plain["status"] == magic["status"] == "error"
    assert (magic["ename"], magic["evalue"]) == (plain["ename"], plain["evalue"])
    assert frames(magic) == frames(plain) == ["Cell In[N], line 4"]
    assert not [m for m in magic_messages if m["msg_type"] == "display_data"]  # -q: nothing to report


def displayed(messages):
    return [m["content"]["data"] for m in messages if m["msg_type"] == "display_data"]


@pytest.mark.parametrize("body, line", [
    ("x = 1\nprint(undefined_name)\n",
     "jupyter-autograd: the cell raised NameError before any tensor operation ran: nothing to check."),
    ("words = ['no', 'tensors']\nlen(words)\n", "jupyter-autograd: no tensor operation ran: nothing to check."),
], ids=["NameError", "no torch code"])
def test_a_cell_with_nothing_to_show_gets_one_line(kernel, body, line):
    """Not the widget (a search box, an empty graph pane, "0 steps", and a green "No problems found"
    under the red "The cell raised NameError"): one line of text."""
    _, client = kernel
    plain, _ = execute(client, "# plain\n" + body)
    magic, messages = execute(client, "%%autograd\n" + body)
    assert displayed(messages) == [{"text/plain": line}]
    assert magic["status"] == plain["status"]
    if magic["status"] == "error":
        assert (magic["ename"], magic["evalue"]) == (plain["ename"], plain["evalue"]) == (
            "NameError", "name 'undefined_name' is not defined")
        # The traceback reads as without the magic: the line that raised, no `1 '%%autograd'` above it.
        tb = ANSI.sub("", "\n".join(magic["traceback"]))
        assert "%%autograd" not in tb and "----> 3 print(undefined_name)" in tb, tb
        assert frames(magic) == frames(plain) == ["Cell In[N], line 3"]
    else:
        assert results(messages) == ["2"]


@pytest.mark.parametrize("first_line", ["# plain", "%%autograd -q"])
def test_an_interrupt_stops_run_all(kernel, first_line):
    manager, client = kernel
    busy = client.execute(first_line + "\nimport time, torch\nstarted = time.time()\n"
                                       "for i in range(10**7):\n    torch.ones(2) * i\nfinished = True\n")
    queued = client.execute("next_cell_ran = True")  # the next cell of "Run All"
    time.sleep(1.5)
    manager.interrupt_kernel()
    replies = {}
    while len(replies) < 2:
        message = client.get_shell_msg(timeout=60)
        replies[message["parent_header"]["msg_id"]] = message["content"]
    assert replies[busy]["status"] == "error" and replies[busy]["ename"] == "KeyboardInterrupt"
    assert replies[queued]["status"] == "aborted"
    assert all(frame.startswith("Cell In[N]") for frame in frames(replies[busy]))
    _, messages = execute(client, "'finished' in globals(), 'next_cell_ran' in globals(), "
                                      "torch._C._len_torch_function_stack()")
    assert results(messages) == ["(False, False, 0)"]


def test_an_interrupt_during_the_report_stops_the_report_not_the_cell(kernel):
    """The kernel's interrupt (a real SIGINT) after the cell's last statement, while the report is
    drawn: the cell finished, so it succeeds with its result; "Run All" goes on; the output says
    the report was cut short; none of the tool's frames shows."""
    manager, client = kernel
    # The picture waits, so that the interrupt surely lands in the report.
    reply, _ = execute(client, "import time, jupyter_autograd.render.draw as draw_module\n"
                               "to_png = draw_module.to_png\n"
                               "def waits(*args, **kwargs):\n    time.sleep(60)\n    return to_png(*args, **kwargs)\n"
                               "draw_module.to_png = waits")
    assert reply["status"] == "ok"
    try:
        busy = client.execute("%%autograd\nimport torch\nx = torch.ones(2, requires_grad=True)\ny = x.exp()\n"
                              "y += 1\nprint('statements done')\n41 + 1")
        queued = client.execute("next_cell_ran = True")  # the next cell of "Run All"
        shown = []
        while not any("statements done" in text for text in shown):
            message = client.get_iopub_msg(timeout=120)
            if message["parent_header"].get("msg_id") == busy and message["msg_type"] == "stream":
                shown.append(message["content"]["text"])
        time.sleep(0.5)
        manager.interrupt_kernel()
        replies = {}
        while len(replies) < 2:
            message = client.get_shell_msg(timeout=120)
            replies[message["parent_header"]["msg_id"]] = message["content"]
        outputs = []
        while True:
            message = client.get_iopub_msg(timeout=60)
            if message["parent_header"].get("msg_id") != busy:
                continue
            if message["msg_type"] == "status" and message["content"]["execution_state"] == "idle":
                break
            outputs.append(message)
    finally:
        execute(client, "draw_module.to_png = to_png")
    assert replies[busy]["status"] == "ok", replies[busy]
    assert replies[queued]["status"] == "ok"
    assert results(outputs) == ["42"]
    text = "".join(m["content"].get("text", "") for m in outputs if m["msg_type"] == "stream")
    assert "the report was interrupted" in text and "KeyboardInterrupt" not in text, text
    _, messages = execute(client, "next_cell_ran")
    assert results(messages) == ["True"]


_WATCH = """import signal, sys, torch
from jupyter_autograd import magic as _magic
from jupyter_autograd.capture import patches as _patches
_apply, _limit = torch.autograd.function.Function.__dict__["apply"], sys.getrecursionlimit()
_exit_code = _magic._CellCapture.__dict__["__exit__"].__code__

def _interrupt_the_exit(frame, event, arg):  # a real SIGINT, handled on the exit's first instruction
    if event == "call" and frame.f_code is _exit_code:
        sys.settrace(None)
        signal.raise_signal(signal.SIGINT)

def _state():
    return (torch._C._len_torch_function_stack(), _patches.hook_users[0], sys.getrecursionlimit() - _limit,
            torch.autograd.function.Function.__dict__["apply"] is _apply)
"""


def test_an_interrupt_on_the_first_instruction_of_the_cells_exit_leaves_no_recorder_behind(kernel):
    """The kernel's SIGINT as the cell's `with` calls its exit, before any of it runs: the cell fails
    with KeyboardInterrupt; the next torch call takes back the hooks, Function.apply and the
    recursion limit; the next %%autograd cell records its own ops (it does not nest in a stale
    recorder) and leaves nothing installed."""
    _, client = kernel
    reply, _ = execute(client, _WATCH)
    assert reply["status"] == "ok", reply
    reply, _ = execute(client, "%%autograd -q\nx = torch.ones(2, requires_grad=True)\ny = (x * 2).sum()\n"
                               "sys.settrace(_interrupt_the_exit)\n")
    assert reply["status"] == "error" and reply["ename"] == "KeyboardInterrupt", reply
    _, messages = execute(client, "z = torch.ones(3) + 1\n_state()")
    assert results(messages) == ["(1, 0, 0, True)"]  # the inert mode leaves the stack at the next capture
    reply, _ = execute(client, "%%autograd -q -o _tr\nw = torch.ones(2, requires_grad=True)\nv = (w * 3).sum()\n")
    assert reply["status"] == "ok", reply
    _, messages = execute(client, "[op.name for op in _tr.ops], _state()")
    assert results(messages) == ["(['torch.ones', 'Tensor.mul', 'Tensor.sum'], (0, 0, 0, True))"]


# -- memory across cells: a widget lives as long as an output shows it --------------------------------

@pytest.fixture(scope="module")
def measured_kernel():
    """A kernel of its own, tracing its Python allocations (tracemalloc) from before the extension."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])))
    manager, client = start_new_kernel(kernel_name="python3", env=env, startup_timeout=120)
    try:
        reply, _ = execute(client, "import tracemalloc\ntracemalloc.start()\n%load_ext jupyter_autograd")
        assert reply["status"] == "ok"
        yield client
    finally:
        client.stop_channels()
        manager.shutdown_kernel(now=True)


def run_cell(client, code, cell_id, deleted=()):
    """Run code as JupyterLab runs a cell: with the cell's id (and the ids of cells deleted since)."""
    content = {"code": code, "silent": False, "store_history": True, "user_expressions": {}, "allow_stdin": False,
               "stop_on_error": True}
    metadata = {"cellId": cell_id, "deletedCells": list(deleted)}
    message = client.session.msg("execute_request", content, metadata=metadata)
    client.shell_channel.send(message)
    while True:
        reply = client.get_shell_msg(timeout=300)
        if reply["parent_header"]["msg_id"] == message["header"]["msg_id"]:
            assert reply["content"]["status"] == "ok", reply["content"]
            return


def alive(client):
    """(bytes Python holds, live Trace objects, live AutogradWidget objects), after a collection."""
    _, messages = execute(client, "import gc as _gc, tracemalloc as _tm, jupyter_autograd as _ja\n_gc.collect()\n"
                                  "from jupyter_autograd.widget import AutogradWidget as _W\n"
                                  "(_tm.get_traced_memory()[0], sum(type(_o) is _ja.Trace for _o in _gc.get_objects()),"
                                  " sum(isinstance(_o, _W) for _o in _gc.get_objects()))")
    return tuple(int(v) for v in results(messages)[0].strip("()").split(","))


def open_widgets(client):
    """How many widgets ipywidgets keeps open (each with its comm), of every kind."""
    _, messages = execute(client, "import ipywidgets as _w\nlen(_w.Widget.widgets)")
    return int(results(messages)[0])


LOOP_CELL = """%%autograd
import torch
torch.manual_seed(0)
net = torch.nn.Linear(8, 1)
opt = torch.optim.SGD(net.parameters(), lr=0.01)
for step in range(50):
    loss = net(torch.randn(4, 8)).pow(2).mean()
    opt.zero_grad()
    loss.backward()
    opt.step()
"""


def test_memory_stays_flat_across_reruns_of_a_cell(measured_kernel):
    client = measured_kernel
    for _ in range(3):
        run_cell(client, LOOP_CELL, "the-loop-cell")
    start, traces, widgets = alive(client)
    opened = open_widgets(client)
    for _ in range(17):
        run_cell(client, LOOP_CELL, "the-loop-cell")
    end, traces_end, widgets_end = alive(client)
    assert (traces_end, widgets_end) == (traces, widgets) == (1, 1)  # the live output's own
    assert open_widgets(client) == opened  # also the widgets ipywidgets makes for it (its Layout)
    assert (end - start) / 17 < 64 * 1024, "%.0f KiB per re-run" % ((end - start) / 17 / 1024)


def test_each_cell_keeps_only_what_its_output_shows(measured_kernel):
    client = measured_kernel
    small = "%%autograd\nimport torch\nw = torch.ones(3, requires_grad=True)\n(w * {i}).sum().backward()\n"
    run_cell(client, small.format(i=0), "warm-up")
    start, traces, widgets = alive(client)
    for i in range(1, 31):
        run_cell(client, small.format(i=i), "cell-%d" % i)
    end, traces_30, widgets_30 = alive(client)
    assert (traces_30 - traces, widgets_30 - widgets) == (30, 30)  # one per output that shows one
    assert (end - start) / 30 <= 64 * 1024, "%.0f KiB per cell" % ((end - start) / 30 / 1024)
    for i in range(1, 31):  # each cell again: its new output replaces the old one
        run_cell(client, small.format(i=i), "cell-%d" % i)
    assert alive(client)[1:] == (traces_30, widgets_30)
    opened = open_widgets(client)
    # Deleted cells (JupyterLab says which with the next run): their widgets go.
    run_cell(client, "pass", "another-cell", deleted=["cell-%d" % i for i in range(1, 11)])
    assert alive(client)[1:] == (traces_30 - 10, widgets_30 - 10)
    assert open_widgets(client) == opened - 2 * 10  # each with its Layout
    # Nothing shown, nothing kept: -q without a problem, and the text report.
    run_cell(client, "%%autograd -q\n" + small.format(i=1).split("\n", 1)[1], "quiet-cell")
    run_cell(client, "%%autograd --text\n" + small.format(i=1).split("\n", 1)[1], "text-cell")
    assert alive(client)[1:] == (traces_30 - 10, widgets_30 - 10)


def test_a_cleared_output_lets_its_widgets_go(measured_kernel):
    client = measured_kernel
    run_cell(client, "%%autograd -q -o kept\nimport torch\nv = torch.ones(2, requires_grad=True)\n"
                     "(v * 2).sum().backward()", "kept-cell")
    _, traces, widgets = alive(client)
    loop = "from IPython.display import clear_output\nfor _ in range(10):\n    clear_output({wait})\n    kept.show()\n"
    run_cell(client, loop.format(wait="wait=True"), "shows-again-and-again")
    assert alive(client)[1:] == (traces, widgets + 2)  # shown, and the one it replaced (gone at the next clear)
    run_cell(client, loop.format(wait="") + "clear_output()\n", "clears-at-the-end")
    assert alive(client)[1:] == (traces, widgets + 2)  # none of its own


# -- a failing cell and the cells queued behind it ----------------------------------------------------
# ipykernel aborts the execute requests that reach it while a failing request runs (stop_on_error,
# which JupyterLab sends unless the cell is tagged raises-exception). Which cells that is depends on
# how long the failing cell runs: the first report of a kernel imported matplotlib and the widget
# libraries and drew its first picture, 1.5 s, and a cell run by hand just after the first failing
# %%autograd cell was aborted where it ran after a plain failing cell.

FAILING_BODY = "import torch\nx = torch.ones(2, requires_grad=True)\ny = x.exp()\ny += 1\ny.sum().backward()\n"


@pytest.fixture
def fresh_kernel():
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])))
    manager, client = start_new_kernel(kernel_name="python3", env=env, startup_timeout=120)
    try:
        reply, _ = execute(client, "%load_ext jupyter_autograd")
        assert reply["status"] == "ok"
        yield client
    finally:
        client.stop_channels()
        manager.shutdown_kernel(now=True)


def test_the_first_failing_cell_of_a_kernel_does_no_first_time_work(fresh_kernel):
    client = fresh_kernel
    plain, _ = execute(client, "# plain\n" + FAILING_BODY)  # IPython's first traceback imports its own modules
    assert plain["status"] == "error"
    execute(client, "import sys\nbefore = set(sys.modules)")
    magic, messages = execute(client, "%%autograd\n" + FAILING_BODY)
    assert magic["status"] == "error" and (magic["ename"], magic["evalue"]) == (plain["ename"], plain["evalue"])
    assert any("application/vnd.jupyter.widget-view+json" in m["content"].get("data", {}) for m in messages)
    _, messages = execute(client, "sorted(set(sys.modules) - before)")
    assert results(messages) == ["[]"]  # all of it done as the extension loaded


def run_with_the_next_cell_queued(client, failing, stop_on_error):
    """Send a failing cell and the next one at once, as "Run All" does; the two replies' statuses."""
    first = client.execute(failing, stop_on_error=stop_on_error)
    queued = client.execute("next_cell_ran = True")
    replies = {}
    while len(replies) < 2:
        message = client.get_shell_msg(timeout=120)
        replies[message["parent_header"]["msg_id"]] = message["content"]["status"]
    return replies[first], replies[queued]


@pytest.mark.parametrize("stop_on_error", [False, True], ids=["tagged-raises-exception", "untagged"])
def test_the_cell_after_the_first_failing_cell_runs_as_after_a_plain_one(fresh_kernel, stop_on_error):
    client = fresh_kernel
    magic = run_with_the_next_cell_queued(client, "%%autograd\n" + FAILING_BODY, stop_on_error)
    plain = run_with_the_next_cell_queued(client, "# plain\n" + FAILING_BODY, stop_on_error)
    assert magic == plain == ("error", "aborted" if stop_on_error else "ok")
