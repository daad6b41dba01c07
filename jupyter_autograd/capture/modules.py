"""Which nn.Modules are running: the module path of each op (so that large graphs can be grouped by
module), the line that called each model, and the calls of modules whose forward the user wrote
(their caller's line names what they return: `fake = G(z)`).

Global forward hooks (installed by patches.py) keep the stack; always-call keeps it right when a
forward raises. Forward hooks change no result.
"""
from __future__ import annotations

import sys

import torch

from .compiling import is_compiling as _is_compiling
from .frames import WRAPPED_CALL_CODE as _WRAPPED_CALL_CODE
from .frames import call_columns, frame_kind, place
from .state import thread_state

_Tensor = torch.Tensor
_SEQUENCES = (list, tuple)
_getframe = sys._getframe


class ModuleCalls:
    __slots__ = ("path", "modules", "call_sites", "op_modules", "open_calls", "user_calls", "above", "call_frames")

    def __init__(self):
        self.path = ()           # the nn.Modules whose forward is running, outermost first
        # For each module call in `path`: the id of its `_wrapped_call_impl` frame (or None), and for
        # those ids, the user's line above that frame (frames.UserLines.user_line's `calls`).
        self.call_frames = []
        self.above = {}
        self.modules = {}        # id(module) -> module, for naming at the end of the block
        self.call_sites = {}     # id(outermost module) -> (filename, line, columns or None) of the user's call
        self.op_modules = {}     # op index -> module path, for ops run inside a forward
        self.open_calls = []     # user-written modules running now: (module, caller's code, line, lasti, first op, path, input tids)
        self.user_calls = {}     # first op index -> [(code, line, lasti, end op, output tids, path, input tids)]

    def enter(self, recorder, module, args):
        """A module's forward is about to run (the pre-hook, five frames below the call)."""
        wrapped = _wrapped_call_frame()
        if not self.path and id(module) not in self.call_sites:
            # The user's line that called the model (`logits = model(x)`): its name for the model. Only
            # a line that calls it itself: `trainer.train()` runs the model from inside a library.
            frame = _module_caller(recorder.lines, wrapped, direct=True)
            if frame is not None:
                self.call_sites[id(module)] = (frame.f_code.co_filename, frame.f_lineno,
                                               call_columns(frame.f_code, frame.f_lineno, frame.f_lasti))
        self.path = self.path + (module,)
        self.modules[id(module)] = module
        self.call_frames.append(self._note_call_frame(recorder.lines, wrapped))
        if _is_user_module(module):
            # A forward the user wrote runs its ops at its own lines: the caller's line is kept, to
            # name what the call returns (`fake = G(z)`) and to say where the module was called.
            frame = _module_caller(recorder.lines, wrapped)
            if frame is not None:
                try:
                    inputs = recorder.tensors.argument_tids(args)
                except Exception as exc:  # never let the tool break the user's call; lose only this
                    inputs = ()
                    recorder.lose("reading the arguments of the call of %s at %s" % (
                        type(module).__name__, place(frame.f_code, frame.f_lineno)), exc,
                        "the tensors passed to that call are not linked to it")
                self.open_calls.append((module, frame.f_code, frame.f_lineno, frame.f_lasti,
                                        len(recorder.ops), self.path, inputs))

    def _note_call_frame(self, lines, wrapped):
        """The id of this call's `_wrapped_call_impl` frame `wrapped`, after noting the user's line above it
        in `above`; None without one (the ops of this call then walk all their frames)."""
        if wrapped is None:
            return None
        try:
            code, line = lines.user_line(wrapped.f_back, self.above)
            self.above[id(wrapped)] = (code, line, None if code is None else lines.kinds[id(code)][1])
            return id(wrapped)
        except Exception:  # never let the tool break the user's call; lose only the shortcut
            return None

    def leave(self, recorder, module, output):
        """A module's forward returned or raised (the always-called hook)."""
        self.path = self.path[:-1]
        if self.call_frames:
            self.above.pop(self.call_frames.pop(), None)
        if self.open_calls and self.open_calls[-1][0] is module:
            self._end_call(recorder, output)

    def _end_call(self, recorder, output):
        """A user-written module returned: keep its caller's line, the ops it ran and the tensors it
        returned, if it ran any op."""
        _, code, line, lasti, first, path, inputs = self.open_calls.pop()
        end = len(recorder.ops)
        if end == first:
            return
        quiet_tid = recorder.tensors.quiet_tid
        if isinstance(output, _Tensor):
            outputs = (quiet_tid(output),)
        elif isinstance(output, _SEQUENCES):
            outputs = tuple(quiet_tid(t) if isinstance(t, _Tensor) else None for t in output)
        else:
            outputs = ()
        self.user_calls.setdefault(first, []).append((code, line, lasti, end, outputs, path, inputs))

    def forget_op(self, index):
        """Folding dropped op `index`'s details (folding.py)."""
        self.op_modules.pop(index, None)
        self.user_calls.pop(index, None)

    def outermost(self):
        """The modules called from user code (the first of each op's module path), with the first op
        each ran, in call order."""
        seen = {}
        for index, path in self.op_modules.items():
            if path and id(path[0]) not in seen:
                seen[id(path[0])] = (path[0], index)
        return list(seen.values())

    def release(self):
        """The block is over, and freeze.py has named its modules: never hold them past it."""
        self.path = ()
        self.call_frames = []
        self.above = {}
        self.modules = {}
        self.open_calls = []
        self.op_modules = {}
        self.user_calls = {}

    def shifted(self, start):
        """As a capture nested in this block sees it, whose op indices start again at 0 at op `start`."""
        part = ModuleCalls()
        part.modules = dict(self.modules)
        part.call_sites = self.call_sites
        part.op_modules = {i - start: path for i, path in self.op_modules.items() if i >= start}
        part.user_calls = {i - start: [c[:3] + (c[3] - start,) + c[4:] for c in calls]
                           for i, calls in self.user_calls.items() if i >= start}
        return part


def _wrapped_call_frame():
    """The `_wrapped_call_impl` frame of the module call whose pre-hook runs ModuleCalls.enter, or None
    when the stack is not as expected."""
    try:
        frame = _getframe(5)  # _wrapped_call_frame, enter, enter_module, inner, _call_impl: _wrapped_call_impl
    except ValueError:
        return None
    return frame if frame.f_code is _WRAPPED_CALL_CODE else None


def _module_caller(lines, wrapped, direct=False):
    """The innermost frame of user code above the module call that runs our pre-hook (with
    `direct`, only if that frame makes the call itself, else None). Walking there frame by frame
    makes a frame object of each frame passed; the hook runs five frames below the call (inner,
    _call_impl, _wrapped_call_impl), so the walk starts above `wrapped` when the stack is as expected,
    and from the hook's caller otherwise."""
    frame = wrapped.f_back if wrapped is not None else _getframe(3)  # _module_caller, enter, enter_module: the hook's caller
    kinds = lines.kinds
    while frame is not None:
        entry = kinds.get(id(frame.f_code)) or lines.entry(frame)
        if not entry[1]:
            return frame
        if direct:
            return None
        frame = frame.f_back
    return None


_user_module_types = {}  # type -> whether its forward is user code (classes are few, and live long)


def _is_user_module(module) -> bool:
    """Whether the module's forward is the user's code (not torch's, not an installed library's)."""
    cls = type(module)
    known = _user_module_types.get(cls)
    if known is None:
        code = getattr(getattr(cls, "forward", None), "__code__", None)
        known = _user_module_types[cls] = code is not None and not frame_kind(code.co_filename)
    return known


# -- the hooks (patches.py installs them) -----------------------------------------------------------

def enter_module(module, args):
    # Dynamo traces global module hooks: a hook that reads frames or keeps the module breaks its
    # graph (and fullgraph=True raises). is_compiling() is a constant to Dynamo, so this returns.
    if _is_compiling():
        return None
    recorder = getattr(thread_state, "recorder", None)
    if recorder is None:
        return None
    recorder.steps.resume_if_failed(recorder)
    if recorder.recording():
        recorder.modules.enter(recorder, module, args)
    return None


def leave_module(module, args, output):
    if _is_compiling():  # see enter_module
        return None
    recorder = getattr(thread_state, "recorder", None)
    if recorder is not None:
        calls = recorder.modules
        if calls.path and calls.path[-1] is module:
            try:
                calls.leave(recorder, module, output)
            except Exception as exc:  # never let the tool break the user's call
                recorder.fail(exc)
    return None
