"""The process-wide patches and hooks that recording needs, shared by every capture of every thread:
custom Function.apply, a step's profiler scope, inference mode's switches, the nn.Module call stack,
optimizer steps, DistributedDataParallel's construction and debuggers' stop_here. They are counted:
the first block to start installs them, the last to end removes them (lifecycle.py holds the lock).
"""
from __future__ import annotations

import sys

import torch
from torch.nn.modules import module as _nn_module
from torch.optim import optimizer as _optim_module
from torch.utils.hooks import RemovableHandle as _RemovableHandle

from . import debuggers, distributed, modules, steps, switches
from .state import RecordingMode

hook_users = [0]
_installed_hooks = []  # (torch's hook dict, our key, its always-call dict or None) of the hooks in place now
_HOOK_KEYS = []        # our keys in torch's hook dicts, which torch reserves for us once
_Function = torch.autograd.function.Function
_record_function = torch.autograd.profiler.record_function
_inference_mode = torch.autograd.grad_mode.inference_mode
_original_has_any_global_hook = _nn_module._has_any_global_hook
_overrides = torch.overrides
original_has_torch_function = _overrides.has_torch_function
_stack_length = torch._C._len_torch_function_stack
_stack_at = torch._C._get_function_stack_at
_pop_stack = torch._C._pop_torch_function_stack
_push_stack = torch._C._push_on_torch_function_stack


def hook_keys():
    """Our keys in torch's global hook dicts."""
    return tuple(_HOOK_KEYS)


def _hook_table():
    """(torch's global hook dict, our hook, its always-call dict or None); our keys, which torch
    reserves for us once, are in _HOOK_KEYS. The entries go straight into torch's dicts: the
    register functions and RemovableHandle cost 54 us at every block's start and end with the
    caches cold (a training loop's step after a collection), direct entries 14."""
    nn_module, optim_module = _nn_module, _optim_module
    table = [(nn_module._global_forward_pre_hooks, modules.enter_module, None),
             (nn_module._global_forward_hooks, modules.leave_module, nn_module._global_forward_hooks_always_called),
             (optim_module._global_optimizer_pre_hooks, steps.before_optimizer_step, None),
             (optim_module._global_optimizer_post_hooks, steps.after_optimizer_step, None)]
    if not _HOOK_KEYS:
        first = _RemovableHandle.next_id  # ids torch will never hand out again
        _RemovableHandle.next_id = first + len(table)
        _HOOK_KEYS[:] = range(first, first + len(table))
    return table


def _has_torch_function_but_ours(relevant_args):
    """torch.overrides.has_torch_function as if our mode were not on the stack. nn.MultiheadAttention
    and nn.Transformer* take their fused fast path (eval, no grad) only when it says False, and
    any mode on the stack makes it say True: their slow path gives other values (padded positions,
    rounding). With another mode on the stack, that mode still counts."""
    if _stack_length() == 1 and isinstance(_stack_at(0), RecordingMode):
        mode = _pop_stack()
        try:
            return original_has_torch_function(relevant_args)
        finally:
            _push_stack(mode)
    return original_has_torch_function(relevant_args)


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


def _dynamo_keeps_has_torch_function():
    """Dynamo folds `has_torch_function` (which Tensor's `**`, `//` and reflected operators call) by a
    handler it registers, once per process, under the function `torch.overrides.has_torch_function`
    holds when it first traces. Registered under ours (a compile traced for the first time inside a
    block), torch's own would be unknown to it for the rest of the process: every such operator
    would break the user's compiled graphs, inside blocks and after them. So the table is built
    before ours is put in place, and given torch's function if it was built under ours."""
    module = sys.modules.get("torch._dynamo.variables.torch")
    if module is None:  # Dynamo not imported: no table yet
        return
    try:
        handlers = module.TorchInGraphFunctionVariable._get_handlers()
        handler = handlers.get(_has_torch_function_but_ours)
        if handler is not None and original_has_torch_function not in handlers:
            handlers[original_has_torch_function] = handler
    except Exception:  # another torch: nothing of ours to keep out of its table
        pass


def install_hooks():
    """Install everything, or nothing: if one part cannot be installed, those already installed are
    removed and the error is raised. Callers hold interrupts (see session.capture) while this runs."""
    if hook_users[0] == 0:
        try:
            _dynamo_keeps_has_torch_function()
            _Function.apply = classmethod(switches.recording_apply)
            _record_function.__exit__ = steps.leaving_profiler_scope
            _inference_mode.__enter__, _inference_mode.__exit__ = (switches.entering_inference_mode,
                                                                   switches.leaving_inference_mode)
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
            remove_all_hooks()
            raise
    hook_users[0] += 1


def remove_hooks():
    """Undo install_hooks once its last user is done. Every step is tried even if one fails;
    the first failure is raised after all of them."""
    hook_users[0] = max(0, hook_users[0] - 1)
    if hook_users[0] == 0:
        remove_all_hooks()


def remove_all_hooks():
    failure = None
    try:
        _Function.apply = switches.original_apply
    except BaseException as exc:
        failure = exc
    try:
        _record_function.__exit__ = steps.original_scope_exit
    except BaseException as exc:
        failure = failure or exc
    try:
        distributed.remove()
    except BaseException as exc:
        failure = failure or exc
    try:
        _inference_mode.__enter__, _inference_mode.__exit__ = (switches.original_inference_enter,
                                                               switches.original_inference_exit)
    except BaseException as exc:
        failure = failure or exc
    try:
        _nn_module._has_any_global_hook = _original_has_any_global_hook
        _overrides.has_torch_function = original_has_torch_function
        _dynamo_keeps_has_torch_function()
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
