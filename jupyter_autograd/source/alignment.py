"""The alignment of the user's statements with the ops they recorded: which ops one execution of a
statement ran (the statement's unit: its file, function and first line), and, for a statement of a
few operations, every way the recorded ops fit its operations in Python's order of evaluation.

Certain means: the op is matched to the part of the statement that ran it, in Python's order of
evaluation, the same way by every reading of the statement's recorded ops that is consistent (each
op where an operation of that name is written; a result of one op used where its expression is an
operand of the next; an operation whose operand made a tensor ran; an operand that made no tensor
is no tensor). Naming (naming.py) reads the statement's target for the op's result, the operand for
an input, the expression written for a write.
"""
from __future__ import annotations

import ast
from typing import Dict, Iterator, List, Optional, Tuple

from ..model import DATA_SWAP, FREEZE_SETTER, Location, OpRecord, TraceData
from .index import SourceIndex
from .statements import BINARY, COMPARE, UNARY, dotted, element, same_op, written_tensor

def outermost_runs(node: ast.AST, op_name: str) -> bool:
    """Whether the expression's outermost operation can be the recorded op (`a + 0.1 * b`: an add;
    `F.mse_loss(p, y)`: mse_loss), the last op its value comes from."""
    short = op_name.rpartition(".")[2].strip("_")
    if isinstance(node, ast.BinOp):
        return short in BINARY.get(type(node.op), (None, ()))[1]
    if isinstance(node, ast.UnaryOp):
        return short in UNARY.get(type(node.op), (None, ()))[1]
    if isinstance(node, ast.Call):
        return same_op(node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", None),
                       op_name)
    return False


# Callees whose arguments, when tensors, are always an op's inputs (a user's function or module may
# do anything with them).
_TORCH_ROOTS = ("torch", "F", "nn", "init")
# Statements whose order of evaluation depends on values: no reading of them is certain.
BRANCHING = (ast.BoolOp, ast.IfExp, ast.ListComp, ast.SetComp, ast.DictComp, ast.GeneratorExp, ast.Lambda,
              ast.NamedExpr, ast.Await, ast.Yield, ast.YieldFrom, ast.Starred)
_READINGS = 64  # consistent readings of one statement beyond which none is taken as certain


class Alignment:
    """The statements of the user's source that a trace's ops ran at, read once for every reader
    (naming, the names at culprit lines, written expressions, stores): each op's statement (its file,
    function and first line: a statement written over several lines runs its ops at any of them),
    the whole text of that statement, and which ops one execution of it ran."""

    def __init__(self, trace: TraceData, index: Optional[SourceIndex] = None):
        self.trace = trace
        self.index = index if index is not None else SourceIndex(trace.sources)
        self._unit_at: Dict[int, Optional[tuple]] = {}  # ops of one line share one Location: its unit is made once
        self._units: Optional[List[Optional[tuple]]] = None
        self._written: Dict[str, object] = {}

    def unit(self, op: OpRecord) -> Optional[tuple]:
        """(file, function, first line of the function, first line of the statement) of the op's
        statement; None for an op at no line."""
        where = op.location
        if where is None:
            return None
        found = self._unit_at.get(id(where))
        if found is None:
            found = self._unit_at[id(where)] = where.function_key + (self.index.first_line(where),)
        return found

    def units(self) -> List[Optional[tuple]]:
        """Per op, its statement's unit, for the ops that take or return a tensor: an op that takes and
        returns none (a grad-mode switch, the bookkeeping of a compiled function) names nothing and does
        not end its statement's value."""
        if self._units is None:
            self._units = [self.unit(op) if op.inputs or op.outputs else None for op in self.trace.ops]
        return self._units

    def text(self, where: Location) -> str:
        return self.index.text(where)

    def same_statement(self, op: OpRecord) -> List[OpRecord]:
        """The ops around `op` that ran at its statement, one after the other (a statement run again, in a
        loop or by another call, follows on; ops of any other line end the run). At most as many on each
        side as a statement of this size can run."""
        ops, mine, limit = self.trace.ops, self.unit(op), 64
        before, after = [], []
        for i in range(op.index - 1, max(-1, op.index - limit), -1):
            if self.unit(ops[i]) != mine:
                break
            before.append(ops[i])
        for i in range(op.index + 1, min(len(ops), op.index + limit)):
            if self.unit(ops[i]) != mine:
                break
            after.append(ops[i])
        return before[::-1] + [op] + after

    def made_in_statement(self, at: int, tid: int) -> Optional[OpRecord]:
        """The op of the statement execution that ends with op `at` which returned tensor `tid`, or None.
        A statement that calls user code (a module's forward) runs that code's lines in the middle of its
        own ops: the execution began after the function was last at another statement."""
        ops, units = self.trace.ops, self.units()
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

    def written(self, op: OpRecord) -> Optional[Tuple[int, str]]:
        """(tid, the user's expression for it) of the tensor op's statement writes in place through one
        expression, when this op is that write (statements.written_tensor), or None."""
        if op.location is None:
            return None
        return written_tensor(op, self.text(op.location), self._written,
                              lambda tid: self.made_in_statement(op.index, tid) if self.units()[op.index] else None)


def windows(nearby: List[OpRecord], op: OpRecord, size: int) -> Iterator[List[OpRecord]]:
    """The stretches of `nearby` holding `op` that one execution of a statement with `size` operations
    could have run."""
    at = nearby.index(op)
    for first in range(max(0, at - size + 1), at + 1):
        for end in range(at + 1, min(len(nearby), first + size) + 1):
            yield nearby[first:end]


class Reading:
    """A statement's operations in Python's order of evaluation, and how recorded ops fit them."""

    def __init__(self, stmt: ast.stmt, text: str):
        self.text = text
        self.value, self.target = None, None
        self.nodes: List[ast.AST] = []
        self.stores = set()  # ids of the targets whose store runs an op (`x[i] = v`, `x.data = v`)
        self.operands: Dict[int, List[ast.AST]] = {}  # id(node) -> its operand expressions
        self.consumer: Dict[int, Tuple[ast.AST, bool]] = {}  # id(operand) -> (its operation, must it run)
        if isinstance(stmt, (ast.Assign, ast.AnnAssign)) and stmt.value is not None:
            targets = stmt.targets if isinstance(stmt, ast.Assign) else [stmt.target]
            self.value = stmt.value
            self._visit(stmt.value)
            if len(targets) == 1:
                self.target = targets[0]
                self._store(targets[0], stmt.value)
        elif isinstance(stmt, ast.AugAssign):
            self._visit(stmt.target.value if isinstance(stmt.target, ast.Attribute) else stmt.target)
            self._visit(stmt.value)
            self._add(stmt, [stmt.target, stmt.value])
        elif isinstance(stmt, (ast.Expr, ast.Return)) and stmt.value is not None:
            self._visit(stmt.value)
        if len(self.nodes) > 12:
            self.nodes = []  # too many operations for every reading of them to be tried

    # -- the statement's operations, in the order Python runs them -------------------------------
    def _visit(self, node: ast.AST) -> None:
        if isinstance(node, ast.BinOp):
            self._visit(node.left)
            self._visit(node.right)
            self._add(node, [node.left, node.right])
        elif isinstance(node, ast.UnaryOp) and type(node.op) in UNARY:
            self._visit(node.operand)
            self._add(node, [node.operand])
        elif isinstance(node, ast.Compare) and len(node.ops) == 1:
            self._visit(node.left)
            self._visit(node.comparators[0])
            self._add(node, [node.left, node.comparators[0]])
        elif isinstance(node, ast.Subscript):
            self._visit(node.value)
            self._visit(node.slice)
            self._add(node, [node.value] + self._flat([node.slice]))
        elif isinstance(node, ast.Call):
            method = isinstance(node.func, ast.Attribute) and not self._torch(node.func)
            if method:
                self._visit(node.func.value)
            for arg in node.args + [k.value for k in node.keywords]:
                self._visit(arg)
            args = self._flat(node.args + [k.value for k in node.keywords])
            self._add(node, ([node.func.value] if method else []) + args, receiver=method)
        elif isinstance(node, ast.Attribute):
            self._visit(node.value)
            if node.attr == "data":  # read as an op of its own (the capture records `.data`)
                self._add(node, [node.value], receiver=True)
        elif isinstance(node, (ast.List, ast.Tuple, ast.Set)):
            for e in node.elts:
                self._visit(e)
        elif isinstance(node, ast.Dict):
            for e in node.keys + node.values:
                if e is not None:
                    self._visit(e)
        elif isinstance(node, ast.Slice):
            for e in (node.lower, node.upper, node.step):
                if e is not None:
                    self._visit(e)

    def _store(self, target: ast.AST, value: ast.AST) -> None:
        """A store that runs an op: `x[i] = v` (Tensor.__setitem__), `x.data = v`, `x.requires_grad = b`."""
        if isinstance(target, ast.Subscript):
            self._visit(target.value)
            self._visit(target.slice)
            self._add(target, [target.value] + self._flat([target.slice]) + self._flat([value]), store=True)
        elif isinstance(target, ast.Attribute) and target.attr in ("data", "requires_grad"):
            self._visit(target.value)
            self._add(target, [target.value, value], store=True)

    def _add(self, node: ast.AST, operands: List[ast.AST], receiver: bool = False, store: bool = False) -> None:
        if store:
            self.stores.add(id(node))
        self.nodes.append(node)
        self.operands[id(node)] = operands
        for k, operand in enumerate(operands):
            # An operation on a tensor runs an op: an operator, an index, a method of it, a torch function;
            # a store runs one only into a tensor (`x[i] = v`), not into a list or a dict.
            must = not store and (not isinstance(node, ast.Call) or (receiver and k == 0) or self._torch(node.func))
            self.consumer.setdefault(id(operand), (node, must))

    @staticmethod
    def _flat(nodes: List[ast.AST]) -> List[ast.AST]:
        out = []
        for node in nodes:
            if isinstance(node, (ast.List, ast.Tuple)):
                out.extend(Reading._flat(node.elts))
            elif node is not None:
                out.append(node)
        return out

    @staticmethod
    def _torch(func: ast.AST) -> bool:
        root = dotted(func.value) if isinstance(func, ast.Attribute) else None
        return root is not None and root.partition(".")[0] in _TORCH_ROOTS

    # -- fitting recorded ops to them ------------------------------------------------------------
    def may_run(self, node: ast.AST, op: OpRecord) -> bool:
        """Whether `op` can be what `node` ran."""
        short = op.name.rpartition(".")[2].strip("_")
        if id(node) in self.stores:
            if isinstance(node, ast.Subscript):
                return short == "setitem"
            return op.name == (DATA_SWAP if node.attr == "data" else FREEZE_SETTER)
        if isinstance(node, (ast.BinOp, ast.UnaryOp, ast.Call)):
            return outermost_runs(node, op.name)
        if isinstance(node, ast.AugAssign):
            names = BINARY.get(type(node.op), (None, ()))[1]
            return short in names or short.startswith("i") and short[1:] in names or short.rstrip("_") in names
        if isinstance(node, ast.Compare):
            return short in COMPARE.get(type(node.ops[0]), ())
        if isinstance(node, ast.Subscript):
            return short == "getitem"
        if isinstance(node, ast.Attribute):
            return op.name == "Tensor.data"
        return False

    def alignments(self, window: List[OpRecord]) -> Optional[List[Dict[int, ast.AST]]]:
        """Each way to give the window's ops, in order, to operations of the statement, in order (an
        operation may have run no op: its operands were no tensors); None when there are too many."""
        found: List[Dict[int, ast.AST]] = []

        def place(k: int, start: int, matched: Dict[int, ast.AST]) -> bool:
            if k == len(window):
                found.append(dict(matched))
                return len(found) <= _READINGS
            for n in range(start, len(self.nodes)):
                if self.may_run(self.nodes[n], window[k]):
                    matched[window[k].index] = self.nodes[n]
                    if not place(k + 1, n + 1, matched):
                        return False
                    del matched[window[k].index]
            return True

        return found if place(0, 0, {}) else None

    def consistent(self, window: List[OpRecord], matched: Dict[int, ast.AST]) -> bool:
        """Whether the ops could have run the statement that way: each result an op of the window made
        and another took is the operand of that other op's operation; each input from before the
        window is an operand that could hold a tensor; and each result whose operation must run on
        a tensor is taken by that operation's op, in the window."""
        ran = {id(node): index for index, node in matched.items()}
        made = {}
        for op in window:
            node = matched[op.index]
            operands = self.operands[id(node)]
            outside = 0
            for t in op.inputs:
                producer = made.get(t)
                if producer is None:
                    outside += 1
                elif not any(operand is matched[producer] for operand in operands):
                    return False
            if outside > len(self._open(node, ran)):
                return False
            for t in op.outputs:
                made[t] = op.index
        for op in window:
            consumer = self.consumer.get(id(matched[op.index]))
            if op.outputs and consumer is not None and consumer[1] and id(consumer[0]) not in ran:
                return False
        return True

    def _open(self, node: ast.AST, ran: Dict[int, int]) -> List[ast.AST]:
        """The operands of `node` that may hold a tensor made before the window: names, attributes,
        elements of containers and calls that ran no op of the window."""
        return [e for e in self.operands[id(node)] if id(e) not in ran
                and isinstance(e, (ast.Name, ast.Attribute, ast.Subscript, ast.Call))
                and not (isinstance(e, ast.Attribute) and self._torch(e))]  # `torch.float64`: torch's, no tensor

    def name_of(self, op: OpRecord, node: ast.AST, tid: int, window: List[OpRecord],
                matched: Dict[int, ast.AST]) -> Optional[str]:
        """What `node`, the operation `op` ran, calls tensor `tid`: the statement's target for the result
        of its whole value; the operand it was for an input from before the window. An op that returned
        the very tensor it was given, unchanged (`.cpu()` of a tensor on the CPU, `.contiguous()` of a
        contiguous one), names it by that operand."""
        if tid in op.outputs and (tid not in op.inputs or tid in op.writes):
            if node is not self.value or self.target is None:
                return None
            if isinstance(self.target, ast.Subscript):  # stored into a list or a dict, unless into a tensor
                return None if any(n is self.target for n in matched.values()) else element(self.target, self.text)
            return dotted(self.target)
        made = {t for other in window if other.index < op.index for t in other.outputs}
        outside = [t for t in op.inputs if t not in made]
        if tid not in outside:
            return None
        ran = {id(n) for n in matched.values()}
        open_operands = self._open(node, {i: 0 for i in ran})
        if len(open_operands) != len(outside) or outside.count(tid) != 1:
            return None
        at = outside.index(tid)
        if op.name.rpartition(".")[2].startswith("__r") and len(outside) == 2:
            at = 1 - at  # `a - t` runs t.__rsub__(a): the tensor is the right operand
        expression = open_operands[at]
        return dotted(expression) or (element(expression, self.text)
                                      if isinstance(expression, ast.Subscript) else None)
