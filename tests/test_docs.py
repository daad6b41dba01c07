"""The user guide and the API reference (docs/) say what the code has, so that they cannot rot: every
parameter of capture(), every field and public method of Trace and Diagnosis and of the records a
trace holds, every flag of the magic, every argument of the callbacks, every name of the pytest
plugin. And the README links both pages; every relative link of the three resolves."""
import ast
import dataclasses
import inspect
import re

import pytest

import jupyter_autograd as ja
from jupyter_autograd import model

from .conftest import ROOT

DOCS = ROOT / "docs"
API = (DOCS / "api.md").read_text(encoding="utf-8")


def named(name, text=API):
    """`name` in code quotes, alone or as the start of a call or a dotted path (`save_html(path)`)."""
    return re.search(r"`(?:[\w.]+\.)?%s(?:[(`\s,=]|\.\w)" % re.escape(name), text) is not None


def missing(names, text=API):
    return sorted(n for n in names if not named(n, text))


def test_every_parameter_of_capture():
    parameters = [p for p in inspect.signature(ja.capture.__init__).parameters if p != "self"]
    assert {"namespace", "check_nan", "note_exceptions"} <= set(parameters)
    assert missing(parameters) == []
    assert missing(["close", "trace"]) == []


def _public(cls):
    return {n for n in dir(cls) if not n.startswith("_")}


def test_every_field_and_method_of_trace():
    fields = [f.name for f in dataclasses.fields(model.TraceData)]
    assert missing(fields) == []
    assert missing(_public(ja.Trace)) == []


def test_every_field_and_property_of_diagnosis():
    assert missing([f.name for f in dataclasses.fields(ja.Diagnosis)]) == []
    assert missing(_public(ja.Diagnosis)) == []
    assert missing(model.PROBLEM_KINDS) == []  # every kind a diagnosis can be


@pytest.mark.parametrize("record", [model.Location, model.OpRecord, model.TensorInfo, model.GraphNode, model.SavedSlot,
                                    model.Checkpoint, model.ModuleCall, model.DistributedModel, model.CompiledCall],
                         ids=lambda r: r.__name__)
def test_every_field_of_the_records_a_trace_holds(record):
    section = API.split("**`%s`**" % record.__name__, 1)
    assert len(section) == 2, "no paragraph for %s" % record.__name__
    paragraph = section[1].split("\n\n", 1)[0]
    assert missing([f.name for f in dataclasses.fields(record)], paragraph) == []


def test_every_flag_of_the_magic():
    from jupyter_autograd.magic import AutogradMagics

    parser = AutogradMagics.autograd.parser
    flags = [option for action in parser._actions for option in action.option_strings]
    assert {"-o", "--output", "-q", "--quiet", "--text", "--nan"} <= set(flags)
    assert [f for f in flags + ["-h", "--help"] if "`%s" % f not in API] == []  # -h: the magic's own
    guide = (DOCS / "user-guide.md").read_text(encoding="utf-8")
    assert [f for f in flags if "`%s" % f not in guide] == []


def _init_arguments(path, cls):
    """The arguments of cls.__init__ in a file, read without importing it (its framework may be absent)."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    (node,) = [n for n in ast.walk(tree) if isinstance(n, ast.ClassDef) and n.name == cls]
    (init,) = [n for n in node.body if isinstance(n, ast.FunctionDef) and n.name == "__init__"]
    return [a.arg for a in init.args.args + init.args.kwonlyargs if a.arg != "self"]


def test_every_argument_of_the_callbacks():
    integrations = ROOT / "jupyter_autograd" / "integrations"
    lightning = _init_arguments(integrations / "_lightning_hooks.py", "LightningHooks")
    hugging_face = _init_arguments(integrations / "transformers.py", "AutogradCallback")
    assert lightning == hugging_face == ["steps", "every_n_steps", "on_exception", "check_nan"]
    assert missing(lightning) == []
    assert "`AutogradCallback(%s)`" % ", ".join(
        "%s=%s" % (p.name, p.default) for p in inspect.signature(_lightning_hooks().__init__).parameters.values()
        if p.name != "self") in API
    assert missing(["traces", "last_trace"]) == []


def _lightning_hooks():
    from jupyter_autograd.integrations._lightning_hooks import LightningHooks
    return LightningHooks


def test_every_name_of_the_pytest_plugin():
    from jupyter_autograd import pytest_plugin

    options = []

    class Group:
        def addoption(self, *names, **kwargs):
            options.extend(names)

    class Parser:
        def getgroup(self, *args, **kwargs):
            return Group()

    pytest_plugin.pytest_addoption(Parser())
    assert options == ["--autograd"]
    assert missing(options + ["autograd_trace", "AnalysisIncomplete"]) == []
    assert "`@pytest.mark.autograd_ok`" in API


def test_the_readme_links_the_guide_and_the_reference():
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    assert "(docs/user-guide.md)" in readme and "(docs/api.md)" in readme
    assert len(readme.encode("utf-8")) < 15 * 1024  # a user's page, not a manual


@pytest.mark.parametrize("page", ["README.md", "docs/user-guide.md", "docs/api.md"])
def test_relative_links_resolve(page):
    path = ROOT / page
    text = path.read_text(encoding="utf-8")
    for target in re.findall(r"\]\(([^)\s]+)\)", text):
        if re.match(r"[a-z]+:", target):
            continue
        file, _, anchor = target.partition("#")
        linked = (path.parent / file).resolve() if file else path
        assert linked.exists(), "%s links to %s, which does not exist" % (page, target)
        if anchor and linked.suffix == ".md":
            assert anchor in _anchors(linked.read_text(encoding="utf-8")), "%s: no heading for #%s in %s" % (
                page, anchor, linked.name)


def _anchors(markdown):
    """GitHub's anchors of a page's headings: lower case, punctuation but - and _ dropped, spaces to -."""
    out = set()
    for heading in re.findall(r"(?m)^#+ (.+)$", markdown):
        out.add(re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-"))
    return out
