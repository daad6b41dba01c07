"""The timeline a person reads: one step per line run, grouped by iteration.

A block of a training loop runs thousands of operations; the timeline does not list them. A
step is one run of a line (the operations one execution of `loss = mse_loss(model(x), y)`
made, the parameters `opt.step()` updated), and the steps are grouped by the iterations of
`layout.iteration_starts`. A step says which tensors it made, read or changed, each once, by
name (unnamed tensors are counted, never shown as `tensor#74`); the parameters a step touched
are one chip, not one per parameter.
"""
from __future__ import annotations

from bisect import bisect_left, bisect_right
from typing import Dict, List, Tuple

from ..model import OpRecord, TraceData
from .layout import iteration_starts, line_labeller

MAX_CHIPS = 12          # named tensors a step lists before it says "and N more"
GROUPED_PARAMETERS = 3  # more parameters than this in one step are one chip


def steps_of(trace: TraceData) -> List[Tuple[int, int]]:
    """(first op, last op) of each step. A step ends where the line changes, or where the op
    that began it runs again in the same module (a loop came back to the same line; the layers
    one line calls are other modules)."""
    out: List[Tuple[int, int]] = []
    ops = trace.ops
    first = 0
    for i in range(1, len(ops) + 1):
        if i == len(ops) or _where(ops[i]) != _where(ops[first]) or ops[i].is_backward or ops[first].is_backward \
                or (ops[i].name == ops[first].name and ops[i].module == ops[first].module):
            out.append((first, i - 1))
            first = i
    return out


def _where(op: OpRecord):
    return (op.location.filename, op.location.line) if op.location is not None else None


def iterations_of(trace: TraceData, steps: List[Tuple[int, int]]) -> List[int]:
    """The index of the first step of each iteration: the step holding its first op."""
    firsts = [first for first, _ in steps]
    out = []
    for start in iteration_starts(trace):
        at = max(0, bisect_right(firsts, start) - 1)
        if at < len(steps) and (not out or at > out[-1]):
            out.append(at)
    return out or [0]


def step_info(trace: TraceData, steps: List[Tuple[int, int]], iterations: List[int], index: int) -> Dict:
    """What the timeline shows for one step: where, what ran, the tensors it touched."""
    first, last = steps[index]
    ops = trace.ops[first:last + 1]
    op = ops[0]
    iteration = max(0, bisect_left(iterations, index + 1) - 1)
    names: Dict[str, int] = {}
    for o in ops:
        names[o.name] = names.get(o.name, 0) + 1
    where = line_labeller(trace)(first)
    return {"index": index, "iteration": iteration, "iterations": len(iterations),
            "first_op": first, "last_op": last,
            "place": trace.place(op.location.filename, op.location.line) if op.location else "",
            "where": where, "file": op.location.filename if op.location else "",
            "line": op.location.line if op.location else 0, "source": op.location.source if op.location else "",
            "ops": [[name, count] for name, count in names.items()],
            "grad_mode": all(o.grad_enabled for o in ops), "error": next((o.error for o in ops if o.error), "") or "",
            "chips": _chips(trace, ops), "note": _note(trace, ops)}


def _chips(trace: TraceData, ops: List[OpRecord]) -> List[List[str]]:
    """[label, role, title] per tensor the step touched: `written` (in place), `made`, `read`."""
    role: Dict[int, str] = {}
    for o in ops:
        for tid in o.inputs:
            role.setdefault(tid, "read")
        for tid in o.outputs:
            role[tid] = "made" if role.get(tid) != "written" else "written"
        for tid in o.writes:
            role[tid] = "written"
    last = ops[-1].index
    rank = {"written": 0, "made": 1, "read": 2}
    chips: Dict[str, List[str]] = {}
    parameters: List[Tuple[str, str, str]] = []
    unnamed = 0
    for tid, what in sorted(role.items(), key=lambda kv: rank[kv[1]]):
        info = trace.tensors.get(tid)
        if info is None or not info.name:
            unnamed += 1
            continue
        version = _version_at(info, last)
        if info.is_parameter:
            parameters.append((info.name, what, version))
            continue
        if info.name in chips:  # a view or an alias under the same name: one chip
            continue
        chips[info.name] = [info.name + (" v%s" % version if version else ""), what,
                            "%s: %s%s" % (info.name, what, ", version %s after this step" % version if version else "")]
    out = list(chips.values())
    if len(parameters) > GROUPED_PARAMETERS:
        written = [p for p in parameters if p[1] == "written"]
        what = "written" if written else parameters[0][1]
        out.insert(0, ["%d parameters" % len(parameters) + (" updated" if written else ""), what,
                       "\n".join("%s: %s%s" % (n, w, " (v%s)" % v if v else "") for n, w, v in parameters)])
    else:
        out[:0] = [[n + (" v%s" % v if v else ""), w, "%s: %s (parameter)" % (n, w)] for n, w, v in parameters]
    if len(out) > MAX_CHIPS:
        more = len(out) - MAX_CHIPS
        out = out[:MAX_CHIPS] + [["and %d more" % more, "more", ", ".join(c[0] for c in out[MAX_CHIPS:])]]
    if unnamed:
        out.append(["+%d unnamed" % unnamed, "unnamed", "tensors without a name in your code (intermediate results)"])
    return out


def _version_at(info, op_index: int) -> str:
    known = [v for at, v in info.versions if at <= op_index]
    return str(known[-1]) if known and known[-1] else ""


def _note(trace: TraceData, ops: List[OpRecord]) -> str:
    """One sentence on what the step means for autograd, where it is not plain."""
    if any(o.is_backward for o in ops):
        return ("backward: runs the graph from this loss down to the parameters, adds into their .grad and "
                "frees the graph's saved tensors (unless retain_graph=True)")
    written = {tid for o in ops for tid in o.writes}
    params = [tid for tid in written if trace.tensors.get(tid) is not None and trace.tensors[tid].is_parameter]
    if params and len(params) == len(written):
        return ("updates %d parameter%s in place%s: each one's version goes up, so a graph made before this "
                "step that saved it cannot run backward any more" % (
                    len(params), "" if len(params) == 1 else "s",
                    " (an optimizer step)" if any(o.name.endswith(".step") for o in ops) else ""))
    if not all(o.grad_enabled for o in ops):
        return "runs with gradients off (torch.no_grad): what it makes has no grad_fn"
    return ""
