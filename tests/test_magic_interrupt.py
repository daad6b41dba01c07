"""An interrupt (the kernel's SIGINT) stops a %%autograd cell as it stops a plain one: the cell
fails with KeyboardInterrupt ("Run All" stops), its traceback shows the user's frames only, and
nothing of the tool stays installed."""
import os
import signal
import threading

import torch

from .test_magic_invisible import PLAIN_FIRST_LINE, Run


def torch_state():
    return (torch._C._len_torch_function_stack(), torch.is_grad_enabled(), torch.is_anomaly_enabled(),
            torch.autograd.function.Function.__dict__["apply"],  # a C classmethod since torch 2.14: no __func__
            torch.autograd.profiler.record_function.__dict__["__exit__"].__name__)


def test_an_interrupt_in_the_tools_code_ends_at_the_users_line(shell, monkeypatch):
    from jupyter_autograd.capture.mode import Recorder

    def interrupted(*args, **kwargs):  # as if SIGINT arrived while the tool records an op
        raise KeyboardInterrupt

    before = torch_state()
    plain = Run(shell, PLAIN_FIRST_LINE + "\nimport torch\nraise KeyboardInterrupt\nafter = True\n",
                PLAIN_FIRST_LINE)
    monkeypatch.setattr(Recorder, "record", interrupted)
    magic = Run(shell, "%%autograd -q\nimport torch\nx = torch.ones(2) * 2\nafter = True\n", "%%autograd -q")
    assert isinstance(magic.result.error_in_exec, KeyboardInterrupt) and not magic.result.success
    assert magic.frames == plain.frames == ["Cell In[N], line 3"]
    assert "jupyter_autograd" not in magic.text and "skipping hidden" not in magic.text
    assert "after" not in shell.user_ns
    assert torch_state() == before


def test_real_interrupts_during_a_busy_cell(shell):
    """SIGINTs at varying moments of an op-heavy loop: many land in the tool's code."""
    before = torch_state()
    shell.run_cell("import torch")
    # Bounded in time, so that a lost interrupt fails the test instead of hanging it.
    cell = ("%%autograd -q\nimport time\nx = torch.ones(3, requires_grad=True)\nend = time.time() + 5\n"
            "for i in range(10**7):\n    y = (x * i).sum()\n    y.backward()\n    if time.time() > end:\n"
            "        break\nfinished = True\n")
    in_cell = [False]

    def interrupt_the_cell_only(signum, frame):  # a press that races the cell's end must not stop pytest
        if in_cell[0]:
            raise KeyboardInterrupt

    previous_handler = signal.signal(signal.SIGINT, interrupt_the_cell_only)
    try:
        _busy_cell_runs(shell, cell, before, in_cell)
    finally:
        signal.signal(signal.SIGINT, previous_handler)


def _busy_cell_runs(shell, cell, before, in_cell):
    for k in range(8):
        # Interrupts from 0.6 s on, pressed again every 0.4 s while the loop still advances, as a
        # user presses the button again: Python loses a signal whose handler runs inside a
        # finalizer (the KeyboardInterrupt is "ignored" there); the cell must still stop. No press
        # once the loop has stopped: one landing in IPython's traceback printing would garble it,
        # with or without the tool.
        stop = threading.Event()
        shell.user_ns.pop("i", None)

        def press(first=0.6 + 0.013 * k):
            if stop.wait(first):
                return
            os.kill(os.getpid(), signal.SIGINT)
            pressed_at = shell.user_ns.get("i")
            while not stop.wait(0.4):
                if shell.user_ns.get("i") != pressed_at:
                    os.kill(os.getpid(), signal.SIGINT)
                    pressed_at = shell.user_ns.get("i")

        presser = threading.Thread(target=press, daemon=True)
        presser.start()
        in_cell[0] = True
        try:
            run = Run(shell, cell, "%%autograd -q")
        finally:
            in_cell[0] = False
            stop.set()
            presser.join()
        assert isinstance(run.result.error_in_exec, KeyboardInterrupt), run.text
        assert run.frames and run.frames[0].startswith("Cell In[N], line "), run.text
        assert "jupyter_autograd" not in run.text and "skipping hidden" not in run.text
        assert "run_cell_magic" not in run.text
        assert "finished" not in shell.user_ns
        assert torch_state() == before


def test_an_interrupt_during_the_report(shell, monkeypatch):
    from jupyter_autograd.magic import AutogradMagics

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(AutogradMagics, "_show", interrupted)
    # After a cell that ran through: the interrupt stops the report, not the cell, whose result stands
    # (real SIGINTs at each stage of the report: tests/test_outputs_robust.py).
    run = Run(shell, "%%autograd\nimport torch\nr = torch.ones(2) + 1\nr", "%%autograd")
    assert run.result.success and "Out[N]: tensor([2., 2.])" in run.text
    assert "the report was interrupted" in run.text and "KeyboardInterrupt" not in run.text
    assert shell.magics_manager.registry["AutogradMagics"]._value is None
    # After a cell that raised: the user's own exception is the one shown.
    shell.user_ns["mine"] = ValueError("the user's own")
    run = Run(shell, "%%autograd\nimport torch\nr = torch.ones(2) + 1\nraise mine", "%%autograd")
    assert run.result.error_in_exec is shell.user_ns["mine"]
    assert "KeyboardInterrupt" not in run.text
