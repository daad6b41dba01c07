"""The interactive view: `widget.py` (the anywidget and the static pictures beside it), `widget.js`
and `widget.css` (the front end, which draws the scene Python computed)."""
from .widget import (AutogradWidget, display_trace, made, save_html, static_bundle, static_html,
                     trace_mimebundle)

__all__ = ["AutogradWidget", "display_trace", "made", "save_html", "static_bundle", "static_html",
           "trace_mimebundle"]
