"""Random training programs with structure, for tests/test_differential_structure.py.

A program is a small training script: a module (`Net`: enc -> tanh -> head, with a buffer), an
optimizer, a loop of 1-4 iterations, run at top level, through a `train_step` function, a
`Trainer` class or a `train()` function, plus at most one *feature* that may break autograd:

- write: an in-place write (method, `+=`, setitem, `out=`, `inplace=True`, `.data`, `.data =`,
  a write into one of several views) to an input, an activation, the output, a buffer or a
  parameter, guarded or not (no_grad, `.detach()`, `.data`), kept in a local, an attribute, a
  list, a dict, a helper object, written inline, in a closure, a helper function or method;
- cut: `.detach()`, `.data`, no_grad, set_grad_enabled (context, helpers, left off), inference
  mode, `.tolist()`/`.item()`/NumPy round trips, integer casts, comparisons, argmax indices, on
  the encoder, the output or the loss, or a helper that leaves grad mode off;
- accumulate: the loss kept across iterations by a local, an attribute, a list, a dict, a helper
  object or a closure, with or without `.item()`/`.detach()`;
- carry: a state carried across iterations (attribute, dict, list, helper), detached or not;
- backward: two backward calls, retain_graph, an optimizer step between forward and backward;
- loss: a per-element loss (`reduction="none"`) and what is done with it;
- function: a custom autograd.Function whose backward returns the right or a wrong gradient, a
  tensor hook that returns the right or a wrong shape, a quantizer with or without a derivative.

Whether the feature breaks anything is not decided here: the oracles in structure_judge.py
decide, from plain PyTorch. The generator only says which lines would be the right culprit
for each kind (`Line.kinds`), and describes itself (`Program.description`): every choice is
made through a Chooser, which records it, so a failing program prints what it is made of.
Choices list their simplest option first: hypothesis shrinks towards it.
"""
from __future__ import annotations

import bisect
import random
from dataclasses import dataclass
from typing import Dict, List, Optional, Sequence, Tuple

# ----------------------------------------------------------------------------------------------
# Choosing


class Chooser:
    """Makes every random choice of the generator and records it under a label."""

    def __init__(self):
        self.description: Dict[str, object] = {}

    def _index(self, n: int, weights: Optional[Sequence[int]]) -> int:
        raise NotImplementedError

    def choose(self, label: str, options: Sequence, weights: Optional[Sequence[int]] = None):
        value = options[self._index(len(options), weights)]
        self.description[label] = value
        return value

    def integer(self, label: str, low: int, high: int) -> int:
        return self.choose(label, list(range(low, high + 1)))


class RandomChooser(Chooser):
    def __init__(self, rng: random.Random):
        super().__init__()
        self.rng = rng

    def _index(self, n, weights):
        if weights is None:
            return self.rng.randrange(n)
        return self.rng.choices(range(n), weights=weights)[0]


class DrawChooser(Chooser):
    """Choices drawn by hypothesis: an integer per choice, so shrinking moves to the first option.
    `forced` fixes the value of some labels (the family of a class of disagreements)."""

    def __init__(self, draw, forced: Optional[Dict[str, object]] = None):
        super().__init__()
        self.draw = draw
        self.forced = forced or {}

    def choose(self, label: str, options: Sequence, weights: Optional[Sequence[int]] = None):
        if label in self.forced:
            self.description[label] = self.forced[label]
            return self.forced[label]
        return super().choose(label, options, weights)

    def _index(self, n, weights):
        from hypothesis import strategies as st
        if weights is None:
            return self.draw(st.integers(0, n - 1))
        cumulative = []
        total = 0
        for w in weights:
            total += w
            cumulative.append(total)
        return bisect.bisect_right(cumulative, self.draw(st.integers(0, total - 1)))


# ----------------------------------------------------------------------------------------------
# Lines and programs


@dataclass(frozen=True)
class Line:
    indent: int
    text: str
    kinds: frozenset = frozenset()   # the diagnosis kinds this line is a right culprit for
    reference: Optional[str] = None  # its text in the reference run (a `.data =` swap as a copy)
    observed_only: bool = False      # a probe: only in the observed run


def L(text: str, *kinds: str, indent: int = 0, reference: Optional[str] = None) -> Line:
    return Line(indent, text, frozenset(kinds), reference)


def shift(lines: List[Line], by: int) -> List[Line]:
    return [Line(l.indent + by, l.text, l.kinds, l.reference, l.observed_only) for l in lines]


def tag(lines: List[Line], *kinds: str) -> List[Line]:
    return [Line(l.indent, l.text, l.kinds | frozenset(kinds), l.reference, l.observed_only) for l in lines]


@dataclass
class Program:
    lines: List[Line]
    description: Dict[str, object]

    def source(self, variant: str = "plain") -> str:
        """plain: the program; reference: `.data =` swaps become copies; observed: with probes."""
        out = []
        for line in self.lines:
            if line.observed_only and variant != "observed":
                continue
            text = line.reference if variant == "reference" and line.reference is not None else line.text
            out.append("    " * line.indent + text if text else "")
        return "\n".join(out) + "\n"

    def culprit_lines(self, kind: str) -> set:
        numbers, n = set(), 0
        for line in self.lines:
            if line.observed_only:
                continue
            n += 1
            if kind in line.kinds:
                numbers.add(n)
        return numbers

    def listing(self) -> str:
        return "\n".join("%3d  %s" % (i, text) for i, text in enumerate(self.source().splitlines(), 1))

    def summary(self) -> str:
        return ", ".join("%s=%s" % (k, v) for k, v in self.description.items())

    def __repr__(self) -> str:
        return "Program(%s)\n%s" % (self.summary(), self.listing())

    def _repr_pretty_(self, printer, cycle) -> None:  # what hypothesis prints for a falsifying example
        printer.text(repr(self))


# ----------------------------------------------------------------------------------------------
# The skeleton: where each feature puts its lines

WRITE_KINDS = ("leaf-inplace", "saved-tensor-modified", "view-inplace", "silent-data-mutation")
CUT_KINDS = ("graph-cut", "missing-grad", "inference-tensor-saved")

# Shapes of the tensors a feature can write, for the spellings that index.
SHAPES = {"x": 2, "z": 2, "h": 2, "out": 2, "scale": 1, "enc.weight": 2, "head.weight": 2, "head.bias": 1}
MADE_IN_FORWARD = ("z", "h", "out")
PARAMETERS = ("head.weight", "enc.weight", "head.bias")


class Skeleton:
    """The program around the feature. Features add lines at named anchors, replace a base
    statement (`replace`), add helper classes and functions (`helper`), lines to Net.__init__
    (`init`), to the Trainer's __init__ (`trainer_init`) or after the model is built (`setup`)."""

    def __init__(self, c: Chooser):
        self.driver = c.choose("driver", ["toplevel", "step function", "trainer class", "train function"])
        self.iterations = c.integer("iterations", 1, 4)
        self.optimizer = c.choose("optimizer", ["SGD", "SGD momentum", "Adam"])
        self.batch = c.choose("data", ["tensors", "batch dict"]) == "batch dict"
        self.zero_grad = c.choose("zero_grad", ["before forward", "before backward", "after step"])
        self.loss_spelling = c.choose("loss", ['F.mse_loss', '(out - y) ** 2', 'nn.MSELoss'])
        self.extras = c.choose("extras", ["none", "item metric", "no_grad validation", "validation with grad"])
        self.anchors: Dict[str, List[Line]] = {}
        self.replaced: Dict[str, List[Line]] = {}
        self.helpers: Dict[str, List[Line]] = {}
        self.init: List[Line] = []
        self.trainer_init: List[Line] = []
        self.setup: List[Line] = []
        self.loop_setup: List[Line] = []
        self.backward_kwargs = ""
        self.out_ref = "out"  # how the step reads the model's output after the forward

    # -- where things are, seen from a place ("forward", "step", "loop") --
    @property
    def inside_function(self) -> Dict[str, bool]:
        return {"forward": True, "step": self.driver != "toplevel", "loop": self.driver == "train function"}

    def model(self, place: str) -> str:
        if place == "forward":
            return "self"
        if place == "step" and self.driver == "trainer class":
            return "self.model"
        return "model"

    def opt(self, place: str) -> str:
        if self.driver == "trainer class":
            return "self.opt" if place == "step" else "trainer.opt"
        return "opt"

    def owner(self, place: str) -> Optional[str]:
        """The object a step keeps things on (`self` in a Trainer), or None."""
        return "self" if place == "step" and self.driver == "trainer class" else None

    def x(self, place: str) -> str:
        return 'batch["x"]' if self.batch and place != "forward" else "x"

    def y(self) -> str:
        return 'batch["y"]' if self.batch else "y"

    # -- adding --
    def add(self, anchor: str, lines: List[Line]) -> None:
        self.anchors.setdefault(anchor, []).extend(lines)

    def replace(self, statement: str, lines: List[Line]) -> None:
        self.replaced[statement] = lines

    def helper(self, name: str, lines: List[Line]) -> None:
        self.helpers.setdefault(name, lines)

    # -- rendering --
    def _at(self, anchor: str, indent: int) -> List[Line]:
        return shift(self.anchors.get(anchor, []), indent)

    def _statement(self, name: str, default: List[Line], indent: int) -> List[Line]:
        return shift(self.replaced.get(name, default), indent)

    def _optimizer(self, params: str) -> str:
        return {"SGD": "torch.optim.SGD(%s, lr=0.1)" % params,
                "SGD momentum": "torch.optim.SGD(%s, lr=0.1, momentum=0.9)" % params,
                "Adam": "torch.optim.Adam(%s, lr=0.01)" % params}[self.optimizer]

    def loss_expr(self, out: str) -> str:
        y = self.y()
        return {"F.mse_loss": "F.mse_loss(%s, %s)" % (out, y),
                "(out - y) ** 2": "((%s - %s) ** 2).mean()" % (out, y),
                "nn.MSELoss": "criterion(%s, %s)" % (out, y)}[self.loss_spelling]

    def step_body(self, indent: int) -> List[Line]:
        m, o = self.model("step"), self.opt("step")
        zero = [L("%s.zero_grad()" % o)]
        body = self._at("step.start", indent)
        if self.zero_grad == "before forward":
            body += shift(zero, indent)
        body += self._statement("step.forward", [L("out = %s(%s)" % (m, self.x("step")))], indent)
        body += self._at("step.after_forward", indent)
        body += self._statement("step.loss", [L("loss = %s" % self.loss_expr(self.out_ref))], indent)
        body += self._at("step.after_loss", indent)
        if self.zero_grad == "before backward":
            body += shift(zero, indent)
        body += self._statement("step.backward", [L("loss.backward(%s)" % self.backward_kwargs)], indent)
        body += self._at("step.after_backward", indent)
        body += self._statement("step.step", [L("%s.step()" % o)], indent)
        body += self._at("step.after_step", indent)
        if self.zero_grad == "after step":
            body += shift(zero, indent)
        return body

    def render(self) -> List[Line]:
        lines = [L("import torch"), L("import torch.nn as nn"), L("import torch.nn.functional as F")]
        for helper in self.helpers.values():
            lines += [L(""), L("")] + helper
        lines += [L(""), L(""), L("class Net(nn.Module):"),
                  L("def __init__(self):", indent=1),
                  L("super().__init__()", indent=2),
                  L("self.enc = nn.Linear(3, 4)", indent=2),
                  L("self.head = nn.Linear(4, 2)", indent=2),
                  L('self.register_buffer("scale", torch.full((2,), 1.5))', indent=2)]
        lines += shift(self.init, 2)
        lines += [L(""), L("def forward(self, x):", indent=1)]
        lines += self._at("forward.start", 2)
        lines += self._statement("forward.z", [L("z = self.enc(x)")], 2)
        lines += self._at("forward.after_z", 2)
        lines += self._statement("forward.h", [L("h = torch.tanh(z)")], 2)
        lines += self._at("forward.after_h", 2)
        lines += self._statement("forward.out", [L("out = self.head(h) * self.scale")], 2)
        lines += self._at("forward.after_out", 2)
        lines += [L("return out", indent=2)]

        data = ["x = torch.linspace(-1.0, 1.0, 6).reshape(2, 3) + 0.1 * step",
                "y = torch.linspace(0.0, 1.0, 4).reshape(2, 2)"]
        if self.batch:
            data = ['batch = {"x": torch.linspace(-1.0, 1.0, 6).reshape(2, 3) + 0.1 * step,',
                    '         "y": torch.linspace(0.0, 1.0, 4).reshape(2, 2)}']
        args = "batch" if self.batch else "x, y"
        if self.driver == "step function":
            lines += [L(""), L(""), L("def train_step(model, opt, %s):" % args)] + self.step_body(1)
            lines += [L("return loss", indent=1)]
            step_call = [L("loss = train_step(model, opt, %s)" % args)]
        elif self.driver == "trainer class":
            lines += [L(""), L(""), L("class Trainer:"), L("def __init__(self, model):", indent=1),
                      L("self.model = model", indent=2),
                      L("self.opt = %s" % self._optimizer("model.parameters()"), indent=2)]
            lines += shift(self.trainer_init, 2)
            lines += [L(""), L("def step(self, %s):" % args, indent=1)] + self.step_body(2)
            lines += [L("return loss", indent=2)]
            step_call = [L("loss = trainer.step(%s)" % args)]
        else:
            step_call = None  # the step is written out in the loop

        extras = {"none": [],
                  "item metric": [L("losses.append(loss.item())")],
                  "no_grad validation": [L("with torch.no_grad():"),
                                         L("val = model(%s).mean().item()" % self.x("loop"), indent=1)],
                  "validation with grad": [L("val = model(%s).mean().item()" % self.x("loop"))]}[self.extras]

        def loop(indent: int) -> List[Line]:
            body = [L("for step in range(%s):" % ("steps" if self.driver == "train function" else self.iterations))]
            body += [L(text, indent=1) for text in data]
            body += shift(step_call, 1) if step_call else self.step_body(1)
            body += self._at("loop.end", 1) + shift(extras, 1)
            body.append(Line(1, "_probe(locals())", observed_only=True))
            return shift(body, indent)

        loop_setup = list(self.loop_setup) + ([L("losses = []")] if self.extras == "item metric" else [])
        if self.driver == "train function":
            lines += [L(""), L(""), L("def train(model, opt, steps):")] + shift(loop_setup, 1) + loop(1)
            lines += [L("return loss", indent=1)]
        lines += [L(""), L(""), L("model = Net()")]
        if self.driver == "trainer class":
            lines += [L("trainer = Trainer(model)")]
        else:
            lines += [L("opt = %s" % self._optimizer("model.parameters()"))]
        if self.loss_spelling == "nn.MSELoss":
            lines += [L("criterion = nn.MSELoss()")]
        lines += self.setup
        if self.driver == "train function":
            lines += [L("loss = train(model, opt, %d)" % self.iterations)]
        else:
            lines += loop_setup + loop(0)
        return lines


# ----------------------------------------------------------------------------------------------
# Where a tensor lives


def keep_made(sk: Skeleton, c: Chooser, label: str, name: str, place: str, storages: Sequence[str]):
    """How a tensor made at `place` is kept: returns (assignment prefix wrapper, ref for later
    lines at the same place, ref from the step, storage). `assign(expr)` gives the statement."""
    storage = c.choose(label, list(storages))
    owner = "self" if place == "forward" else sk.owner(place)
    m = sk.model("step")
    if storage == "local":
        return (lambda e: "%s = %s" % (name, e)), name, None, storage
    if storage == "attribute":
        if owner is None:
            sk.helper("Store", [L("class Store:"), L("pass", indent=1)])
            sk.setup.append(L("store = Store()"))
            return (lambda e: "store.%s = %s" % (name, e)), "store." + name, "store." + name, storage
        step_ref = ("%s.%s" % (m, name)) if place == "forward" else "self." + name
        return (lambda e: "%s.%s = %s" % (owner, name, e)), "%s.%s" % (owner, name), step_ref, storage
    if storage == "list":
        if owner is None:
            return (lambda e: "kept = [%s]" % e), "kept[0]", None, storage
        step_ref = ("%s.cache[0]" % m) if place == "forward" else "self.cache[0]"
        return (lambda e: "%s.cache = [%s]" % (owner, e)), "%s.cache[0]" % owner, step_ref, storage
    if storage == "dict":
        if owner is None:
            return (lambda e: 'kept = {"%s": %s}' % (name, e)), 'kept["%s"]' % name, None, storage
        (sk.init if place == "forward" else sk.trainer_init).append(L("self.state = {}"))
        step_ref = ('%s.state["%s"]' % (m, name)) if place == "forward" else 'self.state["%s"]' % name
        return (lambda e: '%s.state["%s"] = %s' % (owner, name, e)), '%s.state["%s"]' % (owner, name), step_ref, storage
    if storage == "global dict":
        sk.setup.append(L("activations = {}"))
        ref = 'activations["%s"]' % name
        return (lambda e: "%s = %s" % (ref, e)), ref, ref, storage
    if storage == "helper object":
        sk.helper("Holder", HOLDER)
        if owner is None:
            sk.setup.append(L("keeper = Holder()"))
            holder = "keeper"
        else:
            (sk.init if place == "forward" else sk.trainer_init).append(L("self.holder = Holder()"))
            holder = owner + ".holder"
        step_holder = ("%s.holder" % m) if place == "forward" else holder
        return (lambda e: "%s = %s.keep(%s)" % (name, holder, e)), holder + ".value", step_holder + ".value", storage
    raise AssertionError(storage)


HOLDER = [L("class Holder:"), L("def __init__(self):", indent=1), L("self.value = None", indent=2), L(""),
          L("def keep(self, t):", indent=1), L("self.value = t", indent=2), L("return t", indent=2)]
STORAGES = ["local", "attribute", "list", "dict", "global dict", "helper object"]


# ----------------------------------------------------------------------------------------------
# Feature: an in-place write

# name -> lines, with {R} for the tensor written, {V} for a view of it, {ACT} for the model's ReLU
SPELLINGS = {
    "add_": ["{R}.add_(0.5)"],
    "mul_": ["{R}.mul_(1.5)"],
    "clamp_": ["{R}.clamp_(-0.1, 0.1)"],
    "zero_": ["{R}.zero_()"],
    "copy_": ["{R}.copy_(torch.full_like({R}, 0.3))"],
    "sigmoid_": ["{R}.sigmoid_()"],
    "+=": ["{R} += 0.5"],
    "setitem row": ["{R}[0] = 2.0"],
    "setitem slice": ["{R}[:, 1] = 2.0"],
    "out=": ["torch.add({R}, 0.5, out={R})"],
    "F.relu(inplace=True)": ["F.relu({R}, inplace=True)"],
    "nn.ReLU(inplace=True)": ["{R} = {ACT}({R})"],
    ".data = (assignment)": ["{R}.data = {R}.data * 1.5"],
    ".data = (new tensor)": ["{R}.data = torch.full_like({R}, 0.3)"],
    "chunk then write": ["{V}, _ = {R}.chunk(2, dim=0)", "{V}.mul_(1.5)"],
    "split then write": ["{V} = {R}.split(1, dim=0)[0]", "{V}.add_(0.5)"],
    "unbind then write": ["{V} = {R}.unbind(0)[0]", "{V}.zero_()"],
    "no_grad view then write": ["with torch.no_grad():", "    {V} = {R}[0]", "{V}.add_(0.5)"],
}
GUARDS = ["none", "torch.no_grad()", ".detach()", ".data"]
NO_GUARD = (".data = (assignment)", ".data = (new tensor)", "chunk then write", "split then write",
            "unbind then write", "no_grad view then write")
TARGETS = ["h", "x", "z", "out", "scale", "head.weight", "enc.weight", "head.bias"]


def write_lines(spelling: str, guard: str, ref: str, act: Optional[str], rank: int) -> List[Line]:
    """The write of `ref`; the line that writes is marked as the culprit of the write kinds."""
    texts = SPELLINGS[spelling]
    if spelling == "setitem slice" and rank == 1:
        texts = ["{R}[1:] = 2.0"]
    target = {"none": ref, "torch.no_grad()": ref, ".detach()": ref + ".detach()", ".data": ref + ".data"}[guard]
    if guard == ".detach()" and spelling == "+=":
        texts = ["alias = {R}", "alias += 0.5"]
    if guard != "none" and spelling == "nn.ReLU(inplace=True)":
        texts = ["{ACT}({R})"]
    lines = []
    for i, text in enumerate(texts):
        body = text.format(R=target, V="part", ACT=act)
        reference = None
        if spelling.startswith(".data ="):
            # The reference run keeps the memory the graph saved: it copies instead of swapping.
            reference = body.replace("%s.data = " % target, "%s.data.copy_(" % target, 1) + ")"
        indent = 1 if body.startswith("    ") else 0
        kinds = WRITE_KINDS if i == len(texts) - 1 else ()
        lines.append(Line(indent, body.strip(), frozenset(kinds), reference))
    if guard == "torch.no_grad()":
        lines = [L("with torch.no_grad():")] + shift(lines, 1)
    return lines


def written_tensor(c: Chooser, sk: Skeleton, target: str, place: str) -> Tuple[str, str, bool]:
    """Sets up where the written tensor lives; returns (how `place` reaches it, where it lives,
    whether it lives in a helper object that can write it itself)."""
    m = sk.model(place)
    if target in MADE_IN_FORWARD and not (target == "out" and place == "step"):
        storages = STORAGES if place == "forward" else [s for s in STORAGES if s != "local"]
        assign, ref_forward, ref_step, storage = keep_made(sk, c, "write.kept in", target, "forward", storages)
        sk.replace("forward." + target, [L(assign(FORWARD[target].split(" = ", 1)[1]))])
        if ref_forward != target and storage != "helper object":  # later lines read it where it is kept
            if target == "out":
                sk.add("forward.after_out", [L("out = %s" % ref_forward)])
            else:
                following = {"z": "h", "h": "out"}[target]
                sk.replace("forward." + following,
                           [L(FORWARD[following].replace("(%s)" % target, "(%s)" % ref_forward, 1))])
        return (ref_forward if place == "forward" else ref_step), storage, storage == "helper object"
    if target == "out":  # the output, kept by the step
        assign, ref, _, storage = keep_made(sk, c, "write.kept in", "out", "step", STORAGES)
        sk.replace("step.forward", [L(assign("%s(%s)" % (sk.model("step"), sk.x("step"))))])
        if storage != "helper object":
            sk.out_ref = ref
        return ref, storage, storage == "helper object"
    if target == "x":
        ref = sk.x(place)
        return ref, "batch dict" if ref != "x" else "local", False
    if target == "scale":
        return "%s.scale" % m, "module buffer", False
    via = c.choose("write.kept in", ["module", "named_parameters dict", "list of parameters"]) \
        if place == "step" else "module"
    if via == "named_parameters dict":
        sk.setup.append(L("params = dict(model.named_parameters())"))
        return 'params["%s"]' % target, via, False
    if via == "list of parameters":
        sk.setup.append(L("weights = [model.enc.weight, model.head.weight, model.head.bias]"))
        return "weights[%d]" % ["enc.weight", "head.weight", "head.bias"].index(target), via, False
    return "%s.%s" % (m, target), via, False


FORWARD = {"z": "z = self.enc(x)", "h": "h = torch.tanh(z)", "out": "out = self.head(h) * self.scale"}


def feature_write(c: Chooser, sk: Skeleton) -> None:
    target = c.choose("write.target", TARGETS, [4, 2, 1, 2, 2, 3, 2, 1])
    place = "forward" if target == "z" else c.choose("write.place", ["forward", "step"])
    if place == "forward":
        anchors = {"x": ["start", "after_z", "after_h", "after_out"], "z": ["after_z", "after_h", "after_out"],
                   "h": ["after_h", "after_out"], "out": ["after_out"]}.get(target, ["after_out", "start", "after_z",
                                                                                      "after_h"])
    else:
        anchors = ["after_loss", "after_forward", "after_backward", "after_step"]
    anchor = c.choose("write.when", anchors)
    spellings = list(SPELLINGS) + ([SWAPPED] if target in PARAMETERS and place == "step" else [])
    spelling = c.choose("write.spelling", spellings, [2 if s.startswith(".data =") else 1 for s in spellings])
    if spelling == SWAPPED:
        return write_swapped(c, sk, target)
    guards = ["none"] if spelling in NO_GUARD else list(GUARDS)
    if spelling == "out=" and target in MADE_IN_FORWARD:
        guards.remove("none")  # out= into a result that requires grad: see the test's docstring
    if "relu" in spelling.lower():
        guards = [g for g in guards if g != ".data"]  # relu may leave the values as they were
    guard = c.choose("write.guard", guards, [{"none": 3, ".data": 3}.get(g, 2) for g in guards])
    act = None
    if spelling == "nn.ReLU(inplace=True)":
        sk.init.append(L("self.act = nn.ReLU(inplace=True)"))
        act = "%s.act" % sk.model(place)

    ref, storage, in_helper = written_tensor(c, sk, target, place)
    c.description["write.kept in"] = storage
    writers = ["inline", "closure"]
    if spelling != "nn.ReLU(inplace=True)":
        writers.append("helper function")
        if in_helper:
            writers.append("helper method")
    writer = c.choose("write.by", writers)
    rank = SHAPES[target]
    lines = write_lines(spelling, guard, ref, act, rank)
    if writer == "closure":
        rebinds = ref.isidentifier() and any(l.text.startswith(ref + " ") for l in lines)
        prelude = [L(("nonlocal %s" if sk.inside_function[place] else "global %s") % ref)] if rebinds else []
        lines = [L("def perturb():")] + shift(prelude + lines, 1) + [L("perturb()")]
    elif writer == "helper function":
        sk.helper("perturb", [L("def perturb(t):")] + shift(write_lines(spelling, guard, "t", act, rank), 1))
        lines = [L("perturb(%s)" % ref)]
    elif writer == "helper method":
        sk.helpers["Holder"] = HOLDER + [L(""), L("def perturb(self):", indent=1)] + shift(
            write_lines(spelling, guard, "self.value", act, rank), 2)
        lines = [L("%s.perturb()" % ref[: -len(".value")])]
    sk.add("%s.%s" % (place, anchor), lines)


SWAPPED = ".data swapped for the forward, restored before backward"
PERTURBED = [L("import contextlib"), L(""), L(""), L("@contextlib.contextmanager"), L("def perturbed(param):"),
             L("backup = param.data", indent=1, reference="backup = param.data.clone()"),
             L("param.data = backup * 1.5", indent=1, reference="param.data.copy_(backup * 1.5)"),
             L("try:", indent=1), L("yield", indent=2), L("finally:", indent=1),
             L("param.data = backup", *WRITE_KINDS, indent=2, reference="param.data.copy_(backup)")]


def write_swapped(c: Chooser, sk: Skeleton, target: str) -> None:
    """A parameter's data swapped for one forward and put back before backward (weight
    perturbation, sharpness-aware steps): the restore changes what the graph saved, silently.
    The reference copies values instead, into a copy of the original."""
    ref, storage, _ = written_tensor(c, sk, target, "step")
    c.description.update({"write.when": "around the forward", "write.kept in": storage})
    if c.choose("write.by", ["inline", "context manager"]) == "inline":
        sk.add("step.start", [L("backup = %s.data" % ref, reference="backup = %s.data.clone()" % ref),
                              L("%s.data = backup * 1.5" % ref, reference="%s.data.copy_(backup * 1.5)" % ref)])
        # After the restore, `backup` is the parameter's own memory again (the step writes it): in the
        # reference too, so that only what the graph read can differ.
        sk.add("step.after_loss", [L("%s.data = backup" % ref, *WRITE_KINDS,
                                     reference="%s.data.copy_(backup); backup = %s.data" % (ref, ref))])
    else:
        sk.helper("perturbed", PERTURBED)
        sk.replace("step.forward", [L("with perturbed(%s):" % ref),
                                    L("out = %s(%s)" % (sk.model("step"), sk.x("step")), indent=1),
                                    L("loss = %s" % sk.loss_expr("out"), indent=1)])
        sk.replace("step.loss", [])


# ----------------------------------------------------------------------------------------------
# Feature: a cut

# name -> lines computing {N} from {E}; every line is a culprit. "idx": the result is an index.
CUTS = {
    ".detach()": ["{N} = {E}.detach()"],
    ".data": ["{N} = {E}.data"],
    "torch.no_grad()": ["with torch.no_grad():", "    {N} = {E}"],
    "set_grad_enabled(False) block": ["with torch.set_grad_enabled(False):", "    {N} = {E}"],
    "set_grad_enabled helpers": ["grad_off()", "{N} = {E}", "grad_on()"],
    "set_grad_enabled left off": ["grad_off()", "{N} = {E}"],
    "inference_mode()": ["with torch.inference_mode():", "    {N} = {E}"],
    "tolist round trip": ["{N} = torch.tensor({E}.tolist())"],
    "tolist in two lines": ["values = {E}.tolist()", "{N} = torch.tensor(values)"],
    "numpy round trip": ["{N} = torch.tensor({E}.detach().numpy())"],
    "from_numpy": ["{N} = torch.from_numpy({E}.detach().cpu().numpy())"],
    "integer cast": ["{N} = ({E} * 3).long().float()"],
    "comparison": ["{N} = ({E} > 0).float()"],
    "argmax index": ["{N} = {E}.argmax(1)"],
    "torch.max index": ["{N} = torch.max({E}, 1)[1]"],
}
LOSS_CUTS = {
    ".detach()": ["{N} = {E}.detach()"],
    ".item() rebuilt": ["{N} = torch.tensor({E}.item())"],
    ".item() rebuilt with requires_grad": ["{N} = torch.tensor({E}.item(), requires_grad=True)"],
    ".detach() then requires_grad = True": ["{N} = {E}.detach()", "{N}.requires_grad = True"],
    "float() rebuilt": ["{N} = torch.tensor(float({E}))"],
    "numpy round trip": ["{N} = torch.tensor({E}.detach().numpy())"],
    ".data": ["{N} = {E}.data"],
}
GRAD_HELPERS = [L("def grad_off():"), L("torch.set_grad_enabled(False)", "graph-cut", "missing-grad",
                                         "inference-tensor-saved", indent=1),
                L(""), L(""), L("def grad_on():"), L("torch.set_grad_enabled(True)", indent=1)]


def cut_lines(spelling: str, table: Dict[str, List[str]], name: str, expr: str, sk: Skeleton) -> List[Line]:
    if "set_grad_enabled helpers" == spelling or "set_grad_enabled left off" == spelling:
        sk.helper("grad_off", GRAD_HELPERS)
    lines = []
    for text in table[spelling]:
        indent = 1 if text.startswith("    ") else 0
        lines.append(L(text.strip().format(N=name, E=expr), *CUT_KINDS, indent=indent))
    return [Line(l.indent, l.text, frozenset() if l.text == "grad_on()" else l.kinds) for l in lines]


# position -> (the tensor cut, the statement it replaces, the expression, the layer and input a
# helper gets, what follows the cut)
CUT_AT = {
    "encoder output": ("z", "forward.z", "self.enc(x)", ("self.enc", "x"), []),
    "hidden": ("h", "forward.h", "torch.tanh(z)", ("torch.tanh", "z"), []),
    "model output": ("out", "forward.out", "self.head(h)", ("self.head", "h"), ["out = out * self.scale"]),
}


def feature_cut(c: Chooser, sk: Skeleton) -> None:
    where = c.choose("cut.where", ["encoder output", "hidden", "model output", "loss", "evaluate helper",
                                   "setup helper"], [3, 4, 2, 3, 2, 1])
    if where in CUT_AT:
        name, statement, expr, (layer, inp), follow = CUT_AT[where]
        spellings = list(CUTS)
        if where == "model output":
            spellings = [s for s in spellings if "index" not in s]
        # inference_mode on the hidden state feeds the head an inference tensor: the rarest kind
        weights = [(8 if where == "hidden" else 2) if s == "inference_mode()" else 1 for s in spellings]
        spelling = c.choose("cut.spelling", spellings, weights)
        index = "index" in spelling
        if index:
            sk.init.append(L("self.emb = nn.Embedding(4, 4)"))
            follow = ["%s = self.emb(idx)" % name]
        result = "idx" if index else name
        follow = [L(text) for text in follow]
        by = c.choose("cut.by", ["inline", "attribute", "dict", "closure", "helper method", "helper function"])
        if by in ("inline", "attribute", "dict"):
            kept = {"inline": result, "attribute": "self." + result, "dict": 'self.state["%s"]' % result}[by]
            if by == "dict":
                sk.init.append(L("self.state = {}"))
            lines = cut_lines(spelling, CUTS, kept, expr, sk)
            if kept != result:
                lines.append(L("%s = %s" % (result, kept)))
            sk.replace(statement, lines + follow)
        elif by == "closure":
            body = cut_lines(spelling, CUTS, "cut", expr, sk)
            sk.replace(statement, [L("def encode():")] + shift(body + [L("return cut")], 1)
                       + [L("%s = encode()" % result, *CUT_KINDS)] + follow)
        else:
            body = cut_lines(spelling, CUTS, "cut", "layer(inp)", sk)
            if by == "helper method":
                sk.helper("Featurizer", [L("class Featurizer:"), L("def encode(self, layer, inp):", indent=1)]
                          + shift(body + [L("return cut")], 2))
                sk.init.append(L("self.featurizer = Featurizer()"))
                call = "self.featurizer.encode(%s, %s)" % (layer, inp)
            else:
                sk.helper("encode", [L("def encode(layer, inp):")] + shift(body + [L("return cut")], 1))
                call = "encode(%s, %s)" % (layer, inp)
            sk.replace(statement, [L("%s = %s" % (result, call), *CUT_KINDS)] + follow)
    elif where == "loss":
        spelling = c.choose("cut.spelling", list(LOSS_CUTS))
        by = c.choose("cut.by", ["inline", "helper method", "helper function"])
        if by == "inline":
            sk.add("step.after_loss", cut_lines(spelling, LOSS_CUTS, "loss", "loss", sk))
        else:
            body = cut_lines(spelling, LOSS_CUTS, "value", "t", sk) + [L("return value")]
            if by == "helper method":
                sk.helper("Tracker", [L("class Tracker:"), L("def scalar(self, t):", indent=1)] + shift(body, 2))
                sk.setup.append(L("tracker = Tracker()"))
                call = "tracker.scalar(loss)"
            else:
                sk.helper("to_scalar", [L("def to_scalar(t):")] + shift(body, 1))
                call = "to_scalar(loss)"
            sk.add("step.after_loss", [L("loss = %s" % call, *CUT_KINDS)])
    elif where == "evaluate helper":
        spelling = c.choose("cut.spelling", ["set_grad_enabled(False) left off", "set_grad_enabled restored",
                                             "@torch.no_grad() decorator", "torch.no_grad() block"])
        off = L("torch.set_grad_enabled(False)", *CUT_KINDS, indent=1)
        score = "score = model(x).mean().item()"
        body = {"set_grad_enabled(False) left off": [off, L(score, indent=1)],
                "set_grad_enabled restored": [off, L(score, indent=1), L("torch.set_grad_enabled(True)", indent=1)],
                "@torch.no_grad() decorator": [L(score, indent=1)],
                "torch.no_grad() block": [L("with torch.no_grad():", indent=1), L(score, indent=2)]}[spelling]
        head = [L("@torch.no_grad()")] if spelling == "@torch.no_grad() decorator" else []
        sk.helper("evaluate", head + [L("def evaluate(model, x):")] + body + [L("return score", indent=1)])
        sk.add("step.after_step", [L("score = evaluate(%s, %s)" % (sk.model("step"), sk.x("step")), *CUT_KINDS)])
    else:
        spelling = c.choose("cut.spelling", ["set_grad_enabled(False) left off", "set_grad_enabled restored",
                                             "torch.no_grad() block"])
        off = L("torch.set_grad_enabled(False)", *CUT_KINDS, indent=1)
        write = L("model.enc.weight.mul_(0.5)", indent=1)
        body = {"set_grad_enabled(False) left off": [off, write],
                "set_grad_enabled restored": [off, write, L("torch.set_grad_enabled(True)", indent=1)],
                "torch.no_grad() block": [L("with torch.no_grad():", indent=1), shift([write], 1)[0]]}[spelling]
        sk.helper("prepare", [L("def prepare(model):")] + body)
        sk.setup.append(L("prepare(model)", *CUT_KINDS))


# ----------------------------------------------------------------------------------------------
# Feature: the loss kept across iterations

CONVERSIONS = {"none": "{v}", ".item()": "{v}.item()", ".detach()": "{v}.detach()", "float()": "float({v})"}
ACCUMULATED = ("accumulated-graph",)


def feature_accumulate(c: Chooser, sk: Skeleton) -> None:
    level = c.choose("accumulate.level", ["loop", "step"])
    holders = ["local", "attribute", "list", "dict", "helper object", "closure", "dict of lists"]
    holder = c.choose("accumulate.in", holders)
    conversion = c.choose("accumulate.value", list(CONVERSIONS), [4, 2, 1, 1])
    start = c.choose("accumulate.start", ["0.0", "torch.tensor(0.0)", "torch.zeros(())"])
    value = CONVERSIONS[conversion].format(v="loss")
    anchor = "loop.end" if level == "loop" else "step.after_step"
    owner = sk.owner("step") if level == "step" else None
    init_here = sk.trainer_init if owner else sk.setup
    K = ACCUMULATED
    if holder == "local":
        spell = c.choose("accumulate.spelling", ["+=", "x = x + v"])
        line = "total_loss += %s" % value if spell == "+=" else "total_loss = total_loss + %s" % value
        if level == "loop":
            sk.loop_setup.append(L("total_loss = %s" % start))
            sk.add(anchor, [L(line, *K)])
        else:  # a local of one step: reset every step
            sk.add("step.start", [L("total_loss = %s" % start)])
            sk.add(anchor, [L(line, *K)])
    elif holder == "attribute":
        if owner:
            init_here.append(L("self.total_loss = %s" % start))
            sk.add(anchor, [L("self.total_loss += %s" % value, *K)])
        else:
            sk.helper("Stats", [L("class Stats:"), L("def __init__(self):", indent=1),
                                L("self.total_loss = %s" % start, indent=2)])
            sk.setup.append(L("stats = Stats()"))
            sk.add(anchor, [L("stats.total_loss += %s" % value, *K)])
    elif holder == "list":
        target = "self.history" if owner else "history"
        init_here.append(L("%s = []" % target))
        sk.add(anchor, [L("%s.append(%s)" % (target, value), *K)])
    elif holder == "dict":
        spell = c.choose("accumulate.spelling", ["+=", "get"])
        target = "self.logs" if owner else "logs"
        if spell == "+=":
            init_here.append(L('%s = {"loss": %s}' % (target, start)))
            sk.add(anchor, [L('%s["loss"] += %s' % (target, value), *K)])
        else:
            init_here.append(L("%s = {}" % target))
            sk.add(anchor, [L('%s["loss"] = %s.get("loss", %s) + %s' % (target, target, start, value), *K)])
    elif holder == "dict of lists":
        target = "self.logs" if owner else "logs"
        init_here.append(L("%s = {}" % target))
        sk.add(anchor, [L('%s.setdefault("loss", []).append(%s)' % (target, value), *K)])
    elif holder == "helper object":
        kind = c.choose("accumulate.helper", ["AverageMeter", "list keeper"])
        if kind == "AverageMeter":
            sk.helper("Meter", [L("class AverageMeter:"), L("def __init__(self):", indent=1),
                                L("self.sum = %s" % start, indent=2), L("self.count = 0", indent=2), L(""),
                                L("def update(self, value, n=1):", indent=1),
                                L("self.sum += value * n", *K, indent=2), L("self.count += n", indent=2),
                                L("self.avg = self.sum / self.count", *K, indent=2)])
            ctor = "AverageMeter()"
        else:
            sk.helper("Meter", [L("class LossLog:"), L("def __init__(self):", indent=1),
                                L("self.values = []", indent=2), L(""),
                                L("def update(self, value):", indent=1),
                                L("self.values.append(value)", *K, indent=2)])
            ctor = "LossLog()"
        target = "self.meter" if owner else "meter"
        init_here.append(L("%s = %s" % (target, ctor)))
        sk.add(anchor, [L("%s.update(%s)" % (target, value), *K)])
    else:  # closure
        sk.helper("make_logger", [L("def make_logger():"), L("total = %s" % start, indent=1), L(""),
                                  L("def log(value):", indent=1), L("nonlocal total", indent=2),
                                  L("total = total + value", *K, indent=2), L("return total", indent=2), L(""),
                                  L("return log", indent=1)])
        target = "self.log_loss" if owner else "log_loss"
        init_here.append(L("%s = make_logger()" % target))
        sk.add(anchor, [L("%s(%s)" % (target, value), *K)])


# ----------------------------------------------------------------------------------------------
# Feature: a state carried across iterations


def feature_carry(c: Chooser, sk: Skeleton) -> None:
    holder = c.choose("carry.in", ["attribute", "dict", "global dict", "list", "helper object"])
    kept = c.choose("carry.kept as", ["h.detach()", "h", "h.detach().clone()", "h.data", "h.clone()"], [2, 2, 1, 1, 1])
    mark = c.choose("carry.then", ["nothing", "requires_grad = True", "requires_grad_()"], [2, 2, 1])
    retain = c.choose("carry.backward", ["backward()", "backward(retain_graph=True)"])
    zeros = "torch.zeros(2, 4)"
    if holder == "attribute":
        sk.init.append(L("self.prev = %s" % zeros))
        read, store = "self.prev", [L("self.prev = %s" % kept)]
    elif holder == "dict":
        sk.init.append(L('self.state = {"prev": %s}' % zeros))
        read, store = 'self.state["prev"]', [L('self.state["prev"] = %s' % kept)]
    elif holder == "global dict":
        sk.setup.insert(0, L('memory = {"prev": %s}' % zeros))
        read, store = 'memory["prev"]', [L('memory["prev"] = %s' % kept)]
    elif holder == "list":
        sk.init.append(L("self.states = [%s]" % zeros))
        read, store = "self.states[-1]", [L("self.states.append(%s)" % kept)]
    else:
        sk.helper("Memory", [L("class Memory:"), L("def __init__(self):", indent=1),
                             L("self.value = %s" % zeros, indent=2),
                             L(""), L("def read(self):", indent=1), L("return self.value", indent=2), L(""),
                             L("def write(self, t):", indent=1), L("self.value = t", "accumulated-graph", indent=2)])
        sk.init.append(L("self.memory = Memory()"))
        read, store = "self.memory.read()", [L("self.memory.write(%s)" % kept)]
    store = tag(store, "accumulated-graph")
    if mark == "requires_grad = True":
        store.append(L("%s.requires_grad = True" % read, "nonleaf-requires-grad"))
    elif mark == "requires_grad_()":
        store.append(L("%s.requires_grad_()" % read, "nonleaf-requires-grad"))
    sk.replace("forward.h", [L("h = torch.tanh(z + 0.5 * %s)" % read, "graph-freed", "accumulated-graph")] + store)
    if retain != "backward()":
        sk.backward_kwargs = "retain_graph=True"


# ----------------------------------------------------------------------------------------------
# Feature: backward calls and optimizer steps


def feature_backward(c: Chooser, sk: Skeleton) -> None:
    o = sk.opt("step")
    shape = c.choose("backward.calls", [
        "twice, retained first", "twice", "aux loss after", "aux loss after, retained first",
        "aux loss after a step, retained first", "one backward of the sum", "step before backward"])
    aux = L("aux = (out * out).mean()", "graph-freed")
    freed = ("graph-freed",)
    if shape == "twice":
        sk.replace("step.backward", [L("loss.backward()"), L("loss.backward()", *freed)])
    elif shape == "twice, retained first":
        sk.replace("step.backward", [L("loss.backward(retain_graph=True)"), L("loss.backward()", *freed)])
    elif shape == "aux loss after":
        sk.add("step.after_loss", [aux])
        sk.replace("step.backward", [L("loss.backward()"), L("aux.backward()", *freed)])
    elif shape == "aux loss after, retained first":
        sk.add("step.after_loss", [aux])
        sk.replace("step.backward", [L("loss.backward(retain_graph=True)"), L("aux.backward()", *freed)])
    elif shape == "aux loss after a step, retained first":
        sk.add("step.after_loss", [aux])
        sk.replace("step.backward", [L("loss.backward(retain_graph=True)"), L("%s.step()" % o, "saved-tensor-modified"),
                                     L("aux.backward()", *freed)])
    elif shape == "one backward of the sum":
        sk.add("step.after_loss", [aux])
        sk.replace("step.backward", [L("(loss + aux).backward()")])
    else:
        sk.zero_grad = "none"
        c.description["zero_grad"] = "after the step, before backward"
        sk.replace("step.step", [])
        sk.add("step.after_loss", [L("%s.step()" % o, "saved-tensor-modified"), L("%s.zero_grad()" % o)])


# ----------------------------------------------------------------------------------------------
# Feature: a per-element loss


def feature_loss(c: Chooser, sk: Skeleton) -> None:
    use = c.choose("loss.backward", ["per_item.mean().backward()", "per_item.backward()",
                                     "per_item.backward(torch.ones_like(per_item))", "per_item.sum().backward()"],
                   [1, 3, 1, 1])
    per_item = 'per_item = F.mse_loss(%s, %s, reduction="none")' % (sk.out_ref, sk.y())
    sk.replace("step.loss", [L(per_item, "nonscalar-backward"),
                             L("loss = per_item.mean()")])
    sk.replace("step.backward", [L(use)])


# ----------------------------------------------------------------------------------------------
# Feature: a custom autograd.Function


def feature_function(c: Chooser, sk: Skeleton) -> None:
    kind = c.choose("function.kind", ["autograd.Function", "tensor hook", "quantizer"])
    if kind == "autograd.Function":
        returns = c.choose("function.backward returns", ["grad * 1.5", "grad.sum(0)", "grad.t()", "grad * 1.5, grad"],
                           [2, 1, 1, 1])
        sk.helper("Scale", [L("class Scale(torch.autograd.Function):"), L("@staticmethod", indent=1),
                            L("def forward(ctx, t):", indent=1), L("return t * 1.5", indent=2), L(""),
                            L("@staticmethod", indent=1), L("def backward(ctx, grad):", indent=1),
                            L("return %s" % returns, "invalid-gradient", indent=2)])
        sk.add("forward.after_h", [L("h = Scale.apply(h)", "invalid-gradient")])
    elif kind == "quantizer":
        spelling = c.choose("function.quantized by", ["torch.round(h / 0.25) * 0.25",
                                                      "h + (torch.round(h / 0.25) * 0.25 - h).detach()",
                                                      "torch.floor_divide(h, 0.25) * 0.25"], [1, 1, 2])
        sk.add("forward.after_h", [L("h = %s" % spelling, "not-differentiable")])
    else:
        returns = c.choose("function.hook returns", ["g * 0.5", "g.clamp(-1.0, 1.0)", "g.sum(0)", "g.t()"],
                           [1, 1, 2, 2])
        sk.add("forward.after_h", [L("if h.requires_grad:  # not under no_grad"),
                                   L("h.register_hook(lambda g: %s)" % returns, "backward-error", indent=1)])
        sk.replace("forward.h", [L("h = torch.tanh(z)", "backward-error")])


FAMILIES = {"none": None, "write": feature_write, "cut": feature_cut, "accumulate": feature_accumulate,
            "carry": feature_carry, "backward": feature_backward, "loss": feature_loss, "function": feature_function}
WEIGHTS = {"none": 6, "write": 29, "cut": 20, "accumulate": 13, "carry": 11, "backward": 7, "loss": 5, "function": 9}


def generate(c: Chooser) -> Program:
    family = c.choose("family", list(FAMILIES), [WEIGHTS[f] for f in FAMILIES])
    sk = Skeleton(c)
    if FAMILIES[family] is not None:
        FAMILIES[family](c, sk)
    description = dict(c.description)
    return Program(sk.render(), description)


def random_program(rng: random.Random) -> Program:
    return generate(RandomChooser(rng))
