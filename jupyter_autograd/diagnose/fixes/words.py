"""The wording that fixes and messages share: the conventions of a fix's code blocks (see
fixes/__init__.py), and how a write, a line, a cut or backward's outcome is said."""
from __future__ import annotations

from collections import Counter
from typing import List, Optional, Tuple

from ...model import OpRecord


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
    return "`%s(..., inplace=True)`" % name if name.startswith("F.") and short in MODULES else \
        "`%s` (which writes to a tensor it is given)" % name

_AUG = {"__iadd__": "+=", "__isub__": "-=", "__imul__": "*=", "__itruediv__": "/=", "__ipow__": "**=",
        "__ifloordiv__": "//=", "__imod__": "%=", "__iand__": "&=", "__ior__": "|=", "__ixor__": "^=",
        "__imatmul__": "@=", "__ilshift__": "<<=", "__irshift__": ">>="}

# The nn modules whose functional form was called with inplace=True.
MODULES = {"relu": "ReLU", "leaky_relu": "LeakyReLU", "elu": "ELU", "selu": "SELU", "celu": "CELU",
            "hardtanh": "Hardtanh", "relu6": "ReLU6", "dropout": "Dropout", "silu": "SiLU",
            "hardswish": "Hardswish", "hardsigmoid": "Hardsigmoid", "mish": "Mish", "rrelu": "RReLU",
            "alpha_dropout": "AlphaDropout"}

# How the user wrote the ops that cut a chain: what a fix tells them to stop writing.
_CUT_SPELLINGS = {"item": "`.item()`", "tolist": "`.tolist()`", "numpy": "`.numpy()`", "__array__": "`np.asarray()`",
                  "detach": "`.detach()`", "detach_": "`.detach_()`", "data": "`.data`", "__float__": "`float()`",
                  "__int__": "`int()`", "__index__": "an integer index", "__complex__": "`complex()`"}

def cut_spelling(op: OpRecord) -> str:
    """The cut as the user wrote it: `.item()`, `.detach()`, `.data`, or the op that ran under no_grad."""
    if not op.grad_enabled:
        return "`%s` under `torch.no_grad()`" % op.name
    return _CUT_SPELLINGS.get(op.name.rpartition(".")[2], "`%s`" % op.name)
