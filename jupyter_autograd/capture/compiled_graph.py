"""The graph of a torch.compile region, read once: which FX graph Dynamo made for the region now
running, and each of its nodes as an op of the user's line (from the node's stack trace).

Dynamo hands its FX graph (`GraphModule`) to the backend and installs what the backend returned as
a global of the compiled function's module, `__compiled_fn_<n>`, which the function's rewritten
code calls. The AOTAutograd wrappers that the default backends return keep the graph module (their
`named_parameters` is its bound method); the `eager` backend returns its `forward`. So the graph
of a running region is found from the stack: the rewritten frame, the global its current call
loaded, the graph behind it. Nothing is called and no backend is changed: this only reads.

A Region holds plain data only (torch functions, code objects, shapes and dtypes), never a tensor
or a user object: it is cached for as long as torch keeps the compiled function.
"""
from __future__ import annotations

import dis
import linecache
import operator
import re
import sys
import weakref
from typing import List, Optional

import torch

from .frames import USER, frame_kind

_Tensor = torch.Tensor
_AOT_MODULE = "torch._functorch._aot_autograd.runtime_wrappers"
_STACK_FRAME = re.compile(r'File "([^"]+)", line (\d+), in (\S+)')
_SET_GRAD = torch._C._set_grad_enabled
_RESUME = "torch_dynamo_resume_in_"  # Dynamo's name for the code that continues after a graph break

# Python's operators as the functions our mode records for them (`h + b` is recorded as Tensor.add).
_OPERATORS = {operator.add: "add", operator.sub: "sub", operator.mul: "mul", operator.truediv: "div",
              operator.floordiv: "floor_divide", operator.matmul: "matmul", operator.pow: "pow",
              operator.mod: "remainder", operator.neg: "neg", operator.abs: "abs", operator.pos: "positive",
              operator.lt: "lt", operator.le: "le", operator.gt: "gt", operator.ge: "ge", operator.eq: "eq",
              operator.ne: "ne", operator.and_: "bitwise_and", operator.or_: "bitwise_or",
              operator.xor: "bitwise_xor", operator.invert: "bitwise_not", operator.getitem: "__getitem__",
              operator.setitem: "__setitem__", operator.iadd: "add_", operator.isub: "sub_",
              operator.imul: "mul_", operator.itruediv: "div_", operator.ipow: "pow_",
              operator.imatmul: "matmul"}


def is_compiled_function(cls) -> bool:
    """The autograd Function AOTAutograd makes for a compiled graph."""
    return cls.__name__ == "CompiledFunction" and cls.__module__ == _AOT_MODULE


def user_frame(stack_trace):
    """(filename, line, function) of the innermost frame of the user's code in an FX node's stack
    trace (outermost first), or None."""
    found = None
    for filename, line, function in _STACK_FRAME.findall(stack_trace or ""):
        if frame_kind(filename) == USER:
            found = (filename, int(line), function)
    return found


class Node:
    """One op of the region: its FX node's name, what stands for its function in an op record (a torch function, or a
    Tensor method), the user's (code, line), the value slots it reads and makes, the grad mode a
    switch sets (else None), whether it writes its first input, and the modules it ran in (each
    as the attribute path from the region's module, or from a global)."""

    __slots__ = ("name", "func", "code", "line", "inputs", "outputs", "switch", "writes", "modules")

    def __init__(self, name, func, code, line, inputs, outputs, switch, writes, modules):
        self.name, self.func, self.code, self.line = name, func, code, line
        self.inputs, self.outputs, self.switch, self.writes, self.modules = inputs, outputs, switch, writes, modules


class Region:
    """A compiled graph as ops. Value slots: 0 .. n_inputs-1 are the graph's inputs (the arguments
    of its CompiledFunction, in order); later slots are the tensors its nodes make, each with
    (shape, dtype, device, requires_grad) in `values`. `outputs`: the slot of each graph output (None
    for one that is not a tensor); `owner`: the node whose op stands for the region's autograd node
    (the last that makes an output); `no_grad`: the inputs that require grad but reach no output
    through values that do (a cut inside the region), whose gradient is None after backward."""

    __slots__ = ("name", "code", "module", "n_inputs", "values", "nodes", "outputs", "owner", "no_grad", "graph")

    def __init__(self, name, code, module):
        self.name, self.code, self.module = name, code, module  # module: the `__name__` of its globals
        self.n_inputs = 0
        self.values = {}
        self.nodes: List[Node] = []
        self.outputs = ()
        self.owner = None
        self.no_grad = frozenset()
        self.graph = None  # a weak reference to Dynamo's graph, where a NaN can be looked for in it again

    def globals_of(self):
        """The globals of the compiled function, where its module is imported (a notebook's is
        `__main__`); None elsewhere. Not kept: a region lives as long as torch's compiled code."""
        module = sys.modules.get(self.module) if isinstance(self.module, str) else None
        return getattr(module, "__dict__", None)


# -- finding the graph of the region running now ---------------------------------------------------

def running_graph(frame, n_args):
    """(the GraphModule Dynamo made for the region whose code called us, the original code of the
    compiled function, the name of its module) for a region entered from the rewritten frame outside `frame`; None when it
    cannot be told (another kind of caller, a graph whose inputs do not match the call's)."""
    utils = sys.modules.get("torch._dynamo.utils")
    if utils is None:
        return None
    originals = utils.orig_code_map
    depth = 0
    while frame is not None and depth < 64:
        code = frame.f_code
        if code in originals:
            name = _called_global(code, frame.f_lasti)
            if name is None:
                return None
            gm = _graph_module(frame.f_globals.get(name))
            if gm is None or sum(1 for n in gm.graph.nodes if n.op == "placeholder") != n_args:
                return None
            return gm, originals[code], frame.f_globals.get("__name__")
        frame = frame.f_back
        depth += 1
    return None


_loads = weakref.WeakKeyDictionary()  # rewritten code -> [(offset, name)] of its loads of compiled graphs


def _called_global(code, lasti):
    """The `__compiled_fn_<n>` global that the call at instruction `lasti` of Dynamo's rewritten code
    calls: the last one loaded before it (the arguments in between load no other)."""
    loads = _loads.get(code)
    if loads is None:
        loads = _loads[code] = [(i.offset, i.argval) for i in dis.get_instructions(code)
                                if i.opname == "LOAD_GLOBAL" and str(i.argval).startswith("__compiled_fn")]
    found = None
    for offset, name in loads:
        if offset > lasti:
            break
        found = name
    return found


def _graph_module(fn):
    """The Dynamo GraphModule behind a compiled-graph global: through `disable`'s `__wrapped__`,
    a bound `forward`, AOTAutograd's `named_parameters`, and closure cells, a few steps deep.
    Attributes are read from the objects' own dicts: no user code runs."""
    gm_type = torch.fx.GraphModule
    todo, seen = [fn], set()
    for _ in range(32):
        if not todo:
            return None
        obj = todo.pop(0)
        if obj is None or id(obj) in seen:
            continue
        seen.add(id(obj))
        if isinstance(obj, gm_type):
            if "dynamo_compile_id" in obj.meta:
                return obj
            continue
        owner = getattr(obj, "__self__", None) if type(obj).__name__ == "method" else None
        if owner is not None:
            todo.append(owner)
            obj = obj.__func__
        state = getattr(obj, "__dict__", None)
        if type(state) is dict:
            todo.append(state.get("__wrapped__"))
            named = state.get("named_parameters")
            todo.append(getattr(named, "__self__", None) if type(named).__name__ == "method" else None)
        if type(obj).__name__ == "function":
            for cell in obj.__closure__ or ():
                try:
                    todo.append(cell.cell_contents)
                except ValueError:
                    pass
        elif type(obj).__name__ == "partial":
            todo.append(obj.func)
    return None


# -- the graph as ops ------------------------------------------------------------------------------

def region_of(gm, original, module) -> Optional[Region]:
    """The ops of Dynamo's graph `gm` for the compiled function whose code is `original`. A node
    whose stack trace names no line of the user's gets code None: the line that called the region."""
    name = _function_name(original)
    region = Region(name, original, module)
    places = _Places(original)
    slot_of = {}     # fx node -> its slot, or a tuple of slots (a node that makes several tensors)
    by_value = {}    # id of an example tensor -> its slot: an in-place op's result is its input
    inputs_requiring_grad = []
    n_inputs = 0
    for node in gm.graph.nodes:
        if node.op == "placeholder":
            slot_of[node] = n_inputs
            value = node.meta.get("example_value")
            if isinstance(value, _Tensor):
                by_value[id(value)] = n_inputs
                if value.requires_grad:
                    inputs_requiring_grad.append(n_inputs)
            n_inputs += 1
    region.n_inputs = next_slot = n_inputs
    for node in gm.graph.nodes:
        if node.op in ("placeholder", "output"):
            if node.op == "output":
                region.outputs = tuple(s if isinstance(s, int) else None for s in _flat_slots(node.args, slot_of))
            continue
        value = node.meta.get("example_value")
        if node.op == "call_function" and node.target is operator.getitem and node.args and \
                isinstance(slot_of.get(node.args[0]), tuple) and isinstance(node.args[1], int):
            parts = slot_of[node.args[0]]
            slot_of[node] = parts[node.args[1]] if node.args[1] < len(parts) else None
            continue
        func, writes = _func_of(node)
        switch = bool(node.args[0]) if node.target is _SET_GRAD and node.args else None
        inputs = tuple(s for s in _flat_slots((node.args, node.kwargs), slot_of) if isinstance(s, int))
        made = []
        for v in _tensors(value):
            known = by_value.get(id(v))
            if known is None:
                known = by_value[id(v)] = next_slot
                region.values[next_slot] = _meta(v)
                next_slot += 1
            made.append(known)
        if isinstance(value, _Tensor):
            slot_of[node] = made[0]
        elif isinstance(value, (tuple, list)):
            slot_of[node] = tuple(made) if len(made) == len(value) else None
        if func is None or (not inputs and not made and switch is None):
            continue  # bookkeeping with no tensor (sizes, autocast's state): no op of the user's
        code, line = places.of(node.meta.get("stack_trace"))
        region.nodes.append(Node(node.name, func, code, line, inputs, tuple(made), switch, writes and bool(inputs),
                                 _module_paths(node.meta.get("nn_module_stack"))))
    outputs = {s for s in region.outputs if s is not None and s >= n_inputs}
    region.owner = next((i for i in range(len(region.nodes) - 1, -1, -1)
                         if outputs.intersection(region.nodes[i].outputs)), len(region.nodes) - 1)
    region.no_grad = _cut_inputs(region, inputs_requiring_grad)
    return region if region.nodes else None


def _cut_inputs(region, requiring):
    """The input slots that require grad and whose gradient reaches no output: what flows into each
    value, through values that require grad (as autograd propagates it), in the graph's order."""
    flows = {i: {i} for i in requiring}
    for node in region.nodes:
        came = set()
        for s in node.inputs:
            came |= flows.get(s, set())
        for s in node.outputs:
            if s >= region.n_inputs and region.values[s][3]:
                flows[s] = flows.get(s, set()) | came
    reached = set()
    for s in region.outputs:
        if s is not None:
            reached |= flows.get(s, set())
    return frozenset(i for i in requiring if i not in reached)


def _flat_slots(args, slot_of):
    out = []
    torch.fx.node.map_arg(args, lambda n: out.append(slot_of.get(n)))
    flat = []
    for s in out:
        flat.extend(s if isinstance(s, tuple) else (s,))
    return flat


def _tensors(value):
    if isinstance(value, _Tensor):
        return [value]
    if isinstance(value, (tuple, list)):
        return [v for v in value if isinstance(v, _Tensor)]
    return []


def _meta(t):
    shape = []
    for size in t.shape:
        shape.append(size if type(size) is int else str(size))
    return (tuple(shape), t.dtype, t.device, bool(t.requires_grad))


def _func_of(node):
    """(what our mode would have recorded for the node's call, whether it writes its first input)."""
    target = node.target
    if node.op == "call_method":
        func = getattr(_Tensor, target, None)
        return func, target.endswith("_") and not target.endswith("__")
    if node.op == "call_function":
        method = _OPERATORS.get(target)
        if method is not None:
            return getattr(_Tensor, method, target), method.endswith("_") and not method.startswith("__") \
                or method == "__setitem__"
        if target is _SET_GRAD:
            return target, False
        module = getattr(target, "__module__", None) or ""
        if module.startswith(("torch", "_operator")) or type(target).__name__ == "builtin_function_or_method":
            return target, getattr(target, "__name__", "").endswith("_") and not \
                getattr(target, "__name__", "").endswith("__")
        return target, False
    return None, False  # call_module too: Dynamo inlines modules; what it keeps whole is not one of ours


def _module_paths(stack):
    """The module attribute paths of an nn_module_stack ({key: (source, class)}), outermost first,
    each as (root, names): root `self` (the module whose forward was compiled) or a global's name."""
    if not stack:
        return ()
    out = []
    for value in stack.values():
        source = value[0] if isinstance(value, tuple) else value
        parsed = _module_source(str(source))
        if parsed is not None:
            out.append(parsed)
    return tuple(out)


_SOURCE_ROOT = re.compile(r"^(L|G)\['([A-Za-z_][A-Za-z0-9_]*)'\]")
_SOURCE_PART = re.compile(r"\.([A-Za-z_][A-Za-z0-9_]*)|\[(\d+)\]|\._modules\['([^']+)'\]")


def _module_source(source):
    """("self" or ("global", name), attribute names) of a Dynamo source such as
    `L['self'].encoder.layers[0]`; None for one we do not read."""
    m = _SOURCE_ROOT.match(source)
    if m is None:
        return None
    scope, name = m.groups()
    if scope == "L" and name != "self":
        return None  # a module passed as an argument: the call's locals are not read
    rest, names = source[m.end():], []
    while rest:
        p = _SOURCE_PART.match(rest)
        if p is None:
            return None
        names.append(p.group(1) or p.group(2) or p.group(3))
        rest = rest[p.end():]
    return ("self" if scope == "L" else ("global", name), tuple(n for n in names if n != "_modules"))


def _function_name(code):
    name = code.co_name
    if name.startswith(_RESUME):  # `torch_dynamo_resume_in_f_at_12`: the rest of `f`
        name = name[len(_RESUME):].rsplit("_at_", 1)[0]
    return code.co_qualname if hasattr(code, "co_qualname") and code.co_name == name else name


class _Places:
    """The user's (code, line) of a node, from its stack trace: its innermost frame in user code.
    The compiled function's own frames use its code object; an inlined function's, the code object
    found among the constants of that code and the functions of its module, else a stand-in with
    the same attributes (file, name, first line)."""

    def __init__(self, original):
        self.original = original
        self.codes = {}
        self.stand_ins = {}
        self._index(original)

    def _index(self, code):
        self.codes.setdefault((code.co_filename, code.co_name), []).append(code)
        for const in code.co_consts:
            if hasattr(const, "co_code"):
                self._index(const)

    def of(self, stack_trace):
        found = user_frame(stack_trace)
        if found is None:
            return None, 0
        filename, line, function = found
        return self._code(filename, function, line), line

    def _code(self, filename, function, line):
        for code in self.codes.get((filename, function), ()):
            lines = [n for _, n in dis.findlinestarts(code) if n is not None]
            if lines and min(lines + [code.co_firstlineno]) <= line <= max(lines):
                return code
        first = _first_line(filename, function, line)
        stand_in = self.stand_ins.get((filename, function, first))
        if stand_in is None:
            stand_in = self.stand_ins[(filename, function, first)] = CodePlace(filename, function, first)
        return stand_in


class CodePlace:
    """Stands for a code object where the op records need one (its file, name and first line)."""

    __slots__ = ("co_filename", "co_name", "co_firstlineno")

    def __init__(self, filename, name, first):
        self.co_filename, self.co_name, self.co_firstlineno = filename, name, first

    def co_positions(self):
        return iter(())


def _first_line(filename, function, line):
    """The first line of the function `function` that holds `line` in the file's text, as Python
    counts it (its first decorator's); `line` itself when it cannot be told."""
    lines = linecache.getlines(filename)
    if not lines or line > len(lines):
        return line
    pattern = re.compile(r"^(\s*)(?:async\s+)?def\s+%s\b" % re.escape(function))
    for at in range(line - 1, -1, -1):
        m = pattern.match(lines[at])
        if m is not None:
            indent = m.group(1)
            first = at
            while first > 0 and lines[first - 1].startswith(indent + "@"):
                first -= 1
            return first + 1
    return line
