"""Errors torch raises inside the block about a property of a tensor or of a call, named at what gave it
that property. Which property an error is about is read from PyTorch's message, by the words each
kind explains (model/kinds.EXPLAINS); everything else from the recorded ops, switches and checkpoints
and the user's source, never from the shape of a statement:

* grad-to-numpy: NumPy was handed a tensor that requires grad (`.numpy()`, `np.sum` of tensors). The
  property is ordinary (what training code computes), so the culprit is the line that raised, where
  `.detach()` goes; the second line is where its history began (the op that first took a tensor
  that requires grad: a model's call, a parameter's row).
* needs-grad: register_hook, retain_grad, or autograd.grad's inputs got a tensor that does not require
  grad. Culprit: what left it without: the call that froze it, the line that made it without
  requires_grad (a parameter made so, found where the module stores it), or, for a tensor computed
  without a graph, the cut of its chain (the switch, the decorator, the grad-off block, `.detach()`:
  cuts.cut_of).
* nonleaf-copied: copy.deepcopy met a tensor with a history. Culprit: the store that put it on the
  module that was copied (`self.exp = x`), else the op that made it (weight_norm's reparametrisation).
* nonleaf-optimized: an optimizer handed a tensor with a history. Culprit: the op that made it from the
  leaf that requires grad (a scaling or a move after requires_grad=True).
* not-a-parameter: a module's parameter assigned a plain tensor. Culprit: the assignment; the second
  line, where the class registered the parameter.
* fp16-gradients: GradScaler met float16 gradients. Culprit: the cast that made those parameters
  float16 (`.half()`, `.to(torch.float16)` on a module or a parameter).
* transform-unsupported: a custom autograd.Function without setup_context under a torch.func
  transform. Culprit: its `forward(ctx, ...)`, or, for a Function of torch or a library (reentrant
  checkpointing's), the user's call that applied it.
* checkpoint-incompatible: reentrant checkpointing met autograd.grad or backward(inputs=...). Culprit:
  the checkpoint call whose node the failing call runs through.

Only the error the block ended with is judged (one the program caught raised nothing). Where the
cause cannot be traced, the finding names the line that raised and says what it could not trace
(reason `untraced`).

Reasons: `numpy`, `needs-grad`, `nonleaf-copied`, `nonleaf-optimized`, `not-a-parameter`, `fp16-gradients`,
`function-without-setup-context`, `applied-function`, `reentrant-checkpoint`, `untraced`."""
from __future__ import annotations

import ast
from typing import Callable, Dict, List, Optional, Tuple

from ...model import DATA_SWAP, EXPLAINS, FREEZE_SETTER, Location, OpRecord, TraceData, is_description
from ...model.queries import ancestors, reachable
from ...source.index import parse_statement
from ...source.naming import spelled
from ..findings import Finding, Words
from ...source.index import parse_fresh
from ..fixes import (applied_function_fix, checkpoint_under_transform_fix, fp16_fix, line_ref, needs_grad_fix,
                     no_grad_cut_fix, nonleaf_copied_fix, nonleaf_optimized_fix, not_a_parameter_fix, numpy_fix,
                     reentrant_fix, setup_context_fix, where)
from ..wording import words
from .common import first_line, label, line_text, made, raised, shown
from .cut_place import cut_fix, where_at, why_cut
from .cuts import cut_of

# The ops that set a leaf's requires_grad.
_SETTERS = {"Tensor.requires_grad_", FREEZE_SETTER}
_CHECKPOINT = "CheckpointFunction"  # torch.utils.checkpoint's reentrant implementation, an autograd.Function


def raised_causes(trace: TraceData, source) -> List[Finding]:
    """The error the block ended with, when it is about a property of a tensor or a call that a kind
    here explains: one finding, at the cause (see the module's docstring)."""
    error = trace.error
    if not error:
        return []
    kind = next((k for k in _FINDERS if any(w in error for w in EXPLAINS[k])), None)
    if kind is None:
        return []
    op = next((o for o in reversed(trace.ops) if o.error == error), None)
    at = op.location if op is not None else trace.error_location
    if at is None:
        return []
    found = _FINDERS[kind](trace, source, op, at)
    if found is None:
        found = Finding(kind, "untraced", op=op, at=at, subject=_used_at(trace, op, at),
                        facts={"raising": op, "raised_at": at})
    found.facts.setdefault("raised_at", at)
    return [found]


def _used_at(trace: TraceData, op: Optional[OpRecord], at: Location) -> Optional[int]:
    """The tensor the raising call was about: its first input; for an error raised by no op (an
    assignment, a GradScaler), the tensor its line used last."""
    if op is not None:
        return op.inputs[0] if op.inputs else None
    last = next((o for o in reversed(trace.ops) if o.location is not None and not o.is_backward
                 and (o.location.filename, o.location.line) == (at.filename, at.line) and (o.inputs or o.outputs)), None)
    if last is None:
        return None
    return last.outputs[0] if last.outputs else last.inputs[0]


def _requires_grad(trace: TraceData, tid: int) -> bool:
    """Whether the tensor required grad when it was last used: its end state, if it is still alive
    (a parameter frozen in the block), else when first seen."""
    info = trace.tensors.get(tid)
    if info is None:
        return False
    return info.requires_grad if info.alive else info.first_requires_grad


def _placed(trace: TraceData, op: OpRecord) -> Optional[Location]:
    """The line that called the outermost user-written module that ran `op`, where one did."""
    call = next((c for c in trace.calls if c.first_op <= op.index < c.end_op), None)
    return call.location if call is not None else None


# -- grad-to-numpy ---------------------------------------------------------------------------------

def _numpy(trace: TraceData, source, op: Optional[OpRecord], at: Location) -> Optional[Finding]:
    if op is None:
        return None
    tid = next((t for t in op.inputs if _requires_grad(trace, t)), None)
    if tid is None:
        return None
    began = _history_began(trace, tid, op.index)
    name = _spelled(trace, source, op, tid)
    return Finding("grad-to-numpy", "numpy", op=op, saved=began, saved_at=_placed(trace, began) if began else None,
                   subject=tid, tids=(tid,), facts={"began": began, "spelled": name})


# Calls that return a copy of their tensor with the same values and history, on another device or in
# another dtype (on the CPU, `.cpu()` returns the tensor itself).
_COPIES = frozenset(("Tensor.cpu", "Tensor.cuda", "Tensor.to", "Tensor.double", "Tensor.float", "Tensor.half",
                     "Tensor.bfloat16", "Tensor.type", "Tensor.contiguous", "Tensor.clone"))


def _spelled(trace: TraceData, source, op: OpRecord, tid: int) -> Optional[str]:
    """The expression op's statement uses for tensor `tid`: at op, or at the first op of the same run of
    the statement that took it (`array.cpu().numpy()`: `.cpu()` of a tensor on the CPU returns it). A copy
    that the statement made (`.cpu()` of a tensor on a GPU, `.double()`) goes by the tensor it copies,
    as it does where the call returns that tensor itself."""
    if op.location is None:
        return None
    before = [o for o in source.same_statement(op) if o.index < op.index]
    candidates = [o for o in before if tid in o.inputs] + [op]
    while True:
        for other in candidates:
            name = spelled(trace, source, other, tid)
            if name is not None:
                return name
        copy = next((o for o in before if tid in o.outputs and o.name in _COPIES and o.inputs), None)
        if copy is None:
            return None
        tid = copy.inputs[0]
        candidates = [o for o in before if tid in o.inputs]


def _history_began(trace: TraceData, tid: int, before: int) -> Optional[OpRecord]:
    """The first op on the way to tensor `tid` that took a leaf that requires grad (a parameter, an input
    made with requires_grad): where its history, and its requires_grad, began."""
    found = ancestors(trace, [tid], before)
    for op in trace.ops[:before]:
        if op.is_backward or not any(t in found and not trace.tensors[t].is_leaf for t in op.outputs):
            continue  # an op that made no tensor with a history (an initialisation in place of a parameter)
        if any(t in trace.tensors and trace.tensors[t].is_leaf and trace.tensors[t].first_requires_grad
               for t in op.inputs):
            return op
    return None


@words("numpy")
def _numpy_words(trace: TraceData, f: Finding) -> Words:
    op, began = f.op, f.facts["began"]
    name = f.facts["spelled"] or label(trace, f.subject)
    if began is None:
        history = "it is a leaf that requires grad (a parameter, or a tensor made with requires_grad=True)"
    else:
        place = f.saved_at.line if f.saved_at is not None else began.location.line
        history = ("it was computed from tensors that require grad: its history began on line %d, where `%s` "
                   "took one" % (place, began.name))
    message = ("%s hands %s to NumPy, which cannot keep the graph, so PyTorch refuses a tensor that requires grad: "
               "%s. PyTorch raised: \"%s\"" % (where(op), shown(name) or "a tensor", history, raised(op.error)))
    return Words(message, numpy_fix(op.location.source if op.location else "", name, began), name)


# -- needs-grad ------------------------------------------------------------------------------------

def _needs_grad(trace: TraceData, source, op: Optional[OpRecord], at: Location) -> Optional[Finding]:
    if op is None:
        return None
    cp = next((c for c in trace.checkpoints if c.kind == "backward" and c.op_index == op.index), None)
    asked = list(cp.input_tids) if op.is_backward and cp is not None else list(op.inputs[:1])
    tid = next((t for t in asked if not _requires_grad(trace, t)), None)
    if tid is None:
        return None
    cause, cause_at, facts = _without_grad(trace, source, tid, op.index)
    if cause is None and cause_at is None:
        return None
    facts.update(raising=op, guarded=_guarded(trace, source, op) if facts["why"] in ("frozen", "made-without") else None,
                 as_leaf=_as_leaf(source, cause) if facts["why"] in ("made-without", "data") and cause is not None
                 and not trace.tensors[tid].is_parameter else None)
    return Finding("needs-grad", "needs-grad", op=cause if cause is not None else op, at=cause_at, saved=op,
                   subject=tid, tids=(tid,), facts=facts)


def _without_grad(trace: TraceData, source, tid: int, before: int):
    """(the op, the line where it is not the op's, facts with `why`) that left tensor `tid` without
    requires_grad before op `before`: the call that froze a leaf ("frozen"), the op that made it
    without ("made-without"), the store of a parameter made without ("made-without", a line only), or
    the cut of a computed tensor's chain (cuts.cut_of's reasons). (None, None, facts) when untraced."""
    info = trace.tensors[tid]
    maker = made(trace, tid)
    computed = maker is not None and any(t != tid for t in maker.inputs)
    if info.is_leaf and not computed:
        setter = next((o for o in reversed(trace.ops[:before]) if o.name in _SETTERS and o.inputs
                       and o.inputs[0] == tid and o.error is None), None)
        if setter is not None:
            return setter, None, {"why": "frozen"}
        if maker is not None:
            return maker, None, {"why": "made-without"}
        stored = _parameter_store(trace, source, info.name) if info.is_parameter else None
        return None, stored, {"why": "made-without" if stored is not None else "untraced"}
    cut, cut_at, facts = cut_of(trace, source, tid, before)
    if cut is None:
        facts["why"] = "data"
        return maker, None, facts
    return cut, cut_at, facts


def _guarded(trace: TraceData, source, op: OpRecord):
    """(first line, last line, file label, the statement, whether it is the whole fix) of the raising
    call's statement rewritten to leave out what does not require grad: a hook registered only on a
    tensor that requires grad (the whole fix); autograd.grad's inputs filtered (`[p for p in
    model.parameters() if p.requires_grad]`, for a call of `.parameters()` or a list written out: code
    that pairs the gradients with the full list changes too). None where the statement is neither."""
    where = op.location
    if where is None:
        return None
    tree = parse_fresh(source.text(where))
    stmt = tree.body[0] if tree is not None and len(tree.body) == 1 else None
    short = op.name.rpartition(".")[2]
    value = stmt.value if isinstance(stmt, (ast.Expr, ast.Assign)) else None
    if short == "register_hook":
        if not (isinstance(value, ast.Call) and isinstance(value.func, ast.Attribute) and value.func.attr == short):
            return None
        owner = value.func.value
        stmt.value = ast.IfExp(test=ast.Attribute(value=owner, attr="requires_grad", ctx=ast.Load()), body=value,
                               orelse=ast.Constant(None))
    elif short == "grad":
        calls = [n for n in ast.walk(stmt) if isinstance(n, ast.Call) and ast.unparse(n.func).rpartition(".")[2] == short]
        if stmt is None or len(calls) != 1:
            return None
        call = calls[0]
        given = call.args[1] if len(call.args) > 1 else next((k.value for k in call.keywords if k.arg == "inputs"), None)
        if not _a_list_of_tensors(given):
            return None
        kept = ast.ListComp(elt=ast.Name("p", ast.Load()), generators=[ast.comprehension(
            target=ast.Name("p", ast.Store()), iter=given,
            ifs=[ast.Attribute(value=ast.Name("p", ast.Load()), attr="requires_grad", ctx=ast.Load())], is_async=0)])
        if len(call.args) > 1:
            call.args[1] = kept
        else:
            call.keywords = [ast.keyword(arg="inputs", value=kept) if k.arg == "inputs" else k for k in call.keywords]
    else:
        return None
    first = source.index.first_line(where)
    span = source.index.facts(where.filename).spans.get(where.line)
    return first, span[1] if span else first, trace.file_label(where.filename), ast.unparse(tree), short != "grad"


def _a_list_of_tensors(node) -> bool:
    """`[a, b]`, `model.parameters()`, `list(model.parameters())`: what autograd.grad's inputs can be
    filtered by requires_grad as written."""
    if isinstance(node, (ast.List, ast.Tuple)):
        return True
    if not isinstance(node, ast.Call):
        return False
    if isinstance(node.func, ast.Attribute):
        return node.func.attr == "parameters"
    return isinstance(node.func, ast.Name) and node.func.id in ("list", "tuple") and len(node.args) == 1 \
        and _a_list_of_tensors(node.args[0])


def _as_leaf(source, maker: OpRecord) -> Optional[str]:
    """`x = torch.linspace(0, 1, 10).requires_grad_()`: the one-line statement `name = ...` that made a
    tensor, made to require grad as a leaf."""
    found = _as_leaf_lines(source, maker, detached=False)
    return found[2] if found is not None and found[0] == found[1] else None


def _as_leaf_lines(source, maker: OpRecord, detached: bool):
    """(first line, last line, the statement rewritten) for _as_leaf, over the lines of the statement
    (`detached`: a leaf of its values, `.detach().requires_grad_()`, for a tensor with a history)."""
    if maker.location is None:
        return None
    tree = parse_fresh(source.text(maker.location))
    stmt = tree.body[0] if tree is not None and len(tree.body) == 1 else None
    if not (isinstance(stmt, ast.Assign) and len(stmt.targets) == 1 and isinstance(stmt.targets[0], ast.Name)):
        return None
    value = stmt.value
    if detached:
        value = ast.Call(func=ast.Attribute(value=value, attr="detach", ctx=ast.Load()), args=[], keywords=[])
    stmt.value = ast.Call(func=ast.Attribute(value=value, attr="requires_grad_", ctx=ast.Load()), args=[], keywords=[])
    first = source.index.first_line(maker.location)
    span = source.index.facts(maker.location.filename).spans.get(maker.location.line)
    return first, span[1] if span else first, ast.unparse(tree)


def _parameter_store(trace: TraceData, source, name: Optional[str]) -> Optional[Location]:
    """The statement that made the parameter at this dotted path: `self.<attr> = ...` for it, else for the
    module that holds it (`self.embedding = nn.Embedding.from_pretrained(...)`), in a method of the class
    of the module above it, in a function that ran in the block (so that it ran: the module was built in
    the block)."""
    if not name or "." not in name:
        return None
    ran = {(o.location.filename, o.location.scope) for o in trace.ops if o.location is not None}
    path = name
    while "." in path:
        parent, _, attr = path.rpartition(".")
        found = _attribute_store(trace, source, trace.modules.get(parent), attr, ran)
        if found is not None:
            return found
        path = parent
    return None


def _attribute_store(trace: TraceData, source, cls: Optional[str], attr: str, ran) -> Optional[Location]:
    """The one `self.<attr> = ...` in a method of class `cls` (of any class, where the module was never
    called and its class is not known) that ran in the block."""
    found = []
    for filename, tree in source.index.trees():
        for node in ast.walk(tree):
            if not (isinstance(node, ast.ClassDef) and (cls is None or node.name == cls)):
                continue
            for method in node.body:
                if not isinstance(method, (ast.FunctionDef, ast.AsyncFunctionDef)) or not method.args.args or \
                        (filename, first_line(method)) not in ran:
                    continue
                me = method.args.args[0].arg
                found += [Location(filename, n.lineno, method.name, line_text(source, filename, n.lineno),
                                   first_line(method)) for n in ast.walk(method) if isinstance(n, ast.Assign)
                          and any(isinstance(t, ast.Attribute) and t.attr == attr and isinstance(t.value, ast.Name)
                                  and t.value.id == me for t in n.targets)]
    return found[0] if len(found) == 1 else None


@words("needs-grad")
def _needs_grad_words(trace: TraceData, f: Finding) -> Words:
    op, facts = f.facts["raising"], f.facts
    name = label(trace, f.subject)
    said = shown(name) or "a tensor"
    if op.name == "torch.autograd.grad":
        asked = "torch.autograd.grad() on %s was asked for the gradient of %s" % (line_ref(op), said)
    elif op.name.endswith("register_hook"):
        asked = "`%s` on %s registers a hook on %s, to see its gradient" % (op.name, line_ref(op), said)
    else:
        asked = "`%s` on %s needs %s to have a gradient" % (op.name, line_ref(op), said)
    why = facts["why"]
    if why == "frozen":
        cause = "%s set its requires_grad to False" % _lower(where(f.op))
    elif why == "made-without":
        cause = "%s made it without requires_grad" % _lower(where_at(f.op, f.at))
    elif why == "data":
        cause = "%s computed it from tensors that do not require grad, so it has no graph" % _lower(where(f.op))
    else:
        cause = "%s cut it off the graph: %s" % (_lower(where_at(f.op, f.at)), why_cut(facts))
    message = ("%s, but it does not require grad, so it will never have one: %s. PyTorch raised: \"%s\""
               % (asked, cause, raised(op.error)))
    return Words(message, needs_grad_fix("`%s`" % op.name, name, why, facts.get("guarded"), _cut_fix(f, name),
                                         facts.get("as_leaf")), name)


def _lower(text: str) -> str:
    return text[:1].lower() + text[1:]


def _cut_fix(f: Finding, name: Optional[str]) -> Optional[str]:
    """The fix of the cut that left a tensor needed with a gradient without one."""
    why, cut = f.facts["why"], f.op
    if why in ("decorated", "no-graph", "switched"):
        return cut_fix(cut, why, f.facts)
    if why == "op":
        return cut_fix(cut, why) if cut.grad_enabled else no_grad_cut_fix(name)
    return None


# -- nonleaf-copied --------------------------------------------------------------------------------

def _nonleaf_copied(trace: TraceData, source, op: Optional[OpRecord], at: Location) -> Optional[Finding]:
    if op is None or not op.inputs:
        return None
    tid = op.inputs[0]
    maker = made(trace, tid)
    if maker is None or maker.location is None:
        return None
    store = _store_of(source, maker)
    return Finding("nonleaf-copied", "nonleaf-copied", op=maker, at=store[0] if store else None, saved=op,
                   subject=tid, tids=(tid,), facts={"stored": store[1] if store else None, "maker": maker})


def _store_of(source, maker: OpRecord) -> Optional[Tuple[Location, str]]:
    """(the line, the attribute written) that stores the tensor `maker` made on an object: the maker's
    own statement when it assigns an attribute (`self.exp = self.conv(x)`), else the first statement
    after it in its function that assigns the name it bound to an attribute (`self.exp = x`)."""
    where = maker.location
    tree = parse_statement(source.text(where))
    stmt = tree.body[0] if tree is not None and len(tree.body) == 1 else None
    if not isinstance(stmt, ast.Assign) or len(stmt.targets) != 1:
        return None
    target = stmt.targets[0]
    if isinstance(target, ast.Attribute):
        return where, ast.unparse(target)
    if not isinstance(target, ast.Name):
        return None
    file_tree = source.index.tree(where.filename)
    function = next((n for n in ast.walk(file_tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))
                     and first_line(n) == where.scope), None) if file_tree is not None else None
    if function is None:
        return None
    stores = sorted((n for n in ast.walk(function) if isinstance(n, ast.Assign) and n.lineno > where.line
                     and isinstance(n.value, ast.Name) and n.value.id == target.id and len(n.targets) == 1
                     and isinstance(n.targets[0], ast.Attribute)), key=lambda n: n.lineno)
    if not stores:
        return None
    line = stores[0].lineno
    return (Location(where.filename, line, where.function, line_text(source, where.filename, line), where.scope),
            ast.unparse(stores[0].targets[0]))


@words("nonleaf-copied")
def _nonleaf_copied_words(trace: TraceData, f: Finding) -> Words:
    maker, stored = f.facts["maker"], f.facts["stored"]
    name = stored or label(trace, f.subject)
    history = "grad_fn %s" % trace.tensors[f.subject].grad_fn if trace.tensors[f.subject].grad_fn else "a grad_fn"
    if stored:
        what = ("%s stores on the object a tensor with a history (%s, made by `%s` on %s), so copying the object "
                "copies it too" % (where_at(maker, f.at), history, maker.name, line_ref(maker)))
    else:
        what = "%s made %s with `%s`, with grad on, so it is not a leaf: it has a history (%s)" % (
            where(maker), shown(name) if name and not is_description(name) else "a tensor", maker.name, history)
    message = ("%s. copy.deepcopy copies only leaves, tensors without a history, and it met this one. PyTorch "
               "raised: \"%s\"" % (what, raised(f.saved.error)))
    return Words(message, nonleaf_copied_fix(maker.location.source if maker.location else "", stored, maker.name), name)


# -- nonleaf-optimized ----------------------------------------------------------------------------

def _nonleaf_optimized(trace: TraceData, source, op: Optional[OpRecord], at: Location) -> Optional[Finding]:
    """An optimizer built with a tensor that has a history: the one the call's arguments name (the
    optimizer was never built, so no op holds its parameters), made by an op from a leaf that requires
    grad (`torch.randn(..., requires_grad=True) * 0.01`, a move after requires_grad was set)."""
    tree = parse_statement(source.text(at))
    if tree is None:
        return None
    written = [n for n in ast.walk(tree) if isinstance(n, ast.Call)]
    named = {ast.unparse(a) for call in written for a in ast.walk(call) if isinstance(a, (ast.Name, ast.Attribute))}
    candidates = [t for t, info in trace.tensors.items() if info.name in named and not info.is_leaf
                  and info.first_requires_grad and made(trace, t) is not None]
    if len(candidates) != 1:
        return None
    tid = candidates[0]
    maker = made(trace, tid)
    rewritten = _as_leaf_lines(source, maker, detached=True)
    return Finding("nonleaf-optimized", "nonleaf-optimized", op=maker, saved=op, saved_at=at if op is None else None,
                   subject=tid, tids=(tid,),
                   facts={"rewritten": rewritten, "file": trace.file_label(maker.location.filename)})


@words("nonleaf-optimized")
def _nonleaf_optimized_words(trace: TraceData, f: Finding) -> Words:
    maker, name = f.op, label(trace, f.subject)
    info = trace.tensors[f.subject]
    message = ("%s made %s with `%s` from a tensor that requires grad, so it is the result of an operation (grad_fn "
               "%s), not a leaf: the leaf is the tensor it was computed from, and an optimizer updates leaves only. "
               "The optimizer built on %s was handed it. PyTorch raised: \"%s\""
               % (where(maker), shown(name) or "the tensor", maker.name, info.grad_fn or "set",
                  "line %d" % f.facts["raised_at"].line, raised(trace.error)))
    return Words(message, nonleaf_optimized_fix(name, f.facts["rewritten"], f.facts["file"]), name)


# -- not-a-parameter -------------------------------------------------------------------------------

def _not_a_parameter(trace: TraceData, source, op: Optional[OpRecord], at: Location) -> Optional[Finding]:
    tree = parse_statement(source.text(at))
    stmt = tree.body[0] if tree is not None and len(tree.body) == 1 else None
    attr = stmt.targets[0].attr if isinstance(stmt, ast.Assign) and len(stmt.targets) == 1 and \
        isinstance(stmt.targets[0], ast.Attribute) else None
    tid = _used_at(trace, op, at)
    registered = _registration(source, at, attr) if attr else None
    return Finding("not-a-parameter", "not-a-parameter", op=op, at=at, saved_at=registered, subject=tid,
                   tids=tuple(t for t in (tid,) if t is not None),
                   facts={"target": ast.unparse(stmt.targets[0]) if attr else None})


def _registration(source, at: Location, attr: str) -> Optional[Location]:
    """Where the class of the method at `at` makes `self.<attr>` a parameter (`nn.Parameter(...)`)."""
    tree = source.index.tree(at.filename)
    if tree is None:
        return None
    classes = [n for n in ast.walk(tree) if isinstance(n, ast.ClassDef) and n.lineno <= at.line <= n.end_lineno]
    if not classes:
        return None
    cls = max(classes, key=lambda n: n.lineno)
    for node in ast.walk(cls):
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Attribute) and t.attr == attr for t in node.targets) \
                and isinstance(node.value, ast.Call) and ast.unparse(node.value.func).rpartition(".")[2] == "Parameter":
            return Location(at.filename, node.lineno, "", line_text(source, at.filename, node.lineno))
    return None


@words("not-a-parameter")
def _not_a_parameter_words(trace: TraceData, f: Finding) -> Words:
    target, registered = f.facts["target"], f.saved_at
    name = target or label(trace, f.subject)
    made_there = " (%s makes it one)" % ("line %d" % registered.line) if registered is not None else ""
    message = ("%s assigns a plain tensor (the result of a computation) to %s, which the module holds as a "
               "parameter%s: nn.Module keeps a parameter's name for an nn.Parameter (or None), so it refuses the "
               "tensor. PyTorch raised: \"%s\"" % (where_at(f.op, f.at) if f.op is not None else where_at(None, f.at),
                                                   "`%s`" % target if target else "a parameter's name", made_there,
                                                   raised(trace.error)))
    return Words(message, not_a_parameter_fix(target), name)


# -- fp16-gradients --------------------------------------------------------------------------------

def _fp16(trace: TraceData, source, op: Optional[OpRecord], at: Location) -> Optional[Finding]:
    casts: Dict[int, OpRecord] = {}
    for o in trace.ops:
        if o.name == DATA_SWAP and len(o.inputs) == 2 and o.inputs[0] in trace.tensors \
                and trace.tensors[o.inputs[0]].is_parameter:
            if trace.tensors.get(o.inputs[1]) is not None and trace.tensors[o.inputs[1]].dtype == "float16":
                casts[o.inputs[0]] = o
            else:
                casts.pop(o.inputs[0], None)
    for tid, info in trace.tensors.items():
        if info.is_parameter and info.dtype == "float16" and tid not in casts and made(trace, tid) is not None:
            casts[tid] = made(trace, tid)
    trained = {t: c for t, c in casts.items() if trace.tensors[t].grad is not None and c.location is not None}
    if not trained:
        return None
    first = min(trained.values(), key=lambda c: c.index)
    tids = tuple(sorted(trained, key=lambda t: trained[t].index))
    return Finding("fp16-gradients", "fp16-gradients", op=first, saved=op, saved_at=at if op is None else None,
                   subject=tids[0], tids=tids, facts={"lines": sorted({c.location.line for c in trained.values()})})


@words("fp16-gradients")
def _fp16_words(trace: TraceData, f: Finding) -> Words:
    names = [label(trace, t) for t in f.tids]
    lines = f.facts["lines"]
    shown_names = ", ".join(shown(n) for n in names[:4]) + (", ..." if len(names) > 4 else "")
    message = ("%s made %s float16 (%s in all%s), and they are trained: their gradients are float16 too. "
               "GradScaler unscales gradients in float32 and refuses float16 ones, on %s. PyTorch raised: \"%s\""
               % (where(f.op), shown_names, "%d parameter%s" % (len(names), "" if len(names) == 1 else "s"),
                  ", cast on lines %s" % ", ".join(str(n) for n in lines) if len(lines) > 1 else "",
                  "line %d" % f.facts["raised_at"].line, raised(trace.error)))
    return Words(message, fp16_fix(), names[0] if len(names) == 1 else None)


# -- transform-unsupported -------------------------------------------------------------------------

def _transform(trace: TraceData, source, op: Optional[OpRecord], at: Location) -> Optional[Finding]:
    if op is None or not op.name.endswith(".apply"):
        return None
    cls = op.name[:-len(".apply")].rpartition(".")[2]
    forward = _forward_of(source, cls)
    if forward is not None:
        return Finding("transform-unsupported", "function-without-setup-context", op=op, at=forward, saved=op,
                       saved_at=at, facts={"function": cls})
    return Finding("transform-unsupported", "applied-function", op=op, facts={"function": cls})


def _forward_of(source, cls: str) -> Optional[Location]:
    """The `forward(ctx, ...)` of the class `cls` (an autograd.Function of the user's files without a
    setup_context), as a Location; None where there is not exactly one."""
    found = []
    for filename, tree in source.index.trees():
        for node in ast.walk(tree):
            if isinstance(node, ast.ClassDef) and node.name == cls:
                methods = {m.name: m for m in node.body if isinstance(m, (ast.FunctionDef, ast.AsyncFunctionDef))}
                forward = methods.get("forward")
                if forward is not None and "setup_context" not in methods and forward.args.args:
                    found.append(Location(filename, forward.lineno, "forward",
                                          line_text(source, filename, forward.lineno), first_line(forward)))
    return found[0] if len(found) == 1 else None


@words("function-without-setup-context", "applied-function")
def _transform_words(trace: TraceData, f: Finding) -> Words:
    cls, op = f.facts["function"], f.op
    if f.reason == "function-without-setup-context":
        message = ("`%s.forward` takes ctx (%s): that autograd.Function has no setup_context, and torch.func "
                   "transforms (vmap, grad, jvp, jacrev) run only Functions whose forward and setup_context are "
                   "separate. %s applied it under such a transform. PyTorch raised: \"%s\""
                   % (cls, "line %d" % f.at.line, where(op), raised(op.error)))
        return Words(message, setup_context_fix(cls))
    if cls == _CHECKPOINT:
        message = ("%s checkpoints with use_reentrant=True, whose autograd.Function (`%s`) has no setup_context, "
                   "and it ran under a torch.func transform (vmap, grad, jvp, jacrev), which runs only Functions "
                   "that have one. PyTorch raised: \"%s\"" % (where(op), cls, raised(op.error)))
        return Words(message, checkpoint_under_transform_fix(op.location.source if op.location else ""))
    message = ("%s applies the autograd.Function `%s`, which is not in your files and has no setup_context, under "
               "a torch.func transform (vmap, grad, jvp, jacrev), which runs only Functions that have one. PyTorch "
               "raised: \"%s\"" % (where(op), cls, raised(op.error)))
    return Words(message, applied_function_fix(cls))


# -- checkpoint-incompatible -----------------------------------------------------------------------

def _checkpoint(trace: TraceData, source, op: Optional[OpRecord], at: Location) -> Optional[Finding]:
    if op is None or not op.is_backward:
        return None
    cp = next((c for c in trace.checkpoints if c.kind == "backward" and c.op_index == op.index), None)
    reached = reachable(trace, cp.roots) if cp is not None else set()
    applied = [o for o in trace.ops[:op.index] if o.name.endswith(_CHECKPOINT + ".apply") and o.node in reached
               and o.location is not None]
    if not applied:
        return None
    return Finding("checkpoint-incompatible", "reentrant-checkpoint", op=applied[0], saved=op,
                   tids=tuple(t for o in applied[:1] for t in o.outputs[:1]),
                   facts={"lines": sorted({o.location.line for o in applied})})


@words("reentrant-checkpoint")
def _checkpoint_words(trace: TraceData, f: Finding) -> Words:
    op, lines = f.saved, f.facts["lines"]
    call = ("calls torch.autograd.grad() (itself, or through a function of torch's that does, such as "
            "torch.autograd.functional.jvp)" if op.name == "torch.autograd.grad" else
            "calls backward() with inputs=...")
    message = ("%s checkpoints with use_reentrant=True%s: that implementation recomputes the block inside a "
               "backward() of its own and supports neither .grad() nor backward(inputs=...). %s %s, which runs "
               "through it. PyTorch raised: \"%s\"" % (
                   where(f.op), " (also on lines %s)" % ", ".join(str(n) for n in lines[1:]) if len(lines) > 1 else "",
                   where(op), call, raised(op.error)))
    return Words(message, reentrant_fix(f.op.location.source))


# -- what could not be traced ----------------------------------------------------------------------

_PROPERTY = {
    "grad-to-numpy": "requires grad",
    "needs-grad": "does not require grad",
    "nonleaf-copied": "has a history (is not a leaf)",
    "nonleaf-optimized": "has a history (is not a leaf)",
    "not-a-parameter": "is a plain tensor, not an nn.Parameter",
    "fp16-gradients": "has float16 gradients",
    "transform-unsupported": "is an autograd.Function without setup_context",
    "checkpoint-incompatible": "goes through reentrant checkpointing",
}


@words("untraced")
def _untraced(trace: TraceData, f: Finding) -> Words:
    at = f.facts["raised_at"]
    name = label(trace, f.subject)
    message = ("Line %d%s raised: \"%s\": %s %s. jupyter-autograd could not trace which line gave it that (it was "
               "made before the block began, or by code that recorded nothing)."
               % (at.line, " (`%s`)" % at.source if at.source else "", raised(trace.error),
                  shown(name) if name else "what it was given", _PROPERTY[f.kind]))
    return Words(message, "There is no one-line fix: PyTorch's message says what it needs; follow the tensor back from "
                          "line %d to where it was made." % at.line, name)


_FINDERS: Dict[str, Callable] = {
    "grad-to-numpy": _numpy,
    "needs-grad": _needs_grad,
    "nonleaf-copied": _nonleaf_copied,
    "nonleaf-optimized": _nonleaf_optimized,
    "not-a-parameter": _not_a_parameter,
    "fp16-gradients": _fp16,
    "transform-unsupported": _transform,
    "checkpoint-incompatible": _checkpoint,
}
