"""Recording a block of PyTorch code. The only part of the package that touches torch internals."""
from __future__ import annotations

import gc
import os
import sys
import warnings
from typing import Iterable, Optional

import torch

from .. import diagnose as diagnosis
from ..model import Trace
from . import build, graph, lifecycle
# Imported once here rather than in the functions that use them: every block's start and end
# ran those import statements, and a training loop's step pays for each with cold caches.
# Modules, not their functions, where tests and users may replace a function.
from .lifecycle import _InterruptsHeld
from .lifecycle import release as _release
from .lifecycle import take_off_stack as _pop_mode  # noqa: F401  (tests check that an interrupt inside it is harmless)
from .recorder import Recorder, _state, frame_names

__all__ = ["capture", "file_namers"]

# Functions that give a source file the name a person knows it by (a notebook cell's `In [2]`, where
# its code was compiled under a hashed file name), or None. The IPython extension adds the shell's
# while it is loaded; they are asked when a trace is built, for the files its ops ran in.
file_namers = []


class capture:
    """Record every tensor operation of a block, its autograd graph and what breaks it.

    >>> with capture() as trace:
    ...     loss = model(x).sum()
    >>> trace.diagnoses

    The block runs exactly as without the capture: same results, same exceptions, same
    gradients. `trace` is filled in when the block ends, also when it raised. Only the
    thread that entered the block is recorded (PyTorch's function modes are per thread).
    A capture inside another one gets the ops of its own block; the outer one keeps all.

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
        self._note_exceptions = True  # %%autograd shows the diagnosis in its widget instead
        if isinstance(namespace, dict):
            namespace = [namespace]
        if namespace is not None and not isinstance(namespace, (list, tuple)):
            raise TypeError("capture(namespace=...) takes a dict or a list of dicts of variable names, "
                            "for example capture(namespace=globals()); got %r" % (type(namespace).__name__,))
        for ns in namespace or ():
            if not isinstance(ns, dict):
                raise TypeError("capture(namespace=...) takes a dict or a list of dicts of variable names, "
                                "for example capture(namespace=[locals(), globals()]); the list holds a %r"
                                % (type(ns).__name__,))
        for ns in namespace or ():
            key = next((k for k in ns if not isinstance(k, str)), None)
            if key is not None:
                raise TypeError("capture(namespace=...) maps variable names to values, so its keys must be "
                                "str; got the key %r" % (key,))
        self._namespace = None if namespace is None else list(namespace)
        self._entered = False      # a capture records one block (its trace is filled once)
        self._recorder = None
        self._outer = None
        self._start = 0            # for a nested capture: the outer recorder's op count at entry
        self._installed = False    # our mode, hooks and thread state are in place
        self._process = None       # the process that entered the block (a forked child records nothing)
        self._not_started = None   # why recording could not start, if it could not
        self._safety_net = None
        self.trace = Trace()

    def __enter__(self) -> Trace:
        __tracebackhide__ = True  # noqa: F841
        if self._entered:
            raise RuntimeError("this capture() has already recorded a block: it fills one trace, once. Make a new "
                               "one for each block: `with jupyter_autograd.capture() as trace: ...`")
        self._entered = True
        self._process = os.getpid()
        if self._namespace is None:
            frame = sys._getframe(1)
            self._namespace = [frame_names(frame), frame.f_globals]
        try:
            with _InterruptsHeld():
                self._start_recording()
        except BaseException:  # an interrupt held while installing lands here: leave nothing behind
            while self._installed:
                try:
                    with _InterruptsHeld():
                        self._stop_recording()
                except Exception:
                    break
                except BaseException:  # before the interrupts were held: once more
                    continue
            raise
        return self.trace

    def _start_recording(self):
        lifecycle.heal_thread()  # what a block that ended elsewhere, or whose exit never ran, left here
        outer = getattr(_state, "recorder", None)
        if outer is not None:
            # Entering a second mode would record everything twice: the outer recorder records
            # for both, and this block's part of it is cut out at the end.
            self._recorder = self._outer = outer
            self._start = len(outer.ops)
            return
        try:
            recorder = Recorder(check_nan=self._check_nan)
            lifecycle.start(recorder)
        except Exception as exc:  # the block must run as without us: it runs unrecorded
            self._not_started = "jupyter_autograd could not start recording (%s: %s); the block ran unrecorded" % (
                type(exc).__name__, exc)
            warn(self._not_started)
            return
        self._recorder = recorder
        self._installed = True
        self._safety_net = lifecycle.guard(self, recorder)
        lifecycle.watch_block(self, recorder)

    def _stop_recording(self, exc=None):
        """Take back the mode, the hooks and the thread's recorder (lifecycle.release)."""
        if not self._installed:
            return
        self._installed = False
        safety_net, self._safety_net = self._safety_net, None
        lifecycle.unguard(safety_net)
        if exc is not None:
            _finish_interrupted_mode_stashes(exc)
        self._recorder.block_watch = None
        _release(self._recorder)

    def close(self) -> None:
        """Remove what the capture installed, if its block was left without `__exit__` running
        (an interrupt on the very first instruction of `__exit__`, before any of its code ran).
        Harmless otherwise; it also happens when the capture object is freed, and at the next
        torch call or capture of the thread that ran the block."""
        if self._installed:
            with _InterruptsHeld():
                self._stop_recording()

    def __exit__(self, exc_type, exc, tb):
        __tracebackhide__ = True  # noqa: F841
        recorder, outer = self._recorder, self._outer
        ended = []  # our own problems in ending the block, for the trace's warnings
        interrupted = None
        # Written out here, not in a helper: an interrupt can land on the first instruction of
        # any function we call, before it could hold interrupts. Then the removal runs again.
        while self._installed:
            try:
                with _InterruptsHeld():
                    self._stop_recording(exc)
            except Exception as internal:
                ended.append("jupyter_autograd could not remove all its hooks (%s: %s)" % (
                    type(internal).__name__, internal))
            except BaseException as interrupt:
                interrupted = interrupt
        try:
            if interrupted is not None:
                raise interrupted
            for message in ended:
                warn(message)
            if self._process != os.getpid():
                self.trace.warnings.append(
                    "this process was forked inside the block (from process %d), which records it: nothing was "
                    "recorded in this one" % self._process)
            elif self._not_started is not None:
                self.trace.warnings.extend([self._not_started] + ended)
            elif recorder is not None:
                if recorder.step is not None:  # the block ended inside an optimizer step
                    recorder.end_block_inside_step(raised=exc is not None)
                part = recorder if outer is None else recorder.since(self._start)
                previous_off, recorder.off = recorder.off, "building the trace"
                try:
                    self.trace._defer(finish(part, self._namespace, exc, ended))
                finally:
                    recorder.off = previous_off
        except Exception as internal:  # the user's result matters more than our report
            message = "jupyter_autograd could not analyse this block (%s: %s)" % (type(internal).__name__, internal)
            self.trace.warnings.append(message)
            warn(message)
        except BaseException:  # an interrupt while the trace was taken: the block is not analysed
            if "_pending" not in self.trace.__dict__:
                self.trace.__dict__.update(
                    Trace(warnings=["interrupted while the capture ended: this block was not analysed"]).__dict__)
            raise
        finally:
            self._recorder = self._outer = self._namespace = None
        if exc is not None:
            if self._note_exceptions:
                _add_note(exc, self.trace)
            _hide_own_frames(exc)
        return False

    # The with statement holds what this lookup returns until it calls it: see lifecycle.watch_block.
    __exit__ = lifecycle.ExitLookup(__exit__)


def _finish_interrupted_mode_stashes(exc):
    """torch's handle_torch_function takes our mode off the stack for the duration of the call
    (`with _pop_mode_temporarily()`, a generator). An interrupt landing in that context
    manager's __enter__ or __exit__ leaves the generator suspended, and it pushes our mode back
    whenever it is finalized, long after the block. Finish those generators now, while we can
    pop the mode."""
    import contextlib

    stash = getattr(torch.overrides._pop_mode_temporarily, "__wrapped__", None)
    manager_codes = (contextlib._GeneratorContextManager.__enter__.__code__,
                     contextlib._GeneratorContextManager.__exit__.__code__)
    if stash is None:
        return
    seen = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        tb = exc.__traceback__
        while tb is not None:
            frame = tb.tb_frame
            if frame.f_code in manager_codes:
                manager = frame.f_locals.get("self")
                gen = getattr(manager, "gen", None)
                if getattr(gen, "gi_code", None) is stash.__code__ and gen.gi_frame is not None:
                    try:
                        gen.close()
                    except Exception:
                        pass
            tb = tb.tb_next
        exc = exc.__cause__ or exc.__context__


def warn(message: str) -> None:
    """A RuntimeWarning that can never replace the user's own exception or result, even when
    warnings are turned into errors: then it is printed instead."""
    try:
        warnings.warn(message, RuntimeWarning, stacklevel=3)
    except Exception:
        print("Warning: " + message, file=sys.stderr)


def _hide_own_frames(exc: BaseException) -> None:
    """Unlink our frames from the user's traceback (and from the exceptions it chains), with
    the torch dispatch frames that led into them, so that it reads as without us."""
    from .recorder import _without_dispatch

    seen = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        entries = []
        tb = exc.__traceback__
        while tb is not None:
            entries.append(tb)
            tb = tb.tb_next
        keep = _without_dispatch(entries, [e.tb_frame.f_code for e in entries])
        if len(keep) != len(entries):
            for a, b in zip(keep, keep[1:]):
                a.tb_next = b
            if keep:
                keep[-1].tb_next = None
            exc.__traceback__ = keep[0] if keep else None
        exc = exc.__cause__ or exc.__context__


def finish(recorder, namespaces, exc=None, tool_warnings=()):
    """Take, now, what needs the user's live objects; return a function that builds the Trace.

    The build (records to plain data, the graph model, the diagnoses) runs when the trace is
    first read: a training loop under capture() pays for it only if it looks. Our reads of the
    user's tensors are hidden from their `__torch_function__` subclasses, now and at the build."""

    with torch._C.DisableTorchFunctionSubclass():
        try:
            build.end_checkpoint(recorder)
        except Exception as internal:
            recorder.lose("the graph walk at the end of the block", internal,
                          "the saved tensors of graphs that no backward ran were not checked")
        live, names = build.freeze(recorder, namespaces or [])
    error = None if exc is None else "%s: %s" % (type(exc).__name__, exc)
    error_at = None if exc is None else build.raised_at(exc)

    def build_when_read() -> Trace:
        # As in build_trace, through the diagnoses: they allocate while the whole new trace is
        # young, and each collection would walk it again (the chain's diagnoses: 6 ms alone, 40
        # with the collector on). No code of the user's runs here.
        enabled = gc.isenabled()
        gc.disable()
        try:
            return analyse()
        finally:
            if enabled:
                gc.enable()

    def analyse() -> Trace:
        try:
            # Not DisableTorchFunctionSubclass alone: read inside another capture, the build's reads
            # of gradients would be recorded there, at the line that read the trace.
            with torch._C.DisableTorchFunction():
                trace = build.build_trace(recorder, live, names, error, error_at)
            trace.warnings.extend(tool_warnings)
            _name_source_files(trace)
            for message, times in recorder.__dict__.get("lost_parts", {}).items():
                trace.warnings.append(message if times == 1 else "%s (%d times)" % (message, times))
            if recorder.failure:
                trace.warnings.append("recording stopped early after an internal error: " + recorder.failure)
            if recorder.unrecorded_after_step is not None:
                code, line = recorder.unrecorded_after_step
                trace.warnings.append("the optimizer step at %sline %d raised and the exception was caught: the "
                                      "tensor calls after it, up to the next module call or the end of the block, "
                                      "were not recorded" % ("" if code is None else code.co_filename + ", ", line))
            if recorder.too_deep:
                trace.warnings.append("%d calls ran too close to the recursion limit to be recorded"
                                      % recorder.too_deep)
            if recorder.folded:
                trace.notes.append("To keep memory bounded, the details of %d ops were folded: ops that wrote "
                                   "nothing, whose results were gone and whose autograd nodes, if any, a "
                                   "backward had already run and freed; they keep their name, line and "
                                   "nodes, not their tensors." % recorder.folded)
            folded_backwards = recorder.folded_backwards
            if folded_backwards:
                trace.notes.append("The saved tensors of %d backward calls that found nothing (each freed its "
                                   "graph, and nothing it saved was changed) were not kept; the first and the "
                                   "latest calls keep theirs." % folded_backwards)
            if graph.STACK_RAISED[0] and len(trace.nodes) > graph.DEEP_GRAPH:
                trace.notes.append("This graph is deep: to keep PyTorch from crashing when it frees it, the "
                                   "process's stack limit was raised from %d to %d bytes." % graph.STACK_RAISED[0])
            trace.diagnoses = diagnosis.diagnose(trace)
        except Exception as internal:
            message = "jupyter_autograd could not analyse this block (%s: %s)" % (type(internal).__name__, internal)
            trace = Trace(error=error, warnings=[message])
            warn(message)
        return trace

    return build_when_read


def _name_source_files(trace: Trace) -> None:
    for filename in trace.sources:
        for namer in list(file_namers):
            try:
                name = namer(filename)
            except Exception:  # a name is a nicety: never a reason to lose the analysis
                name = None
            if name:
                trace.source_names[filename] = name
                break


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
