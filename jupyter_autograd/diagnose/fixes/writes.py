"""The fixes of the in-place family and of graphs kept alive: a write moved under no_grad, made out of
place or to a copy, a module built without inplace=True, a value kept without its graph."""
from __future__ import annotations

import ast
import re
from typing import Optional, Tuple

from ...model import OpRecord, TraceData
from ...source.functions import arguments_of, ends_its_function, module_construction, returns_later
from ...source.rewrites import (as_code, copy_before_write, is_code_name, is_simple_statement, operand, out_as_copy,
                                out_of_place, rebound_name, replace_name, single_statement)
from .words import (MODULES, NO_ONE_LINE_FIX, REPLACE, REPLACE_LINE, REPLACE_LINES, SAVED_COPY_REMEDY, code,
                    describe_write, line_ref, where)


def leaf_fix(text: str, name: str, following=(), place: Tuple[int, str] = (0, "")) -> str:
    """`following`: the lines right after the culprit (at `place`, its line and file label) that
    write into the same tensor too: the change they make together goes under no_grad together."""
    # A label that describes the tensor (no name found) is no code: it is not quoted as code.
    shown = "`%s`" % name if is_code_name(name) else "the tensor"
    if following and text and is_simple_statement(text):
        line, label = place
        return ("Make the change without recording it, before %s is used: %s after it write%s into it "
                "too. %s\n%s\n(or make it before setting requires_grad=True)."
                % (shown, "the line" if len(following) == 1 else "the %d lines" % len(following),
                   "s" if len(following) == 1 else "",
                   REPLACE_LINES % (line, line + len(following), label),
                   code("with torch.no_grad():\n" + "\n".join("    " + t for t in [text, *following]))))
    copied = out_as_copy(text) if "out=" in text else None
    if copied:
        # Under no_grad an `out=` call still writes, but it also clears the leaf's requires_grad: the
        # parameter would silently stop training. Copying the result in keeps it a trainable leaf.
        return ("Compute the values without `out=` and copy them in without recording it, before %s is used "
                "(an `out=` call under `torch.no_grad()` would also switch off its `requires_grad`). %s\n%s"
                % (shown, REPLACE, code("with torch.no_grad():\n    " + copied)))
    if text and is_simple_statement(text):
        return ("Make the change without recording it, before %s is used. %s\n%s\n"
                "(or make it before setting requires_grad=True, or through %s)."
                % (shown, REPLACE, code("with torch.no_grad():\n    " + text),
                   "`%s.detach()`" % as_code(name) if is_code_name(name) else "its `.detach()`"))
    return "Wrap the in-place change in `with torch.no_grad():`, before the tensor is used."

def accumulation_fix(src: str, linked_name: Optional[str]) -> str:
    # .detach(), not .item(): the accumulator stays a tensor, so code that reads it later
    # (`running_loss.item() / n`) still runs.
    fixed = replace_name(src, linked_name, linked_name + ".detach()") if src and linked_name else ""
    if fixed and fixed != src and is_simple_statement(fixed):
        return ("Accumulate the value without its graph. %s\n%s\n"
                "(or a Python number, `%s.item()`, if nothing reads the total as a tensor)."
                % (REPLACE, code(fixed), as_code(linked_name)))
    if not linked_name:
        return ("Accumulate what this line adds without its graph: its `.detach()`, or a Python number "
                "(`.item()`), instead of the tensor.")
    return "Accumulate `%s.item()` (a Python number) or `%s.detach()` instead of the tensor." % (
        as_code(linked_name), as_code(linked_name))

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

def inplace_fix(trace: TraceData, op: Optional[OpRecord], name: str, save: Optional[OpRecord],
                written: Optional[int] = None) -> str:
    """`written`: the tid of the tensor the line wrote through. When the line's name is only another
    name for it (the same tensor object, held under its own name elsewhere), rebinding that name
    would not reach it. (An alias made by `.detach()` or a view is a tensor of its own: a copy of it
    keeps the values the user wrote to it, and the fix says where else the change can go.)"""
    if op is None:
        return ("Write to a copy (`%s = %s.clone()`) instead of the saved tensor.\n%s"
                % (as_code(name), as_code(name), SAVED_COPY_REMEDY))
    src = op.location.source if op.location else ""
    before = (" Or, if the new values were meant to be used, make the change before %s." % line_ref(save)
              if save is not None and save.location and not (op.location and op.location.line == save.location.line)
              else "")
    view = trace.tensors.get(written) if written is not None else None
    if view is not None and view.base is not None:
        # A write through a view is meant for its base too: a copy of the view, or rebinding it to an
        # out-of-place result, would leave the base unchanged for the code that reads it later.
        copy = ("`%s.clone()`" % as_code(name)) if re.fullmatch(r"[A-Za-z_][\w.]*", name or "") else "`.clone()`"
        return ("%s %s changes `%s` in place through `%s`, a view that shares its memory. Make the change before "
                "%s, or take the view from a copy (%s) made after that line, and use the copy from there on.\n%s"
                % (NO_ONE_LINE_FIX, where(op), name, trace.tensor_label(written),
                   line_ref(save) if save is not None else "the tensor is saved", copy, SAVED_COPY_REMEDY))
    rewritten = out_of_place(src) or copy_before_write(src)
    target = rebound_name(rewritten) if rewritten else None
    if target and not (op.location and target in arguments_of(trace, op.location)):
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
        if op.location and target in arguments_of(trace, op.location) and \
                not returns_later(trace, op.location, target):
            # Rebinding an argument changes nothing outside: the copy has to be handed back.
            function = op.location.function
            if not ends_its_function(trace, op.location):
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
    if functional and short in MODULES:
        return ("%s %s runs `%s(..., inplace=True)` inside this call. Build the model with the out-of-place "
                "form instead:\n%s\n(or pass `inplace=False` to `%s`).%s"
                % (NO_ONE_LINE_FIX, where(op), op.name, code("nn.%s(inplace=False)" % MODULES[short]), op.name,
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
            not is_code_name(name):
        return None
    src = save.location.source or ""
    stmt = single_statement(src)
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

# Where `inplace` is among the positional arguments of each module's constructor.
_INPLACE_POSITION = {"ReLU": 0, "ReLU6": 0, "SELU": 0, "SiLU": 0, "Mish": 0, "Hardswish": 0, "Hardsigmoid": 0,
                     "ELU": 1, "CELU": 1, "LeakyReLU": 1, "Dropout": 1, "Dropout1d": 1, "Dropout2d": 1,
                     "Dropout3d": 1, "AlphaDropout": 1, "FeatureAlphaDropout": 1, "Hardtanh": 2, "RReLU": 2,
                     "Threshold": 2}

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
    built = module_construction(trace, path)
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
    stmt = single_statement(src)
    value = stmt.value if isinstance(stmt, (ast.Assign, ast.Return, ast.Expr)) else None
    if not (isinstance(value, ast.Call) and value.args):
        return False, None
    arg = value.args[0]
    if not isinstance(arg, ast.Name):
        return True, None
    if op.location and arg.id in arguments_of(trace, op.location):
        return False, arg.id
    rebound = isinstance(stmt, ast.Assign) and [ast.unparse(t) for t in stmt.targets] == [arg.id]
    return (True, None) if rebound or isinstance(stmt, ast.Return) else (False, arg.id)

def data_fix(trace: TraceData, culprit, name: str, save: Optional[OpRecord]) -> str:
    alias = as_code(trace.tensor_label(culprit[1])) if culprit else "the alias"
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
        if is_simple_statement(fixed):
            detach = ("\nAnd take the alias with `.detach()` on %s, so that PyTorch raises instead of computing "
                      "wrong gradients:\n%s" % (line_ref(made), code(fixed)))
    # Writing to a copy of the alias is a sound one-line fix when the alias has a name of its own.
    rewritten = out_of_place(src) or copy_before_write(src)
    if rewritten and ".data" not in src:
        return ("%s If the new values are meant only for `%s`, write to a copy. %s\n%s\nOtherwise %s.%s"
                % (head[0].upper() + head[1:], alias, REPLACE, code(rewritten), moved, detach))
    # `w.data.mul_(0.5)`: the write is meant for the tensor itself, so it must move.
    under_no_grad = src.replace(".data", "") if src.count(".data") == 1 else ""
    if under_no_grad and is_simple_statement(under_no_grad):
        return ("%s %s %s; there, do it under torch.no_grad() instead of through `.data`:\n%s%s"
                % (NO_ONE_LINE_FIX, head, moved[0].upper() + moved[1:],
                   code("with torch.no_grad():\n    " + under_no_grad), detach))
    return ("%s %s Use `.detach()` instead of `.data` for `%s`, so PyTorch checks the write; then write to a "
            "copy (`%s.detach().clone()`), or %s.%s" % (NO_ONE_LINE_FIX, head, alias, as_code(name), moved, detach))

def data_swap_fix(trace: TraceData, op: OpRecord) -> str:
    """`t.data = new` after a graph saved `t` itself: the swap has to move, or the tensor be left alone."""
    text = ("%s never swap `.data` of a tensor that a graph still needs: the graph keeps the tensor object, and "
            "PyTorch cannot see the swap. Either swap the values after backward() (restore a parameter once its "
            "gradient is taken), or leave the tensor alone and give the new values a tensor of their own"
            % NO_ONE_LINE_FIX)
    stmt = single_statement(op.location.source if op.location else "")
    swapped = trace.tensors.get(op.writes[0]) if op.writes else None
    if (isinstance(stmt, ast.Assign) and len(stmt.targets) == 1 and isinstance(stmt.targets[0], ast.Attribute)
            and stmt.targets[0].attr == "data" and swapped is not None and not swapped.is_parameter):
        holder = ast.unparse(stmt.targets[0].value)
        if re.fullmatch(r"[A-Za-z_][\w.]*", holder):
            value = ast.unparse(stmt.value)
            value = value if value.endswith((".detach()", ".clone()")) else operand(value) + ".detach()"
            return ("%s: where the tensor is kept, bind a new one instead of swapping the memory of the one the graph "
                    "holds:\n%s" % (text, code("%s = %s" % (holder, value))))
    return text + (" (a parameter: run the forward with other values through `torch.func.functional_call()` instead "
                   "of swapping them in).")

def view_write_fix(src: str, name: Optional[str], base: Optional[str], how: str) -> str:
    """An in-place write to a view PyTorch refuses (see errors.view_inplace): write to a new tensor."""
    shown = as_code(name) if is_code_name(name) else ""
    if how == "views":
        after = ("The write then changes only %s, not %s, which the views share memory with; if that tensor was "
                 "meant to change too, change it before it is split." % (
                     "`%s`" % shown if shown else "the view", "`%s`" % as_code(base) if is_code_name(base) else
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
    if is_code_name(name):
        return ("%s Or make a normal tensor of it outside inference mode, before the part that trains uses it (a "
                "clone made inside inference mode is an inference tensor too):\n%s"
                % (head, code("%s = %s.clone()" % (as_code(name), as_code(name)))))
    return head + " Or `.clone()` it outside inference mode before the part that trains uses it."
