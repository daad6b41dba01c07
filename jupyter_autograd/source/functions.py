"""The code around a line, read off the user's source: the function it is in (its arguments, the rest
of its body), and the line that built a module at a dotted path (`self.act = nn.ReLU(...)` in its
parent's class, an element of the nn.Sequential that built its parent)."""
from __future__ import annotations

import ast
from typing import Optional

from ..model import TraceData
from .index import SourceIndex, parse_fresh


def function_of(trace: TraceData, location):
    """(the source's lines, the number of the line of the `def` of the function whose line this is,
    the indentation of its body), read off the source; None when it cannot be read."""
    lines = trace.sources.get(location.filename or "", [])
    if not location.function or not 0 < location.line <= len(lines):
        return None
    indent = _indent(lines[location.line - 1])
    heads = ("def %s(" % location.function, "async def %s(" % location.function)
    for number in range(location.line - 1, 0, -1):
        text = lines[number - 1]
        if text.lstrip().startswith(heads):
            if _indent(text) >= indent:
                return None
            body = next((_indent(t) for t in lines[number:] if _code(t)), indent)
            return lines, number, body
    return None

def _indent(text: str) -> int:
    return len(text) - len(text.lstrip())

def _code(text: str) -> str:
    return text.split("#", 1)[0].strip()

def arguments_of(trace: TraceData, location) -> frozenset:
    """The parameter names of the function whose line this is; empty when they cannot be read."""
    found = function_of(trace, location)
    if found is None:
        return frozenset()
    lines, number, _ = found
    parsed = parse_fresh(lines[number - 1].strip() + "\n    pass\n")
    if parsed is None:  # a signature over several lines
        return frozenset()
    header = parsed.body[0]
    args = header.args
    return frozenset(a.arg for a in args.posonlyargs + args.args + args.kwonlyargs)

def rest_of_body(trace: TraceData, location):
    """(the body's indentation, its code lines after this one), or None."""
    found = function_of(trace, location)
    if found is None:
        return None
    lines, _, body = found
    rest = []
    for text in lines[location.line:]:
        if _code(text):
            if _indent(text) < body:
                break
            rest.append(text)
    return body, rest

def ends_its_function(trace: TraceData, location) -> bool:
    """Whether the line is the last statement of its function's body, at the body's own level (a
    `return` after it then changes nothing else the function does)."""
    found = rest_of_body(trace, location)
    lines = trace.sources.get(location.filename or "", [])
    return found is not None and not found[1] and _indent(lines[location.line - 1]) == found[0]

def returns_later(trace: TraceData, location, name: str) -> bool:
    """Whether the function goes on to `return name` (then the copy is what it returns)."""
    found = rest_of_body(trace, location)
    return found is not None and any(_code(text) == "return %s" % name for text in found[1])

def module_construction(trace: TraceData, path: str):
    """(filename, the call that built the module at this dotted path), read off the sources of the
    trace: `self.act = nn.ReLU(...)` in the class of its parent, element k of the nn.Sequential(...)
    that built the parent, or the one assignment to a model's own name. None where that is not
    certain (two assignments, a module built in a loop, a file not in the trace)."""
    parent, _, attr = path.rpartition(".")
    if not parent or parent not in trace.modules:
        return _only_assignment(trace, path)
    if attr.isdigit():
        built = module_construction(trace, parent)
        if built is None or not isinstance(built[1], ast.Call):
            return None
        filename, call = built
        elements = _sequence_elements(trace, filename, call)
        k = int(attr)
        return (filename, elements[k]) if elements is not None and k < len(elements) and \
            isinstance(elements[k], ast.Call) else None
    cls = trace.modules.get(parent)
    found = []
    for filename, tree in _parsed_sources(trace):
        for node in ast.walk(tree):
            if isinstance(node, ast.ClassDef) and node.name == cls:
                found += [(filename, value) for value in _attribute_assignments(node, attr)]
    return found[0] if len(found) == 1 and isinstance(found[0][1], ast.Call) else None

def _sequence_elements(trace: TraceData, filename: str, call: ast.Call):
    """The modules an nn.Sequential(...) / nn.ModuleList([...]) call was given, in order: its
    arguments, or the elements of the list literal they come from (`nn.Sequential(*layers)` with
    `layers = [...]` assigned once in the same function). None where they cannot be read."""
    kind = ast.unparse(call.func).rpartition(".")[2]
    if kind == "ModuleList" and len(call.args) == 1 and isinstance(call.args[0], (ast.List, ast.Tuple)):
        return list(call.args[0].elts)
    if kind != "Sequential":
        return None
    if not any(isinstance(a, ast.Starred) for a in call.args):
        return list(call.args)
    if len(call.args) != 1 or not isinstance(call.args[0].value, ast.Name):
        return None
    name = call.args[0].value.id
    for _, tree in _parsed_sources(trace, only=filename):
        scope = _enclosing_function(tree, call)
        values = [n.value for n in ast.walk(scope) if isinstance(n, ast.Assign)
                  and [ast.unparse(t) for t in n.targets] == [name]] if scope is not None else []
        if len(values) == 1 and isinstance(values[0], (ast.List, ast.Tuple)) and not any(
                isinstance(e, ast.Starred) for e in values[0].elts):
            return list(values[0].elts)
    return None

def _enclosing_function(tree, node):
    best = None
    for f in ast.walk(tree):
        if isinstance(f, (ast.FunctionDef, ast.AsyncFunctionDef)) and f.lineno <= node.lineno <= f.end_lineno:
            if best is None or f.lineno > best.lineno:
                best = f
    return best or tree

def _attribute_assignments(cls: ast.ClassDef, attr: str):
    """The values assigned to `self.<attr>` in the methods of a class."""
    for method in cls.body:
        if not isinstance(method, (ast.FunctionDef, ast.AsyncFunctionDef)) or not method.args.args:
            continue
        me = method.args.args[0].arg
        for node in ast.walk(method):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target] if isinstance(
                node, ast.AnnAssign) and node.value is not None else []
            if any(isinstance(t, ast.Attribute) and t.attr == attr and isinstance(t.value, ast.Name)
                   and t.value.id == me for t in targets):
                yield node.value

def _only_assignment(trace: TraceData, name: str):
    found = [(filename, node.value) for filename, tree in _parsed_sources(trace) for node in ast.walk(tree)
             if isinstance(node, ast.Assign) and [ast.unparse(t) for t in node.targets] == [name]]
    return found[0] if len(found) == 1 else None


def _parsed_sources(trace: TraceData, only: Optional[str] = None):
    return SourceIndex(trace.sources).trees(only)
