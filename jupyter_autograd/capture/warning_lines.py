"""Warnings keep the user's line.

A warning raised by a call we run is attributed by Python to our frame, the one calling it:
filters by module and the "once"/"default" registries would then see us instead of the user.
While a call runs, `warnings.filters` is swapped (not mutated, so no registry is reset) for
one that shows everything, and `warnings._showwarnmsg` for show_at_user_line, which re-issues
the warning from the frame that Python would have chosen without our frames, under the
user's real filters.
"""
from __future__ import annotations

import sys
import warnings

from .frames import without_dispatch

ALWAYS = ("always", None, Warning, None, 0)
SHOW_ALL = [ALWAYS]
# warnings.filters and warnings._showwarnmsg while ours are in place: set by the per-op method as it
# routes a call's warnings here (a list, not two globals, so that it can live with the rest of this).
HELD = [None, None]


def put_back():
    """Restore the real filters; keep any filter a call added meanwhile (a module imported
    inside a torch call may run warnings.filterwarnings at import)."""
    w = warnings
    filters, show = HELD
    if len(SHOW_ALL) != 1 or SHOW_ALL[0] is not ALWAYS:
        added = list(SHOW_ALL)
        SHOW_ALL[:] = [ALWAYS]
        if ALWAYS in added:
            at = added.index(ALWAYS)
            filters[:0] = added[:at]
            filters.extend(added[at + 1:])
        else:  # resetwarnings() inside the call
            filters[:] = added
    if w.filters is SHOW_ALL:
        w.filters = filters
    if w._showwarnmsg is show_at_user_line:
        w._showwarnmsg = show


def show_at_user_line(message):
    """warnings._showwarnmsg while one of our calls runs: warn again from the right frame."""
    __tracebackhide__ = True  # noqa: F841
    w = warnings
    inside_filters, inside_show = w.filters, w._showwarnmsg
    filters, show = HELD
    if inside_filters is not SHOW_ALL:  # catch_warnings() inside the call: its copy, less ours
        filters = [f for f in inside_filters if f is not ALWAYS]
    w.filters, w._showwarnmsg = filters, show
    try:
        stack = []
        frame = sys._getframe(1)
        while frame is not None:
            stack.append(frame)
            frame = frame.f_back
        at = next((i for i, f in enumerate(stack)
                   if f.f_lineno == message.lineno and f.f_code.co_filename == message.filename), None)
        if at is None:  # warn_explicit() with a location of its own
            w.warn_explicit(message.message, message.category, message.filename, message.lineno,
                            source=message.source)
            return
        stack.reverse()  # outermost first, as in a traceback
        keep = without_dispatch(stack, [f.f_code for f in stack])
        keep.reverse()
        if at >= len(keep):
            filename, lineno, module, registry = "sys", 1, "sys", sys.__dict__.setdefault("__warningregistry__", {})
        else:
            target = keep[at]
            g = target.f_globals
            filename, lineno = target.f_code.co_filename, target.f_lineno
            module = g.get("__name__", "<string>")
            registry = g.get("__warningregistry__")
            if registry is None:
                registry = g["__warningregistry__"] = {}
        w.warn_explicit(message.message, message.category, filename, lineno, module, registry,
                        source=message.source)
    finally:
        w.filters, w._showwarnmsg = inside_filters, inside_show


def routed() -> bool:
    """Whether a call of ours is routing warnings now (or was cut off while it did)."""
    return warnings.filters is SHOW_ALL or warnings._showwarnmsg is show_at_user_line
