"""The per-operation recorder: a TorchFunctionMode that notes every tensor call of the block.

This is the hot path. It stores flat tuples and does no string formatting or graph work;
everything else happens once, when the block ends (see build.py). It must never raise
anything but the user's own exception: any internal failure switches recording off and the
user's code goes on as if the tool were not there.

Being there must not show either. Our reads of a tensor (`_version`, `shape`, ...) are hidden
from `__torch_function__` subclasses; warnings raised inside a call are re-issued at the line
PyTorch would have blamed without us; a call made near the recursion limit is not recorded
rather than failed; and old ops that cannot matter any more are folded (see `_fold`).
"""
from __future__ import annotations

import bisect
import itertools
import operator
import os
import site
import sys
import sysconfig
import threading
import warnings as _warnings
import weakref
from array import array

import torch
from torch.nn.modules import module as _nn_module
from torch.optim import optimizer as _optim_module
from torch.overrides import TorchFunctionMode
from torch.utils.hooks import RemovableHandle as _RemovableHandle

from . import debuggers, distributed
from . import graph as graph_snapshot
from . import nan_watch
from .kept import KeptTensors
from .graph import byte_range
from .graph import shape_in_parts as _shape_in_parts

_TORCH_DIR = os.path.dirname(torch.__file__) + os.sep
# Installed libraries (transformers, timm, ...): an op inside them is named at the user's line that
# called into them, as an op inside torch is.
_LIBRARY_DIRS = tuple(sorted({os.path.join(p, "") for p in
                              [*site.getsitepackages(), sysconfig.get_paths()["purelib"],
                               sysconfig.get_paths()["platlib"]] if p}))
_OWN_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep
_CAPTURE_DIR = os.path.dirname(os.path.abspath(__file__)) + os.sep
_OVERRIDES_FILE = os.path.abspath(torch.overrides.__file__)
_Tensor = torch.Tensor
_Parameter = torch.nn.Parameter
_DATA_GETTER = torch.Tensor.data.__get__
_GETTER_TYPE = type(_DATA_GETTER)
_REQUIRES_GRAD_SETTER = torch.Tensor.requires_grad.__set__  # `p.requires_grad = False` freezes: an op
# `t.data = new` swaps the memory behind `t` without a version bump: recorded as a write of `t` (_swap_data).
_DATA_SETTER = torch.Tensor.data.__set__
_BACKWARD_FUNCS = {torch.Tensor.backward, torch.autograd.backward, torch.autograd.grad}
# Ops whose records folding never drops (`.data`, backward calls): the first function ids.
_KEPT_FUNCS = (_DATA_GETTER, torch.Tensor.backward, torch.autograd.backward, torch.autograd.grad)
_is_compiling = torch.compiler.is_compiling
_tracing_state = torch._C._get_tracing_state  # not None while torch.jit.trace runs
_next_seq = torch._C._autograd._get_sequence_nr  # the sequence number the next grad_fn node gets
_grad_enabled = torch.is_grad_enabled
_hidden_from_subclasses = torch._C.DisableTorchFunctionSubclass
_version_of = operator.attrgetter("_version")
_weakref = weakref.ref
_getframe = sys._getframe
_warnings_dict = _warnings.__dict__
_SEQUENCES = (list, tuple)
_all_torch_function_off = torch._C.DisableTorchFunction  # modes too: our hooks' reads are no ops
_STEPPING = "inside an optimizer step"  # recorder.off while one runs (Recorder.begin_step)
_stack_length = torch._C._len_torch_function_stack
_stack_at = torch._C._get_function_stack_at
_pop_stack = torch._C._pop_torch_function_stack
_push_stack = torch._C._push_on_torch_function_stack
_PROFILER_ENTER = torch.ops.profiler._record_function_enter_new
_PROFILER_EXIT = torch.ops.profiler._record_function_exit._RecordFunction
# Not recorded by the hot path: backward calls and `.data =` (each recorded by a method of its own:
# _backward_call, _swap_data) and the profiler scopes that torch opens around optimizer steps and
# module calls (they touch no tensor).
_NOT_RECORDED = frozenset(_BACKWARD_FUNCS | {_DATA_SETTER, _PROFILER_ENTER, _PROFILER_EXIT})
_SCALARS = frozenset({int, float, bool, complex, type(None), str, torch.dtype, torch.device, torch.Size})

# An op record is a flat tuple (cheap to build, invisible to the cyclic GC's hot lists):
# (function id (Recorder.funcs), code, lineno, input tids, versions before, versions after, output tids,
#  (first, end) sequence numbers of the grad_fn nodes it made or None, written byte ranges or None,
#  grad enabled, error or None)
# An error is (type name, message), with the tids given as `out=` after them when there were some.
# A write is (tid, byte range): its version counter moved, or (`t.data = new`) its memory was swapped.
# A version is None for an inference tensor, which has no version counter.
OP_FUNC, OP_CODE, OP_LINE, OP_IN, OP_VB, OP_VA, OP_OUT, OP_SEQ, OP_WR, OP_GRAD, OP_ERR = range(11)

thread_state = threading.local()  # .recorder: the Recorder active in this thread, if any


class _BlockEnded:
    __slots__ = ()

    def __repr__(self):
        return "the block has ended"


# Recorder.off once its block has ended (lifecycle.release); the with statement's watch sets it to
# a dead weak reference instead (lifecycle.watch_block). Any `off` that is not None or a str.
BLOCK_ENDED = _BlockEnded()


def block_has_ended(recorder) -> bool:
    off = recorder.off
    return off is not None and off.__class__ is not str


def _after_block(recorder):
    """A call through a recorder whose block has ended without its thread taking it back."""
    from . import lifecycle  # rare: once such a block ended, its first call heals what it can

    try:
        lifecycle.heal(recorder)
    except Exception:  # never let the tool break the user's call; the next capture tries again
        pass
_Function = torch.autograd.function.Function
_original_apply = _Function.__dict__["apply"]


def _recording_apply(cls, *args, **kwargs):
    """Custom autograd.Function.apply is no torch function: record it as one op of the caller."""
    __tracebackhide__ = True  # noqa: F841
    bound = _original_apply.__get__(None, cls)
    if _is_compiling():  # Dynamo traces this wrapper: leave it nothing of ours to trace
        return bound(*args, **kwargs)
    recorder = getattr(thread_state, "recorder", None)
    if recorder is not None and recorder.step_popped:
        _resume(recorder)
    if recorder is None or recorder.off is not None:
        return bound(*args, **kwargs)
    first = len(recorder.ops)
    try:
        return recorder.__torch_function__(bound, (), args, kwargs)
    finally:
        recorder.note_function_call(first)


def _enter_module(module, args):
    # Dynamo traces global module hooks: a hook that reads frames or keeps the module breaks its
    # graph (and fullgraph=True raises). is_compiling() is a constant to Dynamo, so this returns.
    if _is_compiling():
        return None
    recorder = getattr(thread_state, "recorder", None)
    if recorder is not None and recorder.step_popped:
        _resume(recorder)
    if recorder is not None and recorder.off is None:
        if not recorder.module_path and id(module) not in recorder.module_call_sites:
            # The user's line that called the model (`logits = model(x)`): its name for the model. Only
            # a line that calls it itself: `trainer.train()` runs the model from inside a library.
            frame = _module_caller(recorder, direct=True)
            if frame is not None:
                recorder.module_call_sites[id(module)] = (frame.f_code.co_filename, frame.f_lineno,
                                                          _call_columns(frame))
        recorder.module_path = recorder.module_path + (module,)
        recorder.modules[id(module)] = module
        if _is_user_module(module):
            # A forward the user wrote runs its ops at its own lines: the caller's line is kept, to
            # name what the call returns (`fake = G(z)`) and to say where the module was called.
            frame = _module_caller(recorder)
            if frame is not None:
                try:
                    inputs = recorder.argument_tids(args)
                except Exception as exc:  # never let the tool break the user's call; lose only this
                    inputs = ()
                    recorder.lose("reading the arguments of the call of %s at %s" % (
                        type(module).__name__, _place(frame.f_code, frame.f_lineno)), exc,
                        "the tensors passed to that call are not linked to it")
                recorder.open_calls.append((module, frame.f_code, frame.f_lineno, frame.f_lasti,
                                            len(recorder.ops), recorder.module_path, inputs))


_WRAPPED_CALL_CODE = _nn_module.Module._wrapped_call_impl.__code__


def _module_caller(recorder, direct=False):
    """The innermost frame of user code above the module call that runs our pre-hook (with
    `direct`, only if that frame makes the call itself, else None). Walking there frame by frame
    makes a frame object of each frame passed; the hook runs four frames below the call (inner,
    _call_impl, _wrapped_call_impl), so the walk starts there when the stack is as expected, and
    from the hook's caller otherwise."""
    try:
        frame = _getframe(4)  # _module_caller, _enter_module, inner, _call_impl: _wrapped_call_impl
    except ValueError:
        frame = None
    frame = frame.f_back if frame is not None and frame.f_code is _WRAPPED_CALL_CODE else _getframe(2)
    kinds = recorder.internal_code
    while frame is not None:
        entry = kinds.get(id(frame.f_code)) or recorder._code_entry(frame)
        if not entry[1]:
            return frame
        if direct:
            return None
        frame = frame.f_back
    return None


def _is_user_module(module) -> bool:
    """Whether the module's forward is the user's code (not torch's, not an installed library's)."""
    cls = type(module)
    known = _user_module_types.get(cls)
    if known is None:
        code = getattr(getattr(cls, "forward", None), "__code__", None)
        known = _user_module_types[cls] = code is not None and not _frame_kind(code.co_filename)
    return known


_user_module_types = {}  # type -> whether its forward is user code (classes are few, and live long)


def _call_columns(frame):
    """(first, end) UTF-8 columns of the call a frame is making, where Python knows them (3.11+)
    and it fits on its line: `losses.append(model(x).sum())` calls the model at `model(x)`."""
    return call_columns(frame.f_code, frame.f_lineno, frame.f_lasti)


def call_columns(code, line, lasti):
    """_call_columns for a frame's (code, line, last instruction), read later (build.py): the
    positions are a walk over the code's instructions, too slow for every module call."""
    span = call_span(code, lasti)
    if span is None or span[0] != line or span[2] != line:
        return None
    return (span[1], span[3])


def call_span(code, lasti):
    """(first line, first column, end line, end column) of the call a frame is making (UTF-8
    columns), where Python knows them (3.11+): a call may be written over several lines."""
    try:
        first_line, end_line, first, end = next(itertools.islice(code.co_positions(), lasti // 2, None))
    except (AttributeError, StopIteration, ValueError, TypeError):
        return None
    if first_line is None or end_line is None or first is None or end is None:
        return None
    return (first_line, first, end_line, end)


_record_function = torch.autograd.profiler.record_function
_original_scope_exit = _record_function.__dict__["__exit__"]
_STEP_SCOPE = "Optimizer.step#"  # torch's name for the profiler scope around every optimizer step


def _leaving_profiler_scope(self, exc_type, exc_value, traceback):
    """record_function.__exit__ while we capture: a step that took our mode off the stack and
    raises leaves through its profiler scope (its post-hook does not run). Our mode goes back
    on the stack there, so that the calls after a caught failure are recorded."""
    try:
        if exc_type is not None:
            recorder = getattr(thread_state, "recorder", None)
            if (recorder is not None and recorder.step_popped
                    and str(getattr(self, "name", "")).startswith(_STEP_SCOPE)):
                try:
                    recorder.end_step()
                except Exception as exc:  # never let the tool break the user's call
                    recorder._fail(exc)
    finally:  # the scope is closed whatever happened above (an interrupt included)
        result = _original_scope_exit(self, exc_type, exc_value, traceback)
    return result


_inference_mode = torch.autograd.grad_mode.inference_mode
_original_inference_enter = _inference_mode.__dict__["__enter__"]
_original_inference_exit = _inference_mode.__dict__["__exit__"]


def _inference_mode_switch():
    """Stands for entering or leaving torch.inference_mode in an op record (no torch function runs)."""


_inference_mode_switch.__module__, _inference_mode_switch.__qualname__ = "torch", "inference_mode"


def _entering_inference_mode(self):
    """inference_mode.__enter__ while we capture: a grad-mode switch like torch.set_grad_enabled, which
    (unlike it) calls no torch function, so it is recorded here. A `with` block, a decorated function,
    or a generator suspended inside the block: the switch is where graph recording stopped."""
    __tracebackhide__ = True  # noqa: F841
    result = _original_inference_enter(self)
    _note_switch()
    return result


def _leaving_inference_mode(self, exc_type, exc_value, traceback):
    __tracebackhide__ = True  # noqa: F841
    try:
        return _original_inference_exit(self, exc_type, exc_value, traceback)
    finally:
        _note_switch()


def _note_switch():
    if _is_compiling():  # see _enter_module
        return
    recorder = getattr(thread_state, "recorder", None)
    if recorder is not None and recorder.off is None:
        try:
            recorder.record_switch(_inference_mode_switch)
        except Exception as exc:  # never let the tool break the user's block
            recorder._fail(exc)


def _resume(recorder):
    try:
        recorder.resume_after_failed_step()
    except Exception as exc:  # never let the tool break the user's call
        recorder._fail(exc)


def _leave_module(module, args, output):
    if _is_compiling():  # see _enter_module
        return None
    recorder = getattr(thread_state, "recorder", None)
    if recorder is not None and recorder.module_path and recorder.module_path[-1] is module:
        recorder.module_path = recorder.module_path[:-1]
        if recorder.open_calls and recorder.open_calls[-1][0] is module:
            try:
                recorder.end_call(output)
            except Exception as exc:  # never let the tool break the user's call
                recorder._fail(exc)


def _before_optimizer_step(optimizer, args, kwargs):
    """Note the parameters an optimizer updates (the missing-grad rule asks which ones got none),
    and record the step as one op (see Recorder.begin_step)."""
    if _is_compiling():  # a compiled step (see _enter_module)
        return None
    recorder = getattr(thread_state, "recorder", None)
    if recorder is None or (recorder.off is not None and recorder.off is not _STEPPING):
        return None
    try:
        with _all_torch_function_off():  # the mode is on in a hook: our reads would be recorded
            for group in optimizer.param_groups:
                for p in group["params"]:
                    if isinstance(p, _Tensor):
                        t_id = recorder._tid(p)
                        recorder.optimized.add(t_id)
                        if p.grad is not None:  # it got one, whatever ran the backward (see stepped_with_grad)
                            recorder.stepped_with_grad.add(t_id)
        recorder.begin_step(optimizer, args, kwargs)
    except Exception as exc:  # never let the tool break the user's step
        recorder._fail(exc)
    return None


def _after_optimizer_step(optimizer, args, kwargs):
    if _is_compiling():
        return None
    recorder = getattr(thread_state, "recorder", None)
    if recorder is not None and recorder.off is _STEPPING and recorder.step[5] is optimizer:
        try:
            recorder.end_step()
        except Exception as exc:  # never let the tool break the user's step
            recorder._fail(exc)
    return None


# -- process-wide hooks, shared by every capture of every thread ---------------------------------
_hook_users = [0]
_installed_hooks = []  # (torch's hook dict, our key, its always-call dict or None) of the hooks in place now


def _hook_table():
    """(torch's global hook dict, our hook, its always-call dict or None); our keys, which torch
    reserves for us once, are in _HOOK_KEYS. The entries go straight into torch's dicts: the
    register functions and RemovableHandle cost 54 us at every block's start and end with the
    caches cold (a training loop's step after a collection), direct entries 14."""
    nn_module, optim_module = _nn_module, _optim_module
    table = [(nn_module._global_forward_pre_hooks, _enter_module, None),
             (nn_module._global_forward_hooks, _leave_module, nn_module._global_forward_hooks_always_called),
             (optim_module._global_optimizer_pre_hooks, _before_optimizer_step, None),
             (optim_module._global_optimizer_post_hooks, _after_optimizer_step, None)]
    if not _HOOK_KEYS:
        first = _RemovableHandle.next_id  # ids torch will never hand out again
        _RemovableHandle.next_id = first + len(table)
        _HOOK_KEYS[:] = range(first, first + len(table))
    return table


_HOOK_KEYS = []
_original_has_any_global_hook = _nn_module._has_any_global_hook
_overrides = torch.overrides
_original_has_torch_function = _overrides.has_torch_function


def _has_torch_function_but_ours(relevant_args):
    """torch.overrides.has_torch_function as if our mode were not on the stack. nn.MultiheadAttention
    and nn.Transformer* take their fused fast path (eval, no grad) only when it says False, and
    any mode on the stack makes it say True: their slow path gives other values (padded positions,
    rounding). With another mode on the stack, that mode still counts."""
    if _stack_length() == 1 and isinstance(_stack_at(0), Recorder):
        mode = _pop_stack()
        try:
            return _original_has_torch_function(relevant_args)
        finally:
            _push_stack(mode)
    return _original_has_torch_function(relevant_args)


def _has_any_global_hook_but_ours():
    """torch.compile(module) warns at every call when global module hooks exist (they would fire
    once more for its wrapper). Ours fire for it harmlessly: only the user's own hooks count."""
    ours = _HOOK_KEYS
    for table in (_nn_module._global_backward_pre_hooks, _nn_module._global_backward_hooks,
                  _nn_module._global_forward_pre_hooks, _nn_module._global_forward_hooks,
                  _nn_module._global_forward_hooks_always_called, _nn_module._global_forward_hooks_with_kwargs):
        for key in table:
            if key not in ours:
                return True
    return False


def install_hooks():
    """Hooks for the whole capture: custom Function.apply, a step's profiler scope, inference mode's
    switches, the nn.Module call stack (so that large graphs can be grouped by module), optimizer
    steps, and debuggers' stop_here (debuggers.py). Forward hooks change no result; always-call keeps
    the stack right when a forward raises.

    All or nothing: if one cannot be installed, those already installed are removed and the
    error is raised. Callers hold interrupts (see capture) while this runs."""
    if _hook_users[0] == 0:
        try:
            _Function.apply = classmethod(_recording_apply)
            _record_function.__exit__ = _leaving_profiler_scope
            _inference_mode.__enter__, _inference_mode.__exit__ = _entering_inference_mode, _leaving_inference_mode
            _nn_module._has_any_global_hook = _has_any_global_hook_but_ours
            _overrides.has_torch_function = _has_torch_function_but_ours
            distributed.install()  # notes the line that builds a DistributedDataParallel
            debuggers.install()
            for (hooks, hook, always_called), key in zip(_hook_table(), _HOOK_KEYS):
                _installed_hooks.append((hooks, key, always_called))
                hooks[key] = hook
                if always_called is not None:
                    always_called[key] = True
        except BaseException:
            _remove_all_hooks()
            raise
    _hook_users[0] += 1


def remove_hooks():
    """Undo install_hooks once its last user is done. Every step is tried even if one fails;
    the first failure is raised after all of them."""
    _hook_users[0] = max(0, _hook_users[0] - 1)
    if _hook_users[0] == 0:
        _remove_all_hooks()


def _remove_all_hooks():
    failure = None
    try:
        _Function.apply = _original_apply
    except BaseException as exc:
        failure = exc
    try:
        _record_function.__exit__ = _original_scope_exit
    except BaseException as exc:
        failure = failure or exc
    try:
        distributed.remove()
    except BaseException as exc:
        failure = failure or exc
    try:
        _inference_mode.__enter__, _inference_mode.__exit__ = _original_inference_enter, _original_inference_exit
    except BaseException as exc:
        failure = failure or exc
    try:
        _nn_module._has_any_global_hook = _original_has_any_global_hook
        _overrides.has_torch_function = _original_has_torch_function
    except BaseException as exc:
        failure = failure or exc
    try:
        debuggers.remove()
    except BaseException as exc:
        failure = failure or exc
    while _installed_hooks:
        hooks, key, always_called = _installed_hooks[-1]
        try:
            hooks.pop(key, None)
            if always_called is not None:
                always_called.pop(key, None)
        except BaseException as exc:
            failure = failure or exc
            for table in (hooks, always_called or {}):  # the plainest removal, by hand
                try:
                    if key in table:
                        del table[key]
                except BaseException:
                    pass
        finally:
            _installed_hooks.pop()
    if failure is not None:
        raise failure


class NodeRanges:
    """The grad_fn sequence numbers [first, end) each op made, with the op's index, in op order:
    three columns of machine ints (24 bytes an op, where a tuple of three ints cost about 150; a
    training loop adds several per step, for the whole block)."""

    __slots__ = ("firsts", "ends", "indices")

    def __init__(self, rows=()):
        self.firsts, self.ends, self.indices = array("q"), array("q"), array("q")
        for first, end, index in rows:
            self.add(first, end, index)

    def add(self, first, end, index):
        self.firsts.append(first)
        self.ends.append(end)
        self.indices.append(index)

    def __len__(self):
        return len(self.indices)

    def __iter__(self):
        return zip(self.firsts, self.ends, self.indices)

    def op_of_seq(self, seq):
        """The op during which the node with this sequence number was made, or None (the last
        range starting at or before it, if it holds it)."""
        firsts = self.firsts
        i = bisect.bisect_right(firsts, seq) - 1
        if i >= 0 and seq < self.ends[i]:
            return self.indices[i]
        return None

    def of_op(self, index):
        """(first, end) of the nodes op `index` made, or None."""
        indices = self.indices
        i = bisect.bisect_left(indices, index)
        if i < len(indices) and indices[i] == index:
            return (self.firsts[i], self.ends[i])
        return None

    def in_order(self):
        """Whether the ranges are sorted by first sequence number (a custom Function records its
        inner calls first, then its own range around them)."""
        firsts = self.firsts
        return all(firsts[i] <= firsts[i + 1] for i in range(len(firsts) - 1))


class FoldedNodes:
    """Key ranges [first, end) of graph nodes that _fold dropped, with the backward calls that ran
    them, in key order: columns of machine ints (a training loop adds one range per step), the
    calls as one index where one call ran them (almost always), else in `several`."""

    __slots__ = ("firsts", "ends", "ran_by", "several")

    def __init__(self, rows=()):
        self.firsts, self.ends, self.ran_by, self.several = array("q"), array("q"), array("q"), {}
        for first, end, ran_by in rows:
            self.add(first, end, ran_by)

    def add(self, first, end, ran_by):
        """Add a range; one that continues the last with the same calls extends it."""
        n = len(self.firsts)
        if n and self.ends[n - 1] == first and self._runs(n - 1) == ran_by:
            self.ends[n - 1] = end
            return
        at = n if not n or self.firsts[n - 1] <= first else bisect.bisect_right(self.firsts, first)
        if at < n:  # an outer custom Function's range, dropped after its inner ones': keep key order
            self.several = {(i + 1 if i >= at else i): runs for i, runs in self.several.items()}
        self.firsts.insert(at, first)
        self.ends.insert(at, end)
        if len(ran_by) == 1:
            self.ran_by.insert(at, ran_by[0])
        else:
            self.ran_by.insert(at, -1)
            self.several[at] = ran_by

    def _runs(self, i):
        single = self.ran_by[i]
        return (single,) if single >= 0 else self.several[i]

    def __len__(self):
        return len(self.firsts)

    def __iter__(self):
        return ((self.firsts[i], self.ends[i], self._runs(i)) for i in range(len(self.firsts)))

    def runs_of(self, key):
        """The backward calls that ran the dropped node `key`, or () for any other node."""
        i = bisect.bisect_right(self.firsts, key) - 1
        if i >= 0 and key < self.ends[i]:
            return self._runs(i)
        return ()


# In the record of a folded op that made nodes: its range is in node_ranges (NodeRanges.of_op), so
# that the record itself can be shared by every folded op of its line.
NODES_IN_RANGES = (-1, -1)

_FOLD_EVERY = 4096  # ops between two folding passes; the first and the latest such window stay whole


class Recorder(TorchFunctionMode):
    def __init__(self, check_nan=False):
        super().__init__()
        self.check_nan = check_nan     # watch backward nodes for the first non-finite gradient
        self.ops = []
        self.tensor_meta = []          # per tid: (shape tuple, dtype, device, requires_grad, is_leaf, created_by, base tid, data alias of)
        self.tid_of = {}               # id(tensor) -> tid (check refs: ids are reused)
        self.refs = []                 # per tid: a weak reference to the tensor
        self.last_write = -1           # index of the last op that wrote a tensor
        self.internal_code = {}        # id(code) -> (code, _USER, _INTERNAL (torch, us) or _LIBRARY (site-packages))
        self.user_globals = {}         # id(dict) -> globals dict of user frames (names, resolved at the end)
        self.node_ranges = NodeRanges()  # (first, end) grad_fn sequence numbers made by an op, and its index
        self.checkpoints = []          # graph snapshots taken before each backward call
        self.names = {}                # tid -> name, from frames seen at backward calls
        self.graph_nodes = {}          # node key -> (name, input keys, leaf tid, backward op indices, last seen)
        self.retained = {}             # backward op index -> whether that call kept the graph's buffers
        self.walked_nodes = ()         # grad_fn nodes of the last backward's walk (for check_nan), dropped at once
        self.walked_leaves = ()        # tids of the leaves that walk reached
        self.gradient_norms = []       # (backward op index, [(tid, gradient norm: a float, or a 0-d device tensor)])
        self.backward_count = 0        # backward() calls so far (autograd.grad ones too)
        self.unchecked_backward = None  # (op index, leaf tids) of the last backward, if its gradients were not checked
        self.nan_origin = None         # with check_nan: where backward first made a NaN/Inf (nan_watch.py)
        self.nonfinite = {}            # at the end: tid -> index of the first backward that left its grad non-finite
        self.param_owner = {}          # at the end: parameter tid -> name of the outermost module that holds it
        self.failure = None            # why recording stopped, if it did
        self.off = None                # a str while paused or after a failure; not a str once the block has ended
        self.module_path = ()          # the nn.Modules whose forward is running, outermost first
        self.modules = {}              # id(module) -> module, for naming at the end of the block
        self.module_call_sites = {}    # id(outermost module) -> (filename, line, columns or None) of the user's call
        self.op_modules = {}           # op index -> module path, for ops run inside a forward
        self.open_calls = []           # user-written modules running now: (module, caller's code, line, lasti, first op, path, input tids)
        self.user_calls = {}           # first op index -> [(code, line, lasti, end op, output tids, path, input tids)]
        self.optimized = set()         # tids of the parameters of every optimizer stepped in the block
        self.parameters = set()        # tids of the nn.Parameters seen
        # ... and of those it stepped with a gradient: one may have come from a backward we never
        # see (reentrant checkpointing runs its own inside the engine), for a model dead by the end.
        self.stepped_with_grad = set()
        self.too_deep = 0              # calls not recorded: they ran too close to the recursion limit
        self.folded = 0                # ops whose details were dropped (see _fold)
        self.folded_upto = _FOLD_EVERY  # ops before this index have been looked at by _fold
        self.fold_at = 3 * _FOLD_EVERY  # the next pass: one window at a time, one window behind
        self.freeing_backwards = set()  # op indices of backward calls that free their graph (no retain_graph)
        self.write_positions = []      # op indices that wrote, in order, up to folded_upto (see _fold_checkpoints)
        self.checkpoints_folded = 1    # checkpoints before this position were looked at by _fold_checkpoints
        self.folded_backwards = 0      # backward calls whose saved-tensor slots were dropped
        # An op record names its function by index into `funcs`: a record holding the function itself
        # would stay tracked by the cyclic GC, and every full collection of a long loop walks them all.
        self.funcs = list(_KEPT_FUNCS)
        self.func_ids = {f: i for i, f in enumerate(self.funcs)}
        # Made by the first folding pass (most blocks never fold; every block would pay for them):
        self.folded_nodes = ()         # FoldedNodes: key ranges of nodes _fold dropped, with the calls that ran them
        self.folded_created = ()       # array: per tid, for rows _fold shared, the op that made it, or -1
        self.interned_rows = {}        # equal tensor_meta rows of folded tensors, kept once
        self.shared_tuples = {}        # equal tuples of tids in kept records (see _shared)
        self.step = None               # while an optimizer step runs: what begin_step noted (one op)
        self.step_depth = 0            # profiler scopes opened inside that step
        self.step_popped = False       # our mode is off the stack while that step runs (begin_step)
        self.unrecorded_after_step = None  # (code, line) of a step that raised and was caught: see resume
        self.kept = KeptTensors()      # tensors with history still alive at a later backward call
        # Per custom autograd.Function call whose forward ran recorded ops: its first such op and
        # its own op, flat. A forward runs with grad off because the call runs it.
        self.function_calls = array("q")
        self.installation = None       # what its block installed (lifecycle.Installation)
        self.block_watch = None        # the with statement's watch on the block's end (lifecycle.watch_block)

    # -- hot path -----------------------------------------------------------------------------
    # Written for speed: every line here runs for every tensor call of the block. C-level loops
    # (map with attrgetter) replace comprehensions, and kwargs stay None when there are none.
    def __torch_function__(self, func, types, args=(), kwargs=None):
        __tracebackhide__ = True  # noqa: F841  (IPython hides this frame in tracebacks)
        off = self.off
        if off is not None:
            if off is not _STEPPING:
                if off.__class__ is not str:  # its block has ended: see block_has_ended
                    _after_block(self)
                return func(*args, **kwargs) if kwargs else func(*args)
            if func is _PROFILER_EXIT or func is _PROFILER_ENTER:
                try:
                    self._step_profiler_event(func)
                except Exception as exc:  # never let the tool break the user's call
                    self._fail(exc)
        global _real_filters, _real_show
        w = _warnings
        relocate = w.filters is not _SHOW_ALL  # else a call of ours further up already re-routes them
        if relocate:
            _real_filters, _real_show = w.filters, w._showwarnmsg
        # A property read is not an op; inside an optimizer step, the step is the op (end_step).
        passthrough = ((type(func) is _GETTER_TYPE and func != _DATA_GETTER and func != _REQUIRES_GRAD_SETTER
                        and func != _DATA_SETTER) or self.off is _STEPPING)
        if passthrough or func in _NOT_RECORDED or _is_compiling() or _tracing_state() is not None:
            if relocate:
                w.filters, w._showwarnmsg = _SHOW_ALL, _show_at_user_line
            try:
                if not passthrough and func in _BACKWARD_FUNCS:
                    if kwargs is None:
                        kwargs = {}
                    index, frees = len(self.ops), _frees_graph(func, args, kwargs)
                    result = self._backward_call(func, args, kwargs)
                    if frees:  # and it ran: its graph's buffers are gone
                        self.freeing_backwards.add(index)
                    return result
                if not passthrough and func == _DATA_SETTER and not _is_compiling() and _tracing_state() is None:
                    return self._swap_data(func, args)
                return func(*args, **kwargs) if kwargs else func(*args)
            except BaseException as exc:
                _drop_leading_own_frames(exc)
                raise
            finally:
                if relocate:  # written out: a call would be one more place for an interrupt to land
                    if w.filters is _SHOW_ALL and len(_SHOW_ALL) == 1:
                        w.filters, w._showwarnmsg = _real_filters, _real_show
                    else:
                        _put_back_warnings()
        try:
            tensors = _tensors_in(args, kwargs)
            if types:  # a Tensor subclass with its own __torch_function__: it must not see our reads
                with _hidden_from_subclasses():
                    before = _versions(tensors)
            else:
                before = _current_versions(tensors)
            seq = _next_seq()
        except RecursionError:  # too deep for our own bookkeeping: run the call, unrecorded
            self.too_deep += 1
            return func(*args, **kwargs) if kwargs else func(*args)
        except Exception as exc:  # never let the tool break the user's call
            self._fail(exc)
            return func(*args, **kwargs) if kwargs else func(*args)
        try:
            if relocate:  # stored into the module's dict: the same as setting its attributes, cheaper
                wd = _warnings_dict
                wd["filters"], wd["_showwarnmsg"] = _SHOW_ALL, _show_at_user_line
                try:
                    result = func(*args, **kwargs) if kwargs else func(*args)
                finally:
                    if w.filters is _SHOW_ALL and len(_SHOW_ALL) == 1:
                        wd["filters"], wd["_showwarnmsg"] = _real_filters, _real_show
                    else:
                        _put_back_warnings()
            else:
                result = func(*args, **kwargs) if kwargs else func(*args)
        except BaseException as exc:
            _drop_leading_own_frames(exc)
            try:
                if types:
                    with _hidden_from_subclasses():
                        self._record(func, tensors, before, None, exc, seq)
                else:
                    self._record(func, tensors, before, None, exc, seq)
                if kwargs and kwargs.get("out") is not None:
                    self._note_out_arguments(kwargs["out"])
            except RecursionError:
                self.too_deep += 1
            except Exception as inner:
                self._fail(inner)
            raise
        try:
            if types:
                with _hidden_from_subclasses():
                    self._record(func, tensors, before, result, None, seq)
            else:
                self._record(func, tensors, before, result, None, seq)
        except RecursionError:
            self.too_deep += 1
        except Exception as exc:
            self._fail(exc)
        return result

    def _record(self, func, tensors, before, result, error, seq_start):
        seq_end = _next_seq()
        after = _current_versions(tensors)
        ops = self.ops
        index = len(ops)
        written = None
        if after != before:
            tid = self._tid
            written = tuple((tid(t), self.range_written(t)) for t, b, a in zip(tensors, before, after) if a != b)
            self.last_write = index
        else:
            after = before  # one tuple for both: most calls write nothing
        outputs, seq = (), None
        if seq_end != seq_start:  # grad_fn nodes were made during this call: [start, end)
            seq = (seq_start, seq_end)
            self.node_ranges.add(seq_start, seq_end, index)
        # Tids, with known() written out: an id can be reused once its tensor is gone, the weak
        # reference tells the same tensor from a new one at the same address. Outputs first,
        # then inputs (an in-place call on a tensor new to us is where it was "created").
        tid_of, refs = self.tid_of, self.refs
        if result is not None:
            if isinstance(result, _Tensor):
                t_id = tid_of.get(id(result))
                if t_id is None or refs[t_id]() is not result:
                    t_id = self._register(result, index, self._tid(tensors[0]) if func == _DATA_GETTER else None)
                outputs = (t_id,)
            elif isinstance(result, _SEQUENCES):
                outs = [r for r in result if isinstance(r, _Tensor)]
                if outs:
                    alias_of = self._tid(tensors[0]) if func == _DATA_GETTER else None
                    out_ids = []
                    for out in outs:
                        t_id = tid_of.get(id(out))
                        if t_id is None or refs[t_id]() is not out:
                            t_id = self._register(out, index, alias_of)
                        out_ids.append(t_id)
                    outputs = tuple(out_ids)
        code, line = self._user_line(_getframe(2))
        if self.module_path:
            self.op_modules[index] = self.module_path
        in_ids = []
        for t in tensors:
            t_id = tid_of.get(id(t))
            if t_id is None or refs[t_id]() is not t:
                t_id = self._register(t, None, None)
            in_ids.append(t_id)
        func_id = self.func_ids.get(func)
        if func_id is None:
            func_id = self._new_func_id(func)
        ops.append((func_id, code, line, tuple(in_ids), before, after, outputs, seq,
                    written, _grad_enabled(), None if error is None else (type(error).__name__, str(error))))
        if index >= self.fold_at:
            self._fold(index - _FOLD_EVERY)

    def record_switch(self, func):
        """A grad-mode switch that calls no torch function (entering or leaving inference mode): an op
        with no tensors, at the user's line, with the mode it left."""
        with _hidden_from_subclasses():
            self._record(func, [], (), None, None, _next_seq())

    def _note_out_arguments(self, out):
        """A call given `out=` raised (with grad on, PyTorch refuses it when an argument requires
        grad): its error keeps the tids of the tensors it was to write, which a failed call did not."""
        with _hidden_from_subclasses():
            tids = tuple(self._tid(t) for t in (out if isinstance(out, _SEQUENCES) else (out,))
                         if isinstance(t, _Tensor))
        rec = self.ops[-1]
        if tids and rec[OP_ERR] is not None:
            self.ops[-1] = rec[:OP_ERR] + (rec[OP_ERR] + (tids,),)

    def _swap_data(self, func, args):
        """`t.data = new`: the memory behind the tensor object `t` is replaced and its version counter
        does not move, so PyTorch cannot tell that a graph which saved `t` itself will read other
        values. Recorded as a write of `t` with the bytes it now spans."""
        __tracebackhide__ = True  # noqa: F841
        try:
            tensors = _tensors_in(args, None)
            with _hidden_from_subclasses():
                before = _versions(tensors)
            seq = _next_seq()
        except Exception as exc:  # never let the tool break the user's call
            self._fail(exc)
            return func(*args)
        try:
            result = func(*args)
        except BaseException as exc:
            try:
                with _hidden_from_subclasses():
                    self._record(func, tensors, before, None, exc, seq)
            except Exception as inner:
                self._fail(inner)
            raise
        try:
            with _hidden_from_subclasses():
                self._record(func, tensors, before, result, None, seq)
                rec = self.ops[-1]
                if rec[OP_FUNC] == self.func_ids.get(func) and tensors:
                    swapped = ((self._tid(tensors[0]), byte_range(tensors[0])),)
                    self.ops[-1] = rec[:OP_WR] + (swapped,) + rec[OP_WR + 1:]
                    self.last_write = len(self.ops) - 1
        except Exception as exc:
            self._fail(exc)
        return result

    def _user_line(self, frame):
        """(code, line) of the innermost frame of the user's own code from `frame` outwards; else of
        the innermost library frame (a library's own entry point); else (None, 0)."""
        library = None
        internal = self.internal_code
        while frame is not None:
            code = frame.f_code
            # Keyed by id: hashing a code object is not cached and costs microseconds. The entry
            # holds the code object, so the id cannot be reused while we keep it.
            entry = internal.get(id(code)) or self._code_entry(frame)
            kind = entry[1]
            if not kind:
                return code, frame.f_lineno
            if kind == _LIBRARY and library is None:
                library = frame
            frame = frame.f_back
        if library is not None:  # no user code on the stack (a library's own entry point)
            return library.f_code, library.f_lineno
        return None, 0

    def _code_entry(self, frame):
        """internal_code's entry for a frame's code, met for the first time; the globals of user
        code are kept for naming (see build._namespace_names)."""
        code = frame.f_code
        kind = _frame_kind(code.co_filename)
        if kind == _USER and _made_by_torch_compile(code):
            kind = _INTERNAL
        entry = self.internal_code[id(code)] = (code, kind)
        if not entry[1]:
            self.user_globals.setdefault(id(frame.f_globals), frame.f_globals)
        return entry

    # -- optimizer steps ------------------------------------------------------------------------
    def begin_step(self, optimizer, args, kwargs):
        """Record a step of a torch.optim optimizer as one op: the parameters and state it wrote.
        Its own calls (Adam: ten per parameter, all on the user's `opt.step()` line) run unrecorded;
        they were most of what capture cost in a training step. Not for a step that takes a
        closure (forward and backward run inside it), an optimizer whose step is not torch's own
        (it may write anything), or a differentiable one (its calls make graph nodes)."""
        with _all_torch_function_off():
            tensors = [p for group in optimizer.param_groups for p in group["params"] if isinstance(p, _Tensor)]
            tensors += [v for state in optimizer.state.values() if isinstance(state, dict)
                        for v in state.values() if isinstance(v, _Tensor)]
            versions = _versions(tensors)
        if self.step is not None:  # a step run inside the one being recorded: its writes are part of it
            outer = self.step
            self.step = outer[:1] + (outer[1] + tensors, outer[2] + versions) + outer[3:]
            return
        step = getattr(type(optimizer), "step", None)  # args: (optimizer, closure?)
        if (len(args) > 1 or kwargs or not getattr(step, "__module__", "").startswith("torch.optim.")
                or optimizer.defaults.get("differentiable")):
            return
        self.step = (_step_op(type(optimizer), step), tensors, versions, self._user_line(_getframe(1)),
                     _grad_enabled(), optimizer)
        self.step_depth = 0
        self.off = _STEPPING
        # The step's own calls (a hundred in a small model's SGD step, property reads included) would
        # each pass through Python to be ignored: our mode leaves the stack until the post-hook, and
        # the step runs exactly as without us. Not when a mode of the user's is above ours.
        n = _stack_length()
        if n and _stack_at(n - 1) is self:
            self.step_popped = _pop_stack() is self

    def end_step(self):
        """The step is over: its post-hook ran, or its profiler scope closed as it raised, or (our
        mode off the stack) a hook of ours or the block's end met it still open. Our mode goes
        back on the stack while the block is still recording."""
        # Else the block has ended: stay inert.
        recording = getattr(thread_state, "recorder", None) is self and not block_has_ended(self)
        if self.step_popped:
            self.step_popped = False
            if recording and not _on_stack(self):
                _push_stack(self)
        (func, tensors, before, (code, line), grad, _), self.step = self.step, None
        if recording and self.off is _STEPPING:  # not after a failure, nor once the block has ended
            self.off = None
        with _all_torch_function_off():
            after = _versions(tensors)
            changed = [i for i, (b, a) in enumerate(zip(before, after)) if a != b]
            tids = tuple(self._tid(tensors[i]) for i in changed)
            written = tuple((t_id, self.range_written(tensors[i])) for t_id, i in zip(tids, changed)) or None
        index = len(self.ops)
        if written:
            self.last_write = index
        func_id = self.func_ids.get(func)
        if func_id is None:
            func_id = self._new_func_id(func)
        self.ops.append((func_id, code, line, tids, tuple(before[i] for i in changed),
                         tuple(after[i] for i in changed), (), None, written, grad, None))
        if index >= self.fold_at:
            self._fold(index - _FOLD_EVERY)

    def end_block_inside_step(self, raised):
        """The block ends with a step still open. If our mode is off the stack for it and the
        block did not raise, the step raised and the user caught it: what ran after it was not
        recorded."""
        if self.step_popped and not raised:
            self.unrecorded_after_step = self.step[3]
        self.end_step()

    def resume_after_failed_step(self):
        """Called from our module and Function hooks while a step that took our mode off the stack
        is still open: no torch.optim step calls a module or a custom Function, so the step
        raised (no post-hook ran) and the user caught it. The calls in between were not recorded:
        the trace says so."""
        self.unrecorded_after_step = self.step[3]
        self.end_step()

    def _step_profiler_event(self, func):
        """torch runs a step inside a profiler scope; that scope closing at the depth where the
        step began, with the step still open, means the step raised (no post-hook runs then)."""
        if func is _PROFILER_ENTER:
            self.step_depth += 1
        elif self.step_depth:
            self.step_depth -= 1
        else:
            self.end_step()

    def end_call(self, output):
        """A user-written module returned (see _enter_module): keep its caller's line, the ops it ran
        and the tensors it returned, if it ran any op."""
        _, code, line, lasti, first, path, inputs = self.open_calls.pop()
        end = len(self.ops)
        if end == first:
            return
        if isinstance(output, _Tensor):
            outputs = (self._quiet_tid(output),)
        elif isinstance(output, _SEQUENCES):
            outputs = tuple(self._quiet_tid(t) if isinstance(t, _Tensor) else None for t in output)
        else:
            outputs = ()
        self.user_calls.setdefault(first, []).append((code, line, lasti, end, outputs, path, inputs))

    def argument_tids(self, args):
        """The tids of the tensors among a call's positional arguments, and inside tuples and lists
        of them (an LSTM's `(h, c)`)."""
        tids = []
        for a in args:
            if isinstance(a, _Tensor):
                tids.append(self._quiet_tid(a))
            elif isinstance(a, _SEQUENCES):
                tids.extend(self._quiet_tid(t) for t in a if isinstance(t, _Tensor))
        return tuple(tids)

    def _quiet_tid(self, t):
        """_tid from a hook, where our mode is on: registering a tensor reads it, and those reads
        are no ops of the user's. A tensor already seen (the usual case) reads nothing."""
        t_id = self.tid_of.get(id(t))
        if t_id is not None and self.refs[t_id]() is t:
            return t_id
        with _all_torch_function_off():
            return self._register(t, None, None)

    def note_function_call(self, first):
        """A custom Function's apply, begun when the block had `first` ops, has returned or raised:
        the ops recorded since, but its own (the last), ran inside its forward."""
        call = len(self.ops) - 1
        if call > first and self.off is None:
            self.function_calls.extend((first, call))

    def _new_func_id(self, func):
        self.func_ids[func] = len(self.funcs)
        self.funcs.append(func)
        return len(self.funcs) - 1

    def known(self, t):
        """The tid of a tensor seen before, or None. An id can be reused once its tensor is gone:
        the weak reference tells the same tensor from a new one at the same address."""
        t_id = self.tid_of.get(id(t))
        if t_id is not None and self.refs[t_id]() is t:
            return t_id
        return None

    def _tid(self, t):
        t_id = self.tid_of.get(id(t))
        if t_id is not None and self.refs[t_id]() is t:
            return t_id
        return self._register(t, None, None)

    def _register(self, t, created_by, alias_of):
        base = t._base
        # The base first: registering it takes the next row, which must not be this tensor's.
        base_tid = None if base is None else self._tid(base)
        refs = self.refs
        t_id = len(refs)
        # No t.grad_fn here: a Python wrapper on every node makes PyTorch 2.13 free deep graphs
        # recursively (a segfault past ~40,000 nodes). Names of nodes are read once, at the end.
        # An inference tensor has no version counter (None wherever one is read), but it is looked
        # up again like any other: a loss computed from one is cut off the graph where it was made.
        ref = _weakref(t)
        refs.append(ref)
        # The shape as a plain tuple (as _fold keeps it): a torch.Size stays tracked by the cyclic GC,
        # a tuple of ints does not, and in a long loop every tracked row makes each full collection longer.
        try:
            shape = tuple(t.shape)
        except Exception:
            shape = _shape_in_parts(t)
        self.tensor_meta.append((shape, t.dtype, t.device, t.requires_grad, t.is_leaf, created_by, base_tid,
                                 alias_of))
        if type(t) is _Parameter:
            self.parameters.add(t_id)
        self.tid_of[id(t)] = t_id
        return t_id

    def op_of_seq(self, seq):
        """The op during which the grad_fn node with this sequence number was made, or None."""
        return self.node_ranges.op_of_seq(seq)

    def nodes_of(self, index, rec):
        """(first, end) of the grad_fn nodes op `index` made (its record `rec`), or None."""
        seq = rec[OP_SEQ]
        return self.node_ranges.of_op(index) if seq is NODES_IN_RANGES else seq

    def created_by(self, t_id):
        """The op that made tensor t_id, or None (folded rows keep it in a column of their own)."""
        made = self.tensor_meta[t_id][5]
        if made is None and t_id < len(self.folded_created):
            made = self.folded_created[t_id]
            return made if made >= 0 else None
        return made

    def range_written(self, t):
        """The bytes a write changed (graph.byte_range); None, said in the trace, if they cannot be read."""
        try:
            return byte_range(t)
        except Exception as exc:
            self.lose("reading the memory range of a write at %s" % _place(*self._user_line(_getframe(1))), exc,
                      "writes there are not matched to the saved tensors they may have changed")
            return None

    def lose(self, what, exc, lost):
        """One part of the analysis failed: the rest goes on, and the trace says what was lost."""
        if exc is not None and isinstance(exc, RecursionError):
            self.too_deep += 1
            return
        message = lost_part(what, exc, lost)
        lost_parts = self.__dict__.setdefault("lost_parts", {})
        if message in lost_parts or len(lost_parts) < 20:  # a part failing at every step of a loop: said once
            lost_parts[message] = lost_parts.get(message, 0) + 1

    def _fail(self, exc):
        self.failure = "%s: %s" % (type(exc).__name__, exc)
        if not block_has_ended(self):
            self.off = self.failure

    # -- bounded memory -------------------------------------------------------------------------
    def _fold(self, upto):
        """Drop the details of ops in [folded_upto, upto) that can no longer matter: they wrote
        nothing, raised nothing, every tensor they returned is gone, and the autograd nodes they
        made, if any, were all run by a backward call that freed them (no retain_graph), so no
        later backward or check can need their tensors. Such an op keeps its slot (indices stay
        valid) and one record shared by every folded op of its line (its node range stays in
        node_ranges). A tensor it made keeps a row shared by all equal rows (the op that made it
        moves to folded_created) and loses its weak reference. What was folded is said in the
        trace. Only what lies at least one window behind the newest op is folded, and never the
        first window: the first and the last iterations of a loop stay whole."""
        if type(self.folded_nodes) is not FoldedNodes:  # the first pass
            self.folded_nodes, self.folded_created = FoldedNodes(), array("q")
        ops, refs, metas, shared = self.ops, self.refs, self.tensor_meta, self._folded_records()
        shapes, rows, made_by = self._shapes(), self.interned_rows, self.folded_created
        tuples = self.shared_tuples
        op_modules, nodes, freeing = self.op_modules, self.graph_nodes, self.freeing_backwards
        user_calls = self.user_calls
        folded, droppable = 0, []
        for index in range(self.folded_upto, upto):
            rec = ops[index]
            if rec[OP_WR] is not None and rec[OP_ERR] is None and rec[OP_SEQ] is None:
                # A write keeps its record, but an optimizer writes the same parameters at every
                # step: the tuples naming them are shared between steps, the versions packed.
                ops[index] = rec[:3] + (_shared(tuples, rec[OP_IN]), _packed(rec[OP_VB]), _packed(rec[OP_VA]),
                                        _shared(tuples, rec[OP_OUT]), None, _shared(tuples, rec[OP_WR])) + rec[9:]
                continue
            if rec[OP_WR] is not None or rec[OP_ERR] is not None or rec[OP_FUNC] < len(_KEPT_FUNCS):
                continue
            outs = rec[OP_OUT]
            if any(refs[t]() is not None for t in outs):
                continue
            seq = rec[OP_SEQ]
            if seq is not None:
                entries = [nodes.get(key) for key in range(seq[0], seq[1])]
                if not all(e is not None and any(b in freeing for b in e[3]) for e in entries):
                    continue
                ran_by = tuple(entries[0][3])
                if all(tuple(e[3]) == ran_by for e in entries):
                    droppable.append((seq, ran_by))
            key = (rec[OP_FUNC], rec[OP_CODE], rec[OP_LINE], rec[OP_GRAD], seq is not None)
            small = shared.get(key)
            if small is None:
                small = shared[key] = (rec[OP_FUNC], rec[OP_CODE], rec[OP_LINE], (), (), (), (),
                                       None if seq is None else NODES_IN_RANGES, None, rec[OP_GRAD], None)
            ops[index] = small
            op_modules.pop(index, None)
            user_calls.pop(index, None)
            for t in outs:
                refs[t] = _DEAD
                meta = metas[t]
                shape = shapes.setdefault(tuple(meta[0]), tuple(meta[0]))
                row = (shape,) + meta[1:5] + (None,) + meta[6:]
                if meta[6] is None and meta[7] is None:  # a view's or alias's row names its base: its own
                    row = rows.setdefault(row, row)
                metas[t] = row
                if meta[5] is not None:
                    if len(made_by) <= t:
                        made_by.extend(_NO_OP * (t + 1 - len(made_by)))
                    made_by[t] = meta[5]
            folded += 1
        self.folded += folded
        emptied = self._fold_checkpoints(upto)
        for seq, ran_by in droppable:
            # Nodes that only freeing backward calls ran, all of which found nothing, made by an
            # op whose tensors are gone: only a later walk can meet them again (a carried graph),
            # and all it needs to know is which calls ran them. One key range per step is kept.
            if all(b in emptied for b in ran_by):
                for key in range(seq[0], seq[1]):
                    nodes.pop(key, None)  # an outer custom Function's range holds its inner ops' ranges
                self.folded_nodes.add(seq[0], seq[1], ran_by)
        if emptied:
            self._forget_leaf_runs(emptied)
        # Ids of tensors that are gone: known() and _tid() check the weak reference anyway, and
        # the map would otherwise keep an entry for every address a long loop ever used.
        tid_of = self.tid_of
        for obj_id in [obj_id for obj_id, t_id in tid_of.items() if refs[t_id]() is None]:
            del tid_of[obj_id]
        self.folded_upto = upto
        self.fold_at = upto + 2 * _FOLD_EVERY

    def _forget_leaf_runs(self, emptied):
        """A leaf's AccumulateGrad is run by every backward of a loop: its list of runs would grow
        by one per step for every parameter. Runs by calls whose slots were dropped (they found
        nothing) are forgotten, all but the first (what a freed-graph diagnosis names)."""
        for key, entry in self.graph_nodes.items():
            if key >= 0:
                continue
            runs = entry[3]
            if len(runs) > 1 and any(b in emptied for b in runs[1:]):
                runs[1:] = [b for b in runs[1:] if b not in emptied]

    def _fold_checkpoints(self, upto):
        """Drop the saved-tensor slots of backward calls before `upto` that found nothing: the
        call freed its graph, no slot was stale or freed, and no write since the slots' nodes
        were made overlaps a slot's bytes (a silent `.data` write). Such slots can never take
        part in a diagnosis; the call keeps its roots, inputs and retain flag. The first
        backward of the block stays whole, like the first window of ops."""
        ops, cps, freeing = self.ops, self.checkpoints, self.freeing_backwards
        writes = self.write_positions
        for index in range(self.folded_upto, upto):
            if ops[index][OP_WR] is not None:
                writes.append(index)
        at = self.checkpoints_folded
        emptied = set()
        while at < len(cps) and cps[at][0] < upto:
            cp = cps[at]
            at += 1
            slots = cp[3]
            if not slots or cp[0] not in freeing or any(s[7] or s[8] for s in slots):
                continue
            made = [self.op_of_seq(s[0]) if s[0] >= 0 else None for s in slots]
            since = 0 if None in made else min(made)
            ranges = [s[9] for s in slots if s[9] is not None]
            first = bisect.bisect_left(writes, since)
            last = bisect.bisect_left(writes, cp[0])
            if ranges and any(w[1] is not None and any(w[1][0] < hi and lo < w[1][1] for lo, hi in ranges)
                              for index in writes[first:last] for w in ops[index][OP_WR]):
                continue
            cps[at - 1] = (cp[0], cp[1], tuple(cp[2]), (), tuple(cp[4])) + cp[5:]
            emptied.add(cp[0])
        self.checkpoints_folded = at
        self.folded_backwards += len(emptied)
        return emptied

    def folded_node_runs(self, key):
        """The backward calls that ran a node _fold dropped, or () for any other node."""
        if key < 0 or not self.folded_nodes:
            return ()
        return self.folded_nodes.runs_of(key)

    def _folded_records(self):
        shared = self.__dict__.get("folded_records")
        if shared is None:
            shared = self.folded_records = {}
        return shared

    def _shapes(self):
        shapes = self.__dict__.get("interned_shapes")
        if shapes is None:
            shapes = self.interned_shapes = {}
        return shapes

    # -- a nested capture's share ---------------------------------------------------------------
    def since(self, start):
        """A recorder holding only the ops from index `start` on, for a capture nested in this one
        (one mode records for both). Tensors keep their tids; op indices start again at 0; the
        copy has its own lists, so building it changes nothing here."""
        part = Recorder.__new__(Recorder)
        part.__dict__.update(self.__dict__)
        end = len(self.ops)

        def shift(index):
            return index - start if index is not None and start <= index < end else None

        part.ops = self.ops[start:]
        part.tensor_meta = [meta if meta[5] is None else meta[:5] + (shift(meta[5]),) + meta[6:]
                            for meta in self.tensor_meta]
        part.refs = list(self.refs)
        part.tid_of = dict(self.tid_of)
        part.last_write = self.last_write - start if self.last_write >= start else -1
        part.user_globals = dict(self.user_globals)
        part.modules = dict(self.modules)
        part.node_ranges = NodeRanges((a, b, i - start) for a, b, i in self.node_ranges if i >= start)
        part.folded_created = array("q", [-1 if made < start or made >= end else made - start
                                          for made in self.folded_created])
        part.checkpoints = [(i - start,) + cp[1:] for cp in self.checkpoints if (i := cp[0]) >= start]
        part.graph_nodes = {key: [e[0], e[1], e[2], [b - start for b in e[3] if b >= start], e[4] - start]
                            for key, e in self.graph_nodes.items() if e[4] >= start}
        part.names = dict(self.names)
        part.op_modules = {i - start: path for i, path in self.op_modules.items() if i >= start}
        part.user_calls = {i - start: [c[:3] + (c[3] - start,) + c[4:] for c in calls]
                           for i, calls in self.user_calls.items() if i >= start}
        part.optimized = set(self.optimized)
        part.parameters = set(self.parameters)
        part.stepped_with_grad = set(self.stepped_with_grad)
        part.freeing_backwards = {i - start for i in self.freeing_backwards if i >= start}
        part.too_deep = part.folded = part.folded_backwards = 0
        # The nested block's own backward calls: their gradient norms, in its numbering (a shared
        # list would also take the norms its end adds).
        part.gradient_norms = [(i - start, norms) for i, norms in self.gradient_norms if i >= start]
        part.unchecked_backward = (None if self.unchecked_backward is None or self.unchecked_backward[0] < start
                                   else (self.unchecked_backward[0] - start, self.unchecked_backward[1]))
        part.folded_upto = part.fold_at = sys.maxsize  # nothing more is recorded into it
        part.folded_nodes = FoldedNodes((first, end, tuple(b - start for b in ran_by if b >= start))
                                        for first, end, ran_by in self.folded_nodes)
        for name in ("pointer_index", "pointer_indexed", "folded_records", "interned_shapes"):
            part.__dict__.pop(name, None)
        part.shared_tuples, part.interned_rows = {}, {}
        part.kept = self.kept.shifted(start, end)
        calls = self.function_calls
        part.function_calls = array("q", [index - start for i in range(0, len(calls), 2) if calls[i] >= start
                                          for index in calls[i:i + 2]])
        return part

    # -- backward calls -------------------------------------------------------------------------
    def _backward_call(self, func, args, kwargs):
        """backward() and autograd.grad(): inspect the graph first, then run and record the call."""
        __tracebackhide__ = True  # noqa: F841
        watch = None
        try:
            tensors = _tensors_in(args, kwargs)
            with _hidden_from_subclasses():
                before = _versions(tensors)
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
            with _hidden_from_subclasses():
                self._record(func, tensors, before, result, None, seq)
                self._note_gradients(func, result)
        except Exception as exc:
            self._fail(exc)
        return result

    def _note_gradients(self, func, result):
        """The norms of the gradients of the leaves this backward reached (non-finite where a NaN or
        an Inf is, and Trace.grad_stats() data), without a device sync: they stay device tensors
        until the block ends (see build.py). Reading every gradient costs a pass over its memory, so
        a long loop checks backward calls 1, 2, 4, 8, ... and the last one (at the end of the
        block): a NaN that spreads to the weights is still found."""
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
            self.gradient_norms.append((index, nan_watch.norms_of(grads)))

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
        while frame is not None and _frame_kind(frame.f_code.co_filename):
            frame = frame.f_back
        where = "the backward at %s" % ("?" if frame is None else _place(frame.f_code, frame.f_lineno))
        try:
            names = frame_names(frame)
            if names is not None:
                self.note_names(names)
        except Exception as exc:
            self.lose("reading the variable names at " + where, exc, "tensors there are described instead of named")
        try:
            snapshot = graph_snapshot.take(self, roots, len(self.ops), "backward", inputs, retain)
        except Exception as exc:
            self.lose("the graph walk before " + where, exc, "the saved tensors of that call were not checked")
            snapshot = (len(self.ops), "backward", [], [], [], retain)
            self.walked_leaves = self.walked_nodes = ()
        self.checkpoints.append(snapshot)
        self.kept.look(self.refs, len(self.ops))

    def note_names(self, namespace):
        for name, value in list(dict.items(namespace)):  # not a subclass's items(): no code of the user's
            if value_kind(value) is TENSOR and not name.startswith("_"):
                t_id = self.known(value)
                if t_id is not None:
                    self.names.setdefault(t_id, name)


def lost_part(what, exc, lost):
    """The trace's warning for a part of the analysis that failed: what failed, why, what is missing."""
    return "%s failed (%s: %s): %s" % (what, type(exc).__name__, exc, lost)


def _place(code, line):
    return "line %d" % line if code is None else "%s, line %d" % (code.co_filename, line)


def _on_stack(mode):
    return any(_stack_at(i) is mode for i in range(_stack_length()))


TENSOR, MODULE = "tensor", "module"
_value_kinds = {}  # exact type -> TENSOR, MODULE or "" (neither)


def value_kind(value):
    """TENSOR, MODULE or "" for a value of a user's namespace. A notebook's namespace holds
    hundreds of names, scanned before every backward call and at every block's end: the kind is
    looked up by exact type (isinstance on torch.Tensor goes through a metaclass)."""
    cls = type(value)
    kind = _value_kinds.get(cls)
    if kind is None:
        kind = TENSOR if issubclass(cls, _Tensor) else MODULE if issubclass(cls, torch.nn.Module) else ""
        if len(_value_kinds) < 10_000:  # types made on the fly (one per call) must not grow it for ever
            _value_kinds[cls] = kind
    return kind


_signatures = {}
_step_ops = weakref.WeakKeyDictionary()  # optimizer class -> its step op


def _step_op(cls, step):
    """What stands for a whole optimizer step in its op record: named after the optimizer's class
    (AdamW.step, though AdamW runs Adam's step) and the module of the code that runs it."""
    op = _step_ops.get(cls)
    if op is None:
        def op(*args, **kwargs):
            return step(*args, **kwargs)
        op.__qualname__, op.__name__, op.__module__ = cls.__qualname__ + ".step", "step", step.__module__
        _step_ops[cls] = op
    return op


_NO_OP = array("q", [-1])  # folded_created's entry for a tensor no op made


def _packed(versions):
    """Version counters of a kept record as machine ints (an optimizer step lists every
    parameter and state tensor: as a tuple, each version above 256 is an object of its own)."""
    if len(versions) < 4 or None in versions:
        return versions
    return array("q", versions)


def _shared(cache, value):
    """One tuple for equal tuples of tids (folding keeps equal records once)."""
    if not value:
        return value
    return cache.setdefault(value, value)


def _bind_backward(func, args, kwargs):
    """The arguments of a backward()/autograd.grad() call by parameter name (self, tensors or
    outputs; inputs; retain_graph; create_graph), whichever way they were passed."""
    known = _signatures.get(func)
    if known is None:
        import inspect

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


_USER, _INTERNAL, _LIBRARY = 0, 1, 2


def _frame_kind(filename: str) -> int:
    if filename.startswith((_TORCH_DIR, _OWN_DIR)):
        return _INTERNAL
    return _LIBRARY if filename.startswith(_LIBRARY_DIRS) else _USER


def _made_by_torch_compile(code) -> bool:
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


def _dead():
    return None


_DEAD = _dead  # stands for the weak reference of a tensor that is gone or never looked up


def _tensors_in(args, kwargs):
    """The tensors among the arguments, one level into lists and tuples (torch.cat, _foreach_*).
    On every recorded call: a plain tensor or a number is told by its exact type first, since
    isinstance on torch.Tensor goes through its metaclass and costs several times more."""
    found = []
    for a in args:
        cls = type(a)
        if cls is _Tensor:
            found.append(a)
        elif cls in _SCALARS:
            pass
        elif isinstance(a, _Tensor):
            found.append(a)
        elif isinstance(a, _SEQUENCES):
            for b in a:
                if isinstance(b, _Tensor):
                    found.append(b)
    if kwargs:
        for a in kwargs.values():
            if isinstance(a, _Tensor):
                found.append(a)
            elif isinstance(a, _SEQUENCES):
                for b in a:
                    if isinstance(b, _Tensor):
                        found.append(b)
    return found


def _frees_graph(func, args, kwargs):
    """Whether a backward call frees its graph: no retain_graph (which defaults to create_graph)."""
    try:
        at = 3 if func is torch.autograd.grad else 2  # (outputs, inputs, grad_outputs, retain_graph, ...)
        retain = kwargs.get("retain_graph", args[at] if len(args) > at else None)
        if retain is None:
            retain = kwargs.get("create_graph", args[at + 1] if len(args) > at + 1 else False)
        return retain is False or retain is None or retain == 0
    except Exception:  # unusual arguments: say it keeps the graph, so nothing of it is folded
        return False


def _current_versions(tensors):
    """Version counters as the hot path reads them: one or two tensors (most calls) without a
    loop; with an inference tensor among them (it has no counter), through _versions."""
    try:
        n = len(tensors)
        if n == 1:
            return (tensors[0]._version,)
        if n == 2:
            return (tensors[0]._version, tensors[1]._version)
        return tuple(map(_version_of, tensors))
    except RuntimeError as exc:
        if isinstance(exc, RecursionError):
            raise
        return _versions(tensors)


def _versions(tensors):
    """Version counters, None for an inference tensor (it has none)."""
    return tuple([None if t.is_inference() else t._version for t in tensors])


# -- warnings keep the user's line ---------------------------------------------------------------
# A warning raised by a call we run is attributed by Python to our frame, the one calling it:
# filters by module and the "once"/"default" registries would then see us instead of the user.
# While a call runs, `warnings.filters` is swapped (not mutated, so no registry is reset) for
# one that shows everything, and `warnings._showwarnmsg` for _show_at_user_line, which re-issues
# the warning from the frame that Python would have chosen without our frames, under the
# user's real filters.
_ALWAYS = ("always", None, Warning, None, 0)
_SHOW_ALL = [_ALWAYS]
_real_filters = _real_show = None  # warnings.filters and warnings._showwarnmsg while ours are in place


def _put_back_warnings():
    """Restore the real filters; keep any filter a call added meanwhile (a module imported
    inside a torch call may run warnings.filterwarnings at import)."""
    w = _warnings
    filters, show = _real_filters, _real_show
    if len(_SHOW_ALL) != 1 or _SHOW_ALL[0] is not _ALWAYS:
        added = list(_SHOW_ALL)
        _SHOW_ALL[:] = [_ALWAYS]
        if _ALWAYS in added:
            at = added.index(_ALWAYS)
            filters[:0] = added[:at]
            filters.extend(added[at + 1:])
        else:  # resetwarnings() inside the call
            filters[:] = added
    if w.filters is _SHOW_ALL:
        w.filters = filters
    if w._showwarnmsg is _show_at_user_line:
        w._showwarnmsg = show


def _show_at_user_line(message):
    """warnings._showwarnmsg while one of our calls runs: warn again from the right frame."""
    __tracebackhide__ = True  # noqa: F841
    w = _warnings
    inside_filters, inside_show = w.filters, w._showwarnmsg
    filters, show = _real_filters, _real_show
    if inside_filters is not _SHOW_ALL:  # catch_warnings() inside the call: its copy, less ours
        filters = [f for f in inside_filters if f is not _ALWAYS]
    w.filters, w._showwarnmsg = filters, show
    try:
        stack = []
        frame = sys._getframe(1)
        while frame is not None:
            stack.append(frame)
            frame = frame.f_back
        at = next((i for i, f in enumerate(stack)
                   if f.f_lineno == message.lineno and f.f_code.co_filename == message.filename), None)
        if at is None:  # warn_explicit() with a location of its own
            w.warn_explicit(message.message, message.category, message.filename, message.lineno,
                            source=message.source)
            return
        stack.reverse()  # outermost first, as in a traceback
        keep = _without_dispatch(stack, [f.f_code for f in stack])
        keep.reverse()
        if at >= len(keep):
            filename, lineno, module, registry = "sys", 1, "sys", sys.__dict__.setdefault("__warningregistry__", {})
        else:
            target = keep[at]
            g = target.f_globals
            filename, lineno = target.f_code.co_filename, target.f_lineno
            module = g.get("__name__", "<string>")
            registry = g.get("__warningregistry__")
            if registry is None:
                registry = g["__warningregistry__"] = {}
        w.warn_explicit(message.message, message.category, filename, lineno, module, registry,
                        source=message.source)
    finally:
        w.filters, w._showwarnmsg = inside_filters, inside_show


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
        keep = _without_dispatch(entries, [e.tb_frame.f_code for e in entries])
        if len(keep) != len(entries):
            for a, b in zip(keep, keep[1:]):
                a.tb_next = b
            if keep:
                keep[-1].tb_next = None
            exc.__traceback__ = keep[0] if keep else None
        exc = exc.__cause__ or exc.__context__


def _drop_leading_own_frames(exc):
    """Unlink our frames from the head of an exception's traceback before it leaves our frame,
    so that a user catching it inside the block does not see them either (the frames that
    dispatched to us are added further up, as it propagates; capture.__exit__ drops those)."""
    tb = exc.__traceback__
    while tb is not None and tb.tb_frame.f_code.co_filename.startswith(_CAPTURE_DIR):
        tb = tb.tb_next
    exc.__traceback__ = tb


def _without_dispatch(entries, codes):
    """The entries (outermost first) of a stack or traceback as they would be without the tool,
    given the code object of each: no frame of ours, and where torch dispatched to us through
    handle_torch_function, neither the overrides.py frames nor the frame that called them (the
    call we made repeats it: the same code follows them, or one of our frames does)."""
    filenames = [c.co_filename for c in codes]
    drop = [f.startswith(_CAPTURE_DIR) for f in filenames]
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
