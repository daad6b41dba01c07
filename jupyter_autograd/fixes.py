"""The fixes a diagnosis suggests, and the wording shared by messages and fixes.

Plain text from plain data: every fix is code the user can paste (see tests/test_fixes.py).
"""
from __future__ import annotations

import ast
import re
from typing import Optional

from .model import OpRecord, Trace


def leaf_fix(text: str, name: str) -> str:
    if text:
        return ("Do the change without recording it, before the tensor is used:\n"
                "    with torch.no_grad():\n        %s\n"
                "or make the change before setting requires_grad=True (or on `%s.detach()`)." % (text, name))
    return "Wrap the in-place change in `with torch.no_grad():`, before the tensor is used."


def accumulation_fix(src: str, linked_name: str, linked_known: bool) -> str:
    fixed = _replace_name(src, linked_name, linked_name + ".item()") if src and linked_known else ""
    if fixed and fixed != src:
        return "Accumulate a Python number instead of the tensor: `%s`" % fixed
    return "Accumulate `%s.item()` (a Python number) or `%s.detach()` instead of the tensor." % (
        linked_name, linked_name)


def line_ref(op: OpRecord) -> str:
    return "line %d" % op.location.line if op.location else "an unknown line"


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
        return "Write to a copy (`%s = %s.clone()`) instead of the saved tensor." % (name, name)
    src = op.location.source if op.location else ""
    before = (" Or, if the new values were meant to be used, make the change before %s." % line_ref(save)
              if save is not None and save.location else "")
    rewritten = out_of_place(src)
    if rewritten:
        return "Use the out-of-place form, which leaves the saved value intact:\n    %s\n%s" % (rewritten, before.strip())
    if src and "[" in src.split("=")[0] and "=" in src:
        target = src.split("[", 1)[0].strip()
        return ("Write to a copy, so the saved tensor keeps its value:\n    %s = %s.clone()\n    %s\n%s"
                % (target, target, src, before.strip()))
    short = op.name.split(".")[-1]
    if "step" in src or "optim" in op.name:
        return ("The optimizer changed parameters that a graph still needs. Call backward() for every loss that "
                "uses them before optimizer.step(), or run the forward pass again after the step (in GAN "
                "training: compute the generator's loss after the discriminator's step, or detach it).")
    if not short.endswith("_") and op.name.startswith("F."):
        return ("%s runs `%s(..., inplace=True)` inside this call. Use its out-of-place form "
                "(e.g. `nn.%s(inplace=False)` or `inplace=False`).%s"
                % (where(op), op.name, _module_name(short), before))
    return ("%s changes the saved tensor in place with %s. Use the out-of-place form of that operation, "
            "or `.clone()` the tensor before changing it.%s" % (where(op), describe_write(op), before))


def _module_name(fn: str) -> str:
    return {"relu": "ReLU", "leaky_relu": "LeakyReLU", "elu": "ELU", "selu": "SELU", "celu": "CELU",
            "hardtanh": "Hardtanh", "relu6": "ReLU6", "dropout": "Dropout", "silu": "SiLU",
            "hardswish": "Hardswish", "hardsigmoid": "Hardsigmoid", "threshold": "Threshold",
            "mish": "Mish", "rrelu": "RReLU", "alpha_dropout": "AlphaDropout"}.get(fn, fn)


def data_fix(trace: Trace, culprit, name: str, save: Optional[OpRecord]) -> str:
    alias = trace.tensor_label(culprit[1]) if culprit else "the alias"
    made = None
    if culprit is not None:
        info = trace.tensors.get(culprit[1])
        while info is not None and info.data_alias_of is None and info.base is not None:
            info = trace.tensors.get(info.base)
        if info is not None and info.created_by is not None:
            made = trace.ops[info.created_by]
    where = (" (made on %s: `%s`)" % (line_ref(made), made.location.source)
             if made is not None and made.location else "")
    moved = " or make the change before %s," % line_ref(save) if save is not None and save.location else ""
    return ("Never write through `.data` into a tensor that backward still needs. Use `.detach()` instead of "
            "`.data` for `%s`%s, so PyTorch checks the write; then write to a copy (`%s.detach().clone()`),%s "
            "or do the update after backward()." % (alias, where, name, moved))


def out_of_place(src: str) -> Optional[str]:
    """The out-of-place form of a line that writes in place, or None when there is no simple one.

    `y += 1` -> `y = y + 1`; `x.add_(b)` -> `x = x.add(b)`; `nn.ReLU(inplace=True)` -> inplace=False.
    """
    try:
        tree = ast.parse(src)
    except SyntaxError:
        return None
    if len(tree.body) != 1:
        return None
    stmt = tree.body[0]
    if isinstance(stmt, ast.AugAssign) and not isinstance(stmt.target, ast.Subscript):
        target = ast.unparse(stmt.target)
        return "%s = %s %s %s" % (target, target, _OPS.get(type(stmt.op), "?"), ast.unparse(stmt.value))
    if "inplace=True" in src:
        return src.replace("inplace=True", "inplace=False")
    if isinstance(stmt, (ast.Expr, ast.Assign)):
        call = stmt.value
        if isinstance(call, ast.Call) and isinstance(call.func, ast.Attribute) and call.func.attr.endswith("_") \
                and not call.func.attr.startswith("_"):
            receiver = ast.unparse(call.func.value)
            new_call = "%s.%s(%s)" % (receiver, call.func.attr[:-1], ", ".join(
                [ast.unparse(a) for a in call.args] + [ast.unparse(k) for k in call.keywords]))
            if isinstance(stmt, ast.Expr) and re.fullmatch(r"[\w.]+", receiver):
                return "%s = %s" % (receiver, new_call)
            if isinstance(stmt, ast.Assign):
                return "%s = %s" % (" = ".join(ast.unparse(t) for t in stmt.targets), new_call)
    return None


_OPS = {ast.Add: "+", ast.Sub: "-", ast.Mult: "*", ast.Div: "/", ast.Pow: "**", ast.FloorDiv: "//",
        ast.Mod: "%", ast.MatMult: "@", ast.BitAnd: "&", ast.BitOr: "|", ast.BitXor: "^",
        ast.LShift: "<<", ast.RShift: ">>"}


def _replace_name(src: str, name: str, replacement: str) -> str:
    if not re.fullmatch(r"[A-Za-z_]\w*", name or ""):
        return ""
    head, sep, tail = src.partition("+=")
    if sep:
        return head + sep + re.sub(r"\b%s\b" % re.escape(name), replacement, tail)
    return re.sub(r"(?<![\w.])%s\b(?!\s*=[^=])" % re.escape(name), replacement, src)
