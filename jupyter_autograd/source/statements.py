"""Reading the user's statements, with plain `ast` (no torch): the statement a line belongs to (a
call wrapped over several lines runs its ops at any of them), what it writes in place and through
which expression, the dotted names it spells. Naming (capture/build.py) and the diagnoses' names
(diagnose/names.py) read the source the same way."""
from __future__ import annotations

import ast
import functools
import io
import re
import tokenize
from typing import Dict, Iterator, Optional, Tuple

from ..model import DATA_SWAP, Location


def parsed_sources(sources: Dict[str, list], only: Optional[str] = None) -> Iterator[Tuple[str, ast.Module]]:
    """(filename, syntax tree) of each source file a trace read (`trace.sources`), or of `only`; files
    that do not parse (a cell of IPython syntax) are left out."""
    for filename, lines in sources.items():
        if only is not None and filename != only:
            continue
        try:
            yield filename, ast.parse("".join(lines))
        except (SyntaxError, ValueError):
            continue


class Statements:
    """The statements of the user's source that ops ran at. A statement written over several lines
    (a call wrapped by a formatter) runs its ops at any of its lines; only the whole of it says
    what it assigns. A line that is not part of such a statement stands for itself."""

    def __init__(self, trace):
        self.trace = trace
        self.files: Dict[str, "SourceFacts"] = {}

    def facts(self, filename: str) -> "SourceFacts":
        found = self.files.get(filename)
        if found is None:
            lines = self.trace.sources.get(filename) or []
            found = self.files[filename] = source_facts("".join(lines)) if lines else _NO_FACTS
        return found

    def first_line(self, where: Location) -> int:
        span = self.facts(where.filename).spans.get(where.line)
        return where.line if span is None else span[0]

    def text(self, where: Location) -> str:
        span = self.facts(where.filename).spans.get(where.line)
        if span is None:
            return where.source
        lines = self.trace.sources[where.filename][span[0] - 1:span[1]]
        return "".join(lines).strip()


class SourceFacts:
    """What naming needs from a whole source file: `spans`, line -> (first, last) line of the simple
    statement written over several lines that holds it; `classes`, the names the file binds to classes
    (its `class` statements, capitalised names it imports); `modules`, the names it binds to modules."""

    __slots__ = ("spans", "classes", "modules")

    def __init__(self, spans, classes, modules):
        self.spans, self.classes, self.modules = spans, classes, modules

    def is_class(self, callee: str) -> bool:
        """Whether a capitalised callee (`Slot`, `Categorical`, `torch.distributions.Normal`) is a class
        the file defines or imports, or reaches through a module; not a variable (`G(z)`, `self.D(x)`)."""
        root, _, rest = callee.partition(".")
        return callee in self.classes if not rest else root in self.modules


_NO_FACTS = SourceFacts({}, frozenset(), frozenset())
_COMPOUND = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.If, ast.For, ast.AsyncFor, ast.While,
             ast.With, ast.AsyncWith, ast.Try, getattr(ast, "TryStar", ast.Try), getattr(ast, "Match", ast.If))


@functools.lru_cache(maxsize=64)  # a training loop builds a trace per step from the same files
def source_facts(source: str) -> SourceFacts:
    """The SourceFacts of a file; none when it does not parse (a notebook cell with magics)."""
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError):
        return _NO_FACTS
    spans: Dict[int, Tuple[int, int]] = {}
    classes, modules = set(), set()
    for node in ast.walk(tree):
        if isinstance(node, ast.stmt) and not isinstance(node, _COMPOUND) and node.end_lineno > node.lineno:
            for line in range(node.lineno, node.end_lineno + 1):
                spans[line] = (node.lineno, node.end_lineno)
        if isinstance(node, ast.ClassDef):
            classes.add(node.name)
        elif isinstance(node, ast.Import):
            modules.update((a.asname or a.name).partition(".")[0] for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            for a in node.names:
                bound = a.asname or a.name
                (classes if a.name[:1].isupper() else modules).add(bound)
    return SourceFacts(spans, frozenset(classes), frozenset(modules))


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
    try:
        tree = ast.parse(text)
    except SyntaxError:
        return None
    if len(tree.body) != 1:
        return None
    stmt = tree.body[0]
    found = []  # [expression, spelling, callees, the call]
    if isinstance(stmt, ast.AugAssign):
        found.append([stmt.target, "augmented", ("__i%s__" % BINOPS.get(type(stmt.op), "?"),), None])
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


BINOPS = {ast.Add: "add", ast.Sub: "sub", ast.Mult: "mul", ast.Div: "truediv", ast.MatMult: "matmul",
          ast.Pow: "pow", ast.FloorDiv: "floordiv", ast.Mod: "mod"}


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


def without_comment(line: str) -> str:
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
