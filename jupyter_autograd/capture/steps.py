"""Optimizer steps: a step of a torch.optim optimizer is recorded as one op (the parameters it
wrote, and the state tensors it wrote that the block also used elsewhere), and the parameters
each optimizer updates are noted (the missing-grad rule asks which ones got none).

Its own calls (Adam: ten per parameter, all on the user's `opt.step()` line) run unrecorded:
they were most of what capture cost in a training step. Our mode leaves the stack until the
step's post-hook, and the step runs exactly as without us. A step that raises runs no post-hook:
its profiler scope closing (patched here) or the next hook of ours that meets it still open ends it.
"""
from __future__ import annotations

import sys
import weakref
from collections import namedtuple

import torch

from .compiling import is_compiling as _is_compiling
from .state import State, thread_state
from .tensors import current_versions

_Tensor = torch.Tensor
_grad_enabled = torch.is_grad_enabled
_all_torch_function_off = torch._C.DisableTorchFunction  # modes too: our hooks' reads are no ops
_stack_length = torch._C._len_torch_function_stack
_stack_at = torch._C._get_function_stack_at
_pop_stack = torch._C._pop_torch_function_stack
_push_stack = torch._C._push_on_torch_function_stack
_getframe = sys._getframe
PROFILER_ENTER = torch.ops.profiler._record_function_enter_new
PROFILER_EXIT = torch.ops.profiler._record_function_exit._RecordFunction
_record_function = torch.autograd.profiler.record_function
original_scope_exit = _record_function.__dict__["__exit__"]
STEP_SCOPE = "Optimizer.step#"  # torch's name for the profiler scope around every optimizer step

# What begin() noted of the step being recorded: the op that stands for it, the tensors it may write
# and their versions before, the indices of those that are optimizer state (not parameters), the
# user's (code, line), the grad mode, the optimizer.
Step = namedtuple("Step", "func tensors before state where grad optimizer")


class OptimizerSteps:
    __slots__ = ("step", "depth", "popped", "unrecorded_after", "optimized", "stepped_with_grad")

    def __init__(self):
        self.step = None               # while an optimizer step runs: what begin() noted (one op)
        self.depth = 0                 # profiler scopes opened inside that step
        self.popped = False            # our mode is off the stack while that step runs
        self.unrecorded_after = None   # (code, line) of a step that raised and was caught: see resume_if_failed
        self.optimized = set()         # tids of the parameters of every optimizer stepped in the block
        # ... and of those it stepped with a gradient: one may have come from a backward we never
        # see (reentrant checkpointing runs its own inside the engine), for a model dead by the end.
        self.stepped_with_grad = set()

    def note_parameters(self, recorder, optimizer):
        tid = recorder.tensors.tid
        for group in optimizer.param_groups:
            for p in group["params"]:
                if isinstance(p, _Tensor):
                    t_id = tid(p)
                    self.optimized.add(t_id)
                    if p.grad is not None:  # it got one, whatever ran the backward (see stepped_with_grad)
                        self.stepped_with_grad.add(t_id)

    def begin(self, recorder, optimizer, args, kwargs):
        """Record the step as one op. Not for a step that takes a closure (forward and backward run
        inside it), an optimizer whose step is not torch's own (it may write anything), or a
        differentiable one (its calls make graph nodes)."""
        with _all_torch_function_off():
            tensors = [p for group in optimizer.param_groups for p in group["params"] if isinstance(p, _Tensor)]
            parameters = len(tensors)
            tensors += [v for state in optimizer.state.values() if isinstance(state, dict)
                        for v in state.values() if isinstance(v, _Tensor)]
            before = current_versions(tensors)
        if self.step is not None:  # a step run inside the one being recorded: its writes are part of it
            outer = self.step
            offset = len(outer.tensors)
            self.step = outer._replace(tensors=outer.tensors + tensors, before=outer.before + before,
                                       state=outer.state | set(range(offset + parameters, offset + len(tensors))))
            return
        step = getattr(type(optimizer), "step", None)  # args: (optimizer, closure?)
        if (len(args) > 1 or kwargs or not getattr(step, "__module__", "").startswith("torch.optim.")
                or optimizer.defaults.get("differentiable")):
            return
        self.step = Step(_step_op(type(optimizer), step), tensors, before, set(range(parameters, len(tensors))),
                         recorder.lines.user_line(_getframe(1)), _grad_enabled(), optimizer)
        self.depth = 0
        recorder.set_state(State.STEPPING)
        # The step's own calls (a hundred in a small model's SGD step, property reads included) would
        # each pass through Python to be ignored: our mode leaves the stack until the post-hook, and
        # the step runs exactly as without us. Not when a mode of the user's is above ours.
        n = _stack_length()
        if n and _stack_at(n - 1) is recorder:
            self.popped = _pop_stack() is recorder

    def end(self, recorder):
        """The step is over: its post-hook ran, or its profiler scope closed as it raised, or (our
        mode off the stack) a hook of ours or the block's end met it still open. Our mode goes
        back on the stack while the block is still recording."""
        # Else the block has ended: stay inert.
        recording = getattr(thread_state, "recorder", None) is recorder and not recorder.has_ended()
        if self.popped:
            self.popped = False
            if recording and not _on_stack(recorder):
                _push_stack(recorder)
        step, self.step = self.step, None
        if recording and recorder.state is State.STEPPING:  # not after a failure, nor once the block has ended
            recorder.set_state(State.RECORDING)
        tensors, before, state = step.tensors, step.before, step.state
        table = recorder.tensors
        with _all_torch_function_off():
            after = current_versions(tensors)
            # A state tensor (Adam's two moments per parameter) that no op of the block used is read by
            # nothing the diagnoses look at: not registered, it costs no row, no record, no check at the
            # end (half the tensors of a ResNet-50 step). One the block used, or uses later, is.
            changed, tids = [], []
            for i, (b, a) in enumerate(zip(before, after)):
                if a != b:
                    t_id = table.known(tensors[i]) if i in state else table.tid(tensors[i])
                    if t_id is not None:
                        changed.append(i)
                        tids.append(t_id)
            tids = tuple(tids)
            written = tuple((t_id, recorder.range_written(tensors[i])) for t_id, i in zip(tids, changed)) or None
        code, line = step.where
        recorder.add_op(step.func, code, line, tids, tuple(before[i] for i in changed),
                        tuple(after[i] for i in changed), (), None, written, step.grad, None)

    def end_with_block(self, recorder, raised):
        """The block ends with a step still open. If our mode is off the stack for it and the
        block did not raise, the step raised and the user caught it: what ran after it was not
        recorded."""
        if self.popped and not raised:
            self.unrecorded_after = self.step.where
        self.end(recorder)

    def resume_if_failed(self, recorder):
        """Called from our module and Function hooks: while a step that took our mode off the stack
        is still open, no torch.optim step calls a module or a custom Function, so the step raised
        (no post-hook ran) and the user caught it. The calls in between were not recorded: the
        trace says so."""
        if not self.popped:
            return
        try:
            self.unrecorded_after = self.step.where
            self.end(recorder)
        except Exception as exc:  # never let the tool break the user's call
            recorder.fail(exc)

    def profiler_event(self, recorder, func):
        """torch runs a step inside a profiler scope; that scope closing at the depth where the
        step began, with the step still open, means the step raised (no post-hook runs then)."""
        if func is PROFILER_ENTER:
            self.depth += 1
        elif self.depth:
            self.depth -= 1
        else:
            self.end(recorder)

    def shifted(self):
        """As a capture nested in this block sees it."""
        part = OptimizerSteps()
        part.optimized = set(self.optimized)
        part.stepped_with_grad = set(self.stepped_with_grad)
        part.unrecorded_after = self.unrecorded_after
        return part


def _on_stack(mode):
    return any(_stack_at(i) is mode for i in range(_stack_length()))


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


# -- the hooks (patches.py installs them) -----------------------------------------------------------

def before_optimizer_step(optimizer, args, kwargs):
    """Note the parameters an optimizer updates, and record the step as one op."""
    if _is_compiling():  # a compiled step (see modules.enter_module)
        return None
    recorder = getattr(thread_state, "recorder", None)
    if recorder is None or not (recorder.recording() or recorder.stepping()):
        return None
    try:
        with _all_torch_function_off():  # the mode is on in a hook: our reads would be recorded
            recorder.steps.note_parameters(recorder, optimizer)
        recorder.steps.begin(recorder, optimizer, args, kwargs)
    except Exception as exc:  # never let the tool break the user's step
        recorder.fail(exc)
    return None


def after_optimizer_step(optimizer, args, kwargs):
    if _is_compiling():
        return None
    recorder = getattr(thread_state, "recorder", None)
    if recorder is not None and recorder.stepping() and recorder.steps.step.optimizer is optimizer:
        try:
            recorder.steps.end(recorder)
        except Exception as exc:  # never let the tool break the user's step
            recorder.fail(exc)
    return None


def leaving_profiler_scope(self, exc_type, exc_value, traceback):
    """record_function.__exit__ while we capture: a step that took our mode off the stack and
    raises leaves through its profiler scope (its post-hook does not run). Our mode goes back
    on the stack there, so that the calls after a caught failure are recorded."""
    try:
        if exc_type is not None:
            recorder = getattr(thread_state, "recorder", None)
            if (recorder is not None and recorder.steps.popped
                    and str(getattr(self, "name", "")).startswith(STEP_SCOPE)):
                try:
                    recorder.steps.end(recorder)
                except Exception as exc:  # never let the tool break the user's call
                    recorder.fail(exc)
    finally:  # the scope is closed whatever happened above (an interrupt included)
        result = original_scope_exit(self, exc_type, exc_value, traceback)
    return result
