"""Frames: whose code a frame runs (the user's, a library's, torch's or ours), the user's line an
op belongs to, the columns of the call a frame makes, and tracebacks read as without the tool.
"""
from __future__ import annotations

import itertools
import os
import site
import sys
import sysconfig

import torch

_TORCH_DIR = os.path.dirname(torch.__file__) + os.sep
# Installed libraries (transformers, timm, ...) and Python's own (copy.deepcopy, contextlib,
# functools): an op inside them is named at the user's line that called into them, as an op inside
# torch is.
_LIBRARY_DIRS = tuple(sorted({os.path.join(p, "") for p in
                              [*site.getsitepackages(), sysconfig.get_paths()["purelib"],
                               sysconfig.get_paths()["platlib"], sysconfig.get_paths()["stdlib"],
                               sysconfig.get_paths()["platstdlib"]] if p}))
_OWN_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep
_CAPTURE_DIR = os.path.dirname(os.path.abspath(__file__)) + os.sep
# The frames of the tool that a user's traceback or debugger must not show: the capture's, and the
# session's (the `with` statement's __enter__ and __exit__).
OWN_FRAMES = (_CAPTURE_DIR, os.path.join(_OWN_DIR, "session.py"))
_OVERRIDES_FILE = os.path.abspath(torch.overrides.__file__)
WRAPPED_CALL_CODE = torch.nn.Module._wrapped_call_impl.__code__  # the frame every module call passes through

USER, INTERNAL, LIBRARY = 0, 1, 2  # what kind of code a frame runs: frame_kind
_CO_OPTIMIZED = 0x0001


def frame_kind(filename: str) -> int:
    if filename.startswith((_TORCH_DIR, _OWN_DIR)):
        return INTERNAL
    return LIBRARY if filename.startswith(_LIBRARY_DIRS) else USER


def made_by_torch_compile(code) -> bool:
    """Code that torch.compile wrote while the program ran, though it looks like the user's: Dynamo's
    rewrite of a compiled function (its frame stays on the function's first line whatever it runs),
    the forward that FX generates, the module that Inductor writes. What runs there belongs to the
    user's line that called the compiled function."""
    dynamo = sys.modules.get("torch._dynamo.utils")
    if dynamo is not None and code in dynamo.orig_code_map:
        return True
    filename = code.co_filename
    if filename.startswith("<eval_with_key>"):
        return True
    generated = os.environ.get("TORCHINDUCTOR_CACHE_DIR")  # set by Inductor before it writes a module
    return bool(generated) and filename.startswith(os.path.join(generated, ""))


class UserLines:
    """Which code objects are the user's, met once each, and the globals of the user's frames (for
    naming at the block's end)."""

    __slots__ = ("kinds", "user_globals")

    def __init__(self):
        self.kinds = {}         # id(code) -> (code, USER, INTERNAL (torch, us) or LIBRARY (site-packages))
        self.user_globals = {}  # id(dict) -> globals dict of user frames (names, resolved at the end)

    def entry(self, frame):
        """(code, kind) of a frame's code. Keyed by id: hashing a code object is not cached and costs
        microseconds. The entry holds the code object, so the id cannot be reused while we keep it."""
        return self.kinds.get(id(frame.f_code)) or self._first_meeting(frame)

    def _first_meeting(self, frame):
        code = frame.f_code
        kind = frame_kind(code.co_filename)
        if kind == USER and made_by_torch_compile(code):
            kind = INTERNAL
        entry = self.kinds[id(code)] = (code, kind)
        if not kind:
            self.user_globals.setdefault(id(frame.f_globals), frame.f_globals)
        return entry

    def user_line(self, frame, calls=None):
        """(code, line) of the innermost frame of the user's own code from `frame` outwards; else of
        the innermost library frame (a library's own entry point); else (None, 0).

        `calls`: id(frame) -> (code, line, kind) of the module calls running now (ModuleCalls.above),
        each for the frame of its `_wrapped_call_impl`: what lies above that frame was resolved when
        the call began, and stays so while it runs (its callers wait at their lines). A walk from
        an op in a library model (HF's GPT-2: 26 frames) stops at the innermost module call."""
        library = None
        kinds = self.kinds
        while frame is not None:
            code = frame.f_code
            if code is WRAPPED_CALL_CODE and calls:
                above = calls.get(id(frame))
                if above is not None:
                    if library is None or above[2] == USER:
                        return above[0], above[1]
                    return library.f_code, library.f_lineno
            entry = kinds.get(id(code)) or self._first_meeting(frame)
            kind = entry[1]
            if not kind:
                return code, frame.f_lineno
            if kind == LIBRARY and library is None:
                library = frame
            frame = frame.f_back
        if library is not None:  # no user code on the stack (a library's own entry point)
            return library.f_code, library.f_lineno
        return None, 0

    def user_frame(self, frame):
        """The innermost frame of the user's own code from `frame` outwards, or None."""
        kinds = self.kinds
        while frame is not None and (kinds.get(id(frame.f_code)) or self._first_meeting(frame))[1]:
            frame = frame.f_back
        return frame

    def forget_globals(self):
        """Never hold the user's namespaces past the block."""
        self.user_globals = {}

    def copy(self):
        """For a capture nested in this block: the same kinds, its own globals."""
        other = UserLines()
        other.kinds = self.kinds
        other.user_globals = dict(self.user_globals)
        return other


def frame_names(frame):
    """The frame's variables, where reading them is harmless.

    Before Python 3.13 (PEP 667), reading `f_locals` of a function frame caches a dict on the
    frame that keeps every local alive after the user deletes it: a leak of their tensors.
    """
    if frame is None:
        return None
    if sys.version_info >= (3, 13) or not frame.f_code.co_flags & _CO_OPTIMIZED:
        return frame.f_locals
    return frame.f_globals


def call_columns(code, line, lasti):
    """(first, end) UTF-8 columns of the call a frame at (code, line, last instruction) is making,
    where Python knows them (3.11+) and it fits on its line: `losses.append(model(x).sum())` calls
    the model at `model(x)`. A walk over the code's instructions: read at the block's end."""
    span = call_span(code, lasti)
    if span is None or span[0] != line or span[2] != line:
        return None
    return (span[1], span[3])


def call_span(code, lasti):
    """(first line, first column, end line, end column) of the call a frame is making (UTF-8
    columns), where Python knows them (3.11+): a call may be written over several lines."""
    key = (id(code), lasti)
    known = _spans.get(key)
    if known is not None and known[0] is code:
        return known[1]
    span = _read_span(code, lasti)
    if len(_spans) >= _SPANS_KEPT:
        _spans.clear()
    _spans[key] = (code, span)  # the code object is kept with its id: no other can take it
    return span


# (id(code), last instruction) -> (code, its call span): a training loop's block meets the same call
# sites at every step, and reading one walks the code's positions from its start.
_spans = {}
_SPANS_KEPT = 4096


def _read_span(code, lasti):
    try:
        first_line, end_line, first, end = next(itertools.islice(code.co_positions(), lasti // 2, None))
    except (AttributeError, StopIteration, ValueError, TypeError):
        return None
    if first_line is None or end_line is None or first is None or end is None:
        return None
    return (first_line, first, end_line, end)


def place(code, line):
    return "line %d" % line if code is None else "%s, line %d" % (code.co_filename, line)


# -- tracebacks as without the tool -----------------------------------------------------------------

def drop_leading_own_frames(exc):
    """Unlink our frames from the head of an exception's traceback before it leaves our frame,
    so that a user catching it inside the block does not see them either (the frames that
    dispatched to us are added further up, as it propagates; hide_own_frames drops those).

    Where C code dispatched to us straight from a Python frame (a torch.library op's
    OpOverload.__call__ calls its C op, which calls our mode), the call we made runs that frame's
    code again: that repeat, a frame a plain run does not have, goes too."""
    tb = exc.__traceback__
    caller = None
    while tb is not None and tb.tb_frame.f_code.co_filename.startswith(OWN_FRAMES):
        if caller is None:
            caller = tb.tb_frame.f_back
        tb = tb.tb_next
    if caller is not None and tb is not None and tb.tb_frame.f_code is caller.f_code:
        tb = tb.tb_next
    exc.__traceback__ = tb


def without_dispatch(entries, codes):
    """The entries (outermost first) of a stack or traceback as they would be without the tool,
    given the code object of each: no frame of ours, and where torch dispatched to us through
    handle_torch_function, neither the overrides.py frames nor the frame that called them (the
    call we made repeats it: the same code follows them, or one of our frames does)."""
    filenames = [c.co_filename for c in codes]
    drop = [f.startswith(OWN_FRAMES) for f in filenames]
    n = len(entries)
    i = 0
    while i < n:
        if filenames[i] != _OVERRIDES_FILE:
            i += 1
            continue
        k = i
        while k + 1 < n and filenames[k + 1] == _OVERRIDES_FILE:
            k += 1
        if i > 0 and k + 1 < n and (drop[k + 1] or codes[k + 1] is codes[i - 1]):
            for j in range(i - 1, k + 1):
                drop[j] = True
        i = k + 1
    return [e for e, d in zip(entries, drop) if not d]


def hide_own_frames(exc: BaseException) -> None:
    """Unlink our frames from the user's traceback (and from the exceptions it chains), with
    the torch dispatch frames that led into them, so that it reads as without us."""
    seen = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        entries = []
        tb = exc.__traceback__
        while tb is not None:
            entries.append(tb)
            tb = tb.tb_next
        keep = without_dispatch(entries, [e.tb_frame.f_code for e in entries])
        if len(keep) != len(entries):
            for a, b in zip(keep, keep[1:]):
                a.tb_next = b
            if keep:
                keep[-1].tb_next = None
            exc.__traceback__ = keep[0] if keep else None
        exc = exc.__cause__ or exc.__context__


def _frame_locals_type():
    return type(sys._getframe().f_locals)  # in a function: FrameLocalsProxy on Python 3.13+ (PEP 667)


_FRAME_LOCALS = _frame_locals_type()


def namespace_items(namespace):
    """(name, value) pairs of a namespace, read without running code of the user's: a dict (not a
    subclass's own items()) or a function frame's locals as Python 3.13 gives them (a proxy)."""
    if isinstance(namespace, dict):
        return list(dict.items(namespace))
    if type(namespace) is _FRAME_LOCALS:
        return list(namespace.items())
    return []
