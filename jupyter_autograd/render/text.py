"""The plain-text report: what a terminal, a CI log or `text/plain` shows, and the note that a
script's traceback gets when a diagnosis explains its exception."""
from __future__ import annotations

import textwrap
from collections import Counter
from typing import List, Optional

from ..model import EXPLAINS, PROBLEM_KINDS, Diagnosis, TraceData

def graph_summary(trace: TraceData) -> str:
    fns = Counter(n.name for n in trace.nodes.values() if n.variable is None)
    leaves = [trace.tensor_label(n.variable) for n in trace.nodes.values() if n.variable is not None]
    saved = sum(len(n.saved) for n in trace.nodes.values())
    backward = len(trace.backward_calls())
    common = ", ".join("%s x%d" % (k, v) if v > 1 else k for k, v in fns.most_common(6))
    more = ", ..." if len(fns) > 6 else ""
    parts = ["%s recorded, %s." % (_count(len(trace.ops), "operation"), _count(backward, "backward call")),
             "Graph: %s (%s%s), %s." % (_count(len(trace.nodes), "node"), common or "none", more,
                                        _count(saved, "saved tensor"))]
    if leaves:
        # Tensors with no name of their own can share a description: each is said once, counted.
        leaves = ["%s (x%d)" % (name, n) if n > 1 else name for name, n in Counter(leaves).items()]
        shown = ", ".join(leaves[:8]) + (", ..." if len(leaves) > 8 else "")
        parts.append("Leaves that get .grad: %s." % shown)
    return "\n".join(parts)


INCOMPLETE = "the analysis is incomplete"  # said, with `trace.warnings`, wherever the verdict is shown


def verdict(trace: TraceData) -> str:
    """What was found, in a few words. Never a bare "no problems found" when a part of the analysis
    failed (`trace.warnings`, each said by the stage that failed, with what it lost)."""
    if trace.diagnoses:
        n = len(trace.diagnoses)
        return "%d problem%s found" % (n, "" if n == 1 else "s")
    return "no problems found in what was analysed" if trace.warnings else "no problems found"


def headline(trace: TraceData) -> str:
    """The report's first line; the warnings follow it when the analysis is incomplete."""
    if trace.error and not trace.ops and not trace.warnings:
        return ("jupyter-autograd: the block stopped before any tensor operation ran (%s); there is no "
                "graph to analyse." % _first_line(trace.error))
    line = "jupyter-autograd: " + verdict(trace)
    if trace.error and not trace.diagnoses:
        line += "%s (the block raised %s)" % ("" if trace.warnings else " with autograd", _first_line(trace.error))
    return line + ("; %s:" % INCOMPLETE if trace.warnings else "")


def text_report(trace: TraceData, width: int = 100) -> str:
    lines = [headline(trace)]
    for warning in trace.warnings:
        lines.extend(textwrap.wrap(warning, width, initial_indent="  - ", subsequent_indent="    ",
                                   break_long_words=False, break_on_hyphens=False))
    for i, d in enumerate(trace.diagnoses, 1):
        lines.append("")
        lines.append("%d. [%s] %s" % (i, d.kind, d.title))
        lines.extend(_lines_of(trace, d, "   "))
        shown = [s for s in (d.source, d.saved_source) if s]
        if d.saved_version is not None and d.kind == "saved-tensor-modified":
            lines.append("   version: saved at %s, now %s (%s)" % (d.saved_version, d.current_version, d.node))
        lines.extend(_wrap(_without_repeats(d.message, shown), width, "   "))
        lines.append("   fix:")
        lines.extend(fix_lines(_without_repeats(d.fix, shown), width, "     "))
    if not trace.ops and (trace.error or trace.warnings):  # no graph, or none that could be read
        return "\n".join(lines)
    lines.append("")
    lines.append(graph_summary(trace))
    return "\n".join(lines)


def shows_only_text(shell) -> bool:
    """Whether an IPython front end shows only text/plain: a terminal (IPython's
    TerminalInteractiveShell turns the other formats off), where a widget is a line of text."""
    try:
        return "text/html" not in shell.display_formatter.active_types
    except AttributeError:
        return False


def terminal_hint(save: str = "`trace.save_html('report.html')`") -> str:
    """The line under a text report where the front end shows only text: what it lacks, and how to
    get it (`save`: the code that writes the view to a file)."""
    return ("(a terminal shows the text report; in Jupyter the same cell draws the graph, and %s "
            "writes it to a file)" % save)


WHOLE_REPORT = "(trace.report() has the whole diagnosis)"


def explaining_diagnosis(trace: TraceData) -> Optional[Diagnosis]:
    """The diagnosis that explains the exception the block raised (the one `exception_note` is
    about): a problem whose kind explains the error's words, or a `backward-error` quoting it. None
    when the block raised nothing or no diagnosis is about its exception."""
    error = trace.error or ""
    for d in trace.diagnoses:
        quoted = d.kind == "backward-error" and error and error.split(": ", 1)[-1].split("\n")[0].strip() in d.message
        if d.kind in PROBLEM_KINDS and (quoted or any(words in error for words in EXPLAINS.get(d.kind, ()))):
            return d
    return None


def exception_note(trace: TraceData, whole_report: str = WHOLE_REPORT) -> Optional[str]:
    """A few lines for the traceback of a block that raised (PEP 678 `add_note`): the diagnosis
    that explains the exception, its lines and the start of its fix. None when no diagnosis is
    about this exception. `whole_report`, its last line, says where the user finds the rest."""
    d = explaining_diagnosis(trace)
    if d is None:
        return None
    lines = ["jupyter-autograd: %s" % d.title]
    lines.extend(_lines_of(trace, d, "  "))
    fix = fix_lines(_short_fix(d.fix), 100, "  ")
    if fix:
        lines.append("  fix: " + fix[0].strip())
        lines.extend(fix[1:])
    lines.append("  " + whole_report)
    return "\n".join(lines)


def fix_lines(fix: str, width: int, indent: str) -> List[str]:
    """Prose wrapped to the width; code (lines indented by four spaces, see fixes.py) as it is."""
    out = []
    for line in fix.splitlines():
        if line.startswith("    "):
            out.append(indent + line)
        else:
            out.extend(_wrap(line, width, indent) or [""])
    return out


def _lines_of(trace: TraceData, d: Diagnosis, indent: str) -> List[str]:
    """The culprit line and the second line, each with its file or cell (`In [2], line 16`) and
    labelled with what it is (Diagnosis.saved_label), the labels padded to one width."""
    culprit = (trace.place(d.filename, d.line), d.source) if d.line is not None else None
    saved = (trace.place(d.saved_filename or d.filename, d.saved_line), d.saved_source) \
        if d.saved_line is not None else None
    if culprit and saved and culprit[0] == saved[0]:
        # One line did both (a one-line cell, or a model whose forward saves and then writes).
        return ["%sculprit and %s: %s: %s" % (indent, d.saved_label, culprit[0], culprit[1])]
    rows = [(label, where) for label, where in (("culprit", culprit), (d.saved_label, saved)) if where]
    width = max((len(label) for label, _ in rows), default=0) + 1
    return ["%s%s %s: %s" % (indent, (label + ":").ljust(width), place, source) for label, (place, source) in rows]


def _without_repeats(text: str, shown: List[str]) -> str:
    """Drop " (`source`)" after a line number when that source line is already printed above."""
    for source in shown:
        text = text.replace(" (`%s`)" % source, "")
    return text


def _short_fix(fix: str) -> str:
    """The fix up to the end of its first code block (or its first line when it has none)."""
    lines = fix.splitlines()
    end = 1
    for i, line in enumerate(lines):
        if line.startswith("    "):
            end = i + 1
        elif end > 1:
            break
    return "\n".join(lines[:end])


def _count(n: int, noun: str) -> str:
    """`1 node`, `2 nodes`, `0 nodes`."""
    return "%d %s%s" % (n, noun, "" if n == 1 else "s")


def _wrap(text: str, width: int, indent: str) -> List[str]:
    return textwrap.wrap(text, width, initial_indent=indent, subsequent_indent=indent,
                         break_long_words=False, break_on_hyphens=False)


def _first_line(error: str) -> str:
    first = error.splitlines()[0] if error else ""
    return first if len(first) <= 200 else first[:197] + "..."
