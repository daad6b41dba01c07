"""The plain-text report: what a terminal, a CI log or `text/plain` shows."""
from __future__ import annotations

import textwrap
from collections import Counter

from ..model import Trace


def graph_summary(trace: Trace) -> str:
    fns = Counter(n.name for n in trace.nodes.values() if n.variable is None)
    leaves = [trace.tensor_label(n.variable) for n in trace.nodes.values() if n.variable is not None]
    saved = sum(len(n.saved) for n in trace.nodes.values())
    backward = len(trace.backward_calls())
    common = ", ".join("%s x%d" % (k, v) if v > 1 else k for k, v in fns.most_common(6))
    more = ", ..." if len(fns) > 6 else ""
    parts = ["%d operations recorded, %d backward call%s." % (len(trace.ops), backward, "" if backward == 1 else "s"),
             "Graph: %d nodes (%s%s), %d saved tensor%s." % (len(trace.nodes), common or "none", more, saved,
                                                            "" if saved == 1 else "s")]
    if leaves:
        shown = ", ".join(leaves[:8]) + (", ..." if len(leaves) > 8 else "")
        parts.append("Leaves that get .grad: %s." % shown)
    return "\n".join(parts)


def text_report(trace: Trace, width: int = 100) -> str:
    lines = ["jupyter-autograd: " + ("%d problem%s found" % (len(trace.diagnoses), "" if len(trace.diagnoses) == 1
                                                                else "s") if trace.diagnoses else "no problems found")]
    for i, d in enumerate(trace.diagnoses, 1):
        lines.append("")
        lines.append("%d. [%s] %s" % (i, d.kind, d.title))
        if d.line is not None:
            lines.append("   culprit: line %d: %s" % (d.line, d.source))
        if d.saved_line is not None:
            lines.append("   saved:   line %d: %s" % (d.saved_line, d.saved_source))
        if d.saved_version is not None and d.kind == "saved-tensor-modified":
            lines.append("   version: saved at %s, now %s (%s)" % (d.saved_version, d.current_version, d.node))
        lines.extend(textwrap.wrap(d.message, width, initial_indent="   ", subsequent_indent="   "))
        lines.append("   fix:")
        for fix_line in d.fix.splitlines():
            lines.extend(textwrap.wrap(fix_line, width, initial_indent="     ", subsequent_indent="     ",
                                       drop_whitespace=False) or [""])
    lines.append("")
    lines.append(graph_summary(trace))
    for w in trace.warnings:
        lines.append("warning: " + w)
    return "\n".join(lines)
