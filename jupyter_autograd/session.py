"""A session: `capture()` records a block, builds its trace when it is first read, diagnoses it,
and says what it could not do; the public `Trace` it fills, with its views.

The front ends (the magic, the pytest plugin, the callbacks) run blocks through `capture`; below
this module nothing imports IPython or ipywidgets.
"""
from __future__ import annotations

import gc
import os
import sys
import threading
import warnings
import weakref
from dataclasses import asdict
from typing import Any, Dict, Iterable, Optional


from . import diagnose as diagnosis
from .capture import build, lifecycle
# Imported once here rather than in the functions that use them: every block's start and end
# ran those import statements, and a training loop's step pays for each with cold caches.
# Modules, not their functions, where tests and users may replace a function.
from .capture.frames import frame_names, hide_own_frames
from .capture.lifecycle import ExitLookup, InterruptsHeld
from .capture.lifecycle import release as release_block
from .capture.mode import Recorder
from .capture.state import thread_state
from .model import TraceData

__all__ = ["capture", "Trace", "file_namers", "warn"]

# Functions that give a source file the name a person knows it by (a notebook cell's `In [2]`, where
# its code was compiled under a hashed file name), or None. The IPython extension adds the shell's
# while it is loaded; they are asked when a trace is built, for the files its ops ran in.
file_namers = []

_IN_PROGRESS = object()  # Trace._pending while its build runs


class Trace(TraceData):
    """Everything captured from one block (plain data: safe to keep after the block ends), built
    when it is first read, with its views: `report()`, `summary()`, `grad_stats()`, `to_json()`,
    `show()`, `save_html()`."""

    # -- built on first use -------------------------------------------------------------------
    def _defer(self, build) -> None:
        """Drop the fields; `build()` makes them when one is first read (see finish), once,
        whichever thread reads first: the others wait for it. A build cut off (Ctrl-C) leaves the
        trace as it was, to be built on the next read."""
        self.__dict__.clear()
        self.__dict__["_pending"] = build
        self.__dict__["_building"] = threading.RLock()

    def _empty(self) -> None:
        """Back to a trace with no content, built: what a block's end fills."""
        self.__dict__.clear()
        self.__dict__.update(TraceData().__dict__)

    def __getattr__(self, name):
        lock = self.__dict__.get("_building")
        if name.startswith("__"):
            raise AttributeError(name)
        if lock is None:  # built (perhaps by another thread since this read began), or never deferred
            return object.__getattribute__(self, name)
        with lock:
            pending = self.__dict__.get("_pending")
            if pending is not None:  # else another thread built it while this one waited
                if pending is _IN_PROGRESS:  # read by the build itself (this thread holds the lock)
                    raise AttributeError("%s: the trace is being built" % name)
                if type(pending) is _BlockEnd and not pending.dropped:  # read inside its block: nothing to keep
                    return getattr(pending(), name)
                self.__dict__["_pending"] = _IN_PROGRESS
                try:
                    built = pending()
                except BaseException:
                    self.__dict__["_pending"] = pending
                    raise
                fields = built.__dict__
                self.__dict__.update(fields)
                for extra in [k for k in self.__dict__ if k not in fields]:
                    del self.__dict__[extra]  # _pending and _building: built, for good
        return object.__getattribute__(self, name)

    # -- views --------------------------------------------------------------------------------
    def summary(self) -> str:
        from .render.text import graph_summary
        return graph_summary(self)

    def report(self) -> str:
        from .render.text import text_report
        return text_report(self)

    def grad_stats(self) -> Dict[str, Any]:
        """Gradient health per parameter and per module, as plain data (JSON-ready).

        Read from the gradients the capture reads anyway after backward calls 1, 2, 4, 8, ... and
        the block's last ("the checked backward calls"), one pass each, and from each of those
        leaves' own norm when the block ended. Empty lists when no backward ran.

        {"steps": [{"op_index": int, "place": str}, ...],
            the checked backward calls, in order: the index of the backward op in `ops` and where it is
            ("train.py, line 14"). Every `norms` list below has one value per step.
         "parameters": [{...}, ...], one per leaf whose gradient was read, and per trainable
            parameter (of a module called in the block, or held by an optimizer) that got none:
            "name": the parameter's dotted name (`net.0.weight`) or the tensor's name or description,
            "module": the dotted name of the module that holds it (`net.0`), or None,
            "shape": list of int, "dtype": str ("float32"), "is_parameter": bool (an nn.Parameter),
            "norms": [float or None], the L2 norm of its .grad right after each step (None: that
                backward did not reach it; NaN or Inf: the gradient held one),
            "param_norm": float or None, the L2 norm of the tensor itself at the end of the block,
            "ratio": float or None, the last finite norm over param_norm (None when param_norm is 0,
                as for a bias initialised to zero: there is no own scale to judge it by),
            "change": float or None, the last finite norm over the first (None with fewer than two),
            "nonfinite_at": int or None, the first step (an index into steps) whose norm was NaN/Inf,
            "flags": list of str, any of
                "nan-or-inf": the gradient held NaN or Inf after some step;
                "never-updated": no step gave it a gradient, or only zeros;
                "vanishing": ratio below 2**-24 (an update at learning rate 1 is lost to float32
                    rounding), or more than 1000 times below the median ratio of the list;
                "exploding": ratio above 100 (an SGD step at learning rate 0.01 would move it by more
                    than its own size)},
         "modules": [{...}, ...], one per module that holds listed parameters, at every level of its
            path (`net.0` and `net`), sorted by name: "name", "cls" (its class name), "module" (the
            module that holds it, or None), "parameters" (the names of its listed parameters,
            nested ones included), "norms", "param_norm", "ratio", "change", "nonfinite_at" as
            above for all its parameters taken as one tensor (the root of the sum of their squared
            norms), and "flags": every flag of its parameters,
         "thresholds": {"vanishing_ratio": 2**-24, "vanishing_below_median": 1000.0,
                        "exploding_ratio": 100.0}}
        """
        from .stats import grad_stats
        return grad_stats(self)

    def to_json(self) -> Dict[str, Any]:
        """The trace as data that `json.dumps` writes as strict JSON: NaN and infinities (a gradient's
        norm) are the strings "NaN", "Infinity" and "-Infinity", which float() and JavaScript's
        Number() read back."""
        return _finite({
            "ops": [asdict(op) for op in self.ops],
            "tensors": {str(k): asdict(v) for k, v in self.tensors.items()},
            "nodes": {str(k): asdict(v) for k, v in self.nodes.items()},
            "diagnoses": [asdict(d) for d in self.diagnoses],
            "roots": list(self.roots),
            "error": self.error,
            "warnings": list(self.warnings),
            "grad_stats": self.grad_stats(),
        })

    def show(self):
        """Display the interactive widget (in Jupyter) for this trace, with its static fallback."""
        from .widget import display_trace
        display_trace(self)

    def save_html(self, path):
        """Write one self-contained HTML file with the interactive view (no server, no kernel)."""
        from .widget import save_html
        return save_html(self, path)

    def _repr_mimebundle_(self, include=None, exclude=None):
        try:
            from .widget import trace_mimebundle
            return trace_mimebundle(self, include=include, exclude=exclude)
        except ImportError:
            return {"text/plain": self.report()}


NOT_ENDED = "the block has not ended: this trace is filled when it ends (read it after the `with` block)"
END_INTERRUPTED = ("the block's end was interrupted (Ctrl-C as the capture ended): nothing of the block was "
                   "analysed, so this trace holds none of its operations, and finding no problem here says "
                   "nothing about its code; run the block again to analyse it")


class _BlockEnd:
    """A trace's build until its block's end fills it in: while the block runs, a trace that says so
    (kept for nothing); once the with statement has let go of the exit without any of it running (an
    interrupt on its first instruction), a trace that says the block's end was interrupted."""

    __slots__ = ("dropped", "watch")

    def __init__(self, exit_method):
        # The with statement drops the bound exit as it calls it; the callback, list.append, is C code,
        # where no interrupt can land and be lost (as Recorder.watch_exit). No cycle: nothing to collect.
        self.dropped = []
        self.watch = None if exit_method is None else weakref.ref(exit_method, self.dropped.append)

    def __call__(self) -> TraceData:
        return TraceData(warnings=[END_INTERRUPTED if self.dropped else NOT_ENDED])


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

    note_exceptions: when the block raises, add the diagnosis that explains the exception to its
    notes (PEP 678), so that the traceback says which line did it. The front ends that show the
    report themselves (%%autograd's widget, the pytest plugin) turn it off.
    """

    def __init__(self, namespace: Optional[Iterable[dict]] = None, check_nan: bool = False, *,
                 note_exceptions: bool = True):
        if not isinstance(check_nan, bool):
            raise TypeError("capture(check_nan=...) takes True or False, got %r" % (check_nan,))
        if not isinstance(note_exceptions, bool):
            raise TypeError("capture(note_exceptions=...) takes True or False, got %r" % (note_exceptions,))
        self._check_nan = check_nan
        self.note_exceptions = note_exceptions
        # Read with the C methods of dict, list and tuple and checked by type alone: no method of the
        # user's (a dict subclass's keys() or __iter__, a key's __eq__ or __repr__) runs.
        if issubclass(type(namespace), dict):
            namespace = [namespace]
        elif issubclass(type(namespace), list):
            namespace = list(list.__iter__(namespace))
        elif issubclass(type(namespace), tuple):
            namespace = list(tuple.__iter__(namespace))
        elif namespace is not None:
            raise TypeError("capture(namespace=...) takes a dict or a list of dicts of variable names, "
                            "for example capture(namespace=globals()); got %r" % (type(namespace).__name__,))
        for ns in namespace or ():
            if not issubclass(type(ns), dict):
                raise TypeError("capture(namespace=...) takes a dict or a list of dicts of variable names, "
                                "for example capture(namespace=[locals(), globals()]); the list holds a %r"
                                % (type(ns).__name__,))
        for ns in namespace or ():
            key = next((k for k in dict.keys(ns) if not issubclass(type(k), str)), None)
            if key is not None:
                raise TypeError("capture(namespace=...) maps variable names to values, so its keys must be "
                                "str; got a key of type %r" % (type(key).__name__,))
        self._namespace = namespace
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
        lookup = self.__dict__.get("_exit_lookup")
        self.trace._defer(_BlockEnd(lookup() if lookup is not None else None))
        try:
            with InterruptsHeld():
                self._start_recording()
        except BaseException:  # an interrupt held while installing lands here: leave nothing behind
            while self._installed:
                try:
                    with InterruptsHeld():
                        self._stop_recording()
                except Exception:
                    break
                except BaseException:  # before the interrupts were held: once more
                    continue
            raise
        return self.trace

    def _start_recording(self):
        lifecycle.heal_thread()  # what a block that ended elsewhere, or whose exit never ran, left here
        outer = getattr(thread_state, "recorder", None)
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
            lifecycle.finish_interrupted_mode_stashes(exc)
        self._recorder.unwatch_exit()
        release_block(self._recorder)

    def _ends_with(self, manager) -> None:
        """Called, before __enter__, by a front end whose own context manager enters and exits this
        capture (the magic's cell), its class's __exit__ wrapped in ExitLookup: the block ends when the
        with statement lets go of that manager's exit, as it would end with ours (watch_block), also
        when an interrupt on its first instruction keeps any of it from running."""
        lookup = manager.__dict__.get("_exit_lookup")
        if lookup is not None:
            self.__dict__["_exit_lookup"] = lookup

    def close(self) -> None:
        """Remove what the capture installed, if its block was left without `__exit__` running
        (an interrupt on the very first instruction of `__exit__`, before any of its code ran).
        Harmless otherwise; it also happens when the capture object is freed, and at the next
        torch call or capture of the thread that ran the block."""
        if self._installed:
            with InterruptsHeld():
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
                with InterruptsHeld():
                    self._stop_recording(exc)
            except Exception as internal:
                ended.append("jupyter_autograd could not remove all its hooks (%s: %s)" % (
                    type(internal).__name__, internal))
            except BaseException as interrupt:
                interrupted = interrupt
        try:
            if interrupted is not None:
                raise interrupted
            self.trace._empty()
            for message in ended:
                warn(message)
            if self._process != os.getpid():
                self.trace.warnings.append(
                    "this process was forked inside the block (from process %d), which records it: nothing was "
                    "recorded in this one" % self._process)
            elif self._not_started is not None:
                self.trace.warnings.extend([self._not_started] + ended)
            elif recorder is not None:
                if recorder.steps.step is not None:  # the block ended inside an optimizer step
                    recorder.steps.end_with_block(recorder, raised=exc is not None)
                if outer is not None:
                    part = recorder.since(self._start)
                elif recorder.installation.on_thread and recorder.installation.thread != threading.get_ident():
                    # Its mode stays on the entering thread's stack until that thread's next capture:
                    # the records go with the trace, not with it.
                    part = recorder.hand_over()
                else:
                    part = recorder
                previous = recorder.pause()  # the build's own reads are no ops of the block
                try:
                    self.trace._defer(finish(part, self._namespace, exc, ended))
                finally:
                    recorder.resume(previous)
        except Exception as internal:  # the user's result matters more than our report
            message = "jupyter_autograd could not analyse this block (%s: %s)" % (type(internal).__name__, internal)
            self.trace.warnings.append(message)
            warn(message)
        except BaseException:  # an interrupt while the trace was taken: the block is not analysed
            if "_pending" not in self.trace.__dict__:  # else its _BlockEnd says so, or it was taken
                self.trace._empty()
                self.trace.warnings.append(END_INTERRUPTED)
            raise
        finally:
            self._recorder = self._outer = self._namespace = None
        if exc is not None:
            if self.note_exceptions:
                _add_note(exc, self.trace)
            hide_own_frames(exc)
        return False

    # The with statement holds what this lookup returns until it calls it: see lifecycle.watch_block.
    __exit__ = ExitLookup(__exit__)


def _finite(value):
    """`value` with each NaN or infinite float spelled as a string: json.dumps would write NaN and
    Infinity, which are not JSON (strict parsers, JavaScript's JSON.parse, reject them)."""
    if isinstance(value, float):
        if value != value:
            return "NaN"
        if value in (_INF, -_INF):
            return "Infinity" if value > 0 else "-Infinity"
        return value
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, tuple):
        return tuple(_finite(v) for v in value)
    if isinstance(value, list):
        return [_finite(v) for v in value]
    return value


_INF = float("inf")


def warn(message: str) -> None:
    """A RuntimeWarning that can never replace the user's own exception or result, even when
    warnings are turned into errors: then it is printed instead."""
    try:
        warnings.warn(message, RuntimeWarning, stacklevel=3)
    except Exception:
        print("Warning: " + message, file=sys.stderr)


def finish(recorder, namespaces, exc=None, tool_warnings=()):
    """Take, now, what needs the user's live objects; return a function that builds the Trace.

    The build (records to plain data, the graph model, the diagnoses) runs when the trace is
    first read: a training loop under capture() pays for it only if it looks."""
    error = None if exc is None else "%s: %s" % (type(exc).__name__, exc)
    build_data = build.finish(recorder, namespaces, exc, error, tool_warnings)

    def build_when_read() -> TraceData:
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

    def analyse() -> TraceData:
        try:
            trace, source = build_data()
            _name_source_files(trace)
            trace.diagnoses = diagnosis.diagnose(trace, source)
        except Exception as internal:
            message = "jupyter_autograd could not analyse this block (%s: %s)" % (type(internal).__name__, internal)
            trace = TraceData(error=error, warnings=[message])
            warn(message)
        return trace

    return build_when_read


def _name_source_files(trace: TraceData) -> None:
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
        from .render.text import exception_note

        note = exception_note(trace)
        if note and note not in getattr(exc, "__notes__", ()):
            exc.add_note(note)
    except Exception:  # the user's exception matters more than our note
        pass
