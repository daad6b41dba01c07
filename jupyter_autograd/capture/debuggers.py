"""Debuggers step through a captured block as through a plain one.

Stepping into a torch call under capture would land in the recorder's `__torch_function__` (a
Python frame the plain call does not have), then in our hooks and torch's dispatch to them. While
a block records, debuggers built on the standard library's bdb (pdb, IPython's ipdb, pudb) do not
stop in those frames: bdb asks `stop_here` before it traces a new frame, and ours answer no, so a
step goes on to the next frame of the user's code or torch's. Breakpoints set in our files still
work (bdb checks them apart).
"""
from __future__ import annotations

import bdb
import contextlib

import torch.overrides

from .frames import OWN_FRAMES
from .state import RecordingMode

# Torch's stash of the mode around a call to it (handle_torch_function, for torch functions written
# in Python): run only because a mode is on the stack, and made of contextlib's frames.
_STASH = torch.overrides._pop_mode_temporarily.__wrapped__
_STASH_CODES = {_STASH.__code__, torch.overrides._push_mode.__code__, torch.overrides._pop_mode.__code__}
_CONTEXT_MANAGER = {contextlib._GeneratorContextManager.__init__.__code__,
                    contextlib._GeneratorContextManager.__enter__.__code__,
                    contextlib._GeneratorContextManager.__exit__.__code__,
                    contextlib.contextmanager(_STASH).__code__}  # the decorator's helper
_DISPATCH = torch.overrides.handle_torch_function.__code__
_stack_length = torch._C._len_torch_function_stack
_stack_at = torch._C._get_function_stack_at
_original_stop_here = bdb.Bdb.stop_here


def _is_the_tools(frame) -> bool:
    """Our frames, what they call for themselves (is_compiling, inspect.signature, ...), and torch's
    stash of our mode; not the call the tool makes for the user (the function being recorded:
    F.softmax, Tensor.backward, a custom Function's apply), nor what that calls."""
    while frame is not None:
        if _is_own(frame) or _is_stash(frame):
            return True
        caller = frame.f_back
        if caller is not None and _is_own(caller):
            return not _is_the_users_call(caller, frame.f_code)
        frame = caller
    return False


def _is_own(frame) -> bool:
    """Our code, and torch's dispatch of a call to our mode (handle_torch_function with our mode on
    top of the stack; with the user's subclasses it runs again inside our call, for them)."""
    code = frame.f_code
    if code.co_filename.startswith(OWN_FRAMES) or code in _STASH_CODES:
        return True
    if code is _DISPATCH:
        n = _stack_length()
        return n > 0 and isinstance(_stack_at(n - 1), RecordingMode)
    return False


def _is_stash(frame) -> bool:
    if frame.f_code not in _CONTEXT_MANAGER:
        return False
    values = frame.f_locals
    generator = getattr(values.get("self"), "gen", None)
    return values.get("func") is _STASH or getattr(generator, "gi_code", None) is _STASH.__code__


def _is_the_users_call(tool_frame, code) -> bool:
    """Whether `code` runs the function that the tool's frame calls on the user's behalf (`func` in
    the mode's __torch_function__ and BackwardCalls.call, `bound` in switches.recording_apply)."""
    values = tool_frame.f_locals
    for name in ("func", "bound"):
        function = values.get(name)
        target = getattr(function, "__func__", function)
        if target is None:
            continue
        if getattr(target, "__code__", None) is code:
            return True
        # A C function bound to a class calls that class's Python code from no frame of its own:
        # Function.apply from torch 2.14 (the C _FunctionBase.apply) runs the user's forward.
        owner = getattr(function, "__self__", None)
        if not hasattr(target, "__code__") and isinstance(owner, type) and _defined_in(owner, code):
            return True
    return False


def _defined_in(cls, code) -> bool:
    """Whether `code` is that of a function of `cls` or its bases (a staticmethod's too)."""
    for klass in cls.__mro__:
        for value in vars(klass).values():
            if getattr(getattr(value, "__func__", value), "__code__", None) is code:
                return True
    return False


def _stop_here_but_not_in_the_tools_frames(self, frame):
    if _is_the_tools(frame):
        return False
    return _original_stop_here(self, frame)


def install():
    bdb.Bdb.stop_here = _stop_here_but_not_in_the_tools_frames


def remove():
    bdb.Bdb.stop_here = _original_stop_here
