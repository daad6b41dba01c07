"""A diagnosis names its tensor by the expression its culprit line uses for it (diagnose/names.py).

Each program runs from a file of its own, plain and under capture(): PyTorch's outcome must be the
same. The expected name is the expression written at the culprit line, which is where the program's
text puts the tensor: wherever it lives (a module's buffer reached through `self`, a carried state on
a helper object, a dict on an object) and whatever it was called elsewhere or bound it there (a path
through the model, the assignment that made it in an earlier iteration, a variable of the caller's, a
rebinding, the alias an in-place method returns, no name at all). What stays: a parameter's dotted
path, and any name where the line's reading is not certain.
"""
import textwrap

import torch

import jupyter_autograd as ja


def diagnosed(tmp_path, source, kind, error=RuntimeError):
    """The one diagnosis of a program that raises `error`, PyTorch's exception unchanged, and the
    line whose code (without its comment) ends with the comment `# culprit`."""
    path = tmp_path / "program.py"
    path.write_text(textwrap.dedent(source))
    code = compile(path.read_text(), str(path), "exec")
    outcomes = []
    for captured in (False, True):
        torch.manual_seed(0)
        exc = trace = None
        try:
            if captured:
                with ja.capture() as trace:
                    exec(code, {"__name__": "program"})
            else:
                exec(code, {"__name__": "program"})
        except Exception as e:  # the program's own outcome, compared below
            exc = e
        outcomes.append((exc, trace))
    (plain, _), (exc, trace) = outcomes
    assert isinstance(plain, error), plain
    assert type(exc) is type(plain) and str(exc) == str(plain)
    assert not trace.warnings, trace.warnings
    [d] = trace.diagnoses
    assert d.kind == kind, (d.kind, d.message)
    [culprit] = [i for i, text in enumerate(path.read_text().splitlines(), 1) if text.endswith("# culprit")]
    assert d.line == culprit, (d.line, d.source)
    return d, trace


def test_a_buffer_written_in_its_modules_method_goes_by_self(tmp_path):
    d, trace = diagnosed(tmp_path, """
        import torch
        from torch import nn

        class Memory(nn.Module):
            def __init__(self):
                super().__init__()
                self.proj = nn.Linear(4, 4)
                self.register_buffer("bank", torch.randn(4, 6))

            def push(self, keys):
                with torch.no_grad():
                    self.bank[:, :2] = keys.T  # culprit

            def forward(self, q):
                logits = self.proj(q) @ self.bank
                self.push(q.detach())
                return logits

        memory = Memory()
        loss = memory(torch.randn(2, 4)).pow(2).mean()
        loss.backward()
    """, "saved-tensor-modified")
    assert d.tensor == "self.bank", d.tensor
    assert "`self.bank`" in d.message and "`memory.bank`" not in trace.report()


def test_a_state_carried_on_a_helper_object_goes_by_the_attribute_the_line_reads(tmp_path):
    d, _ = diagnosed(tmp_path, """
        import torch

        class Tracker:
            def __init__(self):
                self.centroid = torch.zeros(3)

            def update(self, feats):
                centroid = 0.7 * self.centroid + 0.3 * feats.mean(0)  # culprit
                self.centroid = centroid
                return centroid

        w = torch.randn(4, 3, requires_grad=True)
        tracker = Tracker()
        for step in range(2):
            tracker.update(torch.randn(5, 4) @ w).pow(2).sum().backward()
    """, "graph-freed")
    # Made on this same line an iteration before, as `centroid`: here that is the new tensor.
    assert d.tensor == "self.centroid", d.tensor


def test_a_result_stored_in_a_dict_on_an_object_goes_by_that_element(tmp_path):
    d, _ = diagnosed(tmp_path, """
        import torch

        class Calibration:
            def __init__(self):
                self.stats = {}

            def observe(self, x):
                self.stats["scale"] = x.abs().max() / 127  # culprit

            def quantize(self, x):
                return torch.round(x / self.stats["scale"])

        first, second = Calibration(), Calibration()
        with torch.inference_mode():
            for batch in (torch.randn(8), torch.randn(8)):
                first.observe(batch)
                second.observe(batch)
        w = torch.randn(8, requires_grad=True)
        first.quantize(w * 2).sum().backward()
    """, "inference-tensor-saved")
    # The same statement ran for two objects one after the other: still one reading of it.
    assert d.tensor == 'self.stats["scale"]', d.tensor


def test_a_parameter_keeps_its_dotted_path(tmp_path):
    d, _ = diagnosed(tmp_path, """
        import torch
        from torch import nn

        class Scaled(nn.Module):
            def __init__(self):
                super().__init__()
                self.weight = nn.Parameter(torch.ones(3))

            def forward(self, x):
                return x * self.weight

            def rescale(self):
                self.weight.mul_(2)  # culprit

        layer = Scaled()
        layer(torch.ones(3)).sum().backward()
        layer.rescale()
    """, "leaf-inplace")
    assert d.tensor == "layer.weight", d.tensor


def test_a_line_that_could_mean_either_operand_does_not_rename(tmp_path):
    d, _ = diagnosed(tmp_path, """
        import torch

        class Tracker:
            def __init__(self):
                self.decay = 0.7
                self.centroid = torch.zeros(3)

            def update(self, feats):
                kept = self.decay * self.centroid  # culprit
                centroid = kept + 0.3 * feats.mean(0)
                self.centroid = centroid
                return centroid

        w = torch.randn(4, 3, requires_grad=True)
        tracker = Tracker()
        for step in range(2):
            tracker.update(torch.randn(5, 4) @ w).pow(2).sum().backward()
    """, "graph-freed")
    # `self.decay` holds a number, `self.centroid` the tensor: the op's one tensor input could be
    # either operand as far as the line's text and the op tell, so the name from elsewhere stays.
    assert d.tensor == "centroid", d.tensor


def test_the_alias_an_inplace_method_returns_goes_by_the_name_the_culprit_line_writes(tmp_path):
    d, _ = diagnosed(tmp_path, """
        import torch
        w = torch.randn(3, requires_grad=True)
        a = w * 2
        b = a.exp_()
        c = b * w
        b.add_(1)  # culprit
        c.sum().backward()
    """, "saved-tensor-modified")
    assert d.tensor == "b", d.tensor


def test_a_callers_tensor_rebound_in_a_function_goes_by_the_functions_name_for_it(tmp_path):
    d, _ = diagnosed(tmp_path, """
        import torch
        lin = torch.nn.Linear(3, 3)

        def squash(features):
            x = features
            y = x * x
            x.mul_(2)  # culprit
            return y.sum()

        h = lin(torch.randn(2, 3))
        squash(h).backward()
    """, "saved-tensor-modified")
    assert d.tensor == "x", d.tensor


def test_a_tensor_unpacked_from_a_tuple_goes_by_the_name_it_was_unpacked_to(tmp_path):
    d, _ = diagnosed(tmp_path, """
        import torch
        w = torch.randn(3, requires_grad=True)
        state = (w * 1.5, w * 3)
        hidden, cell = state
        out = (hidden * cell).sum()
        hidden.zero_()  # culprit
        out.backward()
    """, "saved-tensor-modified")
    assert d.tensor == "hidden", d.tensor
