"""The per-operation recorder: a TorchFunctionMode that notes every tensor call of the block.

This is the hot path. It stores flat tuples and does no string formatting or graph work;
everything else happens once, when the block ends (see build.py). It must never raise
anything but the user's own exception: any internal failure switches recording off and the
user's code goes on as if the tool were not there.
"""
from __future__ import annotations

import bisect
import os
import sys
import threading
import weakref

import torch
from torch.overrides import TorchFunctionMode

from . import graph as graph_snapshot
from . import nan_watch
from .graph import byte_range

_TORCH_DIR = os.path.dirname(torch.__file__) + os.sep
_OWN_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep
_Tensor = torch.Tensor
_DATA_GETTER = torch.Tensor.data.__get__
_GETTER_TYPE = type(_DATA_GETTER)
_BACKWARD_FUNCS = {torch.Tensor.backward, torch.autograd.backward, torch.autograd.grad}
_is_compiling = torch.compiler.is_compiling
_next_seq = torch._C._autograd._get_sequence_nr  # the sequence number the next grad_fn node gets
_grad_enabled = torch.is_grad_enabled

# An op record is a flat tuple (cheap to build, invisible to the cyclic GC's hot lists):
# (func, code, lineno, input tids, versions before, versions after, output tids,
#  (first, end) sequence numbers of the grad_fn nodes it made or None, written byte ranges or None,
#  grad enabled, error or None)
OP_FUNC, OP_CODE, OP_LINE, OP_IN, OP_VB, OP_VA, OP_OUT, OP_SEQ, OP_WR, OP_GRAD, OP_ERR = range(11)

_state = threading.local()  # .recorder: the Recorder active in this thread, if any
_Function = torch.autograd.function.Function
_original_apply = _Function.__dict__["apply"]
_hook_users = [0]


def _recording_apply(cls, *args, **kwargs):
    """Custom autograd.Function.apply is no torch function: record it as one op of the caller."""
    bound = _original_apply.__get__(None, cls)
    recorder = getattr(_state, "recorder", None)
    if recorder is None or recorder.off is not None:
        return bound(*args, **kwargs)
    return recorder.__torch_function__(bound, (), args, kwargs)


def _enter_module(module, args):
    recorder = getattr(_state, "recorder", None)
    if recorder is not None and recorder.off is None:
        recorder.module_path = recorder.module_path + (module,)
        recorder.modules[id(module)] = module


def _leave_module(module, args, output):
    recorder = getattr(_state, "recorder", None)
    if recorder is not None and recorder.module_path and recorder.module_path[-1] is module:
        recorder.module_path = recorder.module_path[:-1]


_module_hooks = []


def install_function_hook():
    """Hooks for the whole capture: custom Function.apply, and the nn.Module call stack (so that
    large graphs can be grouped by module). Forward hooks change no result; always_call keeps
    the stack right when a forward raises."""
    _hook_users[0] += 1
    if _hook_users[0] == 1:
        _Function.apply = classmethod(_recording_apply)
        from torch.nn.modules import module as nn_module
        _module_hooks[:] = [nn_module.register_module_forward_pre_hook(_enter_module),
                            nn_module.register_module_forward_hook(_leave_module, always_call=True)]


def remove_function_hook():
    _hook_users[0] = max(0, _hook_users[0] - 1)
    if _hook_users[0] == 0:
        _Function.apply = _original_apply
        for handle in _module_hooks:
            handle.remove()
        _module_hooks.clear()


class Recorder(TorchFunctionMode):
    def __init__(self, check_nan=False):
        super().__init__()
        self.check_nan = check_nan     # watch backward nodes for the first non-finite gradient
        self.ops = []
        self.tensor_meta = []          # per tid: (shape, dtype, device, requires_grad, is_leaf, created_by, base tid, data alias of)
        self.tid_of = {}               # id(tensor) -> tid (check refs: ids are reused)
        self.refs = []                 # per tid: a weak reference to the tensor
        self.last_write = -1           # index of the last op that wrote a tensor
        self.internal_code = {}        # id(code) -> (code, True when it belongs to torch or to us)
        self.user_globals = {}         # id(dict) -> globals dict of user frames (names, resolved at the end)
        self.node_ranges = []          # (first, end) grad_fn sequence numbers made by an op, and its index
        self.checkpoints = []          # graph snapshots taken before each backward call
        self.names = {}                # tid -> name, from frames seen at backward calls
        self.graph_nodes = {}          # node key -> [name, input keys, leaf tid, backward op indices, last seen]
        self.retained = {}             # backward op index -> whether that call kept the graph's buffers
        self.walked_nodes = ()         # grad_fn nodes of the last backward's walk (for check_nan), dropped at once
        self.walked_leaves = ()        # tids of the leaves that walk reached
        self.gradient_flags = []       # (backward op index, [(tid, device flag: gradient not finite)])
        self.backward_count = 0        # backward() calls so far (autograd.grad ones too)
        self.unchecked_backward = None  # (op index, leaf tids) of the last backward, if its gradients were not checked
        self.nan_origin = None         # with check_nan: where backward first made a NaN/Inf (nan_watch.py)
        self.nonfinite = {}            # at the end: tid -> index of the first backward that left its grad non-finite
        self.param_owner = {}          # at the end: parameter tid -> name of the outermost module that holds it
        self.optimized = set()         # tids of the parameters of optimizers that stepped in the block
        self.failure = None            # why recording stopped, if it did
        self.off = None                # non-None while recording is paused or after a failure
        self.module_path = ()          # the nn.Modules whose forward is running, outermost first
        self.modules = {}              # id(module) -> module, for naming at the end of the block
        self.op_modules = {}           # op index -> module path, for ops run inside a forward

    # -- hot path -----------------------------------------------------------------------------
    def __torch_function__(self, func, types, args=(), kwargs=None):
        __tracebackhide__ = True  # noqa: F841  (IPython hides this frame in tracebacks)
        if kwargs is None:
            kwargs = {}
        if self.off is not None or (type(func) is _GETTER_TYPE and func != _DATA_GETTER) or _is_compiling():
            return func(*args, **kwargs)
        if func in _BACKWARD_FUNCS:
            return self._backward_call(func, args, kwargs)
        try:
            tensors = _tensors_in(args, kwargs)
            before = tuple([t._version for t in tensors])
            seq = _next_seq()
        except Exception as exc:  # never let the tool break the user's call
            self._fail(exc)
            return func(*args, **kwargs)
        try:
            result = func(*args, **kwargs)
        except BaseException as exc:
            try:
                self._record(func, tensors, before, None, exc, seq)
            except Exception as inner:
                self._fail(inner)
            raise
        try:
            self._record(func, tensors, before, result, None, seq)
        except Exception as exc:
            self._fail(exc)
        return result

    def _record(self, func, tensors, before, result, error, seq_start):
        tid = self._tid
        seq_end = _next_seq()
        after = tuple([t._version for t in tensors])
        written = None
        index = len(self.ops)
        if after != before:
            written = tuple((tid(t), byte_range(t)) for t, b, a in zip(tensors, before, after) if a != b)
            self.last_write = index
        outputs, seq = (), None
        if seq_end != seq_start:  # grad_fn nodes were made during this call: [start, end)
            seq = (seq_start, seq_end)
            self.node_ranges.append((seq_start, seq_end, index))
        if result is not None:
            outs = [result] if isinstance(result, _Tensor) else (
                [r for r in result if isinstance(r, _Tensor)] if isinstance(result, (tuple, list)) else ())
            if outs:
                alias_of = tid(tensors[0]) if func == _DATA_GETTER else None
                out_ids = []
                for out in outs:
                    t_id = self.known(out)
                    if t_id is None:
                        t_id = self._register(out, index, alias_of)
                    out_ids.append(t_id)
                outputs = tuple(out_ids)
        frame = sys._getframe(2)
        internal = self.internal_code
        while frame is not None:
            code = frame.f_code
            # Keyed by id: hashing a code object is not cached and costs microseconds. The entry
            # holds the code object, so the id cannot be reused while we keep it.
            entry = internal.get(id(code))
            if entry is None:
                entry = internal[id(code)] = (code, code.co_filename.startswith((_TORCH_DIR, _OWN_DIR)))
                if not entry[1]:
                    self.user_globals.setdefault(id(frame.f_globals), frame.f_globals)
            if not entry[1]:
                break
            frame = frame.f_back
        code, line = (frame.f_code, frame.f_lineno) if frame is not None else (None, 0)
        if self.module_path:
            self.op_modules[index] = self.module_path
        self.ops.append((func, code, line, tuple([tid(t) for t in tensors]), before, after, outputs, seq,
                         written, _grad_enabled(), None if error is None else (type(error).__name__, str(error))))

    def known(self, t):
        """The tid of a tensor seen before, or None. An id can be reused once its tensor is gone:
        the weak reference tells the same tensor from a new one at the same address."""
        t_id = self.tid_of.get(id(t))
        if t_id is not None and self.refs[t_id]() is t:
            return t_id
        return None

    def _tid(self, t):
        t_id = self.known(t)
        return self._register(t, None, None) if t_id is None else t_id

    def _register(self, t, created_by, alias_of):
        t_id = len(self.refs)
        base = t._base
        # No t.grad_fn here: a Python wrapper on every node makes PyTorch 2.13 free deep graphs
        # recursively (a segfault past ~40,000 nodes). Names of nodes are read once, at the end.
        ref = weakref.ref(t)
        self.refs.append(ref)
        self.tensor_meta.append((t.shape, t.dtype, t.device, t.requires_grad, t.is_leaf, created_by,
                                 None if base is None else self._tid(base), alias_of))
        self.tid_of[id(t)] = t_id
        return t_id

    def op_of_seq(self, seq):
        """The op during which the grad_fn node with this sequence number was made, or None."""
        ranges = self.node_ranges
        i = bisect.bisect_right(ranges, (seq, float("inf"))) - 1
        if i >= 0 and ranges[i][0] <= seq < ranges[i][1]:
            return ranges[i][2]
        return None

    def _fail(self, exc):
        self.failure = self.off = "%s: %s" % (type(exc).__name__, exc)

    # -- backward calls -------------------------------------------------------------------------
    def _backward_call(self, func, args, kwargs):
        """backward() and autograd.grad(): inspect the graph first, then run and record the call."""
        __tracebackhide__ = True  # noqa: F841
        watch = None
        try:
            tensors = _tensors_in(args, kwargs)
            before = tuple([t._version for t in tensors])
            self._checkpoint_before_backward(func, args, kwargs)
            if self.check_nan:
                watch = nan_watch.NanWatch(self, self.checkpoints[-1][0])
                watch.attach(self.walked_nodes)
            self.walked_nodes = ()
            seq = _next_seq()
        except Exception as exc:  # never let the tool break the user's call
            self.walked_nodes = ()
            if watch is not None:
                watch.detach()
            self._fail(exc)
            return func(*args, **kwargs)
        try:
            result = func(*args, **kwargs)
        except BaseException as exc:
            try:
                self._record(func, tensors, before, None, exc, seq)
            except Exception as inner:
                self._fail(inner)
            raise
        finally:
            if watch is not None:
                watch.detach()
        try:
            self._record(func, tensors, before, result, None, seq)
            self._note_gradients(func, result)
        except Exception as exc:
            self._fail(exc)
        return result

    def _note_gradients(self, func, result):
        """Flag non-finite gradients of the leaves this backward reached, without a device sync:
        the flags stay device tensors until the block ends (see build.py). Reading every gradient
        costs a pass over its memory, so a long loop checks backward calls 1, 2, 4, 8, ... and the
        last one (at the end of the block): a NaN that spreads to the weights is still found."""
        index = len(self.ops) - 1
        self.backward_count += 1
        if self.backward_count & (self.backward_count - 1):
            self.unchecked_backward = (index, self.walked_leaves)
            self.walked_leaves = ()
            return
        self.unchecked_backward = None
        grads = []
        if func is torch.autograd.grad:
            inputs = self.checkpoints[-1][4]
            grads = [(tid, g) for (tid, _), g in zip(inputs, result or ()) if isinstance(g, _Tensor)]
        else:
            for tid in self.walked_leaves:
                t = self.refs[tid]()
                g = None if t is None else t.grad
                if g is not None and (g.is_floating_point() or g.is_complex()):
                    grads.append((tid, g))
        self.walked_leaves = ()
        if grads:
            self.gradient_flags.append((index, nan_watch.nonfinite_flags(grads)))

    def _checkpoint_before_backward(self, func, args, kwargs):
        """Inspect the graph about to be run: the diagnosis must exist even if backward raises."""
        call = _bind_backward(func, args, kwargs)
        roots = call.get("outputs", call.get("tensors", call.get("self")))
        roots = [roots] if isinstance(roots, _Tensor) else list(roots or ())
        inputs = call.get("inputs")
        inputs = [inputs] if isinstance(inputs, _Tensor) else [t for t in (inputs or ()) if isinstance(t, _Tensor)]
        retain = call.get("retain_graph")
        retain = bool(call.get("create_graph", False)) if retain is None else bool(retain)
        self.retained[len(self.ops)] = retain
        frame = sys._getframe(2)
        while frame is not None and frame.f_code.co_filename.startswith((_TORCH_DIR, _OWN_DIR)):
            frame = frame.f_back
        names = frame_names(frame)
        if names is not None:
            self.note_names(names)
        self.checkpoints.append(graph_snapshot.take(self, roots, len(self.ops), "backward", inputs, retain))

    def note_names(self, namespace):
        for name, value in list(namespace.items()):
            if isinstance(value, _Tensor) and not name.startswith("_"):
                t_id = self.known(value)
                if t_id is not None:
                    self.names.setdefault(t_id, name)


_signatures = {}


def _bind_backward(func, args, kwargs):
    """The arguments of a backward()/autograd.grad() call by parameter name (self, tensors or
    outputs; inputs; retain_graph; create_graph), whichever way they were passed."""
    import inspect

    sig = _signatures.get(func)
    if sig is None:
        sig = _signatures[func] = inspect.signature(func)
    try:
        return sig.bind(*args, **kwargs).arguments
    except TypeError:  # the call itself is wrong: backward will say so
        return {}


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


_CO_OPTIMIZED = 0x0001


def _tensors_in(args, kwargs):
    """The tensors among the arguments, one level into lists and tuples (torch.cat, _foreach_*)."""
    found = []
    _collect(args, found)
    if kwargs:
        _collect(kwargs.values(), found)
    return found


def _collect(values, found):
    for a in values:
        if isinstance(a, _Tensor):
            found.append(a)
        elif isinstance(a, (list, tuple)):
            for b in a:
                if isinstance(b, _Tensor):
                    found.append(b)
