"""graph-cut, reason `starved`: a term of a loss that gives the optimizer step after its backward
nothing, though its value was computed from what that step updates.

The principle. A loss is a sum of terms (what reaches the tensor backward starts from through sums,
means, views and products with a constant). After `loss.backward()`, the optimizer steps that run
before the next backward update a set of parameters (each step is one op whose writes are the
parameters it moved). A term whose graph reaches none of those parameters changes none of their
gradients: for that step it is a constant. When that term's value was computed from those very
parameters, and a cut on the way dropped the graph that linked them (`.detach()`, `.data`, a
`.item()` / `.numpy()` round trip, an op run with grad off on a tensor that had a graph), the cut
starves the step: without it, the term would train them. Other terms may keep the loss connected
(an entropy bonus, a reconstruction term), so PyTorch raises nothing.

What stays quiet, by the same principle: a detached baseline or target inside a term that still
trains the step (`logp * (R - V).detach()`, `mse(q, target.detach())`, SimSiam's stop-gradient, PPO's
ratio, truncated BPTT's carried state); a detached value of what the step does not update (a GAN's
fake batch in the discriminator's step, target networks, EMA teachers, reference models); a term
whose graph the step's parameters still reach. A value computed with no graph from the start (a
no-grad forward of the trained model: a rollout, an old policy's log-probs) drops no graph: it is a
snapshot by design as often as not, and is not judged here. Nor is a Python number added to the
loss: the capture records the tensors an op was given, not the numbers.

Named at the cut, placed as graph-cut places a cut (cut_place.place_cut): where grad was switched off,
the grad-off block's call, a grad-off decorator."""
from __future__ import annotations

import bisect
import re
from typing import Dict, List, Optional, Set, Tuple

from ...model import OpRecord, TraceData
from ...model.queries import FunctionCalls, exit_before, is_exit, made_from_values, node_at, reachable
from ...source.statements import added_names, assigned_name
from ..findings import Finding, Words
from ..fixes import NO_ONE_LINE_FIX, REPLACE, code, line_ref
from ..wording import words
from .common import ADDS, STOP_GRADIENT, backward_checkpoints
from .cut_place import cut_fix, place_cut, where_at, why_cut

# Ops whose result is a sum of their tensor inputs' elements (or a part of them): a term passes
# through them unchanged in kind.
_SUMS = ADDS | {
         "sum", "mean", "nansum", "neg", "neg_", "__neg__", "cat", "concat", "concatenate", "stack", "hstack", "vstack",
         "squeeze", "unsqueeze", "view", "view_as", "reshape", "reshape_as", "flatten", "expand", "expand_as",
         "__getitem__", "select", "narrow", "t", "transpose", "permute", "contiguous", "clone", "float", "double",
         "to", "movedim", "sum_to_size"}
# Products: linear in one operand when the other does not require grad (a weight, a coefficient).
_PRODUCTS = {"mul", "mul_", "__mul__", "__rmul__", "__imul__", "multiply"}
# Quotients: linear in the numerator when the divisor does not require grad.
_QUOTIENTS = {"div", "div_", "__truediv__", "__itruediv__", "true_divide", "divide"}
# Sums that may have had a Python number as an operand (recorded with one tensor input).
_NUMBER_SUMS = ADDS - {"rsub"}
_BACKWARDS = {"Tensor.backward", "torch.autograd.backward"}
_FLOATS = ("float", "bfloat16", "complex")  # dtypes are recorded as float16/32/64
_MAX_TERMS = 64


def starved_terms(trace: TraceData, source, taken: Set[Tuple[Optional[str], Optional[int]]],
                  judged_backwards: Set[int]) -> List[Finding]:
    """The starving cuts of the block's backward calls (see the module's doc). `taken`: lines other
    graph-cut findings name; `judged_backwards`: backward calls another graph-cut finding explains."""
    view = _View(trace, source)
    out, judged, clean = [], set(taken), set()
    checkpoints = {cp.op_index: cp for cp in backward_checkpoints(trace)}
    for backward in _judged(trace):
        if backward.error is not None or backward.name not in _BACKWARDS or backward.index in judged_backwards \
                or not backward.inputs:
            continue
        cp = checkpoints.get(backward.index)
        if cp is None or not cp.roots or cp.inputs:
            continue
        steps = view.steps_after(backward)
        trained = {t for step in steps for t in step.writes if _is_parameter(trace, t)}
        if not trained:
            continue
        since = view.previous_step(backward, trained)
        for term, at, graph, number in view.terms(backward.inputs[0], backward.index, since):
            if graph is not None and view.reaches(graph, trained):
                continue  # the term trains the step
            place = (_line(backward), _line(view.maker(term, at)), _line(number[0]) if number else None)
            if place in clean:
                continue  # judged already: an earlier iteration of the loop that runs these lines
            cut = view.cut(term, at, trained, since, backward.index, number[0] if number else None)
            clean.add(place)
            if cut is None:
                continue
            cut_op, starved = cut
            if _line(cut_op) in clean:
                continue  # this cut was named at an earlier iteration
            clean.add(_line(cut_op))
            op, at, facts = place_cut(trace, source, cut_op)
            where = at if at is not None else op.location
            line = (where.filename, where.line) if where is not None else (None, None)
            if line in judged:
                continue  # the same cut, met again by the next iteration of a loop, or named already
            judged.add(line)
            carried = next((t for t in cut_op.inputs if view.node(t, cut_op.index) is not None), term)
            named = next((t for t in cut_op.outputs if trace.tensors.get(t) is not None and trace.tensors[t].name), None)
            if not (trace.tensors.get(carried) is not None and trace.tensors[carried].name) and named is not None:
                carried = named  # the value the cut made, by the name the user gave it
            facts.update(backward=backward, steps=steps, starved=sorted(starved), number=number,
                         others=sorted(view.leaves(graph) - trained) if graph is not None else [],
                         stale=_stale(trace, view, cut_op, backward, since))
            out.append(Finding("graph-cut", "starved", op=op, at=at, subject=carried,
                               tids=(carried, term, backward.inputs[0]), facts=facts))
    return out


class _View:
    """What the rule reads of the trace, each once: the ops that made or wrote each tensor, whether
    a tensor required grad and which node it had before a given op, the leaves a node reaches."""

    def __init__(self, trace: TraceData, source=None):
        self.trace, self.source = trace, source
        self.makers: Dict[int, List[int]] = {}
        for op in trace.ops:
            if op.is_backward:
                continue
            for t in dict.fromkeys(op.outputs + op.writes):
                self.makers.setdefault(t, []).append(op.index)
        self.reached: Dict[int, Set[int]] = {}
        self.calls = FunctionCalls(trace)
        self.steps = [op.index for op in trace.ops if _is_step(op)]
        self.backwards = [op.index for op in trace.ops if op.is_backward]

    def steps_after(self, backward: OpRecord) -> List[OpRecord]:
        """The optimizer steps that use the gradients of a backward call: from the first step after it
        up to the next backward call after that step (several backward calls may feed one step)."""
        i = bisect.bisect_right(self.steps, backward.index)
        if i == len(self.steps):
            return []
        j = bisect.bisect_right(self.backwards, self.steps[i])
        end = self.backwards[j] if j < len(self.backwards) else len(self.trace.ops)
        return [self.trace.ops[k] for k in self.steps[i:bisect.bisect_left(self.steps, end)]]

    def previous_step(self, backward: OpRecord, trained: Set[int]) -> int:
        """The index of the last step before `backward` that moved any of `trained` (-1 if none): a
        graph built before it was built from their old values."""
        for k in reversed(self.steps[:bisect.bisect_left(self.steps, backward.index)]):
            if any(t in trained for t in self.trace.ops[k].writes):
                return k
        return -1

    def maker(self, tid: int, before: int) -> Optional[OpRecord]:
        """The last op before `before` that made or wrote `tid`."""
        indices = self.makers.get(tid, [])
        i = bisect.bisect_left(indices, before)
        return self.trace.ops[indices[i - 1]] if i else None

    def node(self, tid: int, before: int) -> Optional[int]:
        """The grad_fn (or, for a leaf that requires grad, its AccumulateGrad) of `tid` just before op
        `before`; None when it did not require grad then (queries.node_at, backward calls aside)."""
        return node_at(self.trace, tid, before, self.makers)

    def reaches(self, node: int, targets: Set[int]) -> bool:
        """Whether the graph from `node` reaches the AccumulateGrad of one of the leaves `targets`."""
        nodes, seen, stack = self.trace.nodes, set(), [node]
        while stack:
            key = stack.pop()
            if key in seen:
                continue
            seen.add(key)
            record = nodes.get(key)
            if (record is not None and record.variable in targets) or (key < 0 and -1 - key in targets):
                return True
            if record is not None:
                stack.extend(k for k in record.inputs if k not in seen)
        return False

    def leaves(self, node: Optional[int]) -> Set[int]:
        """The leaves (tids) whose AccumulateGrad the graph from `node` reaches."""
        if node is None:
            return set()
        if node not in self.reached:
            nodes = self.trace.nodes
            self.reached[node] = {nodes[k].variable for k in reachable(self.trace, [node])
                                  if nodes[k].variable is not None}
            if node < 0 and node not in nodes:
                self.reached[node].add(-1 - node)
        return self.reached[node]

    def terms(self, root: int, before: int, since: int):
        """(tensor, the op index it is read at, its node or None, None) for each term of the sum that
        reaches `root` just before op `before`; for a Python number added to it, (the tensor it was
        taken out of, the index of the op that took it out, None, (that op, the op that added it))."""
        stack, seen, found = [(root, before)], set(), 0
        while stack and found < _MAX_TERMS:
            tid, at = stack.pop()
            if (tid, at) in seen or not _is_float(self.trace, tid):
                continue
            seen.add((tid, at))
            node = self.node(tid, at)
            op = self.maker(tid, at)
            inner = _linear_operands(self.trace, self, op, at) if op is not None else None
            if inner is None:
                found += 1
                yield tid, at, node, None
                continue
            stack.extend((t, op.index) for t in inner)
            if op.name.rpartition(".")[2] in _NUMBER_SUMS and len(op.inputs) == 1:
                for exit_op in self.numbers_added(op, since):
                    found += 1
                    yield exit_op.inputs[0], exit_op.index, None, (exit_op, op)

    def numbers_added(self, op: OpRecord, since: int) -> List[OpRecord]:
        """For a sum with one tensor operand (`loss = l1 + adv`, `adv` a Python number): the ops that took
        out the numbers its other operands name, each the latest op since op `since`, in the same
        function, that took values out of a tensor (`.item()`, `float()`) in a statement assigning that
        name (`adv = adv_loss.detach().item()`). The capture records the tensors an op was given, not
        its numbers: the source links them."""
        if self.source is None or op.location is None:
            return []
        names = added_names(self.source.text(op.location))
        where = op.location.function_key
        found = []
        for name in names:
            for other in reversed(self.trace.ops[since + 1:op.index]):
                at = other.location
                if not is_exit(other) or not other.inputs or at is None or at.function_key != where:
                    continue
                if assigned_name(self.source.text(at)) == name:
                    found.append(other)
                    break
        return found

    def cut(self, term: int, at: int, trained: Set[int], since: int, backward: int,
            exit_op: Optional[OpRecord] = None):
        """(the cut, the trained parameters its input's graph reaches) on the term's history since op
        `since`: the last op on a floating-point path to the term that dropped a graph reaching
        `trained`, which no backward call before `backward` ran; None when there is none. `exit_op`:
        the op that took the term's values out as Python numbers, a cut itself."""
        trace = self.trace
        found, cuts = {term}, ([exit_op] if exit_op is not None and self._drops(exit_op) else [])
        for op in reversed(trace.ops[since + 1:at]):
            if op.is_backward or not any(t in found for t in op.outputs + op.writes):
                continue
            if self._drops(op):
                cuts.append(op)
            floats = [t for t in op.inputs if _is_float(trace, t)]
            found.update(floats)
            made = made_from_values(trace, op)
            if made is not None:  # a tensor made from Python numbers: the op that took them out
                exit_op = exit_before(trace, op, made)
                if exit_op is not None and exit_op.index > since:
                    found.update(t for t in exit_op.inputs if _is_float(trace, t))
                    if self._drops(exit_op):
                        cuts.append(exit_op)
        for op in sorted(cuts, key=lambda o: -o.index):
            starved: Set[int] = set()
            for t in op.inputs:
                node = self.node(t, op.index)
                if node is None or node < 0 or _ran_before(trace, node, backward):
                    continue
                starved |= self.graph_leaves(t, op.index, since) & trained
            if starved:
                return op, starved
        return None

    def graph_leaves(self, tid: int, before: int, since: int) -> Set[int]:
        """The leaves that requires grad which the graph of `tid` (just before op `before`) reaches,
        read from the ops that built it since op `since`: a graph that a cut dropped is no longer
        reachable from anything the capture walks, but the ops that made it were recorded."""
        found, leaves = {tid}, set()
        for op in reversed(self.trace.ops[since + 1:before]):
            if op.is_backward or op.node is None or not any(t in found for t in op.outputs + op.writes):
                continue
            for t in op.inputs:
                if t not in found and self.node(t, op.index) is not None:
                    found.add(t)
        leaves.update(t for t in found if _is_parameter(self.trace, t))
        return leaves

    def _drops(self, op: OpRecord) -> bool:
        """A cut that can be taken away: `.detach()`, `.data`, a value taken out as Python numbers, an op
        run with grad off (not inside a custom Function's forward, which the call runs so)."""
        short = op.name.rpartition(".")[2]
        if short in STOP_GRADIENT or is_exit(op):
            return True
        return not op.grad_enabled and bool(op.outputs) and self.calls.enclosing(op) is None


def _linear_operands(trace: TraceData, view: _View, op: OpRecord, at: int) -> Optional[List[int]]:
    """The operands a term made by `op` is a sum of (with constant weights), or None when `op` is no
    such sum."""
    short = op.name.rpartition(".")[2]
    inputs = [t for t in op.inputs if _is_float(trace, t)]
    needs = [t for t in inputs if view.node(t, op.index) is not None]
    if short in _SUMS:
        return inputs
    if short in _PRODUCTS:
        return needs if len(needs) == 1 else None
    if short in _QUOTIENTS:
        return inputs[:1] if inputs and (len(inputs) == 1 or inputs[1] not in needs) else None
    return None


def _judged(trace: TraceData) -> List[OpRecord]:
    """The backward calls to judge: of the calls at one line (a training loop's), the first two and the
    last, as the iterations of a loop run the same code; all the others, where the loop changed
    nothing, would cost as much again each."""
    by_line: Dict[tuple, List[OpRecord]] = {}
    for op in trace.ops:
        if op.is_backward:
            by_line.setdefault(_line(op), []).append(op)
    picked = {op.index: op for calls in by_line.values() for op in calls[:2] + calls[-1:]}
    return [picked[i] for i in sorted(picked)]


def _line(op: Optional[OpRecord]):
    return (op.name, op.location.filename, op.location.line) if op is not None and op.location else None


def _is_step(op: OpRecord) -> bool:
    """A torch.optim optimizer's step, recorded as one op (`Adam.step`) whose writes are what it moved."""
    return op.name.endswith(".step") and not op.name.startswith(("torch.", "Tensor.", "F.")) \
        and not op.outputs and not op.is_backward


def _is_parameter(trace: TraceData, tid: int) -> bool:
    info = trace.tensors.get(tid)
    return info is not None and info.is_leaf and info.first_requires_grad


def _is_float(trace: TraceData, tid: int) -> bool:
    info = trace.tensors.get(tid)
    return info is not None and info.dtype.startswith(_FLOATS)


def _ran_before(trace: TraceData, node: int, backward: int) -> bool:
    """Whether a backward call before `backward` ran the node (its gradient was already delivered:
    a carried state detached after its chunk's backward)."""
    record = trace.nodes.get(node)
    return record is not None and any(i < backward for i in record.consumed_by)


def _stale(trace: TraceData, view: _View, cut: OpRecord, backward: OpRecord, since: int) -> Optional[OpRecord]:
    """The step, between the cut and the backward call, that moved parameters the cut's input was
    computed from: without the cut, backward would run into their old values and raise."""
    used: Set[int] = set()
    for t in cut.inputs:
        used |= view.graph_leaves(t, cut.index, since)
    return next((trace.ops[k] for k in view.steps if cut.index < k < backward.index and used & set(trace.ops[k].writes)),
                None)


# -- words ------------------------------------------------------------------------------------------

@words("starved")
def _starved(trace: TraceData, f: Finding) -> Words:
    facts, op = f.facts, f.op
    backward, steps = facts["backward"], facts["steps"]
    tensor = trace.tensor_label(f.subject)
    loss = _short(trace.tensor_label(backward.inputs[0]) if backward.inputs else "loss")
    one = len(steps) == 1
    stepped = _listing(["`%s` on %s" % (_step_call(s), line_ref(s)) for s in steps])
    starved = _listing(["`%s`" % trace.tensor_label(t) for t in facts["starved"]])
    if facts["others"]:
        reaches = "reaches only %s, which %s not update" % (
            _listing(["`%s`" % trace.tensor_label(t) for t in facts["others"]]), "that step does" if one else "those steps do")
    else:
        reaches = "has no graph at all"
    if _draws(f):
        cut = ("%s draws its sample under `torch.no_grad()`, as `.sample()` of a torch.distributions distribution "
               "does: the sample has no history" % where_at(op, f.at))
    else:
        cut = "%s cut `%s` off its graph: %s" % (where_at(op, f.at), tensor, why_cut(facts))
    message = ("%s. The term of `%s` made from it %s: for %s, which %s `%s.backward()` on "
               "%s, that term is a constant and changes no gradient. Yet its value was computed from %s, which %s "
               "updates: without the cut, the term would train %s too. PyTorch raises nothing, because the other "
               "terms of `%s` keep it connected; the %s %s by those terms alone." % (
                   cut, loss, reaches, stepped, "follows" if one else "follow",
                   loss, line_ref(backward), starved, "that step" if one else "those steps",
                   "them" if len(facts["starved"]) > 1 else "it", loss, "step trains" if one else "steps train",
                   "them" if len(facts["starved"]) > 1 else "it"))
    return Words(message, _fix(trace, f), tensor, tuple(trace.tensor_label(t) for t in facts["starved"][:8]))


def _fix(trace: TraceData, f: Finding) -> str:
    facts, op = f.facts, f.op
    stale = facts["stale"]
    if stale is not None:
        return ("%s taking the cut away alone would make backward() raise: `%s` on %s updates, in place, parameters "
                "that value was computed with, before `%s.backward()` runs. Compute the term after that step (run the "
                "forward that makes it again, then the loss), or move `%s` after this backward." % (
                    NO_ONE_LINE_FIX, _step_call(stale), line_ref(stale),
                    _short(trace.tensor_label(facts["backward"].inputs[0])), _step_call(stale)))
    src = op.location.source if op.location else ""
    if facts["number"] is not None or is_exit_in(src):
        added = facts["number"][1] if facts["number"] is not None else None
        kept = "where it is added to the loss%s" % (" (%s)" % line_ref(added) if added is not None else "")
        return ("%s keep the term a tensor %s, and take its value out (`.item()`) only where it is reported "
                "or kept: a number added to a loss is a constant, and a tensor kept with its graph holds that "
                "graph alive." % (NO_ONE_LINE_FIX, kept))
    if _draws(f):
        return ("Draw the sample with the reparameterization trick, so that its value keeps the graph of the "
                "distribution's parameters. %s\n%s" % (REPLACE, code(src.replace(".sample(", ".rsample("))))
    fix = cut_fix(op, facts["why"], facts)
    replaced = fix.split("\n", 1)[1].strip() if REPLACE in fix else None
    if replaced is not None and _assigns_itself(replaced):
        return "Delete the culprit line: it only cuts the chain, and `%s` keeps its graph without it." % \
            replaced.split("=", 1)[0].strip()
    return fix + ("\nIf the term is only meant to be reported, it has no place in the loss: log its `.item()` "
                  "instead." if REPLACE in fix else "")


def is_exit_in(src: str) -> bool:
    """The line takes values out as Python numbers (`.item()`, `.tolist()`, `float(...)`) and keeps them."""
    return any(call in src for call in (".item()", ".tolist()")) or re.search(r"(?<![\w.])float\(", src) is not None


def _draws(f: Finding) -> bool:
    """The cut is a distribution's `.sample()`, which draws under no_grad (`rsample()` keeps the graph)."""
    src = f.op.location.source if f.op.location else ""
    return not f.op.grad_enabled and f.at is None and src.count(".sample(") == 1


def _assigns_itself(statement: str) -> bool:
    target, _, value = statement.partition("=")
    return bool(value) and target.strip() == value.strip() and target.strip().isidentifier()


def _step_call(step: OpRecord) -> str:
    src = step.location.source if step.location else ""
    return src if src.endswith(".step()") and " " not in src else step.name + "()"


def _short(label: str) -> str:
    return label if label.isidentifier() or all(p.isidentifier() for p in label.split(".")) else "loss"


def _listing(items: List[str]) -> str:
    items = list(dict.fromkeys(items))
    shown = items[:6]
    more = " and %d more" % (len(items) - 6) if len(items) > 6 else ""
    if len(shown) <= 1:
        return (shown[0] if shown else "") + more
    return ", ".join(shown[:-1]) + (" and " if not more else ", ") + shown[-1] + more
