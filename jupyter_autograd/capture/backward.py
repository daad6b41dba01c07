"""Backward calls (`backward()`, `torch.autograd.backward`, `torch.autograd.grad`): before each runs,
the graph it is about to run is inspected (the diagnosis must exist even if backward raises);
after it, the norms of the gradients it made are taken (without a device sync) and, with
check_nan, where it first made a NaN or an Inf.
"""
from __future__ import annotations

import inspect
import math
import sys

import torch

from . import graph as graph_snapshot
from . import nan_watch
from .frames import frame_kind, frame_names, namespace_items, place
from .kept import KeptTensors
from .records import Snapshot
from .tensors import TENSOR, tensors_in, value_kind, versions

_Tensor = torch.Tensor
BACKWARD_FUNCS = {torch.Tensor.backward, torch.autograd.backward, torch.autograd.grad}
_next_seq = torch._C._autograd._get_sequence_nr  # the sequence number the next grad_fn node gets
_hidden_from_subclasses = torch._C.DisableTorchFunctionSubclass


class BackwardCalls:
    __slots__ = ("checkpoints", "retained", "freeing", "names", "gradient_norms", "root_norms", "nonfinite_forward",
                 "count", "unchecked", "nan_origin", "kept")

    def __init__(self):
        self.checkpoints = []     # graph snapshots taken before each backward call (graph.take)
        self.retained = {}        # backward op index -> whether that call kept the graph's buffers
        self.freeing = set()      # op indices of backward calls that free their graph (no retain_graph)
        self.names = {}           # tid -> name, from frames seen at backward calls
        self.gradient_norms = []  # (backward op index, [(tid, gradient norm: a float, or a 0-d device tensor)])
        # (backward op index, [(tid, norm)]) of the tensors each checked backward starts from (the loss):
        # a NaN gradient is only "from a finite forward pass" if they were finite
        self.root_norms = []
        self.nonfinite_forward = {}  # backward op index -> the first op whose result, alive then, held NaN/Inf
        self.count = 0            # backward calls so far (autograd.grad ones too)
        self.unchecked = None     # (op index, leaf tids) of the last backward, if its gradients were not checked
        self.nan_origin = None    # with check_nan: where backward first made a NaN/Inf (nan_watch.py)
        self.kept = KeptTensors()  # tensors with history still alive at a later backward call

    def call(self, recorder, func, args, kwargs):
        """Inspect the graph first, then run and record the call."""
        __tracebackhide__ = True  # noqa: F841
        if kwargs is None:
            kwargs = {}
        index, frees = len(recorder.ops), frees_graph(func, args, kwargs)
        watch = walked = None
        try:
            tensors = tensors_in(args, kwargs)
            with _hidden_from_subclasses():
                before = versions(tensors)
                leaves, walked = self._checkpoint_before(recorder, func, args, kwargs)
            if recorder.check_nan and self.nan_origin is None:
                watch = nan_watch.NanWatch(recorder.fail, self.checkpoints[-1].op_index)
                watch.attach(walked)
                recorder.compiled.watch_nan(walked, recorder.fail, watch.backward_index)  # lines inside compiled code
            walked = None
            seq = _next_seq()
        except Exception as exc:  # never let the tool break the user's call
            walked = None
            if watch is not None:
                self._read_watch(watch, recorder)
            recorder.fail(exc)
            result = func(*args, **kwargs)
            if frees:
                self.freeing.add(index)
            return result
        try:
            result = func(*args, **kwargs)
        except BaseException as exc:
            try:
                recorder.record(func, tensors, before, None, exc, seq)
            except Exception as inner:
                recorder.fail(inner)
            raise
        finally:
            if watch is not None:
                self._read_watch(watch, recorder)
        try:
            with _hidden_from_subclasses():
                recorder.record(func, tensors, before, result, None, seq)
                self._note_gradients(recorder, func, result, leaves)
        except Exception as exc:
            recorder.fail(exc)
        if frees:  # and it ran: its graph's buffers are gone
            self.freeing.add(index)
        return result

    def _read_watch(self, watch, recorder):
        watch.detach()
        recorder.compiled.unwatch_nan(watch.origin)
        if watch.origin is not None and self.nan_origin is None:
            self.nan_origin = watch.origin

    def _note_gradients(self, recorder, func, result, leaves):
        """The norms of the gradients of the leaves this backward reached (non-finite where a NaN or
        an Inf is, and Trace.grad_stats() data), without a device sync: they stay device tensors
        until the block ends (see freeze.py). Reading every gradient costs a pass over its memory,
        so a long loop checks backward calls 1, 2, 4, 8, ... and the last one (at the end of the
        block): a NaN that spreads to the weights is still found."""
        index = len(recorder.ops) - 1
        self.count += 1
        if self.count & (self.count - 1):
            self.unchecked = (index, leaves)
            return
        self.unchecked = None
        grads = []
        if func is torch.autograd.grad:
            inputs = self.checkpoints[-1].inputs
            grads = [(tid, g) for (tid, _), g in zip(inputs, result or ()) if isinstance(g, _Tensor)]
        else:
            refs = recorder.tensors.refs
            for tid in leaves:
                t = refs[tid]()
                g = None if t is None else t.grad
                if g is not None and (g.is_floating_point() or g.is_complex()):
                    grads.append((tid, g))
        if grads:
            self.gradient_norms.append((index, nan_watch.norms_of(grads)))

    def _checkpoint_before(self, recorder, func, args, kwargs):
        """Inspect the graph about to be run; return the leaves and (with check_nan) the nodes the
        walk met."""
        call = bind_backward(func, args, kwargs)
        roots = call.get("outputs", call.get("tensors", call.get("self")))
        roots = [roots] if isinstance(roots, _Tensor) else list(roots or ())
        inputs = call.get("inputs")
        inputs = [inputs] if isinstance(inputs, _Tensor) else [t for t in (inputs or ()) if isinstance(t, _Tensor)]
        retain = call.get("retain_graph")
        retain = bool(call.get("create_graph", False)) if retain is None else bool(retain)
        index = len(recorder.ops)
        self.retained[index] = retain
        frame = sys._getframe(2)
        while frame is not None and frame_kind(frame.f_code.co_filename):
            frame = frame.f_back
        where = "the backward at %s" % ("?" if frame is None else place(frame.f_code, frame.f_lineno))
        try:
            names = frame_names(frame)
            if names is not None:
                self.note_names(recorder.tensors, names)
        except Exception as exc:
            recorder.lose("reading the variable names at " + where, exc, "tensors there are described instead of named")
        try:
            snapshot, leaves, walked = graph_snapshot.take(recorder, roots, index, "backward", inputs, retain)
        except Exception as exc:
            recorder.lose("the graph walk before " + where, exc, "the saved tensors of that call were not checked")
            snapshot, leaves, walked = Snapshot(index, "backward", [], [], [], retain), (), ()
        self.checkpoints.append(snapshot)
        self.kept.look(recorder.tensors.refs, index)
        count = self.count + 1
        if not count & (count - 1):  # a call whose gradients are checked (_note_gradients): its roots too
            try:
                self._note_roots(recorder, roots, index)
            except Exception as exc:
                recorder.lose("reading the values " + where + " started from", exc,
                              "a NaN gradient there is not told from a NaN loss")
        return leaves, walked

    def _note_roots(self, recorder, roots, index):
        """The norms of the tensors a backward starts from (a 0-d device tensor off the CPU: no sync). On
        the CPU, where reading costs nothing, a root holding NaN/Inf is traced at once to the first op
        whose result, still alive, holds NaN (else Inf): the forward line that made it."""
        tensors = recorder.tensors
        values = [(tensors.tid(r), r) for r in roots
                  if isinstance(r, _Tensor) and (r.is_floating_point() or r.is_complex())]
        norms = nan_watch.norms_of(values)
        self.root_norms.append((index, norms))
        if any(type(norm) is float and not math.isfinite(norm) for _, norm in norms):
            first = nan_watch.first_nonfinite(recorder.ops[:index], tensors)
            if first is not None:
                self.nonfinite_forward[index] = first

    def note_names(self, tensors, namespace):
        for name, value in namespace_items(namespace):  # never a subclass's items(): no code of the user's
            if value_kind(value) is TENSOR and not name.startswith("_"):
                t_id = tensors.known(value)
                if t_id is not None:
                    self.names.setdefault(t_id, name)

    def take_gradient_norms(self, refs):
        """The norms taken after the checked backward calls, handed over once at the block's end
        (the last call's taken now, if a long loop left it unchecked)."""
        if self.unchecked is not None:
            index, leaves = self.unchecked
            grads = []
            for t_id in leaves:
                t = refs[t_id]()
                g = None if t is None else t.grad
                if g is not None and (g.is_floating_point() or g.is_complex()):
                    grads.append((t_id, g))
            if grads:
                self.gradient_norms.append((index, nan_watch.norms_of(grads)))
            self.unchecked = None
        norms, self.gradient_norms = self.gradient_norms, []
        return norms

    def take_root_norms(self):
        """The norms of the tensors the checked backward calls started from, handed over once."""
        norms, self.root_norms = self.root_norms, []
        return norms

    def empty_checkpoint(self, at):
        """Drop the saved-tensor slots of checkpoint `at` (folding.py): its call found nothing."""
        cp = self.checkpoints[at]
        self.checkpoints[at] = cp._replace(roots=tuple(cp.roots), slots=(), inputs=tuple(cp.inputs))

    def shifted(self, start, end):
        """As a capture nested in this block sees it, whose op indices start again at 0 at op `start`."""
        part = BackwardCalls()
        part.checkpoints = [cp._replace(op_index=cp.op_index - start) for cp in self.checkpoints if cp.op_index >= start]
        part.retained = self.retained
        part.freeing = {i - start for i in self.freeing if i >= start}
        part.names = dict(self.names)
        # The nested block's own backward calls: their gradient norms, in its numbering (a shared
        # list would also take the norms its end adds).
        part.gradient_norms = [(i - start, norms) for i, norms in self.gradient_norms if i >= start]
        part.unchecked = (None if self.unchecked is None or self.unchecked[0] < start
                          else (self.unchecked[0] - start, self.unchecked[1]))
        part.root_norms = [(i - start, norms) for i, norms in self.root_norms if i >= start]
        part.nonfinite_forward = {i - start: op - start for i, op in self.nonfinite_forward.items()
                                  if i >= start and op >= start}
        part.nan_origin = self.nan_origin
        part.kept = self.kept.shifted(start, end)
        return part


_signatures = {}


def bind_backward(func, args, kwargs):
    """The arguments of a backward()/autograd.grad() call by parameter name (self, tensors or
    outputs; inputs; retain_graph; create_graph), whichever way they were passed."""
    known = _signatures.get(func)
    if known is None:
        sig = inspect.signature(func)
        plain = all(p.kind is p.POSITIONAL_OR_KEYWORD for p in sig.parameters.values())
        known = _signatures[func] = (sig, tuple(sig.parameters) if plain else (), frozenset(sig.parameters))
    sig, names, name_set = known
    # What Signature.bind gives for a well-formed call, without it (tens of microseconds): torch
    # passes every keyword of loss.backward() on to __torch_function__.
    if (names and len(args) <= len(names) and name_set.issuperset(kwargs)
            and not any(n in kwargs for n in names[:len(args)])):
        arguments = dict(zip(names, args))
        arguments.update(kwargs)
        return arguments
    try:
        return sig.bind(*args, **kwargs).arguments
    except TypeError:  # the call itself is wrong: backward will say so
        return {}


def frees_graph(func, args, kwargs):
    """Whether a backward call frees its graph: no retain_graph (which defaults to create_graph)."""
    try:
        at = 3 if func is torch.autograd.grad else 2  # (outputs, inputs, grad_outputs, retain_graph, ...)
        retain = kwargs.get("retain_graph", args[at] if len(args) > at else None)
        if retain is None:
            retain = kwargs.get("create_graph", args[at + 1] if len(args) > at + 1 else False)
        return retain is False or retain is None or retain == 0
    except Exception:  # unusual arguments: say it keeps the graph, so nothing of it is folded
        return False
