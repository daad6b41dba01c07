"""The `%%autograd` cell magic. The only module that touches the IPython shell.

IPython runs a `%%autograd` cell itself, as it runs any cell, so that the cell behaves exactly as
without the magic: top-level `await`, the shell's own `__future__` flags, `;` and
`ast_node_interactivity` for Out[], IPython's short tracebacks with the cell's name and line.
`_CellRewrite` makes this possible in the two steps IPython offers:

- on the cell's text, before IPython would turn the whole cell into one `run_cell_magic(...)`
  call, the first line `%%autograd FLAGS` becomes the string `'%%autograd FLAGS'`; every other
  line stays where it was;
- on its syntax tree, the cell's statements go inside `with <capture>:`, and the value of a last
  expression is handed out of the block, so that IPython shows it after the report and nothing
  of that display is recorded.

An exception leaves the `with` untouched, so IPython shows the same traceback as without the
magic. The magic function itself serves `%%autograd?`, `-h`, bad flags (a UsageError) and the
cells IPython did not rewrite.
"""
import ast
import builtins
import keyword
import linecache
import os
import re
import sys
import unicodedata
import weakref

from IPython.core.error import UsageError
from IPython.core.inputtransformer2 import leading_indent
from IPython.core.magic import Magics, cell_magic, magics_class
from IPython.core.magic_arguments import argument, magic_arguments, parse_argstring

from .render.text import shows_only_text, terminal_hint
from .session import ExitLookup, capture, file_namers, warn

_PACKAGE_DIR = os.path.dirname(os.path.abspath(__file__)) + os.sep  # the tool's own frames
_TORCH_DISPATCH = os.path.join("torch", "overrides.py")
_FIRST_LINE = re.compile(r"%%autograd(?:[ \t]+(.*))?")
# The rewritten cell reaches the magic by name, as IPython's own rewrites reach the shell
# (`get_ipython().run_cell_magic(...)`): no variable of ours enters the user's namespace.
_MAGICS = "get_ipython().magics_manager.registry['AutogradMagics']"


@magics_class
class AutogradMagics(Magics):
    _value = None  # the value of a rewritten cell's last expression, on its way out of the block
    _widgets = None  # the _WidgetsOfCells that closes the widgets no output shows any more
    _after = None  # the _AfterTheTraceback that prints a failing cell's text after its traceback
    _first_lines = None  # a cell's file name -> its first line as typed (`%%autograd -q`)

    # IPython prefixes the usage line with one `%` (a line magic's): the name brings the second.
    @magic_arguments(name="%autograd")
    @argument("-o", "--output", metavar="NAME", default=None,
              help="Store the Trace (ops, graph, diagnoses) in the variable NAME of the user namespace.")
    @argument("-q", "--quiet", action="store_true",
              help="Record, but display nothing unless a problem was found (or a part of the analysis failed).")
    @argument("--text", action="store_true",
              help="Show the plain-text report instead of the interactive widget.")
    @argument("--nan", action="store_true",
              help="Also find the first backward node that turned finite gradients into NaN or Inf, with "
                   "the forward line and the input values that caused it (backward runs slower). Without "
                   "it, leaves that got non-finite gradients are still reported.")
    @cell_magic
    def autograd(self, line, cell):
        """Run the cell exactly as usual while recording PyTorch's autograd, then show the graph
        and say which line breaks backward (and how to fix it).

        The cell's last expression is still its result; its exceptions and tracebacks are the
        same as without the magic. Only the thread that runs the cell is recorded.

        A cell with nothing to show (no autograd graph, or an error that no autograd problem
        explains) gets one line instead of the widget. A terminal, which shows only text, gets
        the text report; the text report of a cell that raised comes after its traceback.
        """
        if {"-h", "--help"} & set(line.split()):
            print(self.autograd.__doc__)
            return None
        _parse(line)
        if not cell.strip():  # IPython's own words for an empty body (it says them for "" itself)
            raise UsageError("%%autograd is a cell magic, but the cell body is empty.")
        return self._run_here(line, cell)

    def _run_here(self, line, cell):
        """Run a cell that IPython did not rewrite (a direct `run_cell_magic` call, or a body that
        starts with another cell magic): the same rewrite, run by the magic. Here, unlike in a
        rewritten cell, tracebacks go through the magic and top-level `await` is not available."""
        shell = self.shell
        source = _marker(line) + shell.transform_cell(cell)
        # run_cell has already counted this cell: name the code after the cell the user sees.
        filename = shell.compile.cache(source, max(1, shell.execution_count - 1),
                                       raw_code="%%autograd " + line + "\n" + cell)
        tree = _CellRewrite(shell).visit(shell.transform_ast(shell.compile.ast_parse(source, filename=filename)))
        *statements, last = tree.body or [ast.Pass()]
        for node in statements:
            exec(shell.compile(ast.Module([node], []), filename, "exec"), shell.user_global_ns, shell.user_ns)
        if isinstance(last, ast.Expr):
            return eval(shell.compile(ast.Expression(last.value), filename, "eval"),
                        shell.user_global_ns, shell.user_ns)
        exec(shell.compile(ast.Module([last], []), filename, "exec"), shell.user_global_ns, shell.user_ns)
        return None

    # -- called by the rewritten cell ------------------------------------------------------------
    def _cell(self, line):
        self._value = None
        return _CellCapture(self, _parse(line), ("%%autograd " + line).rstrip())

    def _keep(self, value):
        self._value = value

    def _result(self):
        value, self._value = self._value, None
        return value

    def _show_value(self, value):
        sys.displayhook(value)

    def _show(self, trace, args, filename, raised=False):
        """The report: the widget; the text report with --text or where the front end shows only
        text (a terminal); one line for a cell with nothing to show. Text about a cell that raised
        comes after its traceback, where the reader is (a terminal's traceback is 40 lines)."""
        if args.quiet and not trace.diagnoses and not trace.warnings:  # a failed analysis is said, always
            return
        try:
            text_only = shows_only_text(self.shell)
            line = _nothing_to_show(trace, args.output)
            if line is None and not args.text and not text_only:
                from .widget import display_trace
                display_trace(trace, filename=filename)
                return
            if line is None:
                line = trace.report()
                if not args.text:  # a terminal: no view, and the same cell in Jupyter has one
                    line += "\n" + TERMINAL_HINT
            if raised and (args.text or text_only) and self._after is not None and self._after.later(line):
                return
            _display_text(line)
        except Exception as exc:  # our display must never hide the user's result or exception
            warn("jupyter_autograd could not display its report (%s: %s)" % (type(exc).__name__, exc))
            try:
                print(trace.report())
            except Exception:
                pass


class _CellCapture:
    """The `with` around a rewritten cell's statements: records them, then shows the report."""

    def __init__(self, magics, args, first_line):
        self.magics = magics
        self.args = args
        self.first_line = first_line
        # The traceback stays as without the magic (no note): the widget under it explains it.
        self.recorder = capture(namespace=[magics.shell.user_ns], check_nan=args.nan, note_exceptions=False)
        self.filename = None
        self._entered = False  # until then the with statement's lookup of __exit__ is noted (ExitLookup)

    def __enter__(self):
        self._entered = True
        self.filename = sys._getframe(1).f_code.co_filename  # the cell's name, for the widget's source
        _hide_the_magic_line(self.magics, self.filename, self.first_line)
        try:
            # An interrupt on the first instruction of our __exit__ would leave the capture recording
            # for the rest of the kernel: it ends when the with statement lets go of our exit.
            self.recorder._ends_with(self)
            self.recorder.__enter__()
        except Exception as exc:  # the user's cell runs, recorded or not
            self.recorder = None
            warn("jupyter_autograd could not record this cell (%s: %s); it runs unrecorded"
                 % (type(exc).__name__, exc))

    def __exit__(self, exc_type, exc, tb):
        if self.recorder is None:
            return False
        if isinstance(exc, KeyboardInterrupt):
            _end_traceback_before_the_tool(exc)
        try:
            self.recorder.__exit__(exc_type, exc, tb)
            trace = self.recorder.trace
            _show_first_lines_as_typed(trace, self.magics._first_lines)
            if self.args.output is not None:
                self.magics.shell.user_ns[self.args.output] = trace
            self.magics._show(trace, self.args, self.filename, raised=exc is not None)
        except KeyboardInterrupt:
            # The cell's statements are over: an interrupt now stops the tool's work, not the cell,
            # whose result (or own exception) stands; the output says the report was cut short.
            self.recorder.close()  # an interrupt as the capture ended: leave none of its hooks behind
            if exc is not None:
                self.magics._value = None  # a cell that stops keeps nothing of the user's alive
            _say_the_report_was_interrupted(self.args.output, raised=exc is not None)
        return False

    __exit__ = ExitLookup(__exit__)


class _CellRewrite:
    """Turns a `%%autograd` cell into the user's statements inside `with <capture>:`. IPython
    calls it twice per cell: on the cell's lines (an input transformer), then on its syntax tree
    (an AST transformer)."""

    # IPython's completeness check (the terminal's Enter) skips transformers marked so; this one
    # must be skipped there, so that a `%%autograd` cell still ends with a blank line like any
    # cell magic.
    has_side_effects = True

    def __init__(self, shell):
        self.shell = shell

    def __call__(self, lines):
        flags = _flags(lines[0].rstrip()) if lines else None
        body = lines[1:]
        if (flags is None or (body and body[0].startswith("%%")) or not "".join(body).strip()
                or self not in self.shell.ast_transformers):
            return lines  # not ours, or the magic function runs it (or says the cell is empty)
        try:
            _parse(flags)
        except UsageError:
            return lines  # the magic function says what is wrong with the flags
        # An indented body is dedented as IPython dedents an indented cell.
        return [_marker(flags)] + leading_indent(body)

    def visit(self, tree):
        line = _marked_flags(tree)
        if line is None:
            return tree
        statements = tree.body[1:]
        try:
            tree.body = self._wrap(line, statements)
        except Exception as exc:  # IPython unregisters a transformer that raises
            warn("jupyter_autograd could not record this cell (%s: %s); it runs unrecorded"
                 % (type(exc).__name__, exc))
            tree.body = statements
        ast.fix_missing_locations(tree)
        return tree

    def _wrap(self, line, statements):
        # IPython compiles each top-level statement on its own, so a `from __future__` import works
        # anywhere in a cell; inside the `with` it would not: it goes first.
        futures = [s for s in statements if isinstance(s, ast.ImportFrom) and s.module == "__future__"]
        code = [s for s in statements if not any(s is f for f in futures)]
        wrapped = futures + self._with(line, code)
        if self._compiles(wrapped):
            return wrapped
        # As IPython does: the statements before one that cannot compile (a `return` outside a
        # function) run, then IPython reports that one with its usual short message.
        for i, statement in enumerate(code):
            if not self._compiles(futures + [statement]):
                return futures + (self._with(line, code[:i]) if i else []) + code[i:]
        return wrapped

    def _compiles(self, statements):
        flags = self.shell.compile.flags | (ast.PyCF_ALLOW_TOP_LEVEL_AWAIT if self.shell.autoawait else 0)
        module = ast.fix_missing_locations(ast.Module(body=statements, type_ignores=[]))
        try:
            compile(module, "<cell>", "exec", flags, dont_inherit=True)
        except (SyntaxError, ValueError):
            return False
        return True

    def _with(self, line, code):
        """`with <capture>: code`, then the cell's value, shown where IPython would show it."""
        interactivity = self.shell.ast_node_interactivity
        code = list(code)
        last = code[-1] if code else None
        if interactivity == "last_expr_or_assign" and _assigned_name(last):
            last = ast.copy_location(ast.Expr(ast.Name(_assigned_name(last), ast.Load())), last)
            code.append(last)
        tail = []
        if isinstance(last, ast.Expr) and interactivity != "none":
            code[-1] = ast.copy_location(ast.Expr(_call("_keep", last.value)), last)
            tail = [ast.Expr(_call("_result"))]
        elif interactivity == "last" and last is not None:
            # IPython shows the expression statements inside a last compound statement too.
            code[-1] = _ShowExpressions().visit(last)
            tail = [ast.Expr(_call("_result"))]  # so that the `with` itself is not run as 'single'
        block = ast.With(items=[ast.withitem(context_expr=_call("_cell", ast.Constant(line)))],
                         body=code or [ast.Pass()])
        for node in [block] + tail:
            node.lineno, node.col_offset = 1, 0  # line 1 is the magic's own line
        return [block] + tail


class _ShowExpressions(ast.NodeTransformer):
    """What compiling in 'single' mode does: show each expression statement outside functions
    and classes."""

    def visit_Expr(self, node):
        return ast.copy_location(ast.Expr(_call("_show_value", node.value)), node)

    def visit_FunctionDef(self, node):
        return node

    visit_AsyncFunctionDef = visit_ClassDef = visit_FunctionDef


def _say_the_report_was_interrupted(kept_as, raised):
    message = "jupyter-autograd: the report was interrupted, not the cell: %s" % (
        "its own exception follows." if raised else "it had run to its end, and its result stands.")
    if kept_as is not None:
        message += " `%s.report()` or `%s.show()` shows the report." % (kept_as, kept_as)
    for _ in range(3):  # a press again while this line is written: write it again
        try:
            print(message)
            return
        except KeyboardInterrupt:
            continue


def _end_traceback_before_the_tool(exc):
    """An interrupt that landed in the tool's code (recording an op) reads as if it had landed
    in the user's call: the traceback ends before the tool's frames and torch's frames that
    only dispatched to them."""
    tb, kept = exc.__traceback__, []
    while tb is not None:
        filename = tb.tb_frame.f_code.co_filename
        if filename.startswith(_PACKAGE_DIR):
            while kept and kept[-1].tb_frame.f_code.co_filename.endswith(_TORCH_DISPATCH):
                kept.pop()
            if kept:
                kept[-1].tb_next = None
            return
        kept.append(tb)
        tb = tb.tb_next


def _parse(line):
    """The flags, or a UsageError that says what is wrong with them."""
    try:
        args = parse_argstring(AutogradMagics.autograd, line)
    except ValueError as exc:  # shlex: "No closing quotation", "No escaped character"
        raise UsageError("%%%%autograd could not read its flags %r: %s" % (line, exc)) from None
    name = args.output
    if name is not None:
        # As Python reads an identifier (NFKC): `-o ｘｙ` is the variable the cell's `ｘｙ` reads, `xy`.
        name = args.output = unicodedata.normalize("NFKC", name)
        if keyword.iskeyword(name):
            raise UsageError("%%%%autograd -o %s: %r is a Python keyword, not a variable name" % (name, name))
        if not name.isidentifier():
            raise UsageError("%%%%autograd -o takes a Python variable name, got %r" % name)
        if hasattr(builtins, name):
            raise UsageError("%%%%autograd -o %s would shadow the builtin %r; choose another name" % (name, name))
        if _SHELL_NAME.fullmatch(name) or name in _SHELL_NAMES:
            raise UsageError("%%%%autograd -o %s would replace a name IPython keeps for itself (its history, its "
                             "output cache or the module's own); choose another name" % name)
    return args


# IPython's own names in the user's namespace (In, Out, _oh, _i3, _7, ...) and the module's dunders:
# a trace put there breaks the shell (the output cache or the next import).
_SHELL_NAME = re.compile(r"_+|_i+|_i?\d+|_[iod]h|__\w+__")
_SHELL_NAMES = frozenset(("In", "Out", "exit", "quit", "get_ipython"))


def _flags(first_line):
    """The flags of a line `%%autograd FLAGS`, else None."""
    match = _FIRST_LINE.fullmatch(first_line)
    return None if match is None else (match.group(1) or "").strip()


def _marker(line):
    return repr(("%%autograd " + line).rstrip()) + "\n"


def _marked_flags(tree):
    """The flags of a cell whose first line `_CellRewrite` marked, else None."""
    if not (isinstance(tree, ast.Module) and tree.body):
        return None
    first = tree.body[0]
    if (isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant)
            and isinstance(first.value.value, str) and first.lineno == 1):
        return _flags(first.value.value)
    return None


def _hide_the_magic_line(magics, filename, first_line):
    """IPython's copy of the cell (linecache), which its tracebacks and pdb show, gets a blank line 1
    instead of the marker, so that a traceback reads as without the magic: `----> 3 print(y)` under
    `Cell In[5], line 3`, not `1 '%%autograd'` above it. Blank, not `%%autograd` itself: tracebacks
    parse the cell to show whole statements, and a line that is not Python would stop that."""
    entry = linecache.cache.get(filename)
    if not entry or len(entry) != 4 or not entry[2] or entry[2][0].rstrip("\n") != repr(first_line):
        return
    size, mtime, lines, fullname = entry
    linecache.cache[filename] = (size, mtime, ["\n"] + list(lines[1:]), fullname)
    if magics._first_lines is None:
        magics._first_lines = {}
    magics._first_lines[filename] = first_line + "\n"


def _show_first_lines_as_typed(trace, first_lines):
    """In the report's copy of each %%autograd cell it shows (the running one, and those whose
    functions ran), line 1 reads `%%autograd ...` as typed, not blank."""
    for filename, lines in trace.sources.items():
        if lines and first_lines and filename in first_lines and not lines[0].strip():
            lines[0] = first_lines[filename]


TERMINAL_HINT = terminal_hint("`%%autograd -o tr` then `tr.save_html('report.html')`")


def _nothing_to_show(trace, kept_as=None):
    """One line for a cell whose report would show nothing of use, else None. Nothing to show: no
    problem found and the analysis whole, and either the cell raised (its error is not an autograd
    problem, and a graph or a green "no problems" under a red error would only distract from it),
    or it made no autograd graph (no tensor operation, or none on a tensor that requires grad)."""
    if trace.diagnoses or trace.warnings:
        return None
    ops, nodes = len(trace.ops), len(trace.nodes)
    if trace.error:
        kind = trace.error.split(":", 1)[0].strip() or "an exception"
        if not ops:
            line = "the cell raised %s before any tensor operation ran: nothing to check" % kind
        else:
            line = "no autograd problem found; the cell raised %s (%s, %s recorded)" % (
                kind, _count(ops, "tensor operation"), _count(nodes, "graph node"))
    elif not nodes:
        line = ("no tensor operation ran: nothing to check" if not ops else
                "%s, no autograd graph (no input that requires grad, or grad mode off): nothing to check"
                % _count(ops, "tensor operation"))
    else:
        return None
    kept = "; `%s` keeps the trace" % kept_as if kept_as else ""
    return "jupyter-autograd: %s%s." % (line, kept)


def _count(n, noun):
    return "%d %s%s" % (n, noun, "" if n == 1 else "s")


def _display_text(text):
    from IPython.display import display

    display({"text/plain": text}, raw=True)


class _CellEvents:
    """A listener of IPython's pre_run_cell and post_run_cell events, registered by start() and
    unregistered by stop() (a second stop finds nothing to unregister)."""

    def start(self):
        self.shell.events.register("pre_run_cell", self.pre_run_cell)
        self.shell.events.register("post_run_cell", self.post_run_cell)
        return self

    def stop(self):
        for event, callback in (("pre_run_cell", self.pre_run_cell), ("post_run_cell", self.post_run_cell)):
            try:
                self.shell.events.unregister(event, callback)
            except ValueError:
                pass


class _AfterTheTraceback(_CellEvents):
    """Holds the text report of a cell that raised until IPython has shown the cell's traceback
    (its post_run_cell event comes after it), so that the report is not scrolled away above a long
    torch traceback. Only inside a cell IPython runs and announces (pre_run_cell): a cell run
    otherwise has no post_run_cell to wait for, and shows its report at once."""

    def __init__(self, shell):
        self.shell = shell
        self.running = False
        self.pending = []

    def later(self, text):
        """Keep `text` for after the traceback; False where there will be no after."""
        if not self.running:
            return False
        self.pending.append(text)
        return True

    def pre_run_cell(self, info=None):
        self.running, self.pending = True, []

    def post_run_cell(self, result=None):
        pending, self.running, self.pending = self.pending, False, []
        for text in pending:
            try:
                _display_text(text)
            except Exception as exc:
                warn("jupyter_autograd could not display its report (%s: %s)" % (type(exc).__name__, exc))


def _assigned_name(statement):
    """The name a last `x = ...` assigns, which `ast_node_interactivity='last_expr_or_assign'` shows."""
    if isinstance(statement, ast.Assign) and len(statement.targets) == 1:
        target = statement.targets[0]
    elif isinstance(statement, (ast.AugAssign, ast.AnnAssign)):
        target = statement.target
    else:
        return None
    return target.id if isinstance(target, ast.Name) else None


def _call(method, *args):
    call = ast.parse("%s.%s()" % (_MAGICS, method), mode="eval").body
    call.args = list(args)
    return call


class _CellNames:
    """The name Jupyter shows for a cell (`In [2]`), from the file name IPython compiled it under
    (`/tmp/ipykernel_81/2786300238.py`): the map IPython's own tracebacks use ("Cell In[2]")."""

    def __init__(self, shell):
        self.shell = shell

    def __call__(self, filename):
        number = getattr(self.shell.compile, "_filename_map", {}).get(filename)
        return None if number is None else "In [%s]" % number


class _WidgetsOfCells(_CellEvents):
    """Closes the widgets of ours that no output shows any more, so that their traces can go.

    ipywidgets keeps every widget, and so its Trace, until it is closed, and a front end that
    replaces or clears an output never tells the kernel. A widget belongs to the output of the
    cell whose run made it (Jupyter sends each run's cell id); it is closed when that cell runs
    again or is deleted (JupyterLab sends the ids of deleted cells with the next run), or when the
    cell clears its output: at once for `clear_output()`, and for `clear_output(wait=True)`, which
    keeps the output until something new is shown, at the next clear. Without a cell id (a
    terminal, another front end) nothing is closed: no output is known to be gone."""

    def __init__(self, shell):
        self.shell = shell
        self.of_cell = {}   # cell id -> weak references to the widgets its latest run made
        self.cell = None    # the running cell's id
        self.run = []       # the widgets this run made (the list in of_cell)
        self.replaced = []  # of them, shown before a clear_output(wait=True): replaced by what followed

    def start(self):
        from . import widget

        super().start()
        widget.made.append(self.made)
        register_hook = getattr(self.shell.display_pub, "register_hook", None)  # ipykernel's
        if register_hook is not None:
            register_hook(self.published)
        return self

    def stop(self):
        from . import widget

        super().stop()
        if self.made in widget.made:
            widget.made.remove(self.made)
        unregister_hook = getattr(self.shell.display_pub, "unregister_hook", None)
        if unregister_hook is not None:
            unregister_hook(self.published)

    def pre_run_cell(self, info):
        self.cell = getattr(info, "cell_id", None)
        deleted = (getattr(info, "cell_meta", None) or {}).get("deletedCells") or []
        for cell in [self.cell, *deleted]:
            _close(self.of_cell.pop(cell, []))
        self.run, self.replaced = [], []
        if self.cell is not None:
            self.of_cell[self.cell] = self.run

    def post_run_cell(self, result):
        self.cell = None  # a widget made between runs belongs to no output we know

    def made(self, widget):
        if self.cell is not None:
            self.run.append(weakref.ref(widget))

    def published(self, message):
        """ipykernel's display publisher hook: sees every display message (and returns it)."""
        try:
            if self.cell is not None and message.get("msg_type") == "clear_output":
                if message.get("content", {}).get("wait"):
                    _close(self.replaced)
                    self.run[:] = [ref for ref in self.run if ref not in self.replaced and ref() is not None]
                    self.replaced = list(self.run)
                else:
                    _close(self.run)
                    self.run.clear()
                    self.replaced = []
        except Exception:  # the user's output goes out, whatever happens here
            pass
        return message


def _close(widgets):
    for ref in widgets:
        widget = ref()
        if widget is not None:
            try:
                widget.close()
            except Exception:
                pass


def warm_up() -> None:
    """Import and draw once what a report needs (matplotlib, its fonts), as the extension loads.
    Done by the first report of a kernel instead, it made that cell 1.5 s longer; a failing cell
    that runs longer sees more of the cells run after it reach the kernel while it runs, and
    Jupyter aborts those (ipykernel's stop_on_error). A tiny block with a backward, so that what a
    report of a real block reads (gradient health, the timeline) is imported too."""
    import torch

    from .widget import AutogradWidget, static_bundle

    with capture(namespace={}) as trace:
        w = torch.ones(2, requires_grad=True)
        (w * 2).sum().backward()
    del w
    AutogradWidget(trace).close()
    static_bundle(trace)
    try:  # the first large message of the kernel imports pyzmq's zero-copy bookkeeping
        import zmq.utils.garbage  # noqa: F401
    except ImportError:
        pass


def load(ipython):
    _remove_rewrite(ipython)
    _stop_watching_widgets(ipython)
    ipython.register_magics(AutogradMagics)
    magics = ipython.magics_manager.registry["AutogradMagics"]
    magics._after = _AfterTheTraceback(ipython).start()
    try:
        magics._widgets = _WidgetsOfCells(ipython).start()
        warm_up()
    except Exception:  # a widget library or matplotlib missing: each report says so when it runs
        pass
    rewrite = _CellRewrite(ipython)
    ipython.input_transformers_cleanup.append(rewrite)
    ipython.ast_transformers.append(rewrite)
    file_namers.append(_CellNames(ipython))


def unload(ipython):
    magics = ipython.magics_manager.magics
    if magics["cell"].get("autograd") is not None:
        del magics["cell"]["autograd"]
    _stop_watching_widgets(ipython)
    ipython.magics_manager.registry.pop("AutogradMagics", None)
    _remove_rewrite(ipython)


def _remove_cell_names(ipython):
    # By name, not identity: %reload_ext makes a new class.
    file_namers[:] = [n for n in file_namers if not (type(n).__qualname__ == "_CellNames" and n.shell is ipython)]


def _stop_watching_widgets(ipython):
    magics = ipython.magics_manager.registry.get("AutogradMagics")
    for watcher in (getattr(magics, "_widgets", None), getattr(magics, "_after", None)):
        if watcher is not None:
            watcher.stop()


def _remove_rewrite(ipython):
    _remove_cell_names(ipython)
    # By name, not identity: %reload_ext makes a new class.
    for hooks in (ipython.input_transformers_cleanup, ipython.ast_transformers):
        hooks[:] = [hook for hook in hooks if type(hook).__qualname__ != "_CellRewrite"
                    or type(hook).__module__ != __name__]
