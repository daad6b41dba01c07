"""The `%%autograd` cell magic. The only module that touches the IPython shell."""
from __future__ import annotations

import ast

from IPython.core.error import UsageError
from IPython.core.magic import Magics, cell_magic, magics_class
from IPython.core.magic_arguments import argument, magic_arguments, parse_argstring

from .capture import capture, warn


@magics_class
class AutogradMagics(Magics):

    @magic_arguments()
    @argument("-o", "--output", metavar="NAME", default=None,
              help="Store the Trace (ops, graph, diagnoses) in the variable NAME of the user namespace.")
    @argument("-q", "--quiet", action="store_true",
              help="Record, but display nothing unless a problem was found.")
    @argument("--text", action="store_true",
              help="Show the plain-text report instead of the interactive widget.")
    @cell_magic
    def autograd(self, line, cell):
        """Run the cell exactly as usual while recording PyTorch's autograd, then show the graph
        and say which line breaks backward (and how to fix it).

        The cell's last expression is still its result; its exceptions propagate unchanged.
        Only the thread that runs the cell is recorded.
        """
        if {"-h", "--help"} & set(line.split()):
            print(self.autograd.__doc__)
            return None
        try:
            args = parse_argstring(self.autograd, line)
        except UsageError:
            raise
        except SystemExit as exc:  # argparse's own exit on a bad flag
            raise UsageError("%%%%autograd: could not parse flags %r; see %%%%autograd? for help" % line) from exc
        if args.output is not None and not args.output.isidentifier():
            raise UsageError("%%%%autograd -o takes a Python variable name, got %r" % args.output)

        code, last_expr, filename = self._compile(line, cell)
        shell = self.shell
        result, error = None, None
        recorder = capture(namespace=[shell.user_ns])
        trace = recorder.trace
        try:
            with recorder:
                exec(code, shell.user_ns)
                if last_expr is not None:
                    result = eval(last_expr, shell.user_ns)
        except BaseException as exc:  # re-raised below, after the report
            error = exc
        if args.output is not None:
            shell.user_ns[args.output] = trace
        self._show(trace, args, filename)
        if error is not None:
            __tracebackhide__ = True  # noqa: F841
            raise error
        return result

    def _compile(self, line, cell):
        """Compile the body so that its line numbers are the notebook cell's (the magic is line 1)."""
        shell = self.shell
        source = shell.transform_cell(cell)
        tree = shell.compile.ast_parse(source)
        tree = shell.transform_ast(tree)
        ast.increment_lineno(tree, 1)
        full = "%%%%autograd %s\n%s" % (line, source) if line else "%%autograd\n" + source
        # run_cell has already counted this cell (execution_count is the next one's): name our
        # code after the cell the user sees, so tracebacks say "Cell In[N]" with the right N.
        number = max(1, shell.execution_count - 1)
        filename = shell.compile.cache(full, number, raw_code="%%autograd " + line + "\n" + cell)
        last_expr = None
        if tree.body and isinstance(tree.body[-1], ast.Expr):
            last = tree.body.pop()
            last_expr = compile(ast.Expression(last.value), filename, "eval")
        code = compile(tree, filename, "exec")
        return code, last_expr, filename

    def _show(self, trace, args, filename):
        if args.quiet and not trace.diagnoses:
            return
        try:
            from IPython.display import display
            if args.text:
                display({"text/plain": trace.report()}, raw=True)
            else:
                from .widget import AutogradWidget
                display(AutogradWidget(trace, filename=filename))
        except Exception as exc:  # our display must never hide the user's result or exception
            warn("jupyter_autograd could not display its report (%s: %s)" % (type(exc).__name__, exc))
            try:
                print(trace.report())
            except Exception:
                pass


def load(ipython):
    ipython.register_magics(AutogradMagics)


def unload(ipython):
    magics = ipython.magics_manager.magics
    for kind in ("cell",):
        if magics[kind].get("autograd") is not None:
            del magics[kind]["autograd"]
    ipython.magics_manager.registry.pop("AutogradMagics", None)
