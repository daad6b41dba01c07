"""Recording a block of PyTorch code. The only part of the package that touches torch internals."""
from __future__ import annotations

import sys
import warnings
from typing import Iterable, Optional

from ..model import Trace

__all__ = ["capture"]

from .recorder import _state  # the recorder active in this thread, if any


class capture:
    """Record every tensor operation of a block, its autograd graph and what breaks it.

    >>> with capture() as trace:
    ...     loss = model(x).sum()
    >>> trace.diagnoses

    The block runs exactly as without the capture: same results, same exceptions, same
    gradients. `trace` is filled in when the block ends, also when it raised. Only the
    thread that entered the block is recorded (PyTorch's function modes are per thread).

    namespace: dicts in which to look up the user's variable names (default: the globals of
    the code that entered the block and of every frame seen, and its locals at module level).
    Inside a function on Python < 3.13, names of locals come from the assignment that made
    each tensor (`h = x.exp()`), because reading a running function's locals would keep its
    tensors alive; pass `namespace=locals()` to name the others (modules' parameters too).

    check_nan: watch every backward node of the block and name the first one that turns finite
    gradients into NaN or Inf, with the forward line and the input values that caused it
    (slower backward; without it, non-finite gradients of leaves are still reported, cheaply).
    """

    def __init__(self, namespace: Optional[Iterable[dict]] = None, check_nan: bool = False):
        if not isinstance(check_nan, bool):
            raise TypeError("capture(check_nan=...) takes True or False, got %r" % (check_nan,))
        self._check_nan = check_nan
        if isinstance(namespace, dict):
            namespace = [namespace]
        if namespace is not None and not (isinstance(namespace, (list, tuple))
                                          and all(isinstance(ns, dict) for ns in namespace)):
            raise TypeError("capture(namespace=...) takes a dict or a list of dicts of variable names, "
                            "for example capture(namespace=globals()); got %r" % (type(namespace).__name__,))
        self._namespace = None if namespace is None else list(namespace)
        self._recorder = None
        self._outer = None
        self.trace = Trace()

    def __enter__(self) -> Trace:
        from .recorder import Recorder, frame_names, install_function_hook

        if self._namespace is None:
            frame = sys._getframe(1)
            self._namespace = [frame_names(frame), frame.f_globals]
        self._outer = getattr(_state, "recorder", None)
        if self._outer is not None:
            # Entering a second mode would record everything twice: share the outer recorder.
            self._recorder = self._outer
            return self.trace
        self._recorder = Recorder(check_nan=self._check_nan)
        self._recorder.__enter__()
        _state.recorder = self._recorder
        install_function_hook()
        return self.trace

    def __exit__(self, exc_type, exc, tb):
        from .recorder import remove_function_hook

        recorder = self._recorder
        try:
            if self._outer is None:
                _state.recorder = None
                remove_function_hook()
                recorder.__exit__(None, None, None)
            previous_off, recorder.off = recorder.off, "building the trace"
            try:
                self.trace._defer(finish(recorder, self._namespace, exc))
            finally:
                recorder.off = previous_off
        except Exception as internal:  # the user's result matters more than our report
            message = "jupyter_autograd could not analyse this block (%s: %s)" % (type(internal).__name__, internal)
            self.trace.warnings.append(message)
            warn(message)
        finally:
            self._recorder = self._outer = self._namespace = None
        if exc is not None:
            _add_note(exc, self.trace)
            _hide_own_frames(exc)
        return False


def warn(message: str) -> None:
    """A RuntimeWarning that can never replace the user's own exception or result, even when
    warnings are turned into errors: then it is printed instead."""
    try:
        warnings.warn(message, RuntimeWarning, stacklevel=3)
    except Exception:
        print("Warning: " + message, file=sys.stderr)


def _hide_own_frames(exc: BaseException) -> None:
    """Unlink the recorder's frame from the user's traceback, so it reads as without us."""
    from .recorder import Recorder

    own = {Recorder.__torch_function__.__code__, Recorder._backward_call.__code__}
    tb, prev = exc.__traceback__, None
    while tb is not None:
        if tb.tb_frame.f_code in own:
            if prev is None:
                exc.__traceback__ = tb.tb_next
            else:
                prev.tb_next = tb.tb_next
        else:
            prev = tb
        tb = tb.tb_next


def finish(recorder, namespaces, exc=None):
    """Take, now, what needs the user's live objects; return a function that builds the Trace.

    The build (records to plain data, the graph model, the diagnoses) runs when the trace is
    first read: a training loop under capture() pays for it only if it looks."""
    from ..diagnose import diagnose
    from .build import build_trace, end_checkpoint, freeze
    from .graph import DEEP_GRAPH, STACK_RAISED

    try:
        end_checkpoint(recorder)
    except Exception as internal:
        recorder.failure = recorder.failure or "inspecting the graph at the end: %s: %s" % (
            type(internal).__name__, internal)
    live, names = freeze(recorder, namespaces or [])
    error = None if exc is None else "%s: %s" % (type(exc).__name__, exc)

    def build() -> Trace:
        try:
            trace = build_trace(recorder, live, names, error)
            if recorder.failure:
                trace.warnings.append("recording stopped early after an internal error: " + recorder.failure)
            if STACK_RAISED[0] and len(trace.nodes) > DEEP_GRAPH:
                trace.notes.append("This graph is deep: to keep PyTorch from crashing when it frees it, the "
                                   "process's stack limit was raised from %d to %d bytes." % STACK_RAISED[0])
            trace.diagnoses = diagnose(trace)
        except Exception as internal:
            message = "jupyter_autograd could not analyse this block (%s: %s)" % (type(internal).__name__, internal)
            trace = Trace(error=error, warnings=[message])
            warn(message)
        return trace

    return build


def _add_note(exc: BaseException, trace: Trace) -> None:
    """Put the diagnosis that explains the exception into its traceback (PEP 678, Python 3.11+),
    so a script that dies in backward() says which line did it. Never changes the exception's
    type or str(), never raises; not for Ctrl-C, which must stop at once (no analysis)."""
    if not isinstance(exc, Exception) or not hasattr(exc, "add_note"):
        return
    try:
        from ..render.text import exception_note

        note = exception_note(trace)
        if note and note not in getattr(exc, "__notes__", ()):
            exc.add_note(note)
    except Exception:  # the user's exception matters more than our note
        pass
