"""What changes how the graph is recorded without calling a torch function of its own: a custom
autograd.Function's apply (recorded as one op of its caller, around the ops its forward ran) and
entering or leaving torch.inference_mode (recorded as a switch at the user's line). patches.py
installs the replacements while a block records.
"""
from __future__ import annotations

from array import array

import torch

from .compiled import NOT_HANDLED
from .compiled_graph import is_compiled_function
from .compiled import run as run_compiled
from .compiling import is_compiling as _is_compiling
from .state import thread_state

_Function = torch.autograd.function.Function
original_apply = _Function.__dict__["apply"]
_inference_mode = torch.autograd.grad_mode.inference_mode
original_inference_enter = _inference_mode.__dict__["__enter__"]
original_inference_exit = _inference_mode.__dict__["__exit__"]


class FunctionCalls:
    """Per custom autograd.Function call whose forward ran recorded ops: its first such op and its
    own op, flat. A forward runs with grad off because the call runs it."""

    __slots__ = ("calls",)

    def __init__(self, calls=()):
        self.calls = array("q", calls)

    def note(self, recorder, first):
        """A custom Function's apply, begun when the block had `first` ops, has returned or raised:
        the ops recorded since, but its own (the last), ran inside its forward."""
        call = len(recorder.ops) - 1
        if call > first and recorder.recording():
            self.calls.extend((first, call))

    def pairs(self):
        calls = self.calls
        return [(calls[i], calls[i + 1]) for i in range(0, len(calls), 2)]

    def shifted(self, start):
        """As a capture nested in this block sees it, whose op indices start again at 0 at op `start`."""
        calls = self.calls
        return FunctionCalls([index - start for i in range(0, len(calls), 2) if calls[i] >= start
                              for index in calls[i:i + 2]])


def recording_apply(cls, *args, **kwargs):
    """Custom autograd.Function.apply is no torch function: record it as one op of the caller."""
    __tracebackhide__ = True  # noqa: F841
    bound = original_apply.__get__(None, cls)
    if _is_compiling():  # Dynamo traces this wrapper: leave it nothing of ours to trace
        return bound(*args, **kwargs)
    recorder = getattr(thread_state, "recorder", None)
    if recorder is not None:
        recorder.steps.resume_if_failed(recorder)
    if recorder is None or not recorder.recording():
        return bound(*args, **kwargs)
    if is_compiled_function(cls):  # a torch.compile region: recorded as the ops of its graph
        result = run_compiled(recorder, cls, args, kwargs)
        if result is not NOT_HANDLED:
            return result
    first = len(recorder.ops)
    try:
        return recorder.__torch_function__(bound, (), args, kwargs)
    finally:
        recorder.function_calls.note(recorder, first)


def inference_mode_switch():
    """Stands for entering or leaving torch.inference_mode in an op record (no torch function runs)."""


inference_mode_switch.__module__, inference_mode_switch.__qualname__ = "torch", "inference_mode"


def entering_inference_mode(self):
    """inference_mode.__enter__ while we capture: a grad-mode switch like torch.set_grad_enabled, which
    (unlike it) calls no torch function, so it is recorded here. A `with` block, a decorated function,
    or a generator suspended inside the block: the switch is where graph recording stopped."""
    __tracebackhide__ = True  # noqa: F841
    result = original_inference_enter(self)
    _note_switch()
    return result


def leaving_inference_mode(self, exc_type, exc_value, traceback):
    __tracebackhide__ = True  # noqa: F841
    try:
        return original_inference_exit(self, exc_type, exc_value, traceback)
    finally:
        _note_switch()


def _note_switch():
    if _is_compiling():  # see modules.enter_module
        return
    recorder = getattr(thread_state, "recorder", None)
    if recorder is not None and recorder.recording():
        try:
            recorder.record_switch(inference_mode_switch)
        except Exception as exc:  # never let the tool break the user's block
            recorder.fail(exc)
