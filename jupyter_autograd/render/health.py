"""Gradient health per module, as the view shows it: a badge on each module box and rows in the
details of a module and a parameter, from `trace.grad_stats()`.

What the view needs from the statistics is small: per module and per parameter, the gradient
norm after each checked backward call, the flags (vanishing, exploding, NaN/Inf, never
updated) and the words that explain them. `module_health` and `parameter_health` read that
from `trace.grad_stats()`; a trace without statistics (no backward call, or a capture made
before they existed) shows no badges.
"""
from __future__ import annotations

import math
from typing import Dict, List, Optional

from ..model import Trace

FLAG_WORDS = {"vanishing": "vanishing", "exploding": "exploding", "nonfinite": "NaN/Inf", "nan": "NaN/Inf",
              "never-updated": "never updated", "never_updated": "never updated"}


def stats(trace: Trace) -> Optional[Dict]:
    """trace.grad_stats(), or None where there is none (or it fails: a badge is a nicety)."""
    read = getattr(trace, "grad_stats", None)
    if read is None:
        return None
    try:
        data = read()
    except Exception:
        return None
    return data if isinstance(data, dict) and (data.get("parameters") or data.get("modules")) else None


def _norms(entry: Dict) -> List[Optional[float]]:
    return [None if v is None else float(v) for v in entry.get("norms") or ()]


def _flags(entry: Dict) -> List[str]:
    return [FLAG_WORDS.get(f, f) for f in entry.get("flags") or ()]


def _number(v: Optional[float]) -> str:
    if v is None:
        return "none"
    if not math.isfinite(v):
        return str(v)
    return "%.3g" % v


def describe(entry: Dict, backwards: List[int]) -> List[List[str]]:
    """Rows for a details table: the norm after each checked backward, the change, the flags."""
    norms = _norms(entry)
    rows = []
    if norms:
        shown = norms if len(norms) <= 6 else norms[:3] + [None] + norms[-2:]
        calls = [str(i + 1) for i in range(len(norms))]
        if backwards and len(backwards) == len(norms):
            calls = ["%d" % (i + 1) for i in range(len(backwards))]
        labels = calls if len(norms) <= 6 else calls[:3] + ["..."] + calls[-2:]
        rows.append(["grad norm", ", ".join("%s: %s" % (c, "..." if c == "..." else _number(v))
                                            for c, v in zip(labels, shown))])
    if entry.get("change") is not None:
        rows.append(["change", _number(entry["change"])])
    for key, label in (("ratio", "|grad| / |param|"), ("param_norm", "param norm")):
        if entry.get(key) is not None:
            rows.append([label, _number(entry[key])])
    flags = _flags(entry)
    rows.append(["health", ", ".join(flags) if flags else "ok"])
    if entry.get("reason"):
        rows.append(["why", str(entry["reason"])])
    return rows


def module_health(trace: Trace) -> Dict[str, List]:
    """Module name -> [last norm, flags (list of words), tooltip text], for the boxes."""
    data = stats(trace)
    if data is None:
        return {}
    modules = dict(data.get("modules") or {})
    if not modules:  # roll the parameters up by their module's dotted name
        for name, entry in (data.get("parameters") or {}).items():
            owner = name.rsplit(".", 1)[0] if "." in name else ""
            module = modules.setdefault(owner, {"norms": [], "flags": []})
            norms = _norms(entry)
            mine = module["norms"]
            mine.extend([0.0] * (len(norms) - len(mine)))
            for i, v in enumerate(norms):
                mine[i] = math.hypot(mine[i], v) if v is not None and mine[i] is not None else None
            module["flags"] = list(dict.fromkeys(list(module["flags"]) + list(entry.get("flags") or ())))
    out = {}
    for name, entry in modules.items():
        norms = [v for v in _norms(entry) if v is not None]
        flags = _flags(entry)
        tip = "gradient %s: norm %s after the last checked backward%s" % (
            "flagged" if flags else "ok", _number(norms[-1]) if norms else "none",
            " (%s)" % ", ".join(flags) if flags else "")
        out[name] = [norms[-1] if norms else None, flags, tip]
    return out


def parameter_health(trace: Trace, name: str) -> List[List[str]]:
    data = stats(trace)
    if data is None:
        return []
    entry = (data.get("parameters") or {}).get(name)
    return describe(entry, list(data.get("backwards") or ())) if entry else []


def module_rows(trace: Trace, name: str) -> List[List[str]]:
    data = stats(trace)
    if data is None:
        return []
    entry = (data.get("modules") or {}).get(name)
    return describe(entry, list(data.get("backwards") or ())) if entry else []


def module_parameters(trace: Trace, name: str) -> List[List[str]]:
    """[parameter, last grad norm, flags] for the parameters of module `name` (directly or below)."""
    data = stats(trace)
    if data is None:
        return []
    rows = []
    for pname, entry in (data.get("parameters") or {}).items():
        if pname.startswith(name + "."):
            norms = [v for v in _norms(entry) if v is not None]
            rows.append([pname[len(name) + 1:], _number(norms[-1]) if norms else "none",
                         ", ".join(_flags(entry)) or "ok"])
    return rows
