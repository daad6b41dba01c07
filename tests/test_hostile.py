"""What hostile use still broke (issue 30): a Ctrl-C on the first instruction of an exit, an exit
from another thread, a namespace whose methods raise, a recursion limit set inside the block,
NaN in the JSON, a symlinked report file. Each test does the real thing (a real SIGINT, a real
second thread, a real symlink) and checks what the user can observe."""
import gc
import json
import math
import os
import signal
import sys
import threading
import traceback
import tracemalloc

import pytest
import torch

import jupyter_autograd as ja
from jupyter_autograd.capture import lifecycle
from jupyter_autograd.capture import state as capture_state

from .test_invisible import _check_nothing_left, _global_state
from .test_magic_invisible import Run
from .test_real_setups import _process_state, _records_a_real_bug


def _interrupt_on_the_first_instruction_of(code):
    """A sys.settrace function that delivers a real SIGINT as `code` is called: Python runs the
    handler on its first instruction, before any of its code."""
    def tracer(frame, event, arg):
        if event == "call" and frame.f_code is code:
            sys.settrace(None)
            signal.raise_signal(signal.SIGINT)
        return None
    return tracer


def _traceback_codes(exc):
    tb, codes = exc.__traceback__, []
    while tb is not None:
        codes.append(tb.tb_frame.f_code)
        tb = tb.tb_next
    return codes


# -- 1. the magic's exit interrupted on its first instruction -----------------------------------------

def test_an_interrupt_on_the_first_instruction_of_the_magics_exit_leaves_no_live_recorder(shell):
    from jupyter_autograd import magic

    exit_code = magic._CellCapture.__dict__["__exit__"].__code__
    before = _global_state()
    shell.run_cell("import torch")
    sys.settrace(_interrupt_on_the_first_instruction_of(exit_code))
    try:
        interrupted = Run(shell, "%%autograd -q\nx = torch.ones(2, requires_grad=True)\ny = (x * 2).sum()\n",
                          "%%autograd -q")
    finally:
        sys.settrace(None)
    error = interrupted.result.error_in_exec
    assert isinstance(error, KeyboardInterrupt), interrupted.text
    assert exit_code in _traceback_codes(error)  # it landed in the exit, before any of its code
    # The next cell's first torch call puts back what is process-wide: hooks, Function.apply, the limit.
    later = Run(shell, "z = torch.ones(3) + 1\n", "")
    assert later.result.success
    assert _process_state() == {k: v for k, v in before.items() if k in _process_state()}
    assert getattr(capture_state.thread_state, "recorder", None) is None
    # The next %%autograd cell records its own ops only (not nested in the stale recorder), and
    # leaves nothing behind.
    run = Run(shell, "%%autograd -q -o tr\nw = torch.ones(2, requires_grad=True)\nv = (w * 3).sum()\n", "")
    assert run.result.success
    assert [op.name for op in shell.user_ns["tr"].ops] == ["torch.ones", "Tensor.mul", "Tensor.sum"]
    assert _global_state() == before


# -- 2. capture's exit interrupted on its first instruction: the trace says so -------------------------

def test_a_trace_whose_block_end_was_interrupted_says_so_everywhere():
    from jupyter_autograd.widget import static_html

    before = _global_state()
    exit_code = ja.capture.__dict__["__exit__"].__code__
    x = torch.ones(2, requires_grad=True)
    kept = []
    sys.settrace(_interrupt_on_the_first_instruction_of(exit_code))
    try:
        with ja.capture() as trace:
            (x * 2).sum().backward()
    except KeyboardInterrupt as exc:
        kept.append(exc)  # as IPython keeps the last traceback
    finally:
        sys.settrace(None)
    assert kept and exit_code in _traceback_codes(kept[0])
    assert len(trace.warnings) == 1 and "end was interrupted" in trace.warnings[0]
    assert "nothing of the block was analysed" in trace.warnings[0]
    report = trace.report()
    assert "no problems found\n" not in report + "\n" and "analysis is incomplete" in report
    assert "end was interrupted" in report
    assert trace.to_json()["warnings"] == trace.warnings
    assert "end was interrupted" in static_html(trace)
    torch.ones(1) + 1  # heals what is process-wide; the next capture the rest
    assert _records_a_real_bug() == ["saved-tensor-modified"]
    _check_nothing_left(before)


def test_a_trace_read_inside_its_block_says_the_block_has_not_ended_and_is_filled_at_its_end():
    with ja.capture() as trace:
        y = torch.ones(2) * 2
        inside = list(trace.warnings)
        ops_inside = len(trace.ops)
    assert ops_inside == 0 and len(inside) == 1 and "has not ended" in inside[0]
    assert trace.warnings == [] and [op.name for op in trace.ops] == ["torch.ones", "Tensor.mul"]
    assert y.tolist() == [2.0, 2.0]


def test_a_capture_exited_by_an_exit_stack_fills_its_trace():
    import contextlib

    with contextlib.ExitStack() as stack:
        trace = stack.enter_context(ja.capture())
        torch.ones(2) + 1
    assert trace.warnings == [] and [op.name for op in trace.ops] == ["torch.ones", "Tensor.add"]


# -- 3. an exit from another thread: the inert mode left behind holds nothing big -------------------------

def test_an_exit_from_another_thread_leaves_an_inert_mode_that_holds_no_records():
    before = _global_state()
    tracemalloc.start()
    try:
        gc.collect()
        baseline = tracemalloc.get_traced_memory()[0]
        block = ja.capture()
        trace = block.__enter__()
        x = torch.ones(2)
        for _ in range(15000):
            x = x + 1
        leaving = threading.Thread(target=block.__exit__, args=(None, None, None))
        leaving.start()
        leaving.join()
        assert len(trace.ops) == 15001  # the trace kept what it needs
        del trace, block
        gc.collect()
        held = tracemalloc.get_traced_memory()[0] - baseline
    finally:
        tracemalloc.stop()
    assert torch._C._len_torch_function_stack() == 1  # only this thread can take its mode off
    left = torch._C._get_function_stack_at(0)
    assert held < 1 << 20, "%.1f MiB still held" % (held / 2 ** 20)
    assert left.has_ended() and len(left.ops) == 0
    del left
    assert _records_a_real_bug() == ["saved-tensor-modified"]
    _check_nothing_left(before)


# -- 4. a namespace whose methods raise ------------------------------------------------------------------

class _Hostile(dict):
    """A namespace every one of whose methods raises: no code of the tool may call them."""

    def _refuse(self, *args, **kwargs):
        raise AssertionError("the tool called a method of the user's namespace")

    __iter__ = __getitem__ = __contains__ = __len__ = __eq__ = __repr__ = _refuse
    keys = items = values = get = copy = setdefault = pop = _refuse


def test_a_namespace_whose_methods_raise_is_read_with_dicts_own_methods():
    holder = [torch.ones(2, requires_grad=True)]
    names = _Hostile()
    dict.__setitem__(names, "hidden_weight", holder[0])  # its only name: the namespace is read
    with ja.capture(namespace=names) as trace:
        y = (holder[0] * holder[0]).sum()
        holder[0].data.mul_(2)
        y.backward()
    assert [d.kind for d in trace.diagnoses] == ["silent-data-mutation"] and trace.warnings == []
    assert "`hidden_weight`" in trace.diagnoses[0].title
    with ja.capture(namespace=[names, {}]) as trace:
        torch.ones(1) + 1
    assert trace.warnings == []


def test_a_namespace_whose_keys_are_hostile_is_refused_without_calling_them():
    class Key:
        def __eq__(self, other):
            raise AssertionError("the tool compared a key of the user's")

        __hash__ = object.__hash__

        def __repr__(self):
            raise AssertionError("the tool called a key's repr")

    names = {}
    names[Key()] = 1
    with pytest.raises(TypeError, match="keys must be str; got a key of type 'Key'"):
        ja.capture(namespace=names)


# -- 5. the recursion limit --------------------------------------------------------------------------------

def test_a_recursion_limit_set_inside_the_block_stays_whatever_its_value():
    limit = sys.getrecursionlimit()
    setter = sys.setrecursionlimit
    try:
        with ja.capture():
            assert sys.getrecursionlimit() == limit + lifecycle.RECURSION_HEADROOM
            sys.setrecursionlimit(limit + lifecycle.RECURSION_HEADROOM)  # exactly what the tool had set
        assert sys.getrecursionlimit() == limit + lifecycle.RECURSION_HEADROOM
        assert sys.setrecursionlimit is setter
        sys.setrecursionlimit(limit)
        with ja.capture():
            sys.setrecursionlimit(limit + 100)
        assert sys.getrecursionlimit() == limit + 100
        sys.setrecursionlimit(limit)
        with ja.capture():
            torch.ones(1) + 1
        assert sys.getrecursionlimit() == limit  # the tool's own headroom goes
    finally:
        sys.setrecursionlimit(limit)


def _set_a_limit_too_low():
    try:
        sys.setrecursionlimit(2)
    except RecursionError as exc:
        return str(exc), [(f.name, f.lineno) for f in traceback.extract_tb(exc.__traceback__)]


def test_a_limit_too_low_set_inside_the_block_fails_as_plain():
    limit = sys.getrecursionlimit()
    plain = _set_a_limit_too_low()
    with ja.capture():
        captured = _set_a_limit_too_low()
    assert captured == plain and "at the recursion depth" in plain[0]
    assert sys.getrecursionlimit() == limit


def test_the_headroom_covers_a_python_written_torch_function():
    assert lifecycle.RECURSION_HEADROOM == 5


# -- 6. JSON ---------------------------------------------------------------------------------------

def _refuse_constant(name):
    raise ValueError("not JSON: %s" % name)


def test_to_json_of_non_finite_values_is_strict_json():
    with ja.capture() as trace:
        x = torch.tensor([0.0, 1.0], requires_grad=True)
        torch.sqrt(x).sum().backward()   # an infinite gradient at 0
        w = torch.tensor([1.0], requires_grad=True)
        (w * float("nan")).sum().backward()  # a NaN gradient
    data = trace.to_json()
    text = json.dumps(data)
    assert json.loads(text, parse_constant=_refuse_constant) == json.loads(json.dumps(data, allow_nan=False))
    norms = {p["name"]: p["norms"] for p in data["grad_stats"]["parameters"]}
    assert norms == {"x": ["Infinity", None], "w": [None, "NaN"]}, norms  # None: not reached
    assert float(norms["x"][0]) == math.inf and math.isnan(float(norms["w"][1]))


# -- 8. save_html through a symlink --------------------------------------------------------------------------

def test_save_html_to_a_symlink_writes_its_target(tmp_path):
    with ja.capture() as trace:
        torch.ones(2, requires_grad=True).exp().sum().backward()
    target_dir = tmp_path / "reports"
    target_dir.mkdir()
    target = target_dir / "latest.html"
    previous = "-".join(["PREVIOUS", "CONTENT"])  # the report shows this file's source: not the value
    target.write_text(previous)
    link = tmp_path / "report.html"
    link.symlink_to(target)
    trace.save_html(link)
    assert link.is_symlink() and os.readlink(link) == str(target)
    assert previous not in target.read_text() and "<html" in target.read_text().lower()
    assert sorted(p.name for p in target_dir.iterdir()) == ["latest.html"]  # no temporary left
    assert sorted(p.name for p in tmp_path.iterdir()) == ["report.html", "reports"]
    dangling = tmp_path / "dangling.html"
    dangling.symlink_to(target_dir / "new.html")
    trace.save_html(dangling)
    assert dangling.is_symlink() and "<html" in (target_dir / "new.html").read_text().lower()
