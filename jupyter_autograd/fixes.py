"""The fixes a diagnosis suggests, and the wording shared by messages and fixes.

Plain text from plain data. A fix is prose with code in it, by one convention that
tests/test_fixes.py checks on every scenario (and that every new kind of diagnosis follows):

* Code blocks. A line of a fix indented by four spaces (or more) is code; a run of such lines
  is one block which, dedented by four, compiles on its own (`compile(block, "", "exec")`).
  It uses only the user's own names, `torch`, `nn` and `F`, and every method and attribute
  it names exists (on torch.Tensor, nn.Module, the optimizer, or the module it is read from).
* Drop-in replacements. A block right after a prose line that ends with
  "Replace the culprit line with:" replaces the diagnosis's culprit line (`Diagnosis.line`
  in `Diagnosis.filename`), re-indented to that line's indentation. That is the whole fix: the
  test applies it and checks that the diagnosis is gone and that backward then gives the
  gradients of the clean program. Use it only when that is true.
* No guessing. When no single change is right (the cause is elsewhere, or it depends on what the
  user meant), the fix starts with "There is no one-line fix:" and says what to change where;
  its code blocks are then examples, still valid code.
* Names in backticks in the prose are real too: a method written `.item()` or `x.detach()`
  exists on a tensor, a module or an optimizer; `torch.a.b()` can be looked up from `torch`.
"""
from __future__ import annotations

import ast
import re
from collections import Counter
from typing import List, Optional, Tuple

from .model import OpRecord, Trace

REPLACE = "Replace the culprit line with:"
NO_ONE_LINE_FIX = "There is no one-line fix:"
SAVED_COPY_REMEDY = (
    "If the in-place write has to stay, PyTorch can keep the old value for backward: run both the forward "
    "pass and backward() inside the context manager `torch.autograd.graph.allow_mutation_on_saved_tensors()`. "
    "It copies a saved tensor when it is first changed in place (that much more memory until the graph is "
    "freed) and sends every operation through a Python dispatch mode (slower).")


def code(block: str) -> str:
    """A code block of a fix: each line indented by four spaces (the module's convention)."""
    return "\n".join("    " + line if line else "" for line in block.splitlines())


def leaf_fix(text: str, name: str) -> str:
    if text and _is_simple_statement(text):
        return ("Make the change without recording it, before `%s` is used. %s\n%s\n"
                "(or make it before setting requires_grad=True, or through `%s.detach()`)."
                % (name, REPLACE, code("with torch.no_grad():\n    " + text), _expr(name)))
    return "Wrap the in-place change in `with torch.no_grad():`, before the tensor is used."


def accumulation_fix(src: str, linked_name: str, linked_known: bool) -> str:
    # .detach(), not .item(): the accumulator stays a tensor, so code that reads it later
    # (`running_loss.item() / n`) still runs.
    fixed = _replace_name(src, linked_name, linked_name + ".detach()") if src and linked_known else ""
    if fixed and fixed != src and _is_simple_statement(fixed):
        return ("Accumulate the value without its graph. %s\n%s\n"
                "(or a Python number, `%s.item()`, if nothing reads the total as a tensor)."
                % (REPLACE, code(fixed), _expr(linked_name)))
    return "Accumulate `%s.item()` (a Python number) or `%s.detach()` instead of the tensor." % (
        _expr(linked_name), _expr(linked_name))


def counted(names) -> List[Tuple[str, int]]:
    """[(name, how many times)], in the order first met: a list says each name once."""
    return list(Counter(names).items())


def also_changed(name: str, others) -> str:
    """What else one write broke, each name once: the same name again is the same line run again
    (a cell called in a loop makes a new `self.h1` each time), other names are other tensors."""
    again = sum(1 for other in others if other == name)
    rest = [(other, n) for other, n in counted(others) if other != name]
    parts = []
    if again:
        parts.append("`%s` in %d more run%s of this line" % (name, again, "" if again == 1 else "s"))
    if rest:
        shown = ", ".join("`%s`" % other + (" (in %d runs)" % n if n > 1 else "") for other, n in rest[:6])
        parts.append("%d more saved tensor%s: %s%s" % (len(rest), "" if len(rest) == 1 else "s", shown,
                                                       ", ..." if len(rest) > 6 else ""))
    return ", and ".join(parts)


def line_ref(op: OpRecord) -> str:
    return "line %d" % op.location.line if op.location else "an unknown line"


def backward_outcome(error: Optional[str], own_error: str, raiser: str, stopper: str) -> str:
    """What backward did about one problem of its call: raised for it, will raise (it has not run
    yet), or, when it raised for another problem it met first, that it stopped there and raises
    this one once that is fixed: never that it raised this one."""
    if error is None:
        return raiser + " will raise"
    if own_error in error:
        return raiser + " raised"
    return stopper + " at another error first; with that one fixed, it raises"


def where(op: OpRecord) -> str:
    if op.location is None:
        return "An operation"
    return "Line %d (`%s`)" % (op.location.line, op.location.source) if op.location.source else \
        "Line %d" % op.location.line


def describe_write(op: OpRecord) -> str:
    name = op.name
    short = name.split(".")[-1]
    if short == "__setitem__":
        return "an indexed assignment (`t[...] = ...`)"
    if short.startswith("__i") and short.endswith("__"):
        return "an augmented assignment (`%s`)" % _AUG.get(short, short)
    if short.endswith("_"):
        return "`%s`" % name
    return "`%s(..., inplace=True)`" % name if name.startswith("F.") else "`%s` (which writes to its input)" % name


_AUG = {"__iadd__": "+=", "__isub__": "-=", "__imul__": "*=", "__itruediv__": "/=", "__ipow__": "**=",
        "__ifloordiv__": "//=", "__imod__": "%=", "__iand__": "&=", "__ior__": "|=", "__ixor__": "^=",
        "__imatmul__": "@=", "__ilshift__": "<<=", "__irshift__": ">>="}


def inplace_fix(trace: Trace, op: Optional[OpRecord], name: str, save: Optional[OpRecord]) -> str:
    if op is None:
        return ("Write to a copy (`%s = %s.clone()`) instead of the saved tensor.\n%s"
                % (_expr(name), _expr(name), SAVED_COPY_REMEDY))
    src = op.location.source if op.location else ""
    before = (" Or, if the new values were meant to be used, make the change before %s." % line_ref(save)
              if save is not None and save.location and not (op.location and op.location.line == save.location.line)
              else "")
    rewritten = out_of_place(src)
    if rewritten:
        return ("Use the out-of-place form, which leaves the saved value intact. %s\n%s\n%s\n%s"
                % (REPLACE, code(rewritten), before.strip(), SAVED_COPY_REMEDY)).replace("\n\n", "\n")
    copied = copy_before_write(src)
    if copied:
        target = copied.partition(" = ")[0]
        handed_back = ""
        if op.location and target in _arguments_of(trace, op.location) and \
                not _returns_later(trace, op.location, target):
            # Rebinding an argument changes nothing outside: the copy has to be handed back.
            function = op.location.function
            if not _ends_its_function(trace, op.location):
                return ("%s `%s` is an argument of `%s()`: a copy made there (`%s = %s.clone()` before this line) "
                        "replaces it only inside the function. Return the copy and use what `%s()` returns (a "
                        "forward hook that returns a tensor replaces the module's output).%s\n%s"
                        % (NO_ONE_LINE_FIX, target, function, target, target, function, before,
                           SAVED_COPY_REMEDY))
            copied += "\nreturn %s" % target
            handed_back = ("`%s` is an argument of `%s()`: the copy is returned, so that it replaces the argument "
                           "outside the function too (a forward hook that returns a tensor replaces the module's "
                           "output); use what `%s()` returns." % (target, function, function))
        return ("Write to a copy, so the saved tensor keeps its value. %s\n%s\n%s\n%s\n%s"
                % (REPLACE, code(copied), handed_back.strip(), before.strip(), SAVED_COPY_REMEDY)
                ).replace("\n\n", "\n").replace("\n\n", "\n")
    short = op.name.split(".")[-1]
    if "step" in src or "optim" in op.name:
        return (NO_ONE_LINE_FIX + " the optimizer changed parameters that a graph still needs. Call backward() "
                "for every loss that uses them before optimizer.step(), or run the forward pass again after the "
                "step (in GAN training: compute the generator's loss after the discriminator's step, or detach "
                "it).")
    if not short.endswith("_") and op.name.startswith("F."):
        module = _MODULES.get(short)
        example = ("\n%s\n" % code("nn.%s(inplace=False)" % module)) if module else " "
        return ("%s %s runs `%s(..., inplace=True)` inside this call. Build the model with the out-of-place "
                "form instead:%s(or pass `inplace=False` to `%s`).%s"
                % (NO_ONE_LINE_FIX, where(op), op.name, example, op.name, before))
    return ("%s changes the saved tensor in place with %s. Use the out-of-place form of that operation, "
            "or `.clone()` the tensor before changing it.%s\n%s"
            % (where(op), describe_write(op), before, SAVED_COPY_REMEDY))


# The nn modules whose functional form was called with inplace=True.
_MODULES = {"relu": "ReLU", "leaky_relu": "LeakyReLU", "elu": "ELU", "selu": "SELU", "celu": "CELU",
            "hardtanh": "Hardtanh", "relu6": "ReLU6", "dropout": "Dropout", "silu": "SiLU",
            "hardswish": "Hardswish", "hardsigmoid": "Hardsigmoid", "mish": "Mish", "rrelu": "RReLU",
            "alpha_dropout": "AlphaDropout"}


def data_fix(trace: Trace, culprit, name: str, save: Optional[OpRecord]) -> str:
    alias = _expr(trace.tensor_label(culprit[1])) if culprit else "the alias"
    made = None
    if culprit is not None:
        info = trace.tensors.get(culprit[1])
        while info is not None and info.data_alias_of is None and info.base is not None:
            info = trace.tensors.get(info.base)
        if info is not None and info.created_by is not None:
            made = trace.ops[info.created_by]
    op = culprit[0] if culprit else None
    src = op.location.source if op is not None and op.location else ""
    moved = "make the change before %s, or after backward()" % line_ref(save) if save is not None and \
        save.location else "make the change after backward()"
    head = "never write through `.data` into a tensor that backward still needs: PyTorch cannot see the write."
    detach = ""
    if made is not None and made.location and made.location.source.count(".data") == 1 and \
            not (op is not None and op.location and op.location.line == made.location.line):
        fixed = made.location.source.replace(".data", ".detach()")
        if _is_simple_statement(fixed):
            detach = ("\nAnd take the alias with `.detach()` on %s, so that PyTorch raises instead of computing "
                      "wrong gradients:\n%s" % (line_ref(made), code(fixed)))
    # Writing to a copy of the alias is a sound one-line fix when the alias has a name of its own.
    rewritten = out_of_place(src) or copy_before_write(src)
    if rewritten and ".data" not in src:
        return ("%s If the new values are meant only for `%s`, write to a copy. %s\n%s\nOtherwise %s.%s"
                % (head[0].upper() + head[1:], alias, REPLACE, code(rewritten), moved, detach))
    # `w.data.mul_(0.5)`: the write is meant for the tensor itself, so it must move.
    under_no_grad = src.replace(".data", "") if src.count(".data") == 1 else ""
    if under_no_grad and _is_simple_statement(under_no_grad):
        return ("%s %s %s; there, do it under torch.no_grad() instead of through `.data`:\n%s%s"
                % (NO_ONE_LINE_FIX, head, moved[0].upper() + moved[1:],
                   code("with torch.no_grad():\n    " + under_no_grad), detach))
    return ("%s %s Use `.detach()` instead of `.data` for `%s`, so PyTorch checks the write; then write to a "
            "copy (`%s.detach().clone()`), or %s.%s" % (NO_ONE_LINE_FIX, head, alias, _expr(name), moved, detach))


def out_of_place(src: str) -> Optional[str]:
    """The out-of-place form of a line that writes in place, or None when there is no sound one.

    `y += 1` -> `y = y + 1`; `x.add_(b)` -> `x = x.add(b)`; `c.zero_()` -> `c = torch.zeros_like(c)`;
    `nn.ReLU(inplace=True)` -> inplace=False. The written tensor must have a plain name: rebinding
    `net.weight` or `x[0]` would not do the same thing.
    """
    stmt = _single_statement(src)
    if stmt is None:
        return None
    if isinstance(stmt, ast.AugAssign) and isinstance(stmt.target, ast.Name):
        # Through the AST, so `y *= a + b` becomes `y = y * (a + b)`.
        target = stmt.target.id
        return "%s = %s" % (target, ast.unparse(ast.BinOp(ast.Name(target), stmt.op, stmt.value)))
    if "inplace=True" in src:
        return src.replace("inplace=True", "inplace=False")
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


# In-place methods of torch.Tensor whose name without the "_" is not their out-of-place form
# (tests/test_fixes.py checks this list against the installed torch). None: no simple one.
_NO_TWIN = {
    "zero_": lambda r, a: "torch.zeros_like(%s)" % r if not a else None,
    "fill_": lambda r, a: "torch.full_like(%s, %s)" % (r, a[0]) if len(a) == 1 else None,
    "copy_": lambda r, a: "%s.to(%s).expand_as(%s).clone()" % (_operand(a[0]), r, r) if len(a) == 1 else None,
    "normal_": lambda r, a: _scaled("torch.randn_like(%s)" % r, a),
    "uniform_": lambda r, a: ("torch.rand_like(%s)" % r if not a else
                              "torch.rand_like(%s) * (%s - %s) + %s" % (r, a[1], a[0], a[0]) if len(a) == 2 else None),
}
for _name in ("random_", "cauchy_", "exponential_", "geometric_", "log_normal_", "bernoulli_", "fill_diagonal_",
              "apply_", "map_", "map2_", "set_", "share_memory_", "sparse_resize_", "sparse_resize_and_clear_",
              "resize_as_sparse_", "requires_grad_", "resize_", "resize_as_", "detach_"):
    _NO_TWIN.setdefault(_name, lambda r, a: None)


def _operand(src: str) -> str:
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


def _function_of(trace: Trace, location):
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


def _arguments_of(trace: Trace, location) -> frozenset:
    """The parameter names of the function whose line this is; empty when they cannot be read."""
    found = _function_of(trace, location)
    if found is None:
        return frozenset()
    lines, number, _ = found
    try:
        header = ast.parse(lines[number - 1].strip() + "\n    pass\n").body[0]
    except SyntaxError:  # a signature over several lines
        return frozenset()
    args = header.args
    return frozenset(a.arg for a in args.posonlyargs + args.args + args.kwonlyargs)


def _rest_of_body(trace: Trace, location):
    """(the body's indentation, its code lines after this one), or None."""
    found = _function_of(trace, location)
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


def _ends_its_function(trace: Trace, location) -> bool:
    """Whether the line is the last statement of its function's body, at the body's own level (a
    `return` after it then changes nothing else the function does)."""
    found = _rest_of_body(trace, location)
    lines = trace.sources.get(location.filename or "", [])
    return found is not None and not found[1] and _indent(lines[location.line - 1]) == found[0]


def _returns_later(trace: Trace, location, name: str) -> bool:
    """Whether the function goes on to `return name` (then the copy is what it returns)."""
    found = _rest_of_body(trace, location)
    return found is not None and any(_code(text) == "return %s" % name for text in found[1])


def copy_before_write(src: str) -> Optional[str]:
    """`d[:] = 1` -> `d = d.clone()` then the same line: the saved tensor keeps its value."""
    stmt = _single_statement(src)
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


def _plain_name(node) -> Optional[str]:
    """The name written through: `d` for `d[...]` and `d[0][1]`; None for `net.weight` and calls."""
    while isinstance(node, ast.Subscript):
        node = node.value
    return node.id if isinstance(node, ast.Name) else None


def _single_statement(src: str):
    try:
        tree = ast.parse((src or "").strip())
    except SyntaxError:
        return None
    return tree.body[0] if len(tree.body) == 1 else None


def _is_simple_statement(src: str) -> bool:
    """One statement that can stand alone in a block (not `for x in y:` cut from its body)."""
    stmt = _single_statement(src)
    return stmt is not None and not isinstance(stmt, (ast.For, ast.While, ast.If, ast.With, ast.Try,
                                                      ast.FunctionDef, ast.ClassDef, ast.AsyncFunctionDef))


def _expr(label: str) -> str:
    """A tensor's label as code: `net.2.weight` (a parameter's dotted name) -> `net[2].weight`."""
    return re.sub(r"\.(\d+)(?=\.|$)", r"[\1]", label or "")


def _replace_name(src: str, name: str, replacement: str) -> str:
    if not re.fullmatch(r"[A-Za-z_]\w*", name or ""):
        return ""
    head, sep, tail = src.partition("+=")
    if sep:
        return head + sep + re.sub(r"\b%s\b" % re.escape(name), replacement, tail)
    return re.sub(r"(?<![\w.])%s\b(?!\s*=[^=])" % re.escape(name), replacement, src)
