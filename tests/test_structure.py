"""The package's layers, read from its code: imports go down only (imports inside functions counted),
the user's source is parsed in the source layer only, each of the user's files once per trace, and
one alignment of statements with ops serves every reader of a trace."""
import ast
import pathlib
import textwrap

import torch

import jupyter_autograd as ja

PACKAGE = pathlib.Path(ja.__file__).resolve().parent
# Imports go down only: (the package's public face, whose extension hook loads the magic) -> front ends ->
# session -> widget -> render | diagnose | stats | capture -> source -> model. Siblings (the same rank)
# never import each other.
RANKS = {"model": 0, "source": 1, "capture": 2, "diagnose": 2, "stats": 2, "render": 2, "widget": 3, "session": 4,
         "magic": 5, "pytest_plugin": 5, "integrations": 5, "__init__": 6}
BELOW_THE_VIEW = {"model", "source", "capture", "diagnose", "stats", "render"}
MAX_LINES = 700


def _modules():
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = path.relative_to(PACKAGE).with_suffix("").parts
        yield path, parts


def _imports(path, parts):
    """(the top-level part of the package each import of the module reaches, the line), and the
    names of other packages it imports."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    is_package = parts[-1] == "__init__"
    ours, others = [], []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                root, _, rest = alias.name.partition(".")
                if root == "jupyter_autograd":
                    ours.append((rest.partition(".")[0] or "__init__", node.lineno))
                else:
                    others.append(root)
        elif isinstance(node, ast.ImportFrom):
            if node.level == 0:
                root, _, rest = (node.module or "").partition(".")
                if root != "jupyter_autograd":
                    others.append(root)
                    continue
                target = rest.split(".") if rest else []
            else:
                base = list(parts[:-1]) if not is_package else list(parts[:-1])
                base = base[:len(base) - (node.level - 1)] if node.level > 1 else base
                target = base + (node.module.split(".") if node.module else [])
            if not target:  # `from . import x` at the top of the package
                target = [node.names[0].name]
            ours.append((target[0], node.lineno))
    return ours, others


def test_imports_go_down_only():
    wrong = []
    for path, parts in _modules():
        home = parts[0] if len(parts) > 1 or parts[0] == "__init__" else parts[0]
        rank = RANKS[home]
        for target, line in _imports(path, parts)[0]:
            if target == home:
                continue  # within its own package
            if RANKS.get(target, 99) >= rank:
                wrong.append("%s:%d imports %s" % ("/".join(parts), line, target))
    assert wrong == []


def test_nothing_below_the_view_imports_ipython_or_widgets():
    found = ["/".join(parts) + " imports " + name for path, parts in _modules() if parts[0] in BELOW_THE_VIEW
             for name in _imports(path, parts)[1] if name in ("IPython", "ipywidgets", "anywidget", "ipykernel")]
    assert found == []


def test_only_capture_and_the_layers_above_it_touch_torch():
    """model/ is plain data and source/ reads the user's source: neither imports torch (nor numpy), so
    both can be read, tested and reused without it."""
    found = ["/".join(parts) + " imports " + name for path, parts in _modules() if parts[0] in ("model", "source")
             for name in _imports(path, parts)[1] if name in ("torch", "numpy", "functorch")]
    assert found == []


def test_the_users_source_is_parsed_in_the_source_layer_and_the_magic_only():
    parsing = sorted("/".join(parts) for path, parts in _modules()
                     if any(isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute) and n.func.attr == "parse"
                            and isinstance(n.func.value, ast.Name) and n.func.value.id == "ast"
                            for n in ast.walk(ast.parse(path.read_text(encoding="utf-8")))))
    assert parsing == ["magic", "source/index"]


def test_no_module_is_longer_than_its_reader_can_hold():
    long = {"/".join(parts): n for path, parts in _modules()
            if (n := path.read_text(encoding="utf-8").count("\n") + 1) > MAX_LINES}
    assert long == {}


_PROGRAM = textwrap.dedent("""
    import torch

    class Meter:
        def __init__(self):
            self.history = []

        def update(self, value):
            self.history.append(value)

    w = torch.ones(3, requires_grad=True)
    meter = Meter()
    for step in range(3):
        h = torch.exp(w * 2)
        h.add_(1)
        loss = (h * w).sum()
        meter.update(loss)
        try:
            loss.backward()
        except RuntimeError:
            pass
        total = loss.detach()
""")


def test_each_file_is_parsed_once_and_read_through_one_alignment(tmp_path, monkeypatch):
    from jupyter_autograd.source import alignment, index

    path = tmp_path / "train_loop.py"
    path.write_text(_PROGRAM)
    text = path.read_text()
    index._parse_file.cache_clear()
    index._facts.cache_clear()
    parsed, made = [], []
    real_parse, real_init = ast.parse, alignment.Alignment.__init__

    def counting_parse(source, *args, **kwargs):
        if source == text:
            parsed.append(1)
        return real_parse(source, *args, **kwargs)

    def counting_init(self, *args, **kwargs):
        made.append(1)
        real_init(self, *args, **kwargs)

    monkeypatch.setattr(ast, "parse", counting_parse)
    monkeypatch.setattr(alignment.Alignment, "__init__", counting_init)
    with ja.capture(namespace={}) as trace:
        exec(compile(text, str(path), "exec"), {"__name__": "train_loop"})
    kinds = [d.kind for d in trace.diagnoses]
    assert "saved-tensor-modified" in kinds  # read through naming, the rules and a fix
    assert parsed == [1] and made == [1]
    assert torch.is_grad_enabled()
