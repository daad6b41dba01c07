"""Reading one of the user's statements (no torch): what it writes in place and through which
expression, the dotted names and elements it spells, and whether a call it makes is a recorded op.
Naming (naming.py), the alignment of statements with ops (alignment.py) and the rules read
statements this way."""
from __future__ import annotations

import ast
import re
from typing import List, Optional, Tuple

from ..model import DATA_SWAP
from .index import parse_statement


def written_tensor(op, text: str, parsed, made_in_statement) -> Optional[Tuple[int, str]]:
    """(tid, the user's expression for it) of the tensor a statement writes in place (or tried to:
    PyTorch refuses a write into a leaf that requires grad), or whose memory it swaps, when the
    statement writes through one expression and this op is that write: `x.add_(1)`, `x[i] = v`,
    `x += v`, `torch.arange(n, out=x)`, `F.relu(x, inplace=True)`, `nn.init.zeros_(x)`,
    `x.data = v`, `setattr(x, "data", v)`. `made_in_statement(tid)` is the op of the statement that
    returned a tensor, if one did: it tells an index into a tensor (`model.emb.weight[0].fill_(0)`
    writes a view of `model.emb.weight`) from an element of a list or dict (`bufs[0].add_(1)`)."""
    if not (op.writes or op.out or (op.error is not None and _REFUSED_WRITE.search(op.error))):
        return None
    key = ("written", text)
    if key not in parsed:
        parsed[key] = write_expression(text)
    found = parsed[key]
    if found is None:
        return None
    expression, spelling, callees = found
    if spelling == "out":
        tid = op.out[0] if op.out else (op.writes[0] if len(op.writes) == 1 else None)
        if tid is None or op.name.rpartition(".")[2] not in callees:
            return None
    elif spelling == "swap":
        if op.name != DATA_SWAP or not op.inputs:
            return None
        tid = op.inputs[0]
    else:
        if not op.inputs or not any(same_op(callee, op.name) for callee in callees):
            return None
        tid = op.inputs[0]
    while isinstance(expression, ast.Subscript):
        made = made_in_statement(tid)
        if made is None or made.name != "Tensor.__getitem__" or not made.inputs:
            break  # an element of a container: the whole expression is the user's name for it
        expression, tid = expression.value, made.inputs[0]
    name = dotted(expression) or element(expression, text)
    return (tid, name) if name else None


def element(node, text: str) -> Optional[str]:
    """`bufs[0]`, `state["u"]`, `self.slots[k].h` as written: a name or attribute chain with constant or
    plain-name subscripts. Else None."""
    inner = node
    while isinstance(inner, (ast.Attribute, ast.Subscript)):
        if isinstance(inner, ast.Subscript) and not isinstance(inner.slice, (ast.Constant, ast.Name)):
            return None
        inner = inner.value
    if not isinstance(inner, ast.Name):
        return None
    return ast.get_source_segment(text, node)


# PyTorch's refusals of a write into a leaf: "... is being used in an in-place operation", "functions
# with out=... arguments don't support automatic differentiation".
_REFUSED_WRITE = re.compile(r"in-place operation|out=\.\.\. arguments")
_MODULE_ROOTS = ("torch", "nn", "F", "init", "np")


def write_expression(text: str):
    """(the expression written, how the write is spelled, the names of its calls) of a statement that
    writes in place through exactly one expression, else None. In-place methods return the tensor
    they wrote, so a chain of them (`self.avg.mul_(m).add_(x)`) is one write, through its first
    receiver."""
    tree = parse_statement(text)
    if tree is None or len(tree.body) != 1:
        return None
    stmt = tree.body[0]
    found = []  # [expression, spelling, callees, the call]
    if isinstance(stmt, ast.AugAssign):
        found.append([stmt.target, "augmented", (dunder(stmt.op, inplace=True),), None])
    elif isinstance(stmt, ast.Assign) and len(stmt.targets) == 1:
        target = stmt.targets[0]
        if isinstance(target, ast.Subscript):
            found.append([target.value, "setitem", ("__setitem__",), None])
        elif isinstance(target, ast.Attribute) and target.attr == "data":
            found.append([target.value, "swap", ("data",), None])
    for node in ast.walk(stmt):
        if not isinstance(node, ast.Call):
            continue
        for keyword in node.keywords:
            if keyword.arg == "out":
                found.append([keyword.value, "out", (callee_name(node.func),), node])
            elif (keyword.arg == "inplace" and isinstance(keyword.value, ast.Constant)
                  and keyword.value.value is True and node.args):
                found.append([node.args[0], "inplace", (callee_name(node.func),), node])
        func = node.func
        if (isinstance(func, ast.Name) and func.id == "setattr" and len(node.args) == 3
                and isinstance(node.args[1], ast.Constant) and node.args[1].value == "data"):
            found.append([node.args[0], "swap", ("data",), node])
        elif isinstance(func, ast.Attribute) and func.attr.endswith("_") and not func.attr.startswith("_"):
            receiver = dotted(func.value)
            if receiver is not None and receiver.partition(".")[0] in _MODULE_ROOTS:
                if node.args:  # `nn.init.zeros_(x)`, `torch.relu_(x)`: the first argument is written
                    found.append([node.args[0], "inplace", (func.attr,), node])
            else:
                found.append([func.value, "method", (func.attr,), node])
    # `a.mul_(m).add_(x)`: the add_ writes what the mul_ wrote, `a`. ast.walk meets an outer call
    # before the call it is made on, so inner links are folded first.
    methods = [f for f in found if f[1] == "method"]
    by_call = {id(f[3]): f for f in methods}
    for outer in reversed(methods):
        inner = by_call.get(id(outer[0]))
        if inner is not None:
            outer[0], outer[2] = inner[0], inner[2] + outer[2]
            found.remove(inner)
    if len(found) != 1 or not all(found[0][2]):
        return None
    return tuple(found[0][:3])


def callee_name(func) -> Optional[str]:
    return func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else None


# The one operator table: for each operator of the source, the stem of its dunder method (`__add__`,
# `__iadd__`) and the names (without `Tensor.`, `torch.`, underscores) the op it runs is recorded as.
BINARY = {ast.Add: ("add", {"add"}), ast.Sub: ("sub", {"sub", "rsub"}), ast.Mult: ("mul", {"mul"}),
          ast.MatMult: ("matmul", {"matmul", "rmatmul"}),
          ast.Div: ("truediv", {"div", "truediv", "true_divide", "rdiv", "rtruediv"}),
          ast.Pow: ("pow", {"pow", "rpow"}), ast.FloorDiv: ("floordiv", {"floordiv", "floor_divide", "rfloordiv"}),
          ast.Mod: ("mod", {"mod", "remainder", "fmod", "rmod"}), ast.BitAnd: ("and", {"and", "bitwise_and", "rand"}),
          ast.BitOr: ("or", {"or", "bitwise_or", "ror"}), ast.BitXor: ("xor", {"xor", "bitwise_xor", "rxor"}),
          ast.LShift: ("lshift", {"lshift", "rlshift"}), ast.RShift: ("rshift", {"rshift", "rrshift"})}
UNARY = {ast.USub: ("neg", {"neg", "negative"}), ast.UAdd: ("pos", {"pos", "positive"}),
         ast.Invert: ("invert", {"invert", "bitwise_not"})}
COMPARE = {ast.Gt: {"gt", "greater"}, ast.Lt: {"lt", "less"}, ast.GtE: {"ge", "greater_equal"},
           ast.LtE: {"le", "less_equal"}, ast.Eq: {"eq"}, ast.NotEq: {"ne", "not_equal"}}


def dunder(op: ast.operator, inplace: bool = False) -> str:
    """`__add__` (or `__iadd__`) for the source's `+` (or `+=`)."""
    stem = BINARY.get(type(op), ("?",))[0]
    return "__i%s__" % stem if inplace else "__%s__" % stem


def same_op(callee, op_name: str) -> bool:
    """Whether the source's call (`matmul`, `__mul__`, `add_`) is the recorded op (torch.matmul,
    Tensor.mul, Tensor.__mul__, Tensor.add_)."""
    if not callee:
        return False
    short = op_name.rpartition(".")[2]
    return short == callee or "__%s__" % short == callee or short == callee.strip("_") or (
        callee.startswith("__i") and short == callee[3:-2] + "_")


def dotted(node) -> Optional[str]:
    """`x` or `m.weight` (a name, or attributes of one), else None: exactly what the expression is."""
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if not isinstance(node, ast.Name):
        return None
    return ".".join([node.id] + parts[::-1])


def added_names(text: str) -> List[str]:
    """The plain names in the operands of the sums of a statement, through products and quotients
    (`l1 + adv`, `loss + 0.1 * adv`, `loss += adv / n`)."""
    tree = parse_statement(text)
    names = []

    def operand(node):
        if isinstance(node, ast.Name):
            names.append(node.id)
        elif isinstance(node, ast.BinOp):
            operand(node.left)
            operand(node.right)
        elif isinstance(node, ast.UnaryOp):
            operand(node.operand)

    for node in ast.walk(tree) if tree is not None else ():
        if isinstance(node, ast.BinOp) and isinstance(node.op, (ast.Add, ast.Sub)):
            operand(node.left)
            operand(node.right)
        elif isinstance(node, ast.AugAssign) and isinstance(node.op, (ast.Add, ast.Sub)):
            operand(node.value)
    return list(dict.fromkeys(names))


def assigned_name(text: str) -> Optional[str]:
    """The one plain name a statement assigns (`adv = ...`), or None."""
    tree = parse_statement(text)
    body = getattr(tree, "body", None)
    if not body or len(body) != 1 or not isinstance(body[0], ast.Assign) or len(body[0].targets) != 1:
        return None
    target = body[0].targets[0]
    return target.id if isinstance(target, ast.Name) else None
