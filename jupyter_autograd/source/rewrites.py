"""Rewrites of the user's code for fixes: text in, text out (no trace, no torch). Each parses the
code it is given into a tree of its own (index.parse_fresh), which it may change."""
from __future__ import annotations

import ast
import re
from typing import List, Optional

from .index import parse_fresh


def single_statement(src: str):
    """The one statement of `src` as a tree of its own (a fix may rewrite it), or None."""
    tree = parse_fresh((src or "").strip())
    return tree.body[0] if tree is not None and len(tree.body) == 1 else None

def is_simple_statement(src: str) -> bool:
    """One statement that can stand alone in a block (not `for x in y:` cut from its body)."""
    stmt = single_statement(src)
    return stmt is not None and not isinstance(stmt, (ast.For, ast.While, ast.If, ast.With, ast.Try,
                                                      ast.FunctionDef, ast.ClassDef, ast.AsyncFunctionDef))

def _plain_name(node) -> Optional[str]:
    """The name written through: `d` for `d[...]` and `d[0][1]`; None for `net.weight` and calls."""
    while isinstance(node, ast.Subscript):
        node = node.value
    return node.id if isinstance(node, ast.Name) else None

def as_code(label: str) -> str:
    """A tensor's label as code: `net.2.weight` (a parameter's dotted name) -> `net[2].weight`."""
    return re.sub(r"\.(\d+)(?=\.|$)", r"[\1]", label or "")

def is_code_name(label: Optional[str]) -> bool:
    """Whether a tensor's label is a name or attribute chain the user's code has (`q`, `self.x_adv`,
    `model.aux_head.weight`), not a description."""
    return bool(label) and re.fullmatch(r"[A-Za-z_]\w*(?:\.\w+)*", label) is not None

def replace_name(src: str, name: str, replacement: str) -> str:
    if not re.fullmatch(r"[A-Za-z_]\w*", name or ""):
        return ""
    head, sep, tail = src.partition("+=")
    if sep:
        return head + sep + re.sub(r"\b%s\b" % re.escape(name), replacement, tail)
    return re.sub(r"(?<![\w.])%s\b(?!\s*=[^=])" % re.escape(name), replacement, src)

def writes_after(lines: List[str], line: int) -> List[str]:
    """The statements on the lines right after `line` (1-based, in `lines`), at its indentation, that
    write in place into the tensor it writes (`w[:, i] -= a`, then `w[:, i] += b`), stripped."""
    def written(src: str) -> Optional[str]:
        stmt = single_statement(src)
        if isinstance(stmt, (ast.AugAssign, ast.Assign)):
            target = stmt.target if isinstance(stmt, ast.AugAssign) else \
                (stmt.targets[0] if len(stmt.targets) == 1 else None)
            if isinstance(stmt, ast.Assign) and not isinstance(target, ast.Subscript):
                return None  # binding a name or attribute writes nothing
        elif isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Call) and \
                isinstance(stmt.value.func, ast.Attribute) and stmt.value.func.attr.endswith("_") and \
                not stmt.value.func.attr.startswith("_"):
            target = stmt.value.func.value
        else:
            return None
        while isinstance(target, ast.Subscript):
            target = target.value
        return ast.unparse(target) if isinstance(target, (ast.Name, ast.Attribute)) else None

    if not 0 < line <= len(lines):
        return []
    first = lines[line - 1].rstrip("\n")
    indent = first[:len(first) - len(first.lstrip())]
    base = written(first)
    out = []
    for text in lines[line:]:
        text = text.rstrip("\n")
        if base is None or not text.startswith(indent) or text[len(indent):][:1].isspace() or \
                written(text) != base:
            break
        out.append(text.strip())
    return out

def out_as_copy(text: str) -> Optional[str]:
    """`torch.arange(n, out=self.freq)` -> `self.freq.copy_(torch.arange(n))`: the one call given
    `out=` computes its result, which is copied into the out tensor. `copy_` returns the tensor, as an
    `out=` call does, so the call may sit anywhere in the statement (`torch.arange(n, out=f).mul_(PI)`
    -> `f.copy_(torch.arange(n)).mul_(PI)`). None when that is not the line."""
    stmt = single_statement(text)
    if stmt is None:
        return None
    calls = [node for node in ast.walk(stmt) if isinstance(node, ast.Call)
             and any(k.arg == "out" for k in node.keywords)]
    if len(calls) != 1:
        return None
    call = calls[0]
    out = next(k.value for k in call.keywords if k.arg == "out")
    if isinstance(out, (ast.Tuple, ast.List)):
        return None
    call.keywords = [k for k in call.keywords if k.arg != "out"]
    copied = ast.Call(func=ast.Attribute(value=out, attr="copy_", ctx=ast.Load()),
                      args=[ast.Call(func=call.func, args=call.args, keywords=call.keywords)], keywords=[])
    # The call node becomes the copy in place, wherever the statement holds it.
    call.func, call.args, call.keywords = copied.func, copied.args, copied.keywords
    return ast.unparse(stmt)

def without_graph(head: str, value: str, tail: str, arguments=frozenset()) -> str:
    """The statement `head + value + tail` keeping `value` without its graph: `(val * n).detach()`.
    A value read from `arguments` (parameters filled from a container's elements, which may be Python
    numbers: a meter fed `loss.item()` and loss tensors alike) has no `.detach()` when it is a number:
    then only a tensor is detached, the value computed once (`_kept = val * n` on a line before)."""
    parsed = parse_fresh(value.strip(), mode="eval")
    if parsed is None:
        return ""
    tree = parsed.body
    if not arguments & {n.id for n in ast.walk(tree) if isinstance(n, ast.Name)}:
        primary = isinstance(tree, (ast.Name, ast.Attribute, ast.Subscript, ast.Call))
        return head + (value if primary else "(%s)" % value) + ".detach()" + tail
    kept = value if isinstance(tree, ast.Name) else "_kept"
    guarded = "%s.detach() if isinstance(%s, torch.Tensor) else %s" % (kept, kept, kept)
    # Parenthesized unless it is a whole right-hand side or a call's only argument.
    if not (tail == "" or head.endswith("(") and tail.startswith(")")):
        guarded = "(%s)" % guarded
    return head + guarded + tail if kept == value else "%s = %s\n%s%s%s" % (kept, value, head, guarded, tail)

def rebound_name(rewritten: str) -> Optional[str]:
    """The name a rewrite rebinds to a new tensor made from it: `buf` in `buf = buf / n`, `d` in
    `d = d.clone()` (not `new_h`, which only holds a value on the way)."""
    for line in rewritten.splitlines():
        stmt = single_statement(line)
        if isinstance(stmt, ast.Assign):
            used = {n.id for n in ast.walk(stmt.value) if isinstance(n, ast.Name)}
            for target in stmt.targets:
                if isinstance(target, ast.Name) and target.id in used:
                    return target.id
    return None

def out_of_place(src: str) -> Optional[str]:
    """The out-of-place form of a line that writes in place, or None when there is no sound one.

    `y += 1` -> `y = y + 1`; `x.add_(b)` -> `x = x.add(b)`; `c.zero_()` -> `c = torch.zeros_like(c)`;
    `nn.ReLU(inplace=True)` -> inplace=False. The written tensor must have a plain name: rebinding
    `net.weight` or `x[0]` would not do the same thing.
    """
    stmt = single_statement(src)
    if stmt is None:
        return None
    if isinstance(stmt, ast.AugAssign) and isinstance(stmt.target, ast.Name):
        # Through the AST, so `y *= a + b` becomes `y = y * (a + b)`.
        target = stmt.target.id
        return "%s = %s" % (target, ast.unparse(ast.BinOp(ast.Name(target), stmt.op, stmt.value)))
    if src.count("inplace=True") == 1:
        return _without_inplace(stmt, src.strip().replace("inplace=True", "inplace=False"))
    if isinstance(stmt, (ast.Expr, ast.Assign)):
        call = stmt.value
        if not (isinstance(call, ast.Call) and isinstance(call.func, ast.Attribute)
                and isinstance(call.func.value, ast.Name)):
            return None
        method, receiver = call.func.attr, call.func.value.id
        new_call = _out_of_place_call(receiver, method, call.args, call.keywords)
        if new_call is None:
            return None
        if isinstance(stmt, ast.Assign):  # `y = x.add_(1)` also changed x: rebind both
            names = [ast.unparse(t) for t in stmt.targets]
            return "%s = %s" % (" = ".join(names + ([receiver] if receiver not in names else [])), new_call)
        return "%s = %s" % (receiver, new_call)
    return None

def _without_inplace(stmt, replaced: str) -> str:
    """`F.relu(h, inplace=True)` wrote `h`: its out-of-place form must still give `h` the result
    (`h = F.relu(h, inplace=False)`), and `y = F.relu(h, inplace=True)` both names. A call whose
    first argument is no name (a module's constructor, an expression's result) only changes flag."""
    call = stmt.value if isinstance(stmt, (ast.Assign, ast.Expr)) else None
    if not (isinstance(call, ast.Call) and call.args and isinstance(call.args[0], ast.Name)):
        return replaced
    written = call.args[0].id
    if isinstance(stmt, ast.Expr):
        return "%s = %s" % (written, replaced)
    names = [ast.unparse(t) for t in stmt.targets]
    if written in names:
        return replaced
    return "%s = %s" % (" = ".join(names + [written]), ast.unparse(single_statement(replaced).value))

# In-place methods of torch.Tensor whose name without the "_" is not their out-of-place form
# (tests/test_fixes.py checks this list against the installed torch). None: no simple one.
_NO_TWIN = {
    "zero_": lambda r, a: "torch.zeros_like(%s)" % r if not a else None,
    "fill_": lambda r, a: "torch.full_like(%s, %s)" % (r, a[0]) if len(a) == 1 else None,
    "copy_": lambda r, a: "%s.to(%s).expand_as(%s).clone()" % (operand(a[0]), r, r) if len(a) == 1 else None,
    "normal_": lambda r, a: _scaled("torch.randn_like(%s)" % r, a),
    "uniform_": lambda r, a: ("torch.rand_like(%s)" % r if not a else
                              "torch.rand_like(%s) * (%s - %s) + %s" % (r, a[1], a[0], a[0]) if len(a) == 2 else None),
}

for _name in ("random_", "cauchy_", "exponential_", "geometric_", "log_normal_", "bernoulli_", "fill_diagonal_",
              "apply_", "map_", "map2_", "set_", "share_memory_", "sparse_resize_", "sparse_resize_and_clear_",
              "resize_as_sparse_", "requires_grad_", "resize_", "resize_as_", "detach_"):
    _NO_TWIN.setdefault(_name, lambda r, a: None)

def operand(src: str) -> str:
    return src if re.fullmatch(r"[A-Za-z_][\w.]*", src) else "(%s)" % src

def _scaled(base: str, args) -> Optional[str]:
    """`normal_(mean, std)` as `randn_like(...) * std + mean`."""
    if not args:
        return base
    if len(args) == 2:
        return "%s * %s + %s" % (base, args[1], args[0])
    return None

def _out_of_place_call(receiver: str, method: str, args, keywords) -> Optional[str]:
    if not method.endswith("_") or method.startswith("_"):
        return None
    if method in _NO_TWIN:
        if keywords:
            return None
        return _NO_TWIN[method](receiver, [ast.unparse(a) for a in args])
    return "%s.%s(%s)" % (receiver, method[:-1], ", ".join(
        [ast.unparse(a) for a in args] + [ast.unparse(k) for k in keywords]))

def copy_before_write(src: str) -> Optional[str]:
    """`d[:] = 1` -> `d = d.clone()` then the same line: the saved tensor keeps its value."""
    stmt = single_statement(src)
    if stmt is None:
        return None
    target = None
    if isinstance(stmt, (ast.Assign, ast.AugAssign)):
        targets = stmt.targets if isinstance(stmt, ast.Assign) else [stmt.target]
        if len(targets) == 1 and isinstance(targets[0], ast.Subscript):
            target = _plain_name(targets[0].value)
    elif isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Call) and \
            isinstance(stmt.value.func, ast.Attribute) and stmt.value.func.attr.endswith("_"):
        target = _plain_name(stmt.value.func.value)
    if target is None:
        return None
    value = stmt.value if isinstance(stmt, ast.Assign) else None
    if value is not None and any(isinstance(n, ast.Name) and n.id == target for n in ast.walk(value)):
        # `h[t + 1] = f(h[t])`: f saves a view of h, so compute it before the copy is written to.
        new = "new_" + target
        return "%s = %s\n%s = %s.clone()\n%s = %s" % (new, ast.unparse(value), target, target,
                                                      ast.unparse(stmt.targets[0]), new)
    return "%s = %s.clone()\n%s" % (target, target, src.strip())

def reduced(src: str, name: Optional[str]) -> Optional[str]:
    """The line with its non-scalar result reduced: `loss = F.mse_loss(p, y, reduction='none')` without
    the keyword (the function's default is the mean), `loss = criterion(out, y).mean()`, `return
    hinge.mean()` for a loss function's return, or `(loss * w).mean().backward()` for a line that calls
    backward itself."""
    stmt = single_statement(src)
    assigned = isinstance(stmt, ast.Assign) and len(stmt.targets) == 1 and ast.unparse(stmt.targets[0]) == name
    if (assigned or isinstance(stmt, ast.Return) and stmt.value is not None) \
            and not isinstance(stmt.value, (ast.Dict, ast.List, ast.Tuple, ast.Set)):
        value = stmt.value
        if isinstance(value, ast.Call) and any(k.arg == "reduction" and isinstance(k.value, ast.Constant)
                                               and k.value.value == "none" for k in value.keywords):
            value.keywords = [k for k in value.keywords if k.arg != "reduction"]
        else:
            stmt.value = ast.Call(func=ast.Attribute(value=value, attr="mean", ctx=ast.Load()), args=[], keywords=[])
        return ast.unparse(stmt)
    if isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Call) and isinstance(stmt.value.func, ast.Attribute) \
            and stmt.value.func.attr == "backward" and not stmt.value.args and not stmt.value.keywords:
        receiver = stmt.value.func.value
        stmt.value.func.value = ast.Call(func=ast.Attribute(value=receiver, attr="mean", ctx=ast.Load()), args=[],
                                         keywords=[])
        return ast.unparse(stmt)
    return None


def without_exit(src: str) -> Optional[str]:
    """`loss = torch.tensor(x.mean().item())` -> `loss = x.mean()`."""
    tree = parse_fresh(src)
    if tree is None or len(tree.body) != 1 or not isinstance(tree.body[0], ast.Assign):
        return None
    value = tree.body[0].value
    if isinstance(value, ast.Call) and len(value.args) == 1 and ast.unparse(value.func) in (
            "torch.tensor", "torch.as_tensor", "torch.from_numpy", "torch.Tensor", "torch.FloatTensor"):
        inner = value.args[0]
        if isinstance(inner, ast.Call) and isinstance(inner.func, ast.Attribute) and inner.func.attr in (
                "item", "numpy", "tolist") and not inner.args:
            base = inner.func.value
            while isinstance(base, ast.Call) and isinstance(base.func, ast.Attribute) and base.func.attr in (
                    "cpu", "detach", "numpy"):
                base = base.func.value
            tree.body[0].value = base
            return ast.unparse(tree.body[0])
    return None


def rebound_as_leaf(src: str, name: str) -> Optional[str]:
    """`w = w.type(torch.float)` -> `w = w.type(torch.float).detach().requires_grad_()`: the name then
    holds a leaf of its own, which backward gives the gradient. In a tuple assignment
    (`inputs, targets = inputs.float(), targets.long()`), only the value the name gets."""
    tree = parse_fresh(src)
    if tree is None or len(tree.body) != 1 or not isinstance(tree.body[0], ast.Assign) or len(tree.body[0].targets) != 1:
        return None
    stmt = tree.body[0]
    target = stmt.targets[0]

    def as_leaf(value):
        detached = ast.Call(func=ast.Attribute(value=value, attr="detach", ctx=ast.Load()), args=[], keywords=[])
        return ast.Call(func=ast.Attribute(value=detached, attr="requires_grad_", ctx=ast.Load()), args=[],
                        keywords=[])

    if isinstance(target, (ast.Tuple, ast.List)):
        values = stmt.value.elts if isinstance(stmt.value, (ast.Tuple, ast.List)) else None
        at = [i for i, element in enumerate(target.elts) if ast.unparse(element) == name]
        if values is None or len(values) != len(target.elts) or len(at) != 1:
            return None
        values[at[0]] = as_leaf(values[at[0]])
        return "%s = %s" % (", ".join(map(ast.unparse, target.elts)), ", ".join(map(ast.unparse, values)))
    return "%s = %s" % (ast.unparse(target), ast.unparse(as_leaf(stmt.value)))


def leaf_after_move(src: str, name: str):
    """A leaf made with requires_grad and then moved, made a leaf after the move: ("parameter", target,
    line) for `nn.Parameter(x).to(d)` -> `nn.Parameter(x.to(d))` (a Parameter stays one only if made
    after the move); ("flag", target, line) for `w = torch.randn(3, requires_grad=True).double()` ->
    `w = torch.randn(3).double().requires_grad_()`. None when the line is no such assignment."""
    tree = parse_fresh(src)
    if tree is None or len(tree.body) != 1 or not isinstance(tree.body[0], ast.Assign):
        return None
    stmt = tree.body[0]
    target = ast.unparse(stmt.targets[0]) if len(stmt.targets) == 1 else name
    inside = _moved_into_parameter(stmt.value)
    if inside is not None:
        stmt.value = inside
        return "parameter", target, ast.unparse(stmt)
    removed = False
    for node in ast.walk(stmt.value):
        if isinstance(node, ast.Call):
            kept = [k for k in node.keywords if k.arg != "requires_grad"]
            removed = removed or len(kept) != len(node.keywords)
            node.keywords = kept
    if not removed:
        return None
    stmt.value = ast.Call(func=ast.Attribute(value=stmt.value, attr="requires_grad_", ctx=ast.Load()),
                          args=[], keywords=[])
    return "flag", target, ast.unparse(stmt)


def _moved_into_parameter(value: ast.expr) -> Optional[ast.expr]:
    """`nn.Parameter(x, requires_grad=True).to(d, t)` as `nn.Parameter(x.to(d, t), requires_grad=True)`:
    the methods called on the Parameter, called on what it wraps. None for any other expression."""
    def is_parameter(node):
        return isinstance(node, ast.Call) and ast.unparse(node.func).rpartition(".")[2] == "Parameter"

    chain = []
    while isinstance(value, ast.Call) and isinstance(value.func, ast.Attribute) and not is_parameter(value):
        chain.append(value)
        value = value.func.value
    if not chain or not is_parameter(value) or not value.args:
        return None
    wrapped = value.args[0]
    for call in reversed(chain):
        wrapped = ast.Call(func=ast.Attribute(value=wrapped, attr=call.func.attr, ctx=ast.Load()), args=call.args,
                           keywords=call.keywords)
    return ast.Call(func=value.func, args=[wrapped] + value.args[1:], keywords=value.keywords)
