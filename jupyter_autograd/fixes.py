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

from .model import OpRecord, Trace

REPLACE = "Replace the culprit line with:"
REPLACE_LINE = "Replace line %d of %s with:"
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


def inplace_fix(trace: Trace, op: Optional[OpRecord], name: str, save: Optional[OpRecord],
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
    if not short.endswith("_") and op.name.startswith("F."):
        built = _inplace_module_fix(trace, op)
        if built:
            return built + before
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


def _held_elsewhere(trace: Trace, written: Optional[int], target: str) -> Optional[str]:
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


def _alias_write_fix(trace: Trace, op: OpRecord, target: str, held: str, save: Optional[OpRecord]) -> str:
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


def _inplace_module_fix(trace: Trace, op: OpRecord) -> Optional[str]:
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


def _input_unread_after(trace: Trace, op: OpRecord, path: str):
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


def _construction(trace: Trace, path: str):
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


def _sequence_elements(trace: Trace, filename: str, call: ast.Call):
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


def _only_assignment(trace: Trace, name: str):
    found = [(filename, node.value) for filename, tree in _parsed_sources(trace) for node in ast.walk(tree)
             if isinstance(node, ast.Assign) and [ast.unparse(t) for t in node.targets] == [name]]
    return found[0] if len(found) == 1 else None


def _parsed_sources(trace: Trace, only: Optional[str] = None):
    for filename, lines in trace.sources.items():
        if only is not None and filename != only:
            continue
        try:
            yield filename, ast.parse("".join(lines))
        except (SyntaxError, ValueError):
            continue


# How the user wrote the ops that cut a chain: what a fix tells them to stop writing.
_CUT_SPELLINGS = {"item": "`.item()`", "tolist": "`.tolist()`", "numpy": "`.numpy()`", "__array__": "`np.asarray()`",
                  "detach": "`.detach()`", "detach_": "`.detach_()`", "data": "`.data`", "__float__": "`float()`",
                  "__int__": "`int()`", "__index__": "an integer index", "__complex__": "`complex()`"}


def cut_spelling(op: OpRecord) -> str:
    """The cut as the user wrote it: `.item()`, `.detach()`, `.data`, or the op that ran under no_grad."""
    if not op.grad_enabled:
        return "`%s` under `torch.no_grad()`" % op.name
    return _CUT_SPELLINGS.get(op.name.rpartition(".")[2], "`%s`" % op.name)


def starved_fix(name: str, cut: OpRecord, rewritten: Optional[str]) -> str:
    """The fix for a trained tensor whose path to the loss one op cut: it names that op (`.item()`
    on line 11) and, where the line rebuilt a tensor from it (`torch.tensor(x.mean().item())`), gives
    the line that keeps the tensor: the same value, now with its history."""
    spelled = cut_spelling(cut)
    freeze = "If `%s` should not be trained, freeze it on purpose (`requires_grad_(False)`)." % _expr(name)
    if rewritten and _is_simple_statement(rewritten):
        return ("Keep the chain from `%s` to the loss: %s on %s gives a value without history. %s\n%s\n%s"
                % (_expr(name), spelled, line_ref(cut), REPLACE, code(rewritten), freeze))
    instead = "outside `torch.no_grad()` and `torch.inference_mode()`" if not cut.grad_enabled else \
        "with torch operations on the tensor itself, without %s" % spelled
    return ("%s %s on %s cuts the chain from `%s` to the loss: compute that value %s. %s"
            % (NO_ONE_LINE_FIX, spelled, line_ref(cut), _expr(name), instead, freeze))


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
