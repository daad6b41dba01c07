"""Gradient health per parameter and per module, as plain data: what `plot_grad_flow` gists and
`wandb.watch` are used for, read from the gradient norms the capture takes anyway (after the
checked backward calls, see TensorInfo.grad_norms) and the parameters' own norms at the end of
the block. Nothing here touches torch: it is arithmetic over the Trace.

The thresholds are relative to each parameter's own scale, |g| / |p| (the gradient's L2 norm over
the parameter's), which is what one learning rate turns into a relative update: lr * |g| / |p|.
"""
from __future__ import annotations

import math
import statistics
from typing import Any, Dict, List, Optional

from ..model import TraceData

# An update smaller than 2**-24 of a float32 value is lost to rounding: below this |g| / |p| a
# step at a learning rate of 1 leaves the parameter as it was, and any usual rate even more so.
VANISHING_RATIO = 2.0 ** -24
# A parameter whose |g| / |p| is this many times below the model's median moves that much slower
# than a typical parameter under one learning rate: the early layers of a deep sigmoid network.
VANISHING_BELOW_MEDIAN = 1000.0
# Above this |g| / |p|, one SGD step at a learning rate of 0.01 moves the parameter by more than its
# own size. (Healthy models measured here stay below 15, small biases included.)
EXPLODING_RATIO = 100.0

VANISHING, EXPLODING, NONFINITE, NEVER_UPDATED = "vanishing", "exploding", "nan-or-inf", "never-updated"


def grad_stats(trace: TraceData) -> Dict[str, Any]:
    """See Trace.grad_stats."""
    steps = sorted({index for info in trace.tensors.values() for index, _ in info.grad_norms})
    position = {index: i for i, index in enumerate(steps)}
    parameters = []
    for info in trace.tensors.values():
        trainable = info.is_leaf and info.requires_grad and (info.is_parameter or info.optimized)
        if not info.grad_norms and not (steps and trainable and (info.owner is not None or info.optimized)):
            continue
        norms: List[Optional[float]] = [None] * len(steps)
        for index, norm in info.grad_norms:
            norms[position[index]] = norm
        entry = _entry(trace.tensor_label(info.tid), None, info.shape, info.dtype, norms, info.norm,
                       info.is_parameter)
        entry["module"], entry["_path"] = _modules_holding(trace, info)
        parameters.append(entry)
    _mark(parameters)
    return {
        "steps": [{"op_index": index, "place": _place(trace, index)} for index in steps],
        "parameters": parameters,
        "modules": _modules(trace, parameters, len(steps)),
        "thresholds": {"vanishing_ratio": VANISHING_RATIO, "vanishing_below_median": VANISHING_BELOW_MEDIAN,
                       "exploding_ratio": EXPLODING_RATIO},
    }


def _entry(name, module, shape, dtype, norms, scale, is_parameter) -> Dict[str, Any]:
    finite = [n for n in norms if n is not None and math.isfinite(n)]
    last = finite[-1] if finite else None
    first = finite[0] if finite else None
    return {"name": name, "module": module, "shape": list(shape), "dtype": dtype, "is_parameter": is_parameter,
            "norms": norms, "param_norm": scale,
            "ratio": last / scale if last is not None and scale else None,
            "change": last / first if len(finite) > 1 and first else None,
            "nonfinite_at": next((i for i, n in enumerate(norms) if n is not None and not math.isfinite(n)), None),
            "flags": []}


def _mark(entries: List[Dict[str, Any]]) -> None:
    ratios = [e["ratio"] for e in entries if e["ratio"]]
    median = statistics.median(ratios) if ratios else None
    for e in entries:
        e["flags"] = _flags(e, median)


def _flags(e: Dict[str, Any], median: Optional[float]) -> List[str]:
    flags = []
    if e["nonfinite_at"] is not None:
        flags.append(NONFINITE)
    if all(n is None or n == 0 for n in e["norms"]):
        flags.append(NEVER_UPDATED)
    ratio = e["ratio"]
    if ratio is not None and ratio > 0 and NONFINITE not in flags:
        if ratio < VANISHING_RATIO or (median is not None and ratio * VANISHING_BELOW_MEDIAN < median):
            flags.append(VANISHING)
        elif ratio > EXPLODING_RATIO:
            flags.append(EXPLODING)
    return flags


def _modules_holding(trace: TraceData, info):
    """(the module that holds a parameter, every module on its path up to the outermost), from its
    dotted name: a parameter of a module called in the block is named along that module's tree
    (info.owner is the outermost's name), so each prefix from there is a module, called or not
    (an unused head). ((None, []) for a tensor no module holds.)"""
    name = info.name or ""
    path = []
    module = name.rpartition(".")[0]
    while module:
        if module in trace.modules or (info.owner and (module == info.owner or module.startswith(info.owner + "."))):
            path.append(module)
        elif path:
            break
        module = module.rpartition(".")[0]
    return (path[0] if path else None), path


def _modules(trace: TraceData, parameters: List[Dict[str, Any]], n_steps: int) -> List[Dict[str, Any]]:
    """Each module that holds parameters of the list, at every level of its path (`net.0` and `net`):
    the norms of all its parameters' gradients taken together, and the union of their flags."""
    members: Dict[str, List[Dict[str, Any]]] = {}
    for p in parameters:
        for module in p.pop("_path"):
            members.setdefault(module, []).append(p)
    out = []
    for module, params in sorted(members.items()):
        norms = [_total(p["norms"][i] for p in params) for i in range(n_steps)]
        entry = _entry(module, module.rpartition(".")[0] or None, (), "", norms,
                       _total(p["param_norm"] for p in params), True)
        entry.update(cls=trace.modules.get(module, ""), parameters=[p["name"] for p in params],
                     flags=sorted({f for p in params for f in p["flags"]}, key=_ORDER.index))
        del entry["shape"], entry["dtype"], entry["is_parameter"]
        out.append(entry)
    return out


_ORDER = [NONFINITE, EXPLODING, VANISHING, NEVER_UPDATED]


def _total(norms) -> Optional[float]:
    """The norm of several tensors taken as one: the root of the sum of their squared norms."""
    known = [n for n in norms if n is not None]
    return math.sqrt(sum(n * n for n in known)) if known else None


def _place(trace: TraceData, index: int) -> str:
    op = trace.ops[index] if 0 <= index < len(trace.ops) else None
    return trace.place(op.location.filename, op.location.line) if op is not None and op.location else ""
