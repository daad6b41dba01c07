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
