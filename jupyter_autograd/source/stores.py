"""Where a tensor kept past its iteration is put into a container, read off the user's source.

Storing a tensor in a list (`history.append(loss)`, `logs.setdefault("loss", []).append(loss)`,
`meter.update(loss)` whose `update` appends its argument) is no tensor op, so the capture records
nothing there; but the function that made the tensor is known, and so is the name the tensor goes
by in it. The statement that adds that name to a container, in that function or in a function of
the user's files that it passes the name to, is where the graphs are kept: the line to name, and
the evidence that each iteration's tensor goes into one container that grows.
"""
from __future__ import annotations

import ast
import json
from typing import Iterator, List, Optional, Tuple

from .rewrites import without_graph
from ..model import Location
from .alignment import Alignment, outermost_runs

# Calls that add their argument to a container (list, deque, set) without replacing what it holds.
_ADDING = {"append": 0, "appendleft": 0, "add": 0, "insert": 1}
_SCOPES = (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda, ast.ClassDef)
_DEPTH = 3  # helpers passing the tensor on to helpers


def storing_line(alignment: Alignment, made_at: Location, name: Optional[str],
                 op_name: str = "") -> Optional[Tuple[Location, str, str]]:
    """The one statement that adds the tensor `name`, made at `made_at`, to a container: in the
    function that made it, whose only binding of `name` is that line, in a function of the user's
    files it passes `name` to (the innermost statement), or in the one caller it returns `name`
    to, by the name that caller assigns it, also inside a dict or tuple it returns (`return
    {"loss": loss}`: the caller's `outputs.append(output)` keeps it); for a tensor with no name, the
    line that made it where it adds what it computes (`self.states.append(h.clone())`), or returns
    it. None where there is no such statement, or more than one. With it, the statement as it would
    keep the tensor without its graph (`.detach()`; "" where what is stored holds the tensor) and
    the tensor as the statement reaches it (`h.clone()`, `output["loss"]`), where it is one line."""
    trace = alignment.trace
    trees = _parsed(alignment)
    found = _stored_from(trees, made_at.filename, made_at.line, name, _DEPTH, op_name=op_name)
    if not found or len(found) != 1:
        return None
    filename, line, end_line, columns, within = found[0]
    lines = trace.sources.get(filename, [])
    text = lines[line - 1].rstrip("\n") if 0 < line <= len(lines) else ""
    detached = stored = ""
    if text and end_line == line:
        raw, (start, end) = text.encode(), columns  # the parser's columns count UTF-8 bytes
        stored = raw[start:end].decode()
        indent = len(text) - len(text.lstrip())
        head, tail = raw[indent:start].decode(), raw[end:].decode().rstrip()
        if within is None:
            detached = without_graph(head, stored, tail,
                                     _handed_loop_values(trees, _innermost_scope(trees[filename], line)))
        else:  # the dict or tuple that holds the tensor is stored: `.detach()` is no method of it
            element = "%s[%s]" % (stored, json.dumps(within))
            if isinstance(within, str):  # a copy of the dict, that one value without its graph
                detached = "%s{**%s, %s: %s.detach()}%s" % (head, stored, json.dumps(within), element, tail)
            stored = element
    where = Location(filename, line, made_at.function if filename == made_at.filename else "", text.strip())
    return where, detached, stored


def handed_loop_values(alignment: Alignment, location: Optional[Location]) -> frozenset:
    """The parameters of the function of this line that a call of it, in the user's files, fills with
    the elements of a container it loops over (`for k, v in logs.items(): meter.update(v)`): a container
    may hold Python numbers and tensors alike, so such a value is not known to be a tensor."""
    if location is None:
        return frozenset()
    trees = _parsed(alignment)
    tree = trees.get(location.filename)
    return _handed_loop_values(trees, _innermost_scope(tree, location.line)) if tree is not None else frozenset()


def _handed_loop_values(trees: dict, function: ast.AST) -> frozenset:
    if not isinstance(function, (ast.FunctionDef, ast.AsyncFunctionDef)):
        return frozenset()
    params = [a.arg for a in function.args.posonlyargs + function.args.args]
    method = bool(params) and params[0] in ("self", "cls")
    positional = params[1:] if method else params
    found = set()
    for tree in trees.values():
        for loop in ast.walk(tree):
            if not isinstance(loop, (ast.For, ast.AsyncFor)):
                continue
            drawn = {n.id for n in ast.walk(loop.target) if isinstance(n, ast.Name)}
            for call in (c for stmt in loop.body for c in ast.walk(stmt) if isinstance(c, ast.Call)):
                func = call.func
                named = func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else None
                if named != function.name:
                    continue
                for i, arg in enumerate(call.args[:len(positional)]):
                    if isinstance(arg, ast.Name) and arg.id in drawn:
                        found.add(positional[i])
                found.update(k.arg for k in call.keywords if k.arg in params and isinstance(k.value, ast.Name)
                             and k.value.id in drawn)
    return frozenset(found)


def _stored_from(trees: dict, filename: str, line: int, name: str, depth: int,
                 within=None, op_name: str = "") -> Optional[List[tuple]]:
    """Where the tensor that the statement at `line` binds to `name` (inside it at the key or index
    `within`, where that is not None) is added to a container: in its function, the functions it is
    passed to, and the caller it is returned to. Each place with `within`."""
    tree = trees.get(filename)
    if tree is None:
        return None
    scope = _innermost_scope(tree, line)
    made = [n for n in _own_nodes(scope) if isinstance(n, ast.stmt) and n.lineno <= line <= n.end_lineno]
    if not made:
        return None
    statement = min(made, key=lambda n: n.end_lineno - n.lineno)
    if name is None:
        if isinstance(statement, ast.Return) and statement.value is not None:
            within = _element_made(statement.value, op_name)
            site = _only_assigned_call(trees, scope) if depth and within is not _NOT_HERE else None
            return _stored_from(trees, *site, depth - 1, within) if site is not None else None
        arg = _added(statement.value) if isinstance(statement, ast.Expr) else None
        if arg is None or isinstance(arg, (ast.Name, ast.Attribute, ast.Subscript)):
            return None  # not what the line computed
        return [(filename, statement.lineno, statement.end_lineno, (arg.col_offset, arg.end_col_offset), within)]
    bound = _bindings(scope, name)
    if not bound or not all(statement.lineno <= at <= statement.end_lineno for at in bound):
        return None  # the name means other tensors too
    found = [store + (within,) for store in _stores(trees, filename, scope, name, _DEPTH)]
    returned = {_element_named(n.value, name) for n in _own_nodes(scope)
                if isinstance(n, ast.Return) and n.value is not None} - {_NOT_HERE}
    if depth and within is None and len(returned) == 1:
        site = _only_assigned_call(trees, scope)
        if site is not None:
            found += _stored_from(trees, *site, depth - 1, returned.pop()) or []
    return sorted(set(found), key=repr)


_NOT_HERE = object()  # _element_named and _element_made: the value is not where the tensor is (0 is an index)


def _element_named(value: ast.expr, name: str):
    """Where a returned value holds the tensor `name`: None for the value itself, the key or index
    of a dict or tuple written out (`{"loss": loss}`: "loss"), else _NOT_HERE."""
    if _is(value, name):
        return None
    for key, element in _elements(value):
        if _is(element, name):
            return key
    return _NOT_HERE


def _element_made(value: ast.expr, op_name: str):
    """Where a returned value holds the tensor its line computed (by the op `op_name`): None for the
    value itself, the key or index of the one element of a dict or tuple written out whose outermost
    operation is that op (`{"loss": a + b, "size": len(x)}`: "loss" for an add), or else of the one
    element not written out; _NOT_HERE where there is no such element, or several."""
    elements = list(_elements(value))
    if not elements and not isinstance(value, (ast.Dict, ast.Tuple, ast.List)):
        return None
    for candidates in ([key for key, element in elements if outermost_runs(element, op_name)],
                       [key for key, element in elements if not _written_out(element)]):
        if candidates:
            return candidates[0] if len(candidates) == 1 else _NOT_HERE
    return _NOT_HERE


def _elements(value: ast.expr) -> Iterator[tuple]:
    if isinstance(value, ast.Dict):
        for key, element in zip(value.keys, value.values):
            if isinstance(key, ast.Constant) and isinstance(key.value, (str, int)):
                yield key.value, element
    elif isinstance(value, (ast.Tuple, ast.List)) and not any(isinstance(e, ast.Starred) for e in value.elts):
        yield from enumerate(value.elts)


def _written_out(node: ast.expr) -> bool:
    """A value written out in the source (a number, a string, a container of them), no tensor."""
    if isinstance(node, ast.Constant):
        return True
    if isinstance(node, (ast.Dict, ast.Tuple, ast.List, ast.Set)):
        children = (node.values if isinstance(node, ast.Dict) else node.elts)
        return all(_written_out(child) for child in children)
    return False


def _only_assigned_call(trees: dict, function: ast.AST) -> Optional[Tuple[str, int, str]]:
    """(file, line, target) of the one call of `function` whose result is assigned (`loss =
    train_step(...)`, `loss = trainer.step(batch)`), where no other function of the user's files
    has its name."""
    if not isinstance(function, (ast.FunctionDef, ast.AsyncFunctionDef)):
        return None
    named = [(node, owner) for tree in trees.values() for node, owner in _functions(tree) if node.name == function.name]
    if len(named) != 1:
        return None
    method = named[0][1] is not None
    sites = []
    for filename, tree in trees.items():
        for node in ast.walk(tree):
            if not (isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.value, ast.Call)):
                continue
            func = node.value.func
            if (method and isinstance(func, ast.Attribute) and func.attr == function.name) or \
                    (not method and isinstance(func, ast.Name) and func.id == function.name):
                target = node.targets[0]
                if not isinstance(target, (ast.Name, ast.Attribute, ast.Subscript)):
                    return None
                sites.append((filename, node.lineno, ast.unparse(target)))
    return sites[0] if len(sites) == 1 else None


def _parsed(alignment: Alignment) -> dict:
    return dict(alignment.index.trees())


def _innermost_scope(tree: ast.AST, line: int) -> ast.AST:
    best = tree
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.lineno <= line <= node.end_lineno:
            if best is tree or node.lineno > best.lineno:
                best = node
    return best


def _own_nodes(scope: ast.AST) -> Iterator[ast.AST]:
    """The nodes of a function's own body, not those of functions or classes defined in it."""
    stack = list(ast.iter_child_nodes(scope))
    while stack:
        node = stack.pop()
        yield node
        if not isinstance(node, _SCOPES):
            stack.extend(ast.iter_child_nodes(node))


def _bindings(scope: ast.AST, name: str) -> set:
    """The lines that bind `name` in the scope (assignments, loop targets, `with ... as`, and the
    parameters of the function: line 0)."""
    lines = set()
    if isinstance(scope, (ast.FunctionDef, ast.AsyncFunctionDef)):
        args = scope.args
        if any(a.arg == name for a in args.posonlyargs + args.args + args.kwonlyargs
               + [a for a in (args.vararg, args.kwarg) if a is not None]):
            lines.add(0)
    for node in _own_nodes(scope):
        if isinstance(node, (ast.Name, ast.Attribute, ast.Subscript)) and isinstance(node.ctx, ast.Store) \
                and ast.unparse(node) == name:
            lines.add(node.lineno)
        elif isinstance(node, (ast.Global, ast.Nonlocal)) and name in node.names:
            lines.add(-1)  # bound elsewhere too
    return lines


def _stores(trees: dict, filename: str, scope: ast.AST, name: str, depth: int) -> List[tuple]:
    found = []
    for node in _own_nodes(scope):
        if not isinstance(node, ast.Call):
            continue
        callee = _stored_by_callee(trees, node, name, depth) if depth else None
        if callee is not None:  # a function of the user's (`evaluator.add(out)`), not a list's method
            found.extend(callee)
            continue
        arg = _added(node)
        if arg is not None and _is(arg, name):
            found.append((filename, node.lineno, node.end_lineno, (arg.col_offset, arg.end_col_offset)))
    return sorted(set(found))


def _added(node: ast.AST) -> Optional[ast.expr]:
    """What a call adds to a container (`history.append(x)`: x), if it is such a call."""
    if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)) or node.keywords:
        return None
    position = _ADDING.get(node.func.attr)
    return node.args[position] if position is not None and len(node.args) == position + 1 else None


def _stored_by_callee(trees: dict, call: ast.Call, name: str, depth: int) -> Optional[List[tuple]]:
    """A call passing `name` to the one function of the user's files that the call's name can
    mean (`meter.update(loss)`: the only method `update`): where that function stores it. None
    where the call passes no `name` or means no such function."""
    passed = [i for i, a in enumerate(call.args) if _is(a, name)]
    by_keyword = [k.arg for k in call.keywords if k.arg is not None and _is(k.value, name)]
    if len(passed) + len(by_keyword) != 1 or any(isinstance(a, ast.Starred) for a in call.args):
        return None
    if isinstance(call.func, ast.Attribute):
        called, method = call.func.attr, True
    elif isinstance(call.func, ast.Name):
        called, method = call.func.id, False
    else:
        return None
    candidates = [(filename, node, owner) for filename, tree in trees.items()
                  for node, owner in _functions(tree) if node.name == called and (owner is not None) == method]
    if method and len(candidates) > 1:  # `meter.update`: the method of the class `meter` is made from
        made_from = _classes_assigned(trees, ast.unparse(call.func.value))
        candidates = [c for c in candidates if c[2] in made_from]
    if len(candidates) != 1:
        return None
    filename, function, _ = candidates[0]
    params = [a.arg for a in function.args.posonlyargs + function.args.args]
    if method:
        params = params[1:]  # self
    if passed:
        if passed[0] >= len(params):
            return None
        param = params[passed[0]]
    else:
        param = by_keyword[0]
        if param not in params + [a.arg for a in function.args.kwonlyargs]:
            return None
    if _bindings(function, param) != {0}:
        return None
    return _stores(trees, filename, function, param, depth - 1)


def _functions(tree: ast.AST) -> Iterator[Tuple[ast.AST, Optional[str]]]:
    """Every function of a file, with the class it is a method of (None for a function)."""
    owners = {id(item): node.name for node in ast.walk(tree) if isinstance(node, ast.ClassDef) for item in node.body}
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            yield node, owners.get(id(node))


def _classes_assigned(trees: dict, receiver: str) -> set:
    """The one class whose instance is assigned to `receiver` (`meter = LossLog()`, `self.meter =
    LossLog()`) anywhere in the user's files; empty when there are several, or none."""
    found = {node.value.func.id for tree in trees.values() for node in ast.walk(tree)
             if isinstance(node, ast.Assign) and len(node.targets) == 1 and ast.unparse(node.targets[0]) == receiver
             and isinstance(node.value, ast.Call) and isinstance(node.value.func, ast.Name)}
    return found if len(found) == 1 else set()


def _is(node: ast.AST, name: str) -> bool:
    return isinstance(node, (ast.Name, ast.Attribute, ast.Subscript)) and ast.unparse(node) == name
