"""What needs the user's live objects, taken when the block ends: the final state of each live
tensor, the names tensors and modules go by in the user's namespaces and models, the parameters of
the models called, their backward hooks, the gradient norms read at last. Everything else is built
later, from plain records (build.py). Nothing of the user's code runs here: modules are read from
their dicts, namespaces without their own items().
"""
from __future__ import annotations

import linecache
import math
import os
import types
from dataclasses import dataclass, field
from typing import Dict, Iterable, List, Optional, Tuple

from ..source.naming import callee_of_call, single_callee
from . import distributed, nan_watch
from . import graph as graph_snapshot
from .frames import USER, frame_kind, namespace_items
from .records import NODE_RUNS
from .tensors import TENSOR, value_kind


@dataclass
class Frozen:
    """What freeze() took from the live objects."""
    live: Dict[int, tuple] = field(default_factory=dict)      # tid -> (requires_grad, is_leaf, grad_fn name,
                                                              # node key, weak reference, version, elements)
    names: Dict[int, str] = field(default_factory=dict)       # tid -> the name it goes by
    variables: Dict[int, str] = field(default_factory=dict)   # ... where that name is a variable holding it
    param_owner: Dict[int, str] = field(default_factory=dict)  # parameter tid -> outermost module holding it
    module_notes: List[str] = field(default_factory=list)     # modules that would share a name
    module_classes: Dict[str, str] = field(default_factory=dict)  # dotted module name -> class name
    op_modules: Dict[int, Tuple[str, ...]] = field(default_factory=dict)  # op index -> dotted module path
    user_calls: Dict[int, list] = field(default_factory=dict)  # first op -> calls of user modules, paths named
    backward_hooks: Dict[str, tuple] = field(default_factory=dict)  # dotted module name -> its backward hooks
    distributed: List[tuple] = field(default_factory=list)    # the DDPs called (distributed.freeze)
    nonfinite: Dict[int, int] = field(default_factory=dict)   # tid -> first backward leaving its grad non-finite
    grad_norms: Dict[int, list] = field(default_factory=dict)  # tid -> [(backward op index, norm)]
    leaf_norms: Dict[int, float] = field(default_factory=dict)  # tid -> its own norm at the end of the block
    buffers: set = field(default_factory=set)                 # tids of the buffers of the models called
    roots_finite: Dict[int, bool] = field(default_factory=dict)  # checked backward op index -> its roots were finite


def end_checkpoint(recorder):
    """Inspect every graph still reachable from a live tensor of the block."""
    roots = []
    nodes, freeing = recorder.graph.nodes, recorder.backward.freeing
    for ref in recorder.tensors.refs:
        t = ref()
        if t is None:
            continue
        fn = _graph_of(t)[0]
        if fn is None:
            continue
        entry = nodes.get(fn._sequence_nr()) if type(fn) is not graph_snapshot._ACCUMULATE_GRAD else None
        if entry is not None and any(b in freeing for b in entry[NODE_RUNS]):
            continue  # a backward ran its graph and freed it: nothing in it can be run or checked again
        roots.append(t)
    snap = graph_snapshot.take(recorder, roots, len(recorder.ops), "end")[0]
    recorder.backward.checkpoints.append(snap)
    return snap


def freeze(recorder, namespaces: Iterable[dict]) -> Frozen:
    """What needs the user's live objects, taken when the block ends."""
    frozen = Frozen()
    tensors = recorder.tensors
    live = frozen.live
    for t_id, ref in enumerate(tensors.refs):
        t = ref()
        if t is not None:
            fn, is_leaf = _graph_of(t)
            # The grad is summarised when the trace is built, read through the weak reference.
            live[t_id] = (bool(t.requires_grad), is_leaf,
                          None if fn is None else graph_snapshot.node_name(fn),
                          None if fn is None else graph_snapshot.node_key(fn, tensors), ref,
                          None if t.is_inference() else t._version, _elements(t))
    try:
        # kept to the end: alive now, made before the last backward
        recorder.backward.kept.look(tensors.refs, len(recorder.ops))
    except Exception as exc:
        recorder.lose("looking which tensors outlived their backward call at the end of the block", exc,
                      "graphs kept to the end of the block were not looked for")
    trees = {}  # (id(module), name) -> _ModuleTree: the model is met by more than one of these
    names, module_names = {}, {}
    calls = recorder.modules
    try:  # each part fails alone, and the trace says what it lost
        try:
            names, module_names = _namespace_names(recorder, frozen, namespaces, trees)
        except Exception as exc:
            recorder.lose("reading the variable names of the block", exc,
                          "tensors and modules are described instead of named")
        try:
            frozen.module_notes = _name_outermost_modules(calls, module_names, trees)
        except Exception as exc:
            recorder.lose("naming the models by the lines that called them", exc, "models go by their class names")
        try:
            for t_id, (owner, dotted) in _module_parameters(calls, tensors, module_names, trees).items():
                names.setdefault(t_id, dotted)
                frozen.param_owner[t_id] = owner
        except Exception as exc:
            recorder.lose("listing the parameters of the models called", exc,
                          "parameters are described instead of named, and unused or frozen ones are not listed")
        try:
            for t_id, dotted in _module_buffers(calls, tensors, module_names, trees).items():
                names.setdefault(t_id, dotted)
                frozen.buffers.add(t_id)
        except Exception as exc:
            recorder.lose("listing the buffers of the models called", exc, "buffers are described instead of named")
        module_dotted = {}
        try:
            _name_module_paths(calls, module_names, frozen, module_dotted)
        except Exception as exc:
            recorder.lose("naming the modules that ops ran in", exc, "ops are not grouped by module")
            frozen.op_modules, frozen.user_calls = {}, {}
        try:
            frozen.backward_hooks = _module_backward_hooks(calls, module_dotted)
        except Exception as exc:
            recorder.lose("reading the backward hooks of the modules called", exc,
                          "an error that a module's backward hook raised is not traced to that module")
        try:
            frozen.distributed = distributed.freeze(recorder, module_names, names)
        except Exception as exc:
            recorder.lose("reading the DistributedDataParallel models of the block", exc,
                          "the parameters DDP waits for are not named in its errors")
    finally:
        recorder.lines.forget_globals()  # never hold the user's namespaces (or modules) past the block
        distributed.before_release(calls.modules)
        calls.release()
    frozen.names = names
    try:
        _read_gradient_norms(recorder, frozen)
    except Exception as exc:
        recorder.lose("reading the gradients after backward", exc, "non-finite gradients of leaves were not "
                      "looked for, and trace.grad_stats() has no norms")
    return frozen


def _read_gradient_norms(recorder, frozen):
    """The gradient norms taken after the checked backward calls (the last one's now, if a long loop
    left it unchecked), read at last: frozen.nonfinite (the first backward after which each leaf's
    gradient held NaN/Inf), frozen.grad_norms (tid -> [(backward op index, norm)]), and the norm
    of each of those leaves now, the scale its gradient is judged against (Trace.grad_stats)."""
    refs = recorder.tensors.refs
    checked = recorder.backward.take_gradient_norms(refs)
    roots = recorder.backward.take_root_norms()
    seen = dict.fromkeys(t_id for _, norms in checked for t_id, _ in norms)
    leaves = [(t_id, t) for t_id, t in ((t_id, refs[t_id]()) for t_id in seen)
              if t is not None and (t.is_floating_point() or t.is_complex())]
    # Every norm of the block read at once: on a GPU, one synchronisation at the block's end.
    *read, own = nan_watch.read_norm_lists([norms for _, norms in checked] + [norms for _, norms in roots]
                                            + [nan_watch.norms_of(leaves)])
    after_calls, root_values = read[:len(checked)], read[len(checked):]
    frozen.roots_finite = {index: all(math.isfinite(norm) for _, norm in norms)
                           for (index, _), norms in zip(roots, root_values)}
    for (index, kept), norms in zip(roots, root_values):
        # A loss on a device was not read when its backward ran (a sync): the forward line that first
        # left the finite numbers is looked for now, among the tensors still alive.
        if (not frozen.roots_finite[index] and index not in recorder.backward.nonfinite_forward
                and any(type(norm) is not float for _, norm in kept)):
            first = nan_watch.first_nonfinite(recorder.ops[:index], recorder.tensors, any_device=True)
            if first is not None:
                recorder.backward.nonfinite_forward[index] = first
    for (index, _), norms in zip(checked, after_calls):
        for t_id, norm in norms:
            if not math.isfinite(norm):
                frozen.nonfinite.setdefault(t_id, index)
            frozen.grad_norms.setdefault(t_id, []).append((index, norm))
    frozen.leaf_norms = dict(own)


def _name_outermost_modules(calls, module_names, trees) -> List[str]:
    """A module that no namespace names (a model made inside a function) goes by the callee of the
    line that called it (recorded by the forward pre-hook): `logits = model(x)` names it `model`,
    `h = self.encoder(x)` `self.encoder`, `y = dec(torch.relu(enc(x)))` `dec` (the call itself is
    read where its columns are known). Otherwise by its class name: never by a guess. Modules that
    would share a name (two `Linear`s, the layers of a list called by one line) are told apart by
    the order of their first calls, `layer (call 2)`, and a note says where each was called."""
    call_sites = calls.call_sites
    roots = {}  # id(module) -> (module, name, named by a namespace)
    for module, index in calls.outermost():
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
                callee = callee_of_call(text.encode("utf-8")[first:end].decode("utf-8", "replace").strip())
            callee = callee or single_callee(text.strip())
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
    for module, name, from_namespace in roots.values():
        if not from_namespace:
            module_names[id(module)] = name
            for module_id, dotted in _module_tree(module, name, trees).modules:
                module_names.setdefault(module_id, dotted)
    return notes


def _module_parameters(calls, tensors, module_names, trees):
    """tid -> (outermost module's name, dotted parameter name) for every parameter of the modules
    called in the block, used or not (an unused one is information for the report)."""
    out = {}
    for module, _ in calls.outermost():
        owner = module_names.get(id(module)) or type(module).__name__
        try:
            named = _module_tree(module, owner, trees).params
        except Exception:
            continue
        for dotted, p in named:
            out.setdefault(tensors.tid(p), (owner, dotted))
    return out


def _module_buffers(calls, tensors, module_names, trees):
    """tid -> dotted name of the buffers of the modules called in the block that the block used
    (a spectral norm's power-iteration vector `model.u`): named as parameters are, owned by none."""
    out = {}
    for module, _ in calls.outermost():
        owner = module_names.get(id(module)) or type(module).__name__
        try:
            named = _module_tree(module, owner, trees).buffers
        except Exception:
            continue
        for dotted, b in named:
            t_id = tensors.known(b)
            if t_id is not None:
                out.setdefault(t_id, dotted)
    return out


def _name_module_paths(calls, module_names, frozen, dotted):
    """Each op's module path, and each call of a user module's, with dotted names for the module
    objects (net.encoder.layers.0); `dotted` gets id(module) -> its dotted name."""
    by_path = {}
    children = {}  # id(parent) -> {id(child): its attribute name}
    classes = frozen.module_classes

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

    frozen.op_modules = {index: named(path) for index, path in calls.op_modules.items()}
    frozen.user_calls = {first: [call[:5] + (named(call[5]),) + call[6:] for call in made]
                         for first, made in calls.user_calls.items()}


# How a module's backward hooks were registered, by the dict that holds them and the flag that
# tells the two kinds of `_backward_hooks` apart.
_OLD_STYLE_HOOK, _FULL_HOOK, _FULL_PRE_HOOK = ("register_backward_hook", "register_full_backward_hook",
                                               "register_full_backward_pre_hook")


# How a module's backward hooks were registered, by the dict that holds them and the flag that
# tells the two kinds of `_backward_hooks` apart.
_OLD_STYLE_HOOK, _FULL_HOOK, _FULL_PRE_HOOK = ("register_backward_hook", "register_full_backward_hook",
                                               "register_full_backward_pre_hook")


def _module_backward_hooks(calls, dotted) -> Dict[str, Tuple[Tuple[Optional[str], str], ...]]:
    """Dotted module name -> (the hook's name, how it was registered) for each backward hook of the
    modules that ran in the block, as they are when it ends: a hook that raised in backward is named
    by PyTorch by its `__name__` only. Read from the modules' dicts: nothing of the user's runs."""
    out = {}
    for module in calls.modules.values():
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


def _namespace_names(recorder, frozen, namespaces, trees) -> Tuple[Dict[int, str], Dict[int, str]]:
    known = recorder.tensors.known
    found: Dict[int, str] = {}
    spaces = list(namespaces) + list(recorder.lines.user_globals.values())
    params: Dict[int, str] = {}
    modules: Dict[int, str] = {}
    variables = set()
    for ns in spaces:
        for name, value in namespace_items(ns):  # never a subclass's items(): no code of the user's
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
            if recorder.modules.modules:
                for module_id, dotted in tree.modules:
                    modules.setdefault(module_id, dotted)
    for t_id, name in params.items():
        found.setdefault(t_id, name)
    at_backward = recorder.backward.names
    for t_id, name in at_backward.items():
        found.setdefault(t_id, name)
    # The names that are variables of the user's holding the tensor itself, not paths through a module.
    frozen.variables = {t_id: name for t_id, name in found.items()
                        if t_id in variables or at_backward.get(t_id) == name}
    return found, modules


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


def raised_at(exc) -> Optional[Tuple[str, int, str]]:
    """(filename, line, function) of the innermost frame of the user's code in an exception's
    traceback: the line whose call raised it (`out = ddp(x)`), or the line of a hook or a custom
    Function's backward that backward() ran. None when no user frame is in it."""
    found = None
    tb = getattr(exc, "__traceback__", None)
    while tb is not None:
        code = tb.tb_frame.f_code
        if frame_kind(code.co_filename) == USER:
            found = (code.co_filename, tb.tb_lineno, code.co_name)
        tb = tb.tb_next
    return found
