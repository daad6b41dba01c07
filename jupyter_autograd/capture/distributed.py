"""DistributedDataParallel as the user's code reaches it: the module each DDP wraps, the name the
user's code gives that module, and the parameters the DDP's reducer waits for, in its order.

The reducer's errors count parameters by index ("Parameter indices which did not receive grad for
rank 0: 4 5") or name them inside the wrapped module ("block.0.bias"); the user knows the first as
`model.aux_head.weight`. Nothing here runs per op: a DDP built inside the block is noted once (its
`__init__` is wrapped while a capture runs, as `Function.apply` is), the rest is read when the block
ends, while the modules it called are still held.
"""
from __future__ import annotations

import functools
import linecache
import sys
import time
import weakref

import torch

from ..model import DistributedModel
from ..source.naming import construction
from .frames import call_columns
from .state import thread_state

try:
    from torch.nn.parallel import DistributedDataParallel as _DDP
except ImportError:  # a build of torch without distributed support
    _DDP = None

_original_init = _DDP.__dict__["__init__"] if _DDP is not None else None


class DistributedModels:
    """The DDPs built while the block records (their line, their reducer's parameters then)."""

    __slots__ = ("built",)

    def __init__(self):
        self.built = {}  # id(ddp) -> (weak reference to it, (code, line, lasti) that built it or None, parameters)

    def note_built(self, recorder, ddp, frame):
        frame = recorder.lines.user_frame(frame)
        self.built[id(ddp)] = (weakref.ref(ddp), None if frame is None else (frame.f_code, frame.f_lineno, frame.f_lasti),
                               _reducer_parameters(recorder.tensors, ddp))


def _noting_init(self, *args, **kwargs):
    """DistributedDataParallel.__init__ while a capture runs: the DDP is built as without us, then
    the user's line that built it is noted (it says which of the user's names is the wrapped
    module), with the reducer's parameters as they are now."""
    __tracebackhide__ = True  # noqa: F841
    _original_init(self, *args, **kwargs)
    recorder = getattr(thread_state, "recorder", None)
    if recorder is None or not recorder.recording():
        return
    try:
        recorder.distributed.note_built(recorder, self, sys._getframe(1))
    except Exception as exc:  # never let the tool break the user's call
        recorder.fail(exc)


if _DDP is not None:  # its signature stays the original's (inspect.signature follows __wrapped__)
    functools.update_wrapper(_noting_init, _original_init)


def install():
    if _DDP is not None:
        _DDP.__init__ = _noting_init


def remove():
    if _DDP is not None:
        _DDP.__init__ = _original_init


def _reducer_parameters(tensors, ddp):
    """((tid, name within the wrapped module), ...) of the parameters the reducer waits for, in its
    order: torch's DistributedDataParallel._build_params_for_reducer (modules in named_modules
    order, each one's own parameters that require grad and are not ignored, each parameter once)."""
    ignored = getattr(ddp, "parameters_to_ignore", set())
    seen, out = set(), []
    for module_name, module in _named_modules(ddp.module):
        for param_name, p in _own_parameters(module):
            # torch's own key for an ignored parameter ("." + name for the root module's own).
            if not p.requires_grad or "%s.%s" % (module_name, param_name) in ignored or id(p) in seen:
                continue
            seen.add(id(p))
            out.append((tensors.quiet_tid(p), "%s.%s" % (module_name, param_name) if module_name else param_name))
    return tuple(out)


_Module = torch.nn.Module


def _named_modules(root):
    """named_modules(), read from the module dicts as torch's own does, so that no method of the
    user's runs for us; a module that defines its own named_modules is asked (DDP asks it too)."""
    if type(root).named_modules is not _Module.named_modules:
        yield from root.named_modules()
        return
    seen, todo = set(), [("", root)]
    while todo:
        prefix, module = todo.pop()
        if id(module) in seen:
            continue
        seen.add(id(module))
        yield prefix, module
        todo.extend(reversed([("%s.%s" % (prefix, name) if prefix else name, child)
                              for name, child in module._modules.items() if child is not None]))


def _own_parameters(module):
    """named_parameters(recurse=False), as _named_modules reads it."""
    if type(module).named_parameters is not _Module.named_parameters:
        return list(module.named_parameters(recurse=False))
    return [(name, p) for name, p in module._parameters.items() if p is not None]


def freeze(recorder, module_names, names):
    """For each DDP called in the block, while its modules are still held: plain tuples (see
    models_of). Its parameters are renamed the way the user's code reaches them
    (`model.aux_head.weight` rather than `ddp.module.aux_head.weight`) where the user's name for the
    wrapped module is known."""
    found = []
    built, recorder.distributed.built = recorder.distributed.built, {}
    for module in list(recorder.modules.modules.values()):
        if _DDP is None or not isinstance(module, _DDP):
            continue
        name = module_names.get(id(module)) or type(module).__name__
        noted = built.get(id(module))
        if noted is not None and noted[0]() is not module:
            noted = None
        wrapped = _wrapped_name(module, name, module_names, noted[1] if noted else None)
        parameters = noted[2] if noted else _reducer_parameters(recorder.tensors, module)
        via_ddp = name + ".module."
        for tid, inside in parameters:
            if names.get(tid) is None or names[tid].startswith(via_ddp):
                names[tid] = "%s.%s" % (wrapped, inside)
        found.append((name, wrapped, tuple(t for t, _ in parameters), tuple(n for _, n in parameters),
                      bool(getattr(module, "find_unused_parameters", False))))
    return found


def before_release(modules) -> None:
    """Called before the block lets go of the modules it called. PyTorch deadlocks when the last
    reference to a DDP's reducer goes after its process group was destroyed while a gloo worker
    still finishes a collective (an error in backward leaves one in flight): the worker waits for
    the GIL to drop the work's thread-local state, and the group's destructor, run with the GIL
    held, joins the worker. The block holds the modules until its end, so the last reference can be
    ours: give the workers the GIL for a moment first (only then: no DDP, or its group alive)."""
    if _DDP is None or torch.distributed.is_initialized():
        return
    if any(isinstance(module, _DDP) for module in modules.values()):
        time.sleep(0.05)


def models_of(found):
    return [DistributedModel(name=name, module=wrapped, parameters=tids, parameter_names=inside,
                             find_unused_parameters=unused)
            for name, wrapped, tids, inside, unused in found]


def _wrapped_name(ddp, name, module_names, built_at):
    """How the user's code reaches the module a DDP wraps: the name passed to the line that built it
    (`DDP(model)`: `model`), unless that line rebinds the name to the DDP (`model = DDP(model)`);
    else a name some namespace gives the module itself; else through the DDP (`ddp.module`)."""
    through = name + ".module"
    if built_at is not None:
        argument, target = _construction(*built_at)
        if argument and argument != target:
            return argument
        if argument:
            return through
    own = module_names.get(id(ddp.module))
    if own and not own.startswith(name + "."):
        return own
    return through


def _construction(code, line, lasti):
    """(the dotted name passed as the module, the dotted name the line assigns to) of the call that
    built a DDP, read off its line; (None, None) when it cannot be read (a call over several lines)."""
    return construction(linecache.getline(code.co_filename, line), call_columns(code, line, lasti))
