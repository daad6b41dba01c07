"""Turn a finished Recorder into a plain-data Trace: names, locations, graph, checkpoints."""
from __future__ import annotations

import ast
import functools
import gc
import io
import linecache
import math
import os
import re
import tokenize
import types
from typing import Dict, Iterable, List, Optional, Tuple

import torch

from ..model import (DATA_SWAP, FREEZE_SETTER, Checkpoint, GraphNode, Location, ModuleCall, OpRecord, SavedSlot,
                     TensorInfo, TraceData)
from ..statements import BINOPS as _BINOPS, Statements as _Statements
from ..statements import dotted as _dotted, element as _element, same_op as _same_op
from ..statements import written_tensor as _written_tensor
from . import graph as graph_snapshot
from . import nan_watch
from . import distributed
from .recorder import (_BACKWARD_FUNCS, _DATA_GETTER, _DATA_SETTER, _REQUIRES_GRAD_SETTER, _USER, OP_CODE, OP_ERR,
                       OP_FUNC, OP_GRAD, OP_IN, OP_LINE, OP_OUT, OP_VA, OP_VB, OP_WR, TENSOR, _frame_kind, call_columns,
                       call_span, lost_part,
                       value_kind)

_op_names = {}


def op_name(func) -> str:
    try:
        name = _op_names.get(func)
    except TypeError:
        name = None
    if name is not None:
        return name
    owner = getattr(func, "__self__", None)
    if func == _DATA_GETTER:
        name = "Tensor.data"
    elif func == _REQUIRES_GRAD_SETTER:
        name = FREEZE_SETTER
    elif func == _DATA_SETTER:
        name = DATA_SWAP
    elif isinstance(owner, type):  # a classmethod such as MyFunction.apply
        name = "%s.%s" % (owner.__name__, getattr(func, "__name__", "?"))
    else:
        qual = getattr(func, "__qualname__", None) or getattr(func, "__name__", None) or repr(func)
        module = getattr(func, "__module__", None) or ""
        head, _, tail = qual.rpartition(".")
        if head in ("TensorBase", "Tensor", "_TensorBase"):
            name = "Tensor." + tail
        elif head == "_VariableFunctionsClass" or module == "torch":
            name = "torch." + tail
        elif module in ("torch.nn.functional", "torch._C._nn") or module.startswith("torch.nn.functional"):
            name = "F." + tail
        elif module.startswith("torch.optim."):  # a whole optimizer step (recorder.begin_step): Adam.step
            name = qual
        elif module:
            name = module + "." + qual
        else:
            name = qual
    try:
        _op_names[func] = name
    except TypeError:
        pass
    return name


def finish(recorder, namespaces, exc, error, tool_warnings=()):
    """Take, now, what needs the user's live objects; return a function that builds the block's
    TraceData (all but the diagnoses) from plain records, with what the tool could not do in its
    warnings and what it did in its notes. Our reads of the user's tensors are hidden from their
    `__torch_function__` subclasses, now and at the build."""
    with torch._C.DisableTorchFunctionSubclass():
        try:
            end_checkpoint(recorder)
        except Exception as internal:
            recorder.lose("the graph walk at the end of the block", internal,
                          "the saved tensors of graphs that no backward ran were not checked")
        live, names = freeze(recorder, namespaces or [])
    error_at = None if exc is None else raised_at(exc)

    def build_data() -> TraceData:
        # Not DisableTorchFunctionSubclass alone: read inside another capture, the build's reads
        # of gradients would be recorded there, at the line that read the trace.
        with torch._C.DisableTorchFunction():
            trace = build_trace(recorder, live, names, error, error_at)
        trace.warnings.extend(tool_warnings)
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
            trace.warnings.append("%d calls ran too close to the recursion limit to be recorded" % recorder.too_deep)
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
        if graph_snapshot.STACK_RAISED[0] and len(trace.nodes) > graph_snapshot.DEEP_GRAPH:
            trace.notes.append("This graph is deep: to keep PyTorch from crashing when it frees it, the "
                               "process's stack limit was raised from %d to %d bytes." % graph_snapshot.STACK_RAISED[0])
        return trace

    return build_data


def end_checkpoint(recorder):
    """Inspect every graph still reachable from a live tensor of the block."""
    roots = []
    nodes, freeing = recorder.graph_nodes, recorder.freeing_backwards
    for ref in recorder.refs:
        t = ref()
        if t is None:
            continue
        fn = _graph_of(t)[0]
        if fn is None:
            continue
        entry = nodes.get(fn._sequence_nr()) if type(fn) is not graph_snapshot._ACCUMULATE_GRAD else None
        if entry is not None and any(b in freeing for b in entry[3]):
            continue  # a backward ran its graph and freed it: nothing in it can be run or checked again
        roots.append(t)
    snap = graph_snapshot.take(recorder, roots, len(recorder.ops), "end")
    recorder.checkpoints.append(snap)
    return snap


def freeze(recorder, namespaces: Iterable[dict]):
    """What needs the user's live objects, taken when the block ends: the final state of each
    live tensor and the names it goes by. Everything else is built later, from plain records."""
    live = {}
    for t_id, ref in enumerate(recorder.refs):
        t = ref()
        if t is not None:
            fn, is_leaf = _graph_of(t)
            # The grad is summarised when the trace is built, read through the weak reference.
            live[t_id] = (bool(t.requires_grad), is_leaf,
                          None if fn is None else fn.name().rpartition("::")[2],
                          None if fn is None else graph_snapshot.node_key(fn, recorder), ref,
                          None if t.is_inference() else t._version, _elements(t))
    try:
        recorder.kept.look(recorder.refs, len(recorder.ops))  # kept to the end: alive now, made before the last backward
    except Exception as exc:
        recorder.lose("looking which tensors outlived their backward call at the end of the block", exc,
                      "graphs kept to the end of the block were not looked for")
    trees = {}  # (id(module), name) -> _ModuleTree: the model is met by more than one of these
    names, module_names = {}, {}
    try:  # each part fails alone, and the trace says what it lost
        try:
            names, module_names = _namespace_names(recorder, namespaces, trees)
        except Exception as exc:
            recorder.lose("reading the variable names of the block", exc,
                          "tensors and modules are described instead of named")
        try:
            _name_outermost_modules(recorder, module_names, trees)
        except Exception as exc:
            recorder.lose("naming the models by the lines that called them", exc, "models go by their class names")
        try:
            for t_id, (owner, dotted) in _module_parameters(recorder, module_names, trees).items():
                names.setdefault(t_id, dotted)
                recorder.param_owner[t_id] = owner
        except Exception as exc:
            recorder.lose("listing the parameters of the models called", exc,
                          "parameters are described instead of named, and unused or frozen ones are not listed")
        try:
            for t_id, dotted in _module_buffers(recorder, module_names, trees).items():
                names.setdefault(t_id, dotted)
        except Exception as exc:
            recorder.lose("listing the buffers of the models called", exc, "buffers are described instead of named")
        try:
            _name_module_paths(recorder, module_names)
        except Exception as exc:
            recorder.lose("naming the modules that ops ran in", exc, "ops are not grouped by module")
            recorder.op_modules, recorder.user_calls = {}, {}
        try:
            recorder.backward_hooks = _module_backward_hooks(recorder)
        except Exception as exc:
            recorder.lose("reading the backward hooks of the modules called", exc,
                          "an error that a module's backward hook raised is not traced to that module")
        try:
            distributed.freeze(recorder, module_names, names)
        except Exception as exc:
            recorder.lose("reading the DistributedDataParallel models of the block", exc,
                          "the parameters DDP waits for are not named in its errors")
    finally:
        recorder.user_globals = {}  # never hold the user's namespaces (or modules) past the block
        distributed.before_release(recorder.modules)
        recorder.modules = {}
        recorder.open_calls = []
    recorder.nonfinite, recorder.grad_norms, recorder.leaf_norms = {}, {}, {}
    try:
        _read_gradient_norms(recorder)
    except Exception as exc:
        recorder.lose("reading the gradients after backward", exc, "non-finite gradients of leaves were not "
                      "looked for, and trace.grad_stats() has no norms")
    return live, names


def _read_gradient_norms(recorder):
    """The gradient norms taken after the checked backward calls (the last one's now, if a long loop
    left it unchecked), read at last: recorder.nonfinite (the first backward after which each leaf's
    gradient held NaN/Inf), recorder.grad_norms (tid -> [(backward op index, norm)]), and the norm
    of each of those leaves now, the scale its gradient is judged against (Trace.grad_stats)."""
    recorder.nonfinite, recorder.grad_norms, recorder.leaf_norms = {}, {}, {}
    if recorder.unchecked_backward is not None:  # the last backward of a long loop: check it now
        index, leaves = recorder.unchecked_backward
        grads = [(t_id, g) for t_id, g in ((t_id, _grad_of(recorder, t_id)) for t_id in leaves) if g is not None]
        if grads:
            recorder.gradient_norms.append((index, nan_watch.norms_of(grads)))
        recorder.unchecked_backward = None
    for index, norms in recorder.gradient_norms:
        for t_id, norm in nan_watch.read_norms(norms):
            if not math.isfinite(norm):
                recorder.nonfinite.setdefault(t_id, index)
            recorder.grad_norms.setdefault(t_id, []).append((index, norm))
    recorder.gradient_norms = []
    leaves = [(t_id, t) for t_id, t in ((t_id, recorder.refs[t_id]()) for t_id in recorder.grad_norms)
              if t is not None and (t.is_floating_point() or t.is_complex())]
    recorder.leaf_norms = dict(nan_watch.read_norms(nan_watch.norms_of(leaves)))


def _graph_of(t):
    """(t.grad_fn, t.is_leaf); (None, False) for a view that autograd refuses: a view made by a
    multi-output view op whose base was written in place since, as FSDP's views of its flat
    parameter. Reading either raises for it, and so would any use of it in a graph."""
    try:
        return t.grad_fn, bool(t.is_leaf)
    except RuntimeError:
        return None, False


def _elements(t) -> Optional[int]:
    """How many elements the tensor holds in this process now: 0 for a parameter sharded away to
    another process (FSDP keeps an empty local shard), None where it cannot be told (a ragged size)."""
    try:
        return int(t.numel())
    except Exception:
        return None


def _grad_of(recorder, t_id):
    t = recorder.refs[t_id]()
    g = None if t is None else t.grad
    return g if g is not None and (g.is_floating_point() or g.is_complex()) else None


def _outermost_modules(recorder):
    """The modules called from user code (the first of each op's module path), in call order."""
    seen = {}
    for index, path in recorder.op_modules.items():
        if path and id(path[0]) not in seen:
            seen[id(path[0])] = (path[0], index)
    return list(seen.values())


def _name_outermost_modules(recorder, module_names, trees):
    """A module that no namespace names (a model made inside a function) goes by the callee of the
    line that called it (recorded by the forward pre-hook): `logits = model(x)` names it `model`,
    `h = self.encoder(x)` `self.encoder`, `y = dec(torch.relu(enc(x)))` `dec` (the call itself is
    read where its columns are known). Otherwise by its class name: never by a guess. Modules that
    would share a name (two `Linear`s, the layers of a list called by one line) are told apart by
    the order of their first calls, `layer (call 2)`, and a note says where each was called."""
    call_sites = getattr(recorder, "module_call_sites", {})
    roots = {}  # id(module) -> (module, name, named by a namespace)
    for module, index in _outermost_modules(recorder):
        if id(module) in module_names:
            roots[id(module)] = (module, module_names[id(module)], True)
            continue
        callee = None
        site = call_sites.get(id(module))
        if site is not None:
            filename, line, columns = site
            text = linecache.getline(filename, line)
            if columns is not None:  # the call itself, out of its line
                first, end = columns
                callee = _callee_of_call(text.encode("utf-8")[first:end].decode("utf-8", "replace").strip())
            callee = callee or _single_callee(text.strip())
        roots[id(module)] = (module, callee or type(module).__name__, False)
    by_name = {}
    for module, name, _ in roots.values():
        by_name.setdefault(name, []).append(module)
    notes = []
    for name, modules in by_name.items():
        if len(modules) > 1:
            places = []
            for k, module in enumerate(modules, 1):
                if not roots[id(module)][2]:
                    roots[id(module)] = (module, "%s (call %d)" % (name, k), False)
                site = call_sites.get(id(module))
                if site is not None:
                    places.append("call %d on line %d of %s" % (k, site[1], os.path.basename(site[0])))
            notes.append("%d different modules go by `%s`: each is named after the order of its first call "
                         "(%s)." % (len(modules), name, ", ".join(places) or "no call line known"))
    recorder.module_name_notes = notes
    for module, name, from_namespace in roots.values():
        if not from_namespace:
            module_names[id(module)] = name
            for module_id, dotted in _module_tree(module, name, trees).modules:
                module_names.setdefault(module_id, dotted)


def _callee_of_call(text: str) -> Optional[str]:
    """The module a call expression calls: `dec` for `dec(torch.relu(enc(x)))`, `net.0` for
    `net[0](x)`; None when the text is not one call of a name, an attribute or an element."""
    try:
        call = ast.parse(_without_comment(text), mode="eval").body
    except SyntaxError:
        return None
    if not isinstance(call, ast.Call):
        return None
    callee = _module_path(call.func)
    if not callee or callee.partition(".")[0] in _NOT_MODULES or callee.rpartition(".")[2].endswith("_"):
        return None
    return callee


def _module_path(node) -> Optional[str]:
    """`self.encoder`, `net.0` for `net[0]`: a name with attributes and integer indexes, as dotted
    module paths are written; None for anything else."""
    parts = []
    while True:
        if isinstance(node, ast.Attribute):
            parts.append(node.attr)
            node = node.value
        elif isinstance(node, ast.Subscript) and isinstance(node.slice, ast.Constant) \
                and type(node.slice.value) is int and node.slice.value >= 0:
            parts.append(str(node.slice.value))
            node = node.value
        else:
            break
    if not isinstance(node, ast.Name):
        return None
    return ".".join([node.id] + parts[::-1])


_NOT_MODULES = {"torch", "F", "nn", "np", "math", "len", "print", "float", "int", "sum", "max", "min", "abs",
                "list", "tuple", "range", "zip", "enumerate", "isinstance", "super", "str", "repr", "dict"}


@functools.lru_cache(maxsize=1024)  # the same call line, block after block of a training loop
def _single_callee(text: str) -> Optional[str]:
    try:
        tree = ast.parse(_without_comment(text))
    except SyntaxError:
        return None
    callees = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            callee = _dotted(node.func)
            if callee and callee.partition(".")[0] not in _NOT_MODULES:
                callees.append(callee)
    # `[model(a).sum(), model(b).sum()]` calls one thing twice: it is still one candidate.
    candidates = list(dict.fromkeys(c for c in callees if not c.rpartition(".")[2].endswith("_")))
    return candidates[0] if len(candidates) == 1 else None


def _module_parameters(recorder, module_names, trees):
    """tid -> (outermost module's name, dotted parameter name) for every parameter of the modules
    called in the block, used or not (an unused one is information for the report)."""
    out = {}
    for module, _ in _outermost_modules(recorder):
        owner = module_names.get(id(module)) or type(module).__name__
        try:
            named = _module_tree(module, owner, trees).params
        except Exception:
            continue
        for dotted, p in named:
            out.setdefault(recorder._tid(p), (owner, dotted))
    return out


def _module_buffers(recorder, module_names, trees):
    """tid -> dotted name of the buffers of the modules called in the block that the block used
    (a spectral norm's power-iteration vector `model.u`): named as parameters are, owned by none."""
    out = {}
    for module, _ in _outermost_modules(recorder):
        owner = module_names.get(id(module)) or type(module).__name__
        try:
            named = _module_tree(module, owner, trees).buffers
        except Exception:
            continue
        for dotted, b in named:
            t_id = recorder.known(b)
            if t_id is not None:
                out.setdefault(t_id, dotted)
    return out


def _name_module_paths(recorder, module_names):
    """Replace the module objects of each op's module path by dotted names (net.encoder.layers.0)."""
    by_path = {}
    children = {}  # id(parent) -> {id(child): its attribute name}
    classes = recorder.module_classes = {}
    dotted = recorder.module_dotted = {}  # id(module) -> its dotted name

    def named(path):
        found = by_path.get(id(path))
        if found is not None:
            return found[0]
        parts, parent_name, parent = [], None, None
        for module in path:
            name = module_names.get(id(module))
            if name is None and parent is not None:
                names = children.get(id(parent))
                if names is None:
                    names = children[id(parent)] = {}
                    for k, m in parent._modules.items():  # named_children() without calling the module's code
                        if m is not None:
                            names.setdefault(id(m), k)
                child = names.get(id(module))
                name = "%s.%s" % (parent_name, child) if child is not None else None
            name = name or type(module).__name__
            classes[name] = type(module).__name__
            dotted.setdefault(id(module), name)
            parts.append(name)
            parent_name, parent = name, module
        by_path[id(path)] = (tuple(parts), path)  # the path is kept with its id: no other can take it
        return tuple(parts)

    for index, path in list(recorder.op_modules.items()):
        recorder.op_modules[index] = named(path)
    for calls in recorder.user_calls.values():
        calls[:] = [call[:5] + (named(call[5]),) + call[6:] for call in calls]
    recorder.open_calls = []


# How a module's backward hooks were registered, by the dict that holds them and the flag that
# tells the two kinds of `_backward_hooks` apart.
_OLD_STYLE_HOOK, _FULL_HOOK, _FULL_PRE_HOOK = ("register_backward_hook", "register_full_backward_hook",
                                               "register_full_backward_pre_hook")


def _module_backward_hooks(recorder) -> Dict[str, Tuple[Tuple[Optional[str], str], ...]]:
    """Dotted module name -> (the hook's name, how it was registered) for each backward hook of the
    modules that ran in the block, as they are when it ends: a hook that raised in backward is named
    by PyTorch by its `__name__` only. Read from the modules' dicts: nothing of the user's runs."""
    dotted = getattr(recorder, "module_dotted", {})
    out = {}
    for module in recorder.modules.values():
        state = module.__dict__
        hooks = [(hook, _FULL_HOOK if state.get("_is_full_backward_hook") else _OLD_STYLE_HOOK)
                 for hook in (state.get("_backward_hooks") or {}).values()]
        hooks += [(hook, _FULL_PRE_HOOK) for hook in (state.get("_backward_pre_hooks") or {}).values()]
        if hooks and id(module) in dotted:
            out[dotted[id(module)]] = tuple((_hook_name(hook), how) for hook, how in hooks)
    return out


def _hook_name(hook) -> Optional[str]:
    """A function's name, as PyTorch's messages give it (`'<lambda>'`); None for another callable,
    whose `__name__` could be a property of the user's."""
    return hook.__name__ if isinstance(hook, (types.FunctionType, types.MethodType)) else None


def raised_at(exc) -> Optional[Tuple[str, int, str]]:
    """(filename, line, function) of the innermost frame of the user's code in an exception's
    traceback: the line whose call raised it (`out = ddp(x)`), or the line of a hook or a custom
    Function's backward that backward() ran. None when no user frame is in it."""
    found = None
    tb = getattr(exc, "__traceback__", None)
    while tb is not None:
        code = tb.tb_frame.f_code
        if _frame_kind(code.co_filename) == _USER:
            found = (code.co_filename, tb.tb_lineno, code.co_name)
        tb = tb.tb_next
    return found


def build_trace(recorder, live, names, error: Optional[str] = None, error_at=None) -> TraceData:
    # Tens of thousands of small objects, none of them in a cycle: the cyclic GC would rescan
    # the growing heap again and again while they are made (3x the build time).
    enabled = gc.isenabled()
    gc.disable()
    try:
        trace = TraceData()
        trace.error = error
        # The ops, tensors and graph are what every diagnosis reads: without one of them nothing is
        # analysed (capture.finish says so). The other parts fail alone, and say what they lost.
        locations = {}
        _part(trace, "reading the source lines of the ops", "ops are shown without their lines",
              lambda: locations.update(_locations(recorder, trace)))
        if error_at is not None:
            trace.error_location = _location(trace, *error_at)
        trace.distributed = distributed.models_of(recorder)
        _tensors(recorder, trace, live, names)
        _ops(recorder, trace, locations)
        if not _part(trace, "linking the calls of your modules to their lines", "what a module you wrote returned "
                     "is not named by the line that called it", _calls, recorder, trace):
            trace.calls = []
        _graph(recorder, trace)
        if not _part(trace, "naming the tensors", "tensors are described instead of named", _names, trace, names,
                     getattr(recorder, "variable_names", {})):
            for info in trace.tensors.values():
                info.name = None
        trace.kept = {t_id: (first, last) for t_id, (first, last) in recorder.kept.seen.items() if t_id in trace.tensors}
        calls = recorder.function_calls
        trace.function_calls = [(calls[i], calls[i + 1]) for i in range(0, len(calls), 2)]
        trace.notes.extend(getattr(recorder, "module_name_notes", ()))
        trace.backward_hooks = dict(getattr(recorder, "backward_hooks", {}))
        if recorder.nan_origin is not None:
            backward, key, name, facts = recorder.nan_origin
            trace.nan_origin = {"backward": backward, "node": key, "name": name, "facts": facts}
        return trace
    finally:
        if enabled:
            gc.enable()


def _part(trace, what, lost, step, *args):
    """Run one part of the build that the rest can do without; False, and a warning, if it failed."""
    try:
        step(*args)
        return True
    except Exception as exc:
        trace.warnings.append(lost_part(what, exc, lost))
        return False


def _locations(recorder, trace) -> Dict[tuple, Location]:
    cache: Dict[tuple, Location] = {}  # (id(code), line): code objects do not cache their hash
    for rec in recorder.ops:
        code, line = rec[OP_CODE], rec[OP_LINE]
        if code is None or (id(code), line) in cache:
            continue
        filename = code.co_filename
        if filename not in trace.sources:
            trace.sources[filename] = list(linecache.getlines(filename))
        text = _without_comment(trace.source_line(filename, line)).strip()
        cache[(id(code), line)] = Location(filename, line, code.co_name, text, code.co_firstlineno)
    return cache


def _location(trace, filename, line, function) -> Location:
    if filename not in trace.sources:
        trace.sources[filename] = list(linecache.getlines(filename))
    return Location(filename, line, function, _without_comment(trace.source_line(filename, line)).strip())


def _calls(recorder, trace):
    """trace.calls, from the recorder's calls of user-written modules, in the order they began."""
    locations: Dict[tuple, Location] = {}
    for first in sorted(recorder.user_calls):
        for code, line, lasti, end, outputs, path, inputs in recorder.user_calls[first]:
            where = locations.get((id(code), line))
            if where is None:
                filename = code.co_filename
                if filename not in trace.sources:
                    trace.sources[filename] = list(linecache.getlines(filename))
                text = _without_comment(trace.source_line(filename, line)).strip()
                where = locations[(id(code), line)] = Location(filename, line, code.co_name, text,
                                                               code.co_firstlineno)
            outputs = tuple(t if t in trace.tensors else None for t in outputs)
            trace.calls.append(ModuleCall(location=where, module=path, first_op=first, end_op=end,
                                          outputs=outputs, inputs=tuple(t for t in inputs if t in trace.tensors),
                                          columns=call_columns(code, line, lasti), span=call_span(code, lasti)))
    trace.calls.sort(key=lambda call: (call.first_op, -call.end_op))  # an enclosing call before those inside it


def _without_comment(line: str) -> str:
    """The code of a line without its trailing comment (a `#` inside a string stays)."""
    if "#" not in line:
        return line
    try:
        for tok in tokenize.generate_tokens(io.StringIO(line).readline):
            if tok.type == tokenize.COMMENT:
                return line[:tok.start[1]].rstrip()
    except (tokenize.TokenError, IndentationError, SyntaxError):
        pass  # a line of a multi-line statement: keep it whole
    return line


def _tensors(recorder, trace, live, names_found):
    names: Dict[object, str] = {}
    metas = recorder.tensor_meta
    folded_created = len(recorder.folded_created)
    wanted = _referenced_tensors(recorder, live, names_found) if recorder.folded else None
    for t_id, meta in enumerate(metas) if wanted is None else ((t, metas[t]) for t in sorted(wanted)):
        shape, dtype, device, requires_grad, is_leaf, created_by, base, alias_of = meta
        if created_by is None and folded_created:
            created_by = recorder.created_by(t_id)
        dtype_name = names.get(dtype) or names.setdefault(dtype, str(dtype).replace("torch.", ""))
        device_name = names.get(device) or names.setdefault(device, str(device))
        info = TensorInfo(tid=t_id, shape=_plain_shape(shape), dtype=dtype_name,
                          device=device_name, requires_grad=bool(requires_grad), is_leaf=bool(is_leaf),
                          created_by=created_by, base=base, data_alias_of=alias_of,
                          first_requires_grad=bool(requires_grad), owner=recorder.param_owner.get(t_id),
                          optimized=t_id in recorder.optimized, is_parameter=t_id in recorder.parameters,
                          stepped_with_grad=t_id in recorder.stepped_with_grad, nonfinite_after=recorder.nonfinite.get(t_id),
                          grad_norms=recorder.grad_norms.get(t_id, []), norm=recorder.leaf_norms.get(t_id))
        if t_id in live:
            info.alive = True
            info.requires_grad, info.is_leaf, info.grad_fn, info.node, ref, info.version, info.elements = live[t_id]
            t = ref()
            info.grad = _grad_summary(t) if t is not None else None
        trace.tensors[t_id] = info


def _referenced_tensors(recorder, live, names_found) -> set:
    """After folding, the tensors anything kept still mentions. The others were made and used
    only by folded ops (whose records no longer list them): a long loop leaves millions."""
    wanted = set(live) | set(names_found) | set(recorder.param_owner) | set(recorder.optimized)
    wanted |= set(recorder.nonfinite) | set(recorder.grad_norms)
    wanted |= set(recorder.kept.seen)
    for rec in recorder.ops:
        if rec[OP_IN] or rec[OP_OUT]:
            wanted.update(rec[OP_IN])
            wanted.update(rec[OP_OUT])
    for cp in recorder.checkpoints:
        wanted.update(s[2] for s in cp[3] if s[2] is not None)
        wanted.update(t for t, _ in cp[4])
    wanted.update(e[2] for e in recorder.graph_nodes.values() if e[2] is not None)
    metas, todo = recorder.tensor_meta, list(wanted)
    while todo:  # the bases and `.data` sources of those, and theirs
        meta = metas[todo.pop()]
        for other in (meta[6], meta[7]):
            if other is not None and other not in wanted:
                wanted.add(other)
                todo.append(other)
    return wanted


def _plain_shape(shape) -> tuple:
    """Sizes as ints; a symbolic size (a nested tensor's ragged dimension) as its text."""
    if type(shape) is tuple and all(type(size) is int for size in shape):
        return shape  # recorded shapes are plain tuples already
    out = []
    for size in shape:
        try:
            out.append(int(size))
        except Exception:
            out.append(str(size))
    return tuple(out)


def _grad_summary(t) -> Optional[str]:
    try:
        g = t.grad if t.is_leaf else None
    except Exception:
        return None
    if g is None:
        return None
    try:
        flat = g.detach().reshape(-1)[:6].tolist()
    except Exception:  # layouts without a flat view (sparse, nested)
        return "tensor(shape=%s, layout=%s)" % (_plain_shape(graph_snapshot.shape_of(g)),
                                                str(g.layout).replace("torch.", ""))
    values = ", ".join(_number(v) for v in flat)
    more = ", ..." if g.numel() > 6 else ""
    return "tensor([%s%s]) shape=%s" % (values, more, _plain_shape(g.shape))


def _number(v) -> str:
    if isinstance(v, complex):
        return "%.4g%+.4gj" % (v.real, v.imag)
    return "%.4g" % v if isinstance(v, float) else str(v)


def _ops(recorder, trace, locations):
    op_modules = recorder.op_modules
    trace.modules = dict(getattr(recorder, "module_classes", {}))
    funcs = recorder.funcs
    nodes_of = recorder.nodes_of
    for index, rec in enumerate(recorder.ops):
        func = funcs[rec[OP_FUNC]]
        written = rec[OP_WR] or ()
        err = rec[OP_ERR]
        before, after = rec[OP_VB], rec[OP_VA]
        if type(before) is not tuple:  # packed by _fold
            before, after = tuple(before), tuple(after)
        op = OpRecord(index=index, name=op_name(func), location=locations.get((id(rec[OP_CODE]), rec[OP_LINE])),
                      module=op_modules.get(index, ()),
                      inputs=rec[OP_IN], outputs=rec[OP_OUT], versions_before=before, versions_after=after,
                      writes=tuple(w[0] for w in written) if written else (),
                      write_ranges=tuple(w[1] for w in written) if written else (),
                      grad_enabled=rec[OP_GRAD], node=nodes_of(index, rec),
                      error=None if err is None else "%s: %s" % err[:2],
                      out=err[2] if err is not None and len(err) > 2 else (), is_backward=func in _BACKWARD_FUNCS)
        trace.ops.append(op)
        for t_id, vb, va in zip(op.inputs, op.versions_before, op.versions_after):
            info = trace.tensors[t_id]
            if not info.versions:
                info.versions.append((-1 if info.created_by is None else info.created_by, vb))
            if va != vb:
                info.versions.append((index, va))
        for t_id in op.outputs:
            info = trace.tensors[t_id]
            if not info.versions and info.created_by == index:
                info.versions.append((index, 0))


def _made_by(recorder) -> Dict[int, int]:
    """Node key -> the op that made it: the recorder's node ranges and the sorted keys walked
    together (one bisect per node cost as much as the rest of the graph's build)."""
    ranges, made = recorder.node_ranges, {}
    keys = sorted(k for k in recorder.graph_nodes if k >= 0)
    if not ranges.in_order():
        # Not in order (a custom Function records its inner calls first): bisect as op_of_seq does.
        return {key: index for key in keys if (index := recorder.op_of_seq(key)) is not None}
    firsts, ends, indices = ranges.firsts, ranges.ends, ranges.indices
    at, n = -1, len(ranges)
    for key in keys:  # as op_of_seq: the last range starting at or before the key, if it holds it
        while at + 1 < n and firsts[at + 1] <= key:
            at += 1
        if at >= 0 and key < ends[at]:
            made[key] = indices[at]
    return made


def _graph(recorder, trace):
    made_by = _made_by(recorder)
    for key, (name, inputs, variable, consumed, _seen) in recorder.graph_nodes.items():
        trace.nodes[key] = GraphNode(key=key, name=name, created_by=made_by.get(key),
                                     inputs=[k for k in inputs if k is not None], variable=variable,
                                     consumed_by=list(consumed))
    # The node an op made for its result: the live tensor's grad_fn where known, else the
    # last node of the op's range that is in the graph (F.linear makes TBackward, then Addmm).
    for op in trace.ops:
        if op.node is None:
            continue
        first, end = op.node
        result = None
        for tid in op.outputs + op.writes:
            info = trace.tensors[tid]
            if info.node is not None and first <= info.node < end:
                result = info.node
        if result is None:
            # A node no checkpoint walked (a graph dropped before the end) is still the last one made.
            result = next((k for k in range(end - 1, first - 1, -1) if k in trace.nodes), end - 1)
        op.node = result
    for info in trace.tensors.values():
        if info.grad_fn is None and info.created_by is not None and info.requires_grad and not info.is_leaf:
            key = trace.ops[info.created_by].node
            if key in trace.nodes:
                info.grad_fn = trace.nodes[key].name
    latest: Dict[tuple, SavedSlot] = {}
    dtype_names: Dict[object, str] = {}
    for op_index, kind, roots, raw_slots, inputs, retain in recorder.checkpoints:
        cp = Checkpoint(op_index=op_index, kind=kind, roots=list(roots), inputs=[k for _, k in inputs],
                        input_tids=[t for t, _ in inputs], retain=retain)
        for raw in raw_slots:
            slot = SavedSlot(*raw)
            slot.shape = _plain_shape(slot.shape)
            dtype = dtype_names.get(slot.dtype)
            if dtype is None:
                dtype = dtype_names[slot.dtype] = str(slot.dtype).replace("torch.", "")
            slot.dtype = dtype
            cp.slots.append(slot)
            prev = latest.get((slot.node, slot.slot))
            if prev is None or not prev.stale or slot.stale:
                if not (slot.freed and prev is not None):
                    latest[(slot.node, slot.slot)] = slot
        trace.checkpoints.append(cp)
        for r in roots:
            if r not in trace.roots:
                trace.roots.append(r)
    for (key, _), slot in latest.items():
        if key in trace.nodes:
            trace.nodes[key].saved.append(slot)


def _namespace_names(recorder, namespaces, trees) -> Dict[int, str]:
    known = recorder.known
    found: Dict[int, str] = {}
    spaces: List[dict] = [ns for ns in namespaces if isinstance(ns, dict)]
    spaces += list(recorder.user_globals.values())
    params: Dict[int, str] = {}
    modules: Dict[int, str] = {}
    variables = set()
    for ns in spaces:
        for name, value in list(dict.items(ns)):  # not a subclass's items(): no code of the user's
            kind = value_kind(value)
            if not kind or name.startswith("_") or name in ("In", "Out"):
                continue
            if kind is TENSOR:
                t_id = known(value)
                if t_id is not None:
                    found.setdefault(t_id, name)
                    variables.add(t_id)
                continue
            try:
                tree = _module_tree(value, name, trees)
            except Exception:
                continue
            for dotted, p in tree.params + tree.buffers:
                t_id = known(p)
                if t_id is not None:
                    params.setdefault(t_id, dotted)
            if recorder.modules:
                for module_id, dotted in tree.modules:
                    modules.setdefault(module_id, dotted)
    for t_id, name in params.items():
        found.setdefault(t_id, name)
    for t_id, name in recorder.names.items():
        found.setdefault(t_id, name)
    # The names that are variables of the user's holding the tensor itself, not paths through a module.
    recorder.variable_names = {t_id: name for t_id, name in found.items()
                               if t_id in variables or recorder.names.get(t_id) == name}
    return found, modules


class _ModuleTree:
    """A module's parameters and buffers, then its submodules, by dotted name (as
    named_parameters, named_buffers and named_modules give them, first occurrence of each).
    Read from the module dicts in one walk: the three generators cost several times more, and
    the end of every block of a training loop runs this."""

    __slots__ = ("params", "buffers", "modules")

    def __init__(self, module, name):
        params, buffers, modules = [], [], []
        seen_tensors, seen_modules = set(), set()
        todo = [(name, module)]
        while todo:
            prefix, m = todo.pop()
            if id(m) in seen_modules:
                continue
            seen_modules.add(id(m))
            modules.append((id(m), prefix))
            for store, out in ((m._parameters, params), (m._buffers, buffers)):
                for pname, p in store.items():
                    if p is not None and id(p) not in seen_tensors:
                        seen_tensors.add(id(p))
                        out.append(("%s.%s" % (prefix, pname), p))
            children = [("%s.%s" % (prefix, child), sub) for child, sub in m._modules.items() if sub is not None]
            todo.extend(reversed(children))
        self.params, self.buffers, self.modules = params, buffers, modules


def _module_tree(module, name, trees):
    """The module's tree, read from its dicts also when its class defines named_parameters or
    named_modules of its own: plain PyTorch would not call them, and they may do anything (FSDP's
    give the same names outside summon_full_params)."""
    tree = trees.get((id(module), name))
    if tree is None:
        tree = trees[(id(module), name)] = _ModuleTree(module, name)
    return tree


def _names(trace, found: Dict[int, str], variables: Dict[int, str]):
    found = dict(found)
    for t_id, name in _assignment_targets(trace).items():
        found.setdefault(t_id, name)
    for t_id, info in trace.tensors.items():
        info.name = found.get(t_id)
        info.by_variable = info.name is not None and variables.get(t_id) == info.name
    # A detached alias shares its source's memory and version counter, as a view shares its base's.
    # One that torch made by calling the aten op (the output a compiled function saved for backward)
    # was never the user's: it is that tensor. (The user's own `x.detach()` is a tensor of its own.)
    detached_from = {op.outputs[0]: op.inputs[0] for op in trace.ops
                     if len(op.inputs) == 1 and len(op.outputs) == 1 and op.name.endswith("aten::detach")}
    # Views and aliases without a name of their own go by their base's name.
    for info in trace.tensors.values():
        if info.name is None:
            seen, cur = set(), info
            while cur.name is None and cur.tid not in seen:
                seen.add(cur.tid)
                nxt = cur.base if cur.base is not None else cur.data_alias_of
                if nxt is None:
                    nxt = detached_from.get(cur.tid)
                if nxt is None or nxt not in trace.tensors:
                    break
                cur = trace.tensors[nxt]
            if cur.name is not None and cur is not info:
                info.name = cur.name + (".data" if info.data_alias_of == cur.tid else "")


def _assignment_targets(trace) -> Dict[int, str]:
    """Names read off the source: `d = torch.matmul(x, w1)` names the result of the last op that
    ran for that statement; when it is the only op of the statement, its operands name its inputs
    too; an in-place write names the tensor it writes (`self.freq` in `torch.arange(n, out=self.freq)`)."""
    names: Dict[int, str] = {}
    parsed: Dict[str, tuple] = {}
    ops = trace.ops
    tensors = trace.tensors
    statements = _Statements(trace)

    def give(tid, name, text):
        # A parameter goes by its dotted path, or is described: `self.emb = nn.Embedding(10, 4)` ends
        # with an op on the embedding's weight, which is not what the line calls `self.emb`.
        info = tensors.get(tid)
        if info is not None and info.is_parameter and not _MAKES_PARAMETER.search(text):
            return
        names.setdefault(tid, name)

    # Each op's statement, as (file, function, first line): a statement written over several lines
    # runs its ops at any of them. An op that takes and returns no tensor (a grad-mode switch, the
    # bookkeeping of a compiled function) names nothing and does not end its statement's value.
    units: List[Optional[tuple]] = [None] * len(ops)
    unit_at: Dict[int, tuple] = {}  # ops of one line share one Location: its unit is made once
    for i, op in enumerate(ops):
        where = op.location
        if where is not None and (op.inputs or op.outputs):
            unit = unit_at.get(id(where))
            if unit is None:
                unit = unit_at[id(where)] = (where.filename, where.function, where.scope, statements.first_line(where))
            units[i] = unit
    # The next op of the same function: a statement that calls user code (a module's forward written
    # by the user, a forward hook) runs that code's lines in the middle of its own ops, so its last
    # op is the last before the function moves to another statement, not before any other line.
    # Functions are told apart by their code (two `forward`s of one file are two functions).
    later: Dict[tuple, int] = {}
    next_in_function: List[Optional[int]] = [None] * len(ops)
    for i in range(len(ops) - 1, -1, -1):
        unit = units[i]
        if unit is not None:
            next_in_function[i] = later.get(unit[:3])
            later[unit[:3]] = i
    # Calls of user-written modules by statement: when one ends after the statement's last op (a
    # Sequential whose last layer is the user's), what the statement assigns is what the call returned.
    calls_from: Dict[tuple, List[int]] = {}
    for call in trace.calls:
        where = call.location
        calls_from.setdefault((where.filename, where.function, where.scope, statements.first_line(where)),
                              []).append(call.first_op)
    previous = None
    for i, op in enumerate(ops):
        unit = units[i]
        if unit is None:
            continue
        prev, previous = previous, unit
        following = next_in_function[i]
        if following is not None and units[following] == unit:
            continue
        text = statements.text(op.location)
        if text not in parsed:
            parsed[text] = _read_statement(text)
        target, callee, operands, element, constructor = parsed[text]
        if constructor is not None and statements.facts(op.location.filename).is_class(constructor):
            target = element = None  # `dist = Categorical(logits=...)` is the object, not the last op's tensor
        if op.writes or op.error is not None:
            written = _written_tensor(op, text, parsed, lambda tid: _made_in_statement(ops, units, i, tid))
            if written is not None:
                names.setdefault(*written)
        starts = calls_from.get(unit)
        if starts and any(i < first < (len(ops) if following is None else following) for first in starts):
            continue
        if isinstance(target, _LoopTarget):  # `for row in h.unbind(0):`: each element goes by the loop's name
            if not op.is_backward:
                for tid in op.outputs:
                    give(tid, target.name, text)
        elif isinstance(target, tuple):  # `out, self.hidden = self.rnn(x, self.hidden)`: one name per output
            if len(target) == len(op.outputs) and not op.is_backward:
                for tid, name in zip(op.outputs, target):
                    if name:
                        give(tid, name, text)
        elif target and op.outputs and not op.is_backward:
            give(op.outputs[0], target, text)
        elif element and op.outputs and op.name != "Tensor.__setitem__":  # `stats["loss"] = F.mse_loss(...)`
            give(op.outputs[0], element, text)
        # Operands name inputs only when the statement's call is this very op: `self.emb(ids)` runs
        # F.embedding(ids, weight), whose inputs are not (self, ids).
        if prev != unit and operands is not None and len(operands) == len(op.inputs) and _same_op(callee, op.name):
            for tid, name in zip(op.inputs, operands):
                if name:
                    names.setdefault(tid, name)
    # What a user-written module returned, by the statement that called it (`fake = G(z)`: its ops ran
    # at the lines of G.forward, none at this one). After the names above: inside, it has its own.
    for call in trace.calls:
        if call.span is None or not call.outputs:
            continue
        text, first, indent = statements.text(call.location), statements.first_line(call.location), 0
        if first == call.location.line:
            full = trace.source_line(call.location.filename, first)
            indent = len(full.encode("utf-8")) - len(full.lstrip().encode("utf-8"))
        key = (text, first, indent, call.span)
        if key not in parsed:
            parsed[key] = _call_target(text, first, indent, call.span)
        target = parsed[key]
        if isinstance(target, tuple):
            if len(target) == len(call.outputs):
                for tid, name in zip(call.outputs, target):
                    if tid is not None and name:
                        give(tid, name, text)
        elif target and len(call.outputs) == 1 and call.outputs[0] is not None:
            give(call.outputs[0], target, text)
    return names


_MAKES_PARAMETER = re.compile(r"\bParameter\s*\(")


def _made_in_statement(ops, units, at: int, tid: int):
    """The op of the statement execution that ends with op `at` which returned tensor `tid`, or None."""
    unit = units[at]
    for i in range(at - 1, -1, -1):
        if units[i] is None:
            continue
        if units[i] == unit:
            if tid in ops[i].outputs:
                return ops[i]
        elif units[i][:3] == unit[:3]:
            return None  # the function was at another statement before: this execution began after it
    return None


def _call_target(text: str, first_line: int, indent: int, span) -> Optional[object]:
    """The name (or tuple of names) a statement assigns the result of the call at `span` to (lines
    and UTF-8 columns in the file; the statement starts at `first_line`, indented by `indent`), when
    the call is the whole value: `fake = G(z)`, `out, self.hidden = self.rnn(x, self.hidden)`. Else None."""
    try:
        tree = ast.parse(text)
    except SyntaxError:
        return None
    if len(tree.body) != 1 or not isinstance(tree.body[0], (ast.Assign, ast.AnnAssign)):
        return None
    stmt = tree.body[0]
    targets = stmt.targets if isinstance(stmt, ast.Assign) else [stmt.target]
    value = stmt.value
    if len(targets) != 1 or not isinstance(value, ast.Call):
        return None
    at = (value.lineno + first_line - 1, value.col_offset + (indent if value.lineno == 1 else 0),
          value.end_lineno + first_line - 1, value.end_col_offset + (indent if value.end_lineno == 1 else 0))
    if at != tuple(span):
        return None
    return _dotted(targets[0]) or _dotted_tuple(targets[0])


class _LoopTarget(str):
    """The name a `for` line gives, in turn, to each element of what it iterates."""

    @property
    def name(self) -> str:
        return str(self)


def _read_statement(text: str):
    """(assigned name or None, name of its one operation or None, operand names or None, the element
    of a list or dict it stores into or None, the callee of its value when that may be a class or None)."""
    if text.startswith("for ") and text.endswith(":"):
        try:
            loop = ast.parse(text + " pass").body[0]
        except SyntaxError:
            return None, None, None, None, None
        name = _dotted(loop.target) if isinstance(loop, ast.For) else None
        return (_LoopTarget(name) if name else None), None, None, None, None
    try:
        tree = ast.parse(text)
    except SyntaxError:
        return None, None, None, None, None
    if len(tree.body) != 1:
        return None, None, None, None, None
    stmt = tree.body[0]
    target, value, element = None, None, None
    if isinstance(stmt, ast.Assign) and len(stmt.targets) == 1:
        # A name or an attribute (`self.hidden = ...`: what the user's code calls it there).
        target = _dotted(stmt.targets[0]) or _dotted_tuple(stmt.targets[0])
        value = stmt.value
        if isinstance(stmt.targets[0], ast.Subscript):  # t[i] = v: Tensor.__setitem__(t, i, v); or a dict's item
            element = None if isinstance(value, _NOT_ONE_VALUE) else _element(stmt.targets[0], text)
            return None, "__setitem__", _operands([stmt.targets[0].value, stmt.value]), element, _constructor(value)
    elif isinstance(stmt, (ast.AnnAssign, ast.AugAssign)) and _dotted(stmt.target):
        target = _dotted(stmt.target)
        value = stmt.value
        if isinstance(stmt, ast.AugAssign):
            return target, "__i%s__" % _BINOPS.get(type(stmt.op), "?"), _operands([stmt.target, stmt.value]), None, None
    elif isinstance(stmt, ast.Expr):
        value = stmt.value
    if isinstance(value, _NOT_ONE_VALUE) and not isinstance(target, tuple):
        target = None  # `scales = [torch.ones(3)]`: the list is `scales`, the tensor in it is not
    return (target,) + _operands_of(value) + (None, _constructor(value))


# Values that are never the result of their statement's last op: containers built on the line.
_NOT_ONE_VALUE = (ast.List, ast.Tuple, ast.Set, ast.Dict, ast.ListComp, ast.SetComp, ast.DictComp, ast.GeneratorExp)


def _constructor(value) -> Optional[str]:
    """The callee of a value that may construct an object, by its capitalised name (`Slot`,
    `torch.distributions.Categorical`), except the classes that make tensors; else None."""
    if not isinstance(value, ast.Call):
        return None
    callee = _dotted(value.func)
    last = callee.rpartition(".")[2] if callee else ""
    if not last[:1].isupper() or last.endswith(("Tensor", "Parameter", "Variable", "Buffer")):
        return None
    return callee


def _operands_of(node):
    """(the call's name, operand names) of an expression that is one operation, else (None, None)."""
    if isinstance(node, ast.BinOp):
        return "__%s__" % _BINOPS.get(type(node.op), "?"), _operands([node.left, node.right])
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
        return "__neg__", _operands([node.operand])
    if isinstance(node, ast.Call) and not node.keywords and isinstance(node.func, ast.Attribute):
        owner = node.func.value
        if isinstance(owner, ast.Name) and owner.id in ("torch", "F", "nn", "np"):
            return node.func.attr, _operands(list(node.args))
        if _dotted(owner):  # a method call: the receiver (`x`, `m.weight`) is the first input
            return node.func.attr, _operands([owner] + list(node.args))
    return None, None


def _dotted_tuple(node) -> Optional[tuple]:
    """`h, c` or `out, self.hidden` (a tuple of names or attributes, `_` for one not kept), else None."""
    if not isinstance(node, (ast.Tuple, ast.List)) or not node.elts:
        return None
    names = tuple(_dotted(e) for e in node.elts)
    if None in names:
        return None
    return tuple(None if n == "_" else n for n in names)


def _operands(nodes):
    """Names of the tensor-like operands; None when one is an expression we cannot place."""
    out = []
    for n in nodes:
        name = _dotted(n)  # `x`, `self.w`: the value of that name or attribute is the operand
        if name:
            out.append(name)
        elif isinstance(n, ast.Constant) or (isinstance(n, ast.UnaryOp) and isinstance(n.operand, ast.Constant)):
            continue  # a Python number (-0.1 too): not among the op's tensor inputs
        else:
            return None
    return out
