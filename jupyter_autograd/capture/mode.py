"""The recorder: a TorchFunctionMode whose per-op method records each tensor call of the block and
returns its result, and the rooms it keeps (tensors, user lines, modules, optimizer steps,
backward calls, the graph, folding, custom Functions, DDP models).

The per-op method is the hot path. It stores flat tuples (records.py) and does no string
formatting or graph work; everything else happens once, when the block ends (freeze.py,
build.py). It must never raise anything but the user's own exception: any internal failure
switches recording off and the user's code goes on as if the tool were not there.

Being there must not show either. Our reads of a tensor (`_version`, `shape`, ...) are hidden
from `__torch_function__` subclasses; warnings raised inside a call are re-issued at the line
PyTorch would have blamed without us (warning_lines.py); a call made near the recursion limit is
not recorded rather than failed; and old ops that cannot matter any more are folded (folding.py).
"""
from __future__ import annotations

import functools
import sys
import warnings as _warnings
import weakref

import torch

from . import lifecycle
from .backward import BACKWARD_FUNCS, BackwardCalls
from .compiled import CompiledRegions
from .compiling import is_compiling as _is_compiling
from .distributed import DistributedModels
from .folding import KEPT_FUNCS, Folding
from .frames import UserLines, drop_leading_own_frames, place
from .graph import GraphRecord
from .modules import ModuleCalls
from .records import NODES_IN_RANGES, OP_ERR, OP_FUNC, OP_SEQ, OP_WR, NodeRanges, lost_part
from .state import Installation, RecordingMode, State
from .steps import PROFILER_ENTER, PROFILER_EXIT, OptimizerSteps
from .switches import FunctionCalls
from .tensors import TensorTable, byte_range, current_versions, tensors_in, versions
from .warning_lines import HELD, SHOW_ALL, put_back, show_at_user_line

_Tensor = torch.Tensor
DATA_GETTER = torch.Tensor.data.__get__
_GETTER_TYPE = type(DATA_GETTER)
REQUIRES_GRAD_SETTER = torch.Tensor.requires_grad.__set__  # `p.requires_grad = False` freezes: an op
# `t.data = new` swaps the memory behind `t` without a version bump: recorded as a write of `t` (_swap_data).
DATA_SETTER = torch.Tensor.data.__set__
_tracing_state = torch._C._get_tracing_state  # not None while torch.jit.trace runs
_next_seq = torch._C._autograd._get_sequence_nr  # the sequence number the next grad_fn node gets
_grad_enabled = torch.is_grad_enabled
_hidden_from_subclasses = torch._C.DisableTorchFunctionSubclass
_getframe = sys._getframe
_warnings_dict = _warnings.__dict__
_SEQUENCES = (list, tuple)
_RECORDING, _STEPPING = State.RECORDING, State.STEPPING
# Not recorded by the hot path: backward calls and `.data =` (each recorded by a method of its own:
# BackwardCalls.call, _swap_data) and the profiler scopes that torch opens around optimizer steps and
# module calls (they touch no tensor).
_NOT_RECORDED = frozenset(BACKWARD_FUNCS | {DATA_SETTER, PROFILER_ENTER, PROFILER_EXIT})


class Recorder(RecordingMode):
    def __init__(self, check_nan=False):
        super().__init__()
        self.check_nan = check_nan     # watch backward nodes for the first non-finite gradient
        self.state = State.RECORDING
        # The with statement's watch on the block's end (lifecycle.watch_block) sets this, from C code,
        # when the statement drops the exit it looked up: then the block has ended, whatever `state` says.
        self.exit_seen = None
        self.block_watch = None        # that watch
        self.installation = Installation()  # what its block installed (lifecycle.py)
        self.failure = None            # why recording stopped, if it did
        self.lost_parts = {}           # what parts of the analysis failed -> how many times (see lose)
        self.too_deep = 0              # calls not recorded: they ran too close to the recursion limit
        self.ops = []                  # op records (records.py)
        self.last_write = -1           # index of the last op that wrote a tensor
        self.node_ranges = NodeRanges()  # (first, end) grad_fn sequence numbers made by an op, and its index
        # An op record names its function by index into `funcs`: a record holding the function itself
        # would stay tracked by the cyclic GC, and every full collection of a long loop walks them all.
        self.funcs = list(KEPT_FUNCS)
        self.func_ids = {f: i for i, f in enumerate(self.funcs)}
        self.tensors = TensorTable()
        self.lines = UserLines()
        self.modules = ModuleCalls()
        self.steps = OptimizerSteps()
        self.backward = BackwardCalls()
        self.graph = GraphRecord()
        self.folding = Folding()
        self.function_calls = FunctionCalls()
        self.distributed = DistributedModels()
        self.compiled = CompiledRegions()  # calls of torch.compile regions recorded as their graphs' ops

    # -- state --------------------------------------------------------------------------------
    def recording(self) -> bool:
        return self.state is _RECORDING and self.exit_seen is None

    def stepping(self) -> bool:
        return self.state is _STEPPING and self.exit_seen is None

    def has_ended(self) -> bool:
        return self.state is State.ENDED or self.exit_seen is not None

    def set_state(self, state: State) -> None:
        self.state = state

    def end(self) -> None:
        """Its block has ended: from now on every call passes straight through."""
        if not self.has_ended():
            self.state = State.ENDED

    def pause(self) -> State:
        """The tool's own work runs (the trace is built): nothing it calls is recorded. Returns the
        state to give back to resume()."""
        previous, self.state = self.state, State.PAUSED
        return previous

    def resume(self, previous: State) -> None:
        self.state = previous

    def watch_exit(self, method) -> None:
        """Note the block's end when `method` (the with statement's bound exit) is dropped: the
        callback is setattr itself (C, no Python frame where an interrupt could land and be lost)."""
        self.block_watch = weakref.ref(method, functools.partial(setattr, self, "exit_seen"))

    def unwatch_exit(self) -> None:
        self.block_watch = None

    def fail(self, exc) -> None:
        self.failure = "%s: %s" % (type(exc).__name__, exc)
        if not self.has_ended():
            self.state = State.FAILED

    def lose(self, what, exc, lost) -> None:
        """One part of the analysis failed: the rest goes on, and the trace says what was lost."""
        if exc is not None and isinstance(exc, RecursionError):
            self.too_deep += 1
            return
        message = lost_part(what, exc, lost)
        lost_parts = self.lost_parts
        if message in lost_parts or len(lost_parts) < 20:  # a part failing at every step of a loop: said once
            lost_parts[message] = lost_parts.get(message, 0) + 1

    # -- hot path -----------------------------------------------------------------------------
    # Written for speed: every line here runs for every tensor call of the block. C-level loops
    # (map with attrgetter) replace comprehensions, and kwargs stay None when there are none.
    def __torch_function__(self, func, types, args=(), kwargs=None):
        __tracebackhide__ = True  # noqa: F841  (IPython hides this frame in tracebacks)
        state = self.state
        if state is not _RECORDING or self.exit_seen is not None:
            if state is not _STEPPING or self.exit_seen is not None:
                if self.has_ended():
                    _after_block(self)
                return func(*args, **kwargs) if kwargs else func(*args)
            if func is PROFILER_EXIT or func is PROFILER_ENTER:
                try:
                    self.steps.profiler_event(self, func)
                except Exception as exc:  # never let the tool break the user's call
                    self.fail(exc)
        w, held = _warnings, HELD
        relocate = w.filters is not SHOW_ALL  # else a call of ours further up already re-routes them
        if relocate:
            held[0], held[1] = w.filters, w._showwarnmsg
        # A property read is not an op; inside an optimizer step, the step is the op (steps.py).
        passthrough = ((type(func) is _GETTER_TYPE and func != DATA_GETTER and func != REQUIRES_GRAD_SETTER
                        and func != DATA_SETTER) or self.state is _STEPPING)
        if passthrough or func in _NOT_RECORDED or _is_compiling() or _tracing_state() is not None:
            if relocate:
                w.filters, w._showwarnmsg = SHOW_ALL, show_at_user_line
            try:
                if not passthrough and func in BACKWARD_FUNCS:
                    return self.backward.call(self, func, args, kwargs)
                if not passthrough and func == DATA_SETTER and not _is_compiling() and _tracing_state() is None:
                    return self._swap_data(func, args)
                return func(*args, **kwargs) if kwargs else func(*args)
            except BaseException as exc:
                drop_leading_own_frames(exc)
                raise
            finally:
                if relocate:  # written out: a call would be one more place for an interrupt to land
                    if w.filters is SHOW_ALL and len(SHOW_ALL) == 1:
                        w.filters, w._showwarnmsg = held[0], held[1]
                    else:
                        put_back()
        try:
            tensors = tensors_in(args, kwargs)
            if types:  # a Tensor subclass with its own __torch_function__: it must not see our reads
                with _hidden_from_subclasses():
                    before = versions(tensors)
            else:
                before = current_versions(tensors)
            seq = _next_seq()
        except RecursionError:  # too deep for our own bookkeeping: run the call, unrecorded
            self.too_deep += 1
            return func(*args, **kwargs) if kwargs else func(*args)
        except Exception as exc:  # never let the tool break the user's call
            self.fail(exc)
            return func(*args, **kwargs) if kwargs else func(*args)
        try:
            if relocate:  # stored into the module's dict: the same as setting its attributes, cheaper
                wd = _warnings_dict
                wd["filters"], wd["_showwarnmsg"] = SHOW_ALL, show_at_user_line
                try:
                    result = func(*args, **kwargs) if kwargs else func(*args)
                finally:
                    if w.filters is SHOW_ALL and len(SHOW_ALL) == 1:
                        wd["filters"], wd["_showwarnmsg"] = held[0], held[1]
                    else:
                        put_back()
            else:
                result = func(*args, **kwargs) if kwargs else func(*args)
        except BaseException as exc:
            drop_leading_own_frames(exc)
            try:
                if types:
                    with _hidden_from_subclasses():
                        self.record(func, tensors, before, None, exc, seq)
                else:
                    self.record(func, tensors, before, None, exc, seq)
                if kwargs and kwargs.get("out") is not None:
                    self._note_out_arguments(kwargs["out"])
            except RecursionError:
                self.too_deep += 1
            except Exception as inner:
                self.fail(inner)
            raise
        try:
            if types:
                with _hidden_from_subclasses():
                    self.record(func, tensors, before, result, None, seq)
            else:
                self.record(func, tensors, before, result, None, seq)
        except RecursionError:
            self.too_deep += 1
        except Exception as exc:
            self.fail(exc)
        return result

    def record(self, func, tensors, before, result, error, seq_start):
        """Append the record of a call that ran (or raised): the caller's caller is the frame the
        user's line is looked for from."""
        seq_end = _next_seq()
        after = current_versions(tensors)
        ops = self.ops
        index = len(ops)
        table = self.tensors
        written = None
        if after != before:
            tid = table.tid
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
        tid_of, refs, register = table.tid_of, table.refs, table.register
        if result is not None:
            if isinstance(result, _Tensor):
                t_id = tid_of.get(id(result))
                if t_id is None or refs[t_id]() is not result:
                    t_id = register(result, index, table.tid(tensors[0]) if func == DATA_GETTER else None)
                outputs = (t_id,)
            elif isinstance(result, _SEQUENCES):
                outs = [r for r in result if isinstance(r, _Tensor)]
                if outs:
                    alias_of = table.tid(tensors[0]) if func == DATA_GETTER else None
                    out_ids = []
                    for out in outs:
                        t_id = tid_of.get(id(out))
                        if t_id is None or refs[t_id]() is not out:
                            t_id = register(out, index, alias_of)
                        out_ids.append(t_id)
                    outputs = tuple(out_ids)
        modules = self.modules
        code, line = self.lines.user_line(_getframe(2), modules.above)
        if modules.path:
            modules.op_modules[index] = modules.path
        in_ids = []
        for t in tensors:
            t_id = tid_of.get(id(t))
            if t_id is None or refs[t_id]() is not t:
                t_id = register(t, None, None)
            in_ids.append(t_id)
        func_id = self.func_ids.get(func)
        if func_id is None:
            func_id = self._new_func_id(func)
        ops.append((func_id, code, line, tuple(in_ids), before, after, outputs, seq,
                    written, _grad_enabled(), None if error is None else (type(error).__name__, str(error))))
        if index >= self.folding.at:
            self.folding.fold(self, index)

    def add_op(self, func, code, line, inputs, before, after, outputs, seq, written, grad, error):
        """Append a record made elsewhere (a whole optimizer step: steps.py)."""
        index = len(self.ops)
        if written:
            self.last_write = index
        func_id = self.func_ids.get(func)
        if func_id is None:
            func_id = self._new_func_id(func)
        self.ops.append((func_id, code, line, inputs, before, after, outputs, seq, written, grad, error))
        if index >= self.folding.at:
            self.folding.fold(self, index)

    def replace_last_op(self, last_write, rows, plans):
        """The last op (a compiled region's one call: compiled.py) becomes the ops `plans` (add_op's
        arguments, each with its module path), over tensor rows of the tool's own (`rows`, values made
        inside the region, with no tensor behind them); the index of the last write before it is
        `last_write`."""
        index = len(self.ops) - 1
        self.ops.pop()
        self.modules.op_modules.pop(index, None)
        self.node_ranges.drop_last(index)  # the call's node range moves to the op that owns the node
        self.last_write = last_write
        for row in rows:
            self.tensors.add_row(row)
        for func, code, line, inputs, before, after, outputs, seq, writes, grad, path in plans:
            if seq is not None:
                self.node_ranges.add(seq[0], seq[1], len(self.ops))
            if path:
                self.modules.op_modules[len(self.ops)] = path
            self.add_op(func, code, line, inputs, before, after, outputs, seq, writes, grad, None)

    def record_switch(self, func):
        """A grad-mode switch that calls no torch function (entering or leaving inference mode): an op
        with no tensors, at the user's line, with the mode it left."""
        with _hidden_from_subclasses():
            self.record(func, [], (), None, None, _next_seq())

    def _new_func_id(self, func):
        self.func_ids[func] = len(self.funcs)
        self.funcs.append(func)
        return len(self.funcs) - 1

    def _note_out_arguments(self, out):
        """A call given `out=` raised (with grad on, PyTorch refuses it when an argument requires
        grad): its error keeps the tids of the tensors it was to write, which a failed call did not."""
        with _hidden_from_subclasses():
            tids = tuple(self.tensors.tid(t) for t in (out if isinstance(out, _SEQUENCES) else (out,))
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
            tensors = tensors_in(args, None)
            with _hidden_from_subclasses():
                before = versions(tensors)
            seq = _next_seq()
        except Exception as exc:  # never let the tool break the user's call
            self.fail(exc)
            return func(*args)
        try:
            result = func(*args)
        except BaseException as exc:
            try:
                with _hidden_from_subclasses():
                    self.record(func, tensors, before, None, exc, seq)
            except Exception as inner:
                self.fail(inner)
            raise
        try:
            with _hidden_from_subclasses():
                self.record(func, tensors, before, result, None, seq)
                rec = self.ops[-1]
                if rec[OP_FUNC] == self.func_ids.get(func) and tensors:
                    swapped = ((self.tensors.tid(tensors[0]), byte_range(tensors[0])),)
                    self.ops[-1] = rec[:OP_WR] + (swapped,) + rec[OP_WR + 1:]
                    self.last_write = len(self.ops) - 1
        except Exception as exc:
            self.fail(exc)
        return result

    def range_written(self, t):
        """The bytes a write changed (tensors.byte_range); None, said in the trace, if they cannot be read."""
        try:
            return byte_range(t)
        except Exception as exc:
            self.lose("reading the memory range of a write at %s" % place(*self.lines.user_line(_getframe(1))), exc,
                      "writes there are not matched to the saved tensors they may have changed")
            return None

    def nodes_of(self, index, rec):
        """(first, end) of the grad_fn nodes op `index` made (its record `rec`), or None."""
        seq = rec[OP_SEQ]
        return self.node_ranges.of_op(index) if seq is NODES_IN_RANGES else seq

    def hand_over(self):
        """For a block that ended in another thread than the one that entered it: a recorder holding all
        that this one recorded, for the trace's build. This one, which stays on the entering thread's
        stack (inert) until that thread's next capture, keeps only its state and installation."""
        records = Recorder.__new__(Recorder)
        records.__dict__.update(self.__dict__)
        empty = Recorder(check_nan=self.check_nan).__dict__
        for name in list(self.__dict__):
            if name not in _INERT_KEEPS and name in empty:
                self.__dict__[name] = empty[name]
        return records

    # -- a nested capture's share ---------------------------------------------------------------
    def since(self, start):
        """A recorder holding only the ops from index `start` on, for a capture nested in this one
        (one mode records for both). Tensors keep their tids; op indices start again at 0; the
        copy has its own lists, so building it changes nothing here."""
        part = Recorder.__new__(Recorder)
        part.__dict__.update(self.__dict__)
        end = len(self.ops)
        part.ops = self.ops[start:]
        part.last_write = self.last_write - start if self.last_write >= start else -1
        part.node_ranges = NodeRanges((a, b, i - start) for a, b, i in self.node_ranges if i >= start)
        part.funcs = list(self.funcs)
        part.too_deep = 0
        part.tensors = self.tensors.shifted(start, end)
        part.lines = self.lines.copy()
        part.modules = self.modules.shifted(start)
        part.steps = self.steps.shifted()
        part.backward = self.backward.shifted(start, end)
        part.graph = self.graph.shifted(start)
        part.folding = self.folding.shifted(start)
        part.function_calls = self.function_calls.shifted(start)
        part.compiled = self.compiled.shifted(start)
        return part


_INERT_KEEPS = frozenset(("state", "exit_seen", "block_watch", "installation", "check_nan"))


def _after_block(recorder):
    """A call through a recorder whose block has ended without its thread taking it back."""
    try:
        lifecycle.heal(recorder)
    except Exception:  # never let the tool break the user's call; the next capture tries again
        pass
