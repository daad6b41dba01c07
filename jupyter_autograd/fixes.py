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
* A line other than the culprit. A block right after a prose line that ends with
  "Replace line N of FILE with:" (`REPLACE_LINE`; FILE as `Trace.file_label` names it, N its line
  number there) replaces that line, re-indented to its indentation: the same whole fix, for a
  mistake made where something was built (`nn.ReLU(inplace=True)` in a model's `__init__`).
  "Replace lines N to M of FILE with:" (`REPLACE_LINES`) replaces those lines, the culprit's first,
  for a change that the lines right after the culprit make too (two edits of one weight).
* The program's meaning stays. A replacement computes what the program meant: it may stop a
  write that broke backward, never drop it (rebinding a name that is only an alias of a module's
  buffer leaves the buffer as it was) or stop a change that other code reads.
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

from .model import OpRecord, TraceData
from .source.index import SourceIndex, parse_fresh

REPLACE = "Replace the culprit line with:"
REPLACE_LINE = "Replace line %d of %s with:"
REPLACE_LINES = "Replace lines %d to %d of %s with:"
NO_ONE_LINE_FIX = "There is no one-line fix:"
SAVED_COPY_REMEDY = (
    "If the in-place write has to stay, PyTorch can keep the old value for backward: run both the forward "
    "pass and backward() inside the context manager `torch.autograd.graph.allow_mutation_on_saved_tensors()`. "
    "It copies a saved tensor when it is first changed in place (that much more memory until the graph is "
    "freed) and sends every operation through a Python dispatch mode (slower).")


def code(block: str) -> str:
    """A code block of a fix: each line indented by four spaces (the module's convention)."""
    return "\n".join("    " + line if line else "" for line in block.splitlines())


def leaf_fix(text: str, name: str, following=(), place: Tuple[int, str] = (0, "")) -> str:
    """`following`: the lines right after the culprit (at `place`, its line and file label) that
    write into the same tensor too: the change they make together goes under no_grad together."""
    # A label that describes the tensor (no name found) is no code: it is not quoted as code.
    shown = "`%s`" % name if _is_code_name(name) else "the tensor"
    if following and text and _is_simple_statement(text):
        line, label = place
        return ("Make the change without recording it, before %s is used: %s after it write%s into it "
                "too. %s\n%s\n(or make it before setting requires_grad=True)."
                % (shown, "the line" if len(following) == 1 else "the %d lines" % len(following),
                   "s" if len(following) == 1 else "",
                   REPLACE_LINES % (line, line + len(following), label),
                   code("with torch.no_grad():\n" + "\n".join("    " + t for t in [text, *following]))))
    copied = _out_as_copy(text) if "out=" in text else None
    if copied:
        # Under no_grad an `out=` call still writes, but it also clears the leaf's requires_grad: the
        # parameter would silently stop training. Copying the result in keeps it a trainable leaf.
        return ("Compute the values without `out=` and copy them in without recording it, before %s is used "
                "(an `out=` call under `torch.no_grad()` would also switch off its `requires_grad`). %s\n%s"
                % (shown, REPLACE, code("with torch.no_grad():\n    " + copied)))
    if text and _is_simple_statement(text):
        return ("Make the change without recording it, before %s is used. %s\n%s\n"
                "(or make it before setting requires_grad=True, or through %s)."
                % (shown, REPLACE, code("with torch.no_grad():\n    " + text),
                   "`%s.detach()`" % _expr(name) if _is_code_name(name) else "its `.detach()`"))
    return "Wrap the in-place change in `with torch.no_grad():`, before the tensor is used."


def writes_after(lines: List[str], line: int) -> List[str]:
    """The statements on the lines right after `line` (1-based, in `lines`), at its indentation, that
    write in place into the tensor it writes (`w[:, i] -= a`, then `w[:, i] += b`), stripped."""
    def written(src: str) -> Optional[str]:
        stmt = _single_statement(src)
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


def _out_as_copy(text: str) -> Optional[str]:
    """`torch.arange(n, out=self.freq)` -> `self.freq.copy_(torch.arange(n))`: the one call given
    `out=` computes its result, which is copied into the out tensor. `copy_` returns the tensor, as an
    `out=` call does, so the call may sit anywhere in the statement (`torch.arange(n, out=f).mul_(PI)`
    -> `f.copy_(torch.arange(n)).mul_(PI)`). None when that is not the line."""
    stmt = _single_statement(text)
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


def accumulation_fix(src: str, linked_name: Optional[str]) -> str:
    # .detach(), not .item(): the accumulator stays a tensor, so code that reads it later
    # (`running_loss.item() / n`) still runs.
    fixed = _replace_name(src, linked_name, linked_name + ".detach()") if src and linked_name else ""
    if fixed and fixed != src and _is_simple_statement(fixed):
        return ("Accumulate the value without its graph. %s\n%s\n"
                "(or a Python number, `%s.item()`, if nothing reads the total as a tensor)."
                % (REPLACE, code(fixed), _expr(linked_name)))
    if not linked_name:
        return ("Accumulate what this line adds without its graph: its `.detach()`, or a Python number "
                "(`.item()`), instead of the tensor.")
    return "Accumulate `%s.item()` (a Python number) or `%s.detach()` instead of the tensor." % (
        _expr(linked_name), _expr(linked_name))


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


def kept_fix(name: str, detached: str) -> str:
    """Tensors kept past their iteration whole (a list of losses): keep them without their graphs,
    at the statement that stores them (`detached`: that statement with `.detach()`), if known."""
    if detached:
        return ("Keep the values without their graphs. %s\n%s\n(or store a Python number, `.item()`, if "
                "nothing reads them as tensors)." % (REPLACE, code(detached)))
    if all(part.isidentifier() for part in name.split(".")):
        return ("%s wherever `%s` is kept past its iteration (appended to a list, stored on an object, passed to a "
                "meter or a logger), keep `%s.item()` (a Python number) or `%s.detach()` instead of the tensor."
                % (NO_ONE_LINE_FIX, name, name, name))
    return ("%s wherever this tensor is kept past its iteration (appended to a list, stored on an object, passed "
            "to a meter or a logger), keep its `.item()` (a Python number) or its `.detach()` instead."
            % NO_ONE_LINE_FIX)


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
    if op.out:
        return "`%s(..., out=...)`, which writes its result into it" % name
    return "`%s(..., inplace=True)`" % name if name.startswith("F.") and short in _MODULES else \
        "`%s` (which writes to a tensor it is given)" % name


_AUG = {"__iadd__": "+=", "__isub__": "-=", "__imul__": "*=", "__itruediv__": "/=", "__ipow__": "**=",
        "__ifloordiv__": "//=", "__imod__": "%=", "__iand__": "&=", "__ior__": "|=", "__ixor__": "^=",
        "__imatmul__": "@=", "__ilshift__": "<<=", "__irshift__": ">>="}


def inplace_fix(trace: TraceData, op: Optional[OpRecord], name: str, save: Optional[OpRecord],
                written: Optional[int] = None) -> str:
    """`written`: the tid of the tensor the line wrote through. When the line's name is only another
    name for it (the same tensor object, held under its own name elsewhere), rebinding that name
    would not reach it. (An alias made by `.detach()` or a view is a tensor of its own: a copy of it
    keeps the values the user wrote to it, and the fix says where else the change can go.)"""
    if op is None:
        return ("Write to a copy (`%s = %s.clone()`) instead of the saved tensor.\n%s"
                % (_expr(name), _expr(name), SAVED_COPY_REMEDY))
    src = op.location.source if op.location else ""
    before = (" Or, if the new values were meant to be used, make the change before %s." % line_ref(save)
              if save is not None and save.location and not (op.location and op.location.line == save.location.line)
              else "")
    view = trace.tensors.get(written) if written is not None else None
    if view is not None and view.base is not None:
        # A write through a view is meant for its base too: a copy of the view, or rebinding it to an
        # out-of-place result, would leave the base unchanged for the code that reads it later.
        copy = ("`%s.clone()`" % _expr(name)) if re.fullmatch(r"[A-Za-z_][\w.]*", name or "") else "`.clone()`"
        return ("%s %s changes `%s` in place through `%s`, a view that shares its memory. Make the change before "
                "%s, or take the view from a copy (%s) made after that line, and use the copy from there on.\n%s"
                % (NO_ONE_LINE_FIX, where(op), name, trace.tensor_label(written),
                   line_ref(save) if save is not None else "the tensor is saved", copy, SAVED_COPY_REMEDY))
    rewritten = out_of_place(src) or copy_before_write(src)
    target = _rebound_name(rewritten) if rewritten else None
    if target and not (op.location and target in _arguments_of(trace, op.location)):
        held = _held_elsewhere(trace, written, target)
        if held:
            return _alias_write_fix(trace, op, target, held, save)
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
    functional = not short.endswith("_") and op.name.startswith("F.")
    built = _inplace_module_fix(trace, op) if functional else None
    if built:
        return built + before
    # A functional that writes only when given `inplace=True` (F.relu); F.embedding with max_norm
    # renormalises the weight it looks up whatever it is given: its saving line reads a copy (below).
    if functional and short in _MODULES:
        return ("%s %s runs `%s(..., inplace=True)` inside this call. Build the model with the out-of-place "
                "form instead:\n%s\n(or pass `inplace=False` to `%s`).%s"
                % (NO_ONE_LINE_FIX, where(op), op.name, code("nn.%s(inplace=False)" % _MODULES[short]), op.name,
                   before))
    read_copy = _read_a_copy(trace, save, name, written)
    if read_copy:
        # The write stays (a module's buffer, state that later code reads): the op that saved the
        # tensor reads a copy of it instead, with the same values, which the write leaves alone.
        return ("%s changes the saved tensor in place with %s, and the write is the program's state: keep it, and "
                "let %s read a copy, which backward then uses. %s\n%s\n%s"
                % (where(op), describe_write(op), line_ref(save),
                   REPLACE_LINE % (save.location.line, trace.file_label(save.location.filename)), code(read_copy),
                   SAVED_COPY_REMEDY))
    return ("%s changes the saved tensor in place with %s. Use the out-of-place form of that operation, "
            "or `.clone()` the tensor before changing it.%s\n%s"
            % (where(op), describe_write(op), before, SAVED_COPY_REMEDY))


def _read_a_copy(trace: TraceData, save: Optional[OpRecord], name: str, written: Optional[int]) -> Optional[str]:
    """The line of the op that saved the written tensor, reading `name.clone()` where it reads `name`:
    only where the op took that very tensor and its line names it once (`torch.einsum(..., [q, self.queue])`)."""
    if save is None or save.location is None or written is None or written not in save.inputs or \
            not _is_code_name(name):
        return None
    src = save.location.source or ""
    stmt = _single_statement(src)
    if stmt is None:
        return None
    # A module's parameter goes by its path from the model (`model.entity.weight`); inside the module's
    # own code, by `self.` and the rest of that path (`self.entity.weight`).
    parts = name.split(".")
    spellings = {name} | {".".join(["self"] + parts[i:]) for i in range(1, len(parts))}
    reads = [node for node in ast.walk(stmt) if isinstance(node, (ast.Name, ast.Attribute))
             and isinstance(node.ctx, ast.Load) and ast.unparse(node) in spellings]
    if len(reads) != 1 or reads[0].lineno != 1:
        return None
    raw = src.strip().encode("utf-8")
    end = reads[0].end_col_offset
    return (raw[:end] + b".clone()" + raw[end:]).decode("utf-8")


# The nn modules whose functional form was called with inplace=True.
_MODULES = {"relu": "ReLU", "leaky_relu": "LeakyReLU", "elu": "ELU", "selu": "SELU", "celu": "CELU",
            "hardtanh": "Hardtanh", "relu6": "ReLU6", "dropout": "Dropout", "silu": "SiLU",
            "hardswish": "Hardswish", "hardsigmoid": "Hardsigmoid", "mish": "Mish", "rrelu": "RReLU",
            "alpha_dropout": "AlphaDropout"}


# Where `inplace` is among the positional arguments of each module's constructor.
_INPLACE_POSITION = {"ReLU": 0, "ReLU6": 0, "SELU": 0, "SiLU": 0, "Mish": 0, "Hardswish": 0, "Hardsigmoid": 0,
                     "ELU": 1, "CELU": 1, "LeakyReLU": 1, "Dropout": 1, "Dropout1d": 1, "Dropout2d": 1,
                     "Dropout3d": 1, "AlphaDropout": 1, "FeatureAlphaDropout": 1, "Hardtanh": 2, "RReLU": 2,
                     "Threshold": 2}


def _rebound_name(rewritten: str) -> Optional[str]:
    """The name a rewrite rebinds to a new tensor made from it: `buf` in `buf = buf / n`, `d` in
    `d = d.clone()` (not `new_h`, which only holds a value on the way)."""
    for line in rewritten.splitlines():
        stmt = _single_statement(line)
        if isinstance(stmt, ast.Assign):
            used = {n.id for n in ast.walk(stmt.value) if isinstance(n, ast.Name)}
            for target in stmt.targets:
                if isinstance(target, ast.Name) and target.id in used:
                    return target.id
    return None


def _held_elsewhere(trace: TraceData, written: Optional[int], target: str) -> Optional[str]:
    """Who else holds the tensor the line wrote, when the line reaches it through `target`, another name:
    a module (its buffer or parameter), an object (an attribute), or the code before the block.
    Rebinding `target` or writing to a copy would not reach that holder. None when `target` is its
    name, or only the block's own code holds it (an argument handed on, `out = x`: the copy goes
    where `out` goes)."""
    info = trace.tensors.get(written) if written is not None else None
    if info is None or info.name == target:
        return None
    label = "`%s`" % info.name if info.name else trace.tensor_label(written)
    owner = info.name.rpartition(".")[0] if info.name else ""
    if owner in trace.modules:
        return "%s, held by the module `%s`" % (label, owner)
    if info.is_parameter or info.created_by is None:
        return "%s, which was made before the block" % label if info.name else label
    if info.name and "." in info.name:
        return "%s, kept on an object" % label
    return None


def _alias_write_fix(trace: TraceData, op: OpRecord, target: str, held: str, save: Optional[OpRecord]) -> str:
    backward = next((o for o in trace.ops[op.index + 1:] if o.is_backward), None)
    after = "after the backward on %s" % line_ref(backward) if backward is not None else \
        "after the backward() that uses the saved value"
    forward = "before %s, the forward pass that saved it" % line_ref(save) if save is not None and save.location \
        else "before the forward pass that saved it"
    return ("%s `%s` is another name for %s: rebinding `%s` (`%s = ...`) would leave it unchanged, and a copy "
            "would take the write away from it. Keep the write "
            "in place and move it where no graph needs the old value: %s (the gradient is computed from the values "
            "the forward pass saw), or %s (that forward pass then uses the new values). Which one your program "
            "means is yours to choose." % (NO_ONE_LINE_FIX, target, held, target, target, after, forward))


def _inplace_module_fix(trace: TraceData, op: OpRecord) -> Optional[str]:
    """The fix for a module built with inplace=True that wrote a saved tensor: the line that built
    it, read from the source of its parent module's class (or of the line that made the model),
    with inplace=False. A one-line replacement when the module's input is read by nothing else
    after the call; otherwise the same line, as an example."""
    if not op.module:
        return None
    path = op.module[-1]
    built = _construction(trace, path)
    if built is None:
        return None
    filename, call = built
    cls = trace.modules.get(path, "")
    flag = next((k.value for k in call.keywords if k.arg == "inplace"), None)
    position = _INPLACE_POSITION.get(cls)
    if flag is None and position is not None and position < len(call.args):
        flag = call.args[position]
    if not (isinstance(flag, ast.Constant) and flag.value is True):
        return None
    lines = trace.sources.get(filename, [])
    text = lines[flag.lineno - 1].rstrip("\n") if 0 < flag.lineno <= len(lines) else ""
    raw = text.encode("utf-8")
    if raw[flag.col_offset:flag.end_col_offset] != b"True":
        return None
    new = (raw[:flag.col_offset] + b"False" + raw[flag.end_col_offset:]).decode("utf-8").strip()
    place = REPLACE_LINE % (flag.lineno, trace.file_label(filename))
    head = ("%s runs `%s` (%s, built with inplace=True), which overwrites its input in place, and that input was "
            "saved for backward. Build it with inplace=False." % (where(op), path, cls))
    safe, read_again = _input_unread_after(trace, op, path)
    if safe:
        return "%s %s\n%s\n" % (head, place, code(new))
    return ("%s %s The module then leaves its input unchanged: check that no line after %s reads %s expecting "
            "the change. On line %d of %s:\n%s\n"
            % (NO_ONE_LINE_FIX, head, line_ref(op), "`%s`" % read_again if read_again else "its input",
               flag.lineno, trace.file_label(filename), code(new)))


def _input_unread_after(trace: TraceData, op: OpRecord, path: str):
    """(True, None) when nothing can read a module's input after the call that wrote it in place: a
    later layer of an nn.Sequential (its input is the layer before's output), an expression's result
    (`self.relu(self.conv(x))`), or a local the call rebinds or returns (`x = self.act(x)`; not an
    argument of the function, which its caller holds). Else (False, the name that may be read)."""
    parent, _, index = path.rpartition(".")
    if trace.modules.get(parent) == "Sequential" and index.isdigit() and int(index) > 0:
        return True, None
    src = op.location.source if op.location else ""
    stmt = _single_statement(src)
    value = stmt.value if isinstance(stmt, (ast.Assign, ast.Return, ast.Expr)) else None
    if not (isinstance(value, ast.Call) and value.args):
        return False, None
    arg = value.args[0]
    if not isinstance(arg, ast.Name):
        return True, None
    if op.location and arg.id in _arguments_of(trace, op.location):
        return False, arg.id
    rebound = isinstance(stmt, ast.Assign) and [ast.unparse(t) for t in stmt.targets] == [arg.id]
    return (True, None) if rebound or isinstance(stmt, ast.Return) else (False, arg.id)


def _construction(trace: TraceData, path: str):
    """(filename, the call that built the module at this dotted path), read off the sources of the
    trace: `self.act = nn.ReLU(...)` in the class of its parent, element k of the nn.Sequential(...)
    that built the parent, or the one assignment to a model's own name. None where that is not
    certain (two assignments, a module built in a loop, a file not in the trace)."""
    parent, _, attr = path.rpartition(".")
    if not parent or parent not in trace.modules:
        return _only_assignment(trace, path)
    if attr.isdigit():
        built = _construction(trace, parent)
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


# How the user wrote the ops that cut a chain: what a fix tells them to stop writing.
_CUT_SPELLINGS = {"item": "`.item()`", "tolist": "`.tolist()`", "numpy": "`.numpy()`", "__array__": "`np.asarray()`",
                  "detach": "`.detach()`", "detach_": "`.detach_()`", "data": "`.data`", "__float__": "`float()`",
                  "__int__": "`int()`", "__index__": "an integer index", "__complex__": "`complex()`"}


def cut_spelling(op: OpRecord) -> str:
    """The cut as the user wrote it: `.item()`, `.detach()`, `.data`, or the op that ran under no_grad."""
    if not op.grad_enabled:
        return "`%s` under `torch.no_grad()`" % op.name
    return _CUT_SPELLINGS.get(op.name.rpartition(".")[2], "`%s`" % op.name)


def starved_fix(name: str, cut: OpRecord, rewritten: Optional[str], advice: Optional[str] = None) -> str:
    """The fix for a trained tensor whose path to the loss one op cut: it names that op (`.item()`
    on line 11) and, where the line rebuilt a tensor from it (`torch.tensor(x.mean().item())`), gives
    the line that keeps the tensor: the same value, now with its history."""
    spelled = cut_spelling(cut)
    freeze = "If `%s` should not be trained, freeze it on purpose (`requires_grad_(False)`)." % _expr(name)
    if rewritten and _is_simple_statement(rewritten):
        return ("Keep the chain from `%s` to the loss: %s on %s gives a value without history. %s\n%s\n%s"
                % (_expr(name), spelled, line_ref(cut), REPLACE, code(rewritten), freeze))
    if advice:  # what to do about this kind of cut (an index, a checkpoint given no tensor that requires grad)
        return ("%s %s on %s cuts the chain from `%s` to the loss: %s, so that `%s` gets a gradient. %s"
                % (NO_ONE_LINE_FIX, spelled, line_ref(cut), _expr(name), advice, _expr(name), freeze))
    instead = "outside `torch.no_grad()` and `torch.inference_mode()`" if not cut.grad_enabled else \
        "with torch operations on the tensor itself, without %s" % spelled
    return ("%s %s on %s cuts the chain from `%s` to the loss: compute that value %s. %s"
            % (NO_ONE_LINE_FIX, spelled, line_ref(cut), _expr(name), instead, freeze))


def data_fix(trace: TraceData, culprit, name: str, save: Optional[OpRecord]) -> str:
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


def data_swap_fix(trace: TraceData, op: OpRecord) -> str:
    """`t.data = new` after a graph saved `t` itself: the swap has to move, or the tensor be left alone."""
    text = ("%s never swap `.data` of a tensor that a graph still needs: the graph keeps the tensor object, and "
            "PyTorch cannot see the swap. Either swap the values after backward() (restore a parameter once its "
            "gradient is taken), or leave the tensor alone and give the new values a tensor of their own"
            % NO_ONE_LINE_FIX)
    stmt = _single_statement(op.location.source if op.location else "")
    swapped = trace.tensors.get(op.writes[0]) if op.writes else None
    if (isinstance(stmt, ast.Assign) and len(stmt.targets) == 1 and isinstance(stmt.targets[0], ast.Attribute)
            and stmt.targets[0].attr == "data" and swapped is not None and not swapped.is_parameter):
        holder = ast.unparse(stmt.targets[0].value)
        if re.fullmatch(r"[A-Za-z_][\w.]*", holder):
            value = ast.unparse(stmt.value)
            value = value if value.endswith((".detach()", ".clone()")) else _operand(value) + ".detach()"
            return ("%s: where the tensor is kept, bind a new one instead of swapping the memory of the one the graph "
                    "holds:\n%s" % (text, code("%s = %s" % (holder, value))))
    return text + (" (a parameter: run the forward with other values through `torch.func.functional_call()` instead "
                   "of swapping them in).")


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
    return "%s = %s" % (" = ".join(names + [written]), ast.unparse(_single_statement(replaced).value))


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


def _function_of(trace: TraceData, location):
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


def _arguments_of(trace: TraceData, location) -> frozenset:
    """The parameter names of the function whose line this is; empty when they cannot be read."""
    found = _function_of(trace, location)
    if found is None:
        return frozenset()
    lines, number, _ = found
    parsed = parse_fresh(lines[number - 1].strip() + "\n    pass\n")
    if parsed is None:  # a signature over several lines
        return frozenset()
    header = parsed.body[0]
    args = header.args
    return frozenset(a.arg for a in args.posonlyargs + args.args + args.kwonlyargs)


def _rest_of_body(trace: TraceData, location):
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


def _ends_its_function(trace: TraceData, location) -> bool:
    """Whether the line is the last statement of its function's body, at the body's own level (a
    `return` after it then changes nothing else the function does)."""
    found = _rest_of_body(trace, location)
    lines = trace.sources.get(location.filename or "", [])
    return found is not None and not found[1] and _indent(lines[location.line - 1]) == found[0]


def _returns_later(trace: TraceData, location, name: str) -> bool:
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
    """The one statement of `src` as a tree of its own (a fix may rewrite it), or None."""
    tree = parse_fresh((src or "").strip())
    return tree.body[0] if tree is not None and len(tree.body) == 1 else None


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


# -- fixes of the errors PyTorch raises (diagnose/errors.py) -----------------------------------------

def _is_code_name(label: Optional[str]) -> bool:
    """Whether a tensor's label is a name or attribute chain the user's code has (`q`, `self.x_adv`,
    `model.aux_head.weight`), not a description."""
    return bool(label) and re.fullmatch(r"[A-Za-z_]\w*(?:\.\w+)*", label) is not None


def view_write_fix(src: str, name: Optional[str], base: Optional[str], how: str) -> str:
    """An in-place write to a view PyTorch refuses (see errors.view_inplace): write to a new tensor."""
    shown = _expr(name) if _is_code_name(name) else ""
    if how == "views":
        after = ("The write then changes only %s, not %s, which the views share memory with; if that tensor was "
                 "meant to change too, change it before it is split." % (
                     "`%s`" % shown if shown else "the view", "`%s`" % _expr(base) if _is_code_name(base) else
                     "the tensor they were taken from"))
    elif how == "inference tensor":
        after = ("Or make a normal tensor of it outside inference mode before changing it (%s); a clone made "
                 "inside inference mode is an inference tensor too." % (
                     "`%s = %s.clone()`" % (shown, shown) if shown else "`.clone()`"))
    else:
        mode = "torch.no_grad()" if how == "no_grad" else "torch.inference_mode()"
        after = ("Or take the view outside `%s`, so that the write is recorded, or make the write inside it too, "
                 "so that it is not." % mode)
    rewritten = out_of_place(src) or copy_before_write(src)
    # Only a rewrite that rebinds the view itself (`q = q * s`), not what holds it (`parts[0]` in a list).
    if rewritten and shown and rewritten.partition(" = ")[0] == shown:
        return "Write to a new tensor instead of the view. %s\n%s\n%s" % (REPLACE, code(rewritten), after)
    return ("%s replace the in-place operation on %s by its out-of-place form (`y = y * 2` rather than `y *= 2`), "
            "or change a copy (`.clone()`). %s" % (NO_ONE_LINE_FIX, "`%s`" % shown if shown else "the view", after))


def inference_tensor_fix(name: Optional[str]) -> str:
    """A tensor made under inference mode that a graph needs (see errors.inference_tensor_saved)."""
    head = ("%s run the frozen part under `torch.no_grad()` instead of `torch.inference_mode()`: its results then "
            "record no graph either, but a graph can use them." % NO_ONE_LINE_FIX)
    if _is_code_name(name):
        return ("%s Or make a normal tensor of it outside inference mode, before the part that trains uses it (a "
                "clone made inside inference mode is an inference tensor too):\n%s"
                % (head, code("%s = %s.clone()" % (_expr(name), _expr(name)))))
    return head + " Or `.clone()` it outside inference mode before the part that trains uses it."


def nonleaf_requires_grad_fix(src: str, name: Optional[str], also_set: int = 0) -> str:
    """`x.requires_grad = True` on a tensor with a history (see errors.nonleaf_requires_grad): make a leaf
    of it, `x = x.detach().requires_grad_()`; for False, `x = x.detach()`. Not where the line also set
    the flag of `also_set` other tensors (leaves): rebinding its name to a copy would drop the change
    for them, the line's purpose."""
    stmt = _single_statement(src)
    target, flag = None, None
    if isinstance(stmt, ast.Assign) and len(stmt.targets) == 1 and isinstance(stmt.targets[0], ast.Attribute) \
            and stmt.targets[0].attr == "requires_grad" and isinstance(stmt.value, ast.Constant):
        target, flag = stmt.targets[0].value, bool(stmt.value.value)
    elif isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Call) \
            and isinstance(stmt.value.func, ast.Attribute) and stmt.value.func.attr == "requires_grad_":
        call = stmt.value
        given = call.args[0] if call.args else next((k.value for k in call.keywords if k.arg == "requires_grad"), None)
        if given is None or isinstance(given, ast.Constant):
            target, flag = call.func.value, True if given is None else bool(given.value)
    if not isinstance(target, (ast.Name, ast.Attribute, ast.Subscript)):
        return ("%s to train `%s` as a tensor of its own, make a new leaf of it: `%s.detach().requires_grad_()`, "
                "assigned where the code reads it; to read the gradient of the non-leaf itself, call `.retain_grad()` "
                "on it before backward." % (NO_ONE_LINE_FIX, name, _expr(name) if _is_code_name(name) else "x"))
    expr = ast.unparse(target)
    if also_set:
        held = "`%s`" % _expr(name) if _is_code_name(name) and name != expr else "it"
        return ("%s this line also sets requires_grad of %d other tensor%s (leaves, for which it works): rebinding "
                "`%s` to a copy would take the change away from them, and would not reach the code that holds %s. "
                "Hand this code a tensor that is a leaf: %s where it is made or passed in, or leave tensors that "
                "are not leaves (`%s.is_leaf` is False) out of it."
                % (NO_ONE_LINE_FIX, also_set, "" if also_set == 1 else "s", expr, held,
                   "`%s`" % (("%s.detach()" if not flag else "%s.detach().requires_grad_()") % _expr(name))
                   if _is_code_name(name) else "a detached copy", expr))
    if flag:
        return ("Make it a new leaf with the same values: backward then stores its gradient in `%s.grad`, and the "
                "history before it is dropped, which is what setting requires_grad asks for. %s\n%s\n"
                "To read the gradient of the non-leaf itself instead, keep its history and call `%s.retain_grad()` "
                "before backward." % (expr, REPLACE, code("%s = %s.detach().requires_grad_()" % (expr, expr)), expr))
    return ("To use its values without its history, take a detached copy. %s\n%s"
            % (REPLACE, code("%s = %s.detach()" % (expr, expr))))


def nonscalar_fix(src: str, name: Optional[str], grad_call: bool, backward_at: str) -> str:
    """backward() from a tensor with many values (see errors.nonscalar_backward): reduce it where it is
    made, and say that the reduction is a choice."""
    shown = _expr(name) if _is_code_name(name) else ""
    choice = ("The mean is what every built-in loss gives by default (reduction='mean'); if the sum was meant, "
              "use `.sum()` instead (the gradients then grow with the batch size); to weight the values, multiply "
              "by the weights before reducing. To backpropagate a gradient for each value instead, pass it: %s."
              % ("`%s.backward(torch.ones_like(%s))`" % (shown, shown) if shown else "`backward(gradient)`"))
    if grad_call:
        return ("%s `torch.autograd.grad` needs a gradient for each value of %s: pass %s on %s (the gradient of "
                "their sum, what a gradient penalty needs), or reduce it first (`.sum()`, `.mean()`)."
                % (NO_ONE_LINE_FIX, "`%s`" % shown if shown else "its outputs",
                   "`grad_outputs=torch.ones_like(%s)`" % shown if shown else "`grad_outputs`", backward_at))
    reduced = _reduced(src, name)
    if reduced is not None:
        return "Reduce it to one number where it is made. %s\n%s\n%s" % (REPLACE, code(reduced), choice)
    return ("%s reduce %s to one number before backward(): `.mean()` or `.sum()`. %s"
            % (NO_ONE_LINE_FIX, "`%s`" % shown if shown else "it", choice))


def _reduced(src: str, name: Optional[str]) -> Optional[str]:
    """The line with its non-scalar result reduced: `loss = F.mse_loss(p, y, reduction='none')` without
    the keyword (the function's default is the mean), `loss = criterion(out, y).mean()`, `return
    hinge.mean()` for a loss function's return, or `(loss * w).mean().backward()` for a line that calls
    backward itself."""
    stmt = _single_statement(src)
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


def not_differentiable_fix(op_name: str, name: Optional[str], input_name: Optional[str]) -> str:
    """An op without a derivative on the way to the loss (see errors.not_differentiable)."""
    detached = "`%s.detach()`" % _expr(input_name) if _is_code_name(input_name) else "`.detach()`"
    return ("%s %s has no derivative, so no gradient can flow back through %s. If what it computes only selects, "
            "sorts or counts (indices, a mask, the distinct values), compute it from the detached input (%s) and "
            "keep the values the loss needs on a differentiable path (index the original tensor with what it "
            "returns); otherwise replace it with a differentiable operation (a soft version, `torch.softmax` "
            "instead of a hard choice)." % (NO_ONE_LINE_FIX, op_name,
                                            "`%s`" % _expr(name) if _is_code_name(name) else "its result", detached))


def second_order_fix(op_name: str, inner_backward: str) -> str:
    """A second-order gradient through an op whose backward has no derivative (see errors.not_differentiable)."""
    return ("%s the backward of %s cannot be differentiated, so no gradient of a gradient can flow through it. "
            "Either take the inner gradient on %s without create_graph=True (a first-order approximation: its "
            "result then enters the loss as a constant), or compute %s with operations whose backward is "
            "differentiable (its plain formula, written with torch operations)."
            % (NO_ONE_LINE_FIX, op_name, inner_backward, op_name))


def invalid_gradient_fix(function: str, shape: bool) -> str:
    """A custom Function whose backward returns the wrong gradients (see errors.invalid_gradient)."""
    what = ("each with the shape of its input: sum a broadcast gradient back over the broadcast dimensions "
            "(`.sum(dim, keepdim=True)`), reshape a flattened one (`.reshape(...)`)" if shape else
            "one value for each")
    return ("%s `%s.backward` must return one gradient per input of `%s.forward` (after ctx), in the same order, %s, "
            "and None for an input that is not a tensor or needs no gradient. `torch.autograd.gradcheck` on small "
            "double-precision inputs then checks its values against finite differences."
            % (NO_ONE_LINE_FIX, function, function, what))


def ddp_unused_fix(module: str, names, why: str) -> str:
    """Parameters a DDP waited for in vain (see errors.ddp_unused_parameters)."""
    owner = _expr(names[0].rpartition(".")[0]) if names and _is_code_name(names[0]) else ""
    build = ("\n%s\n" % code("ddp = torch.nn.parallel.DistributedDataParallel(%s, find_unused_parameters=True)"
                             % _expr(module)) if _is_code_name(module) else " ")
    listed = ", ".join("`%s`" % n for n in names[:8]) + (" and %d more" % (len(names) - 8) if len(names) > 8 else "")
    return ("%s in the last iteration %s got no gradient: %s. If that is on purpose (an auxiliary head used only on "
            "some steps, a branch not taken), build the DDP with find_unused_parameters=True, and it looks for such "
            "parameters in every iteration (one more walk over the graph):%sIf they should train, make what they "
            "compute part of the loss; if they should not train at all, freeze them before wrapping the model%s."
            % (NO_ONE_LINE_FIX, listed, why, build, " (`%s.requires_grad_(False)`)" % owner if owner else ""))


def ddp_ready_twice_fix(src: str, by_function: bool) -> str:
    """A parameter's gradient delivered twice to DDP in one backward (see errors.ddp_ready_twice)."""
    others = ("Or, if the model's graph is the same in every iteration, build the DDP with static_graph=True; or "
              "with find_unused_parameters=False if every parameter is used in every iteration.")
    if "use_reentrant=True" in src and _is_simple_statement(src.replace("use_reentrant=True", "use_reentrant=False")):
        return ("Checkpoint without a reentrant backward: the recomputation then runs inside this backward's own "
                "graph, and DDP sees each parameter's gradient once. %s\n%s\n%s"
                % (REPLACE, code(src.replace("use_reentrant=True", "use_reentrant=False")), others))
    if by_function:
        return ("%s pass use_reentrant=False to the checkpoint on that line, so that the recomputation runs inside "
                "this backward's graph. %s" % (NO_ONE_LINE_FIX, others))
    return ("%s use the parameter only inside the forward of the DDP module, so that its gradient reaches DDP once. %s"
            % (NO_ONE_LINE_FIX, others))


def backward_error_fix(name: Optional[str], line: Optional[int], error: Optional[str],
                       hook: Optional[str] = None) -> str:
    """The floor (see errors.backward_error): where to look, and how to make PyTorch say more; for a hook
    whose return value PyTorch refused, what a hook must return."""
    if hook is not None:
        return ("%s make the hook `%s` return None (to leave the gradient as it is) or a gradient like the one it "
                "gets: of the same shape, dtype and device (for a module's hook, one for each gradient of the tuple "
                "it gets, in the same order). A module hook registered with `register_backward_hook` gets the "
                "gradients of the module's last operation, whose inputs may not be the module's (a layer without "
                "bias has one input less): `register_full_backward_hook` gives those of the module's own inputs."
                % (NO_ONE_LINE_FIX, hook))
    if error and "grad_output" in error:
        return ("%s the gradient given to backward() must have the shape and dtype of the tensor it starts from: "
                "%s for the gradient of its sum, or the gradient you computed, reshaped and cast to match."
                % (NO_ONE_LINE_FIX, "`torch.ones_like(%s)`" % _expr(name) if _is_code_name(name) else
                   "`torch.ones_like(...)` of that tensor"))
    return ("%s jupyter-autograd does not know this error in detail; %s is where it comes from. Running the forward "
            "pass and the backward call under `torch.autograd.detect_anomaly()` adds the forward traceback of the "
            "failing node to PyTorch's message." % (NO_ONE_LINE_FIX, "line %d" % line if line else "the line above"))
