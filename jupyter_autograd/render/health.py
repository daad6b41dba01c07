"""Gradient health per module, as the view shows it: a bar on each module box (red when a flag
is raised, the numbers on hover) and rows in the details of a module and of a parameter.

Everything comes from the gradient statistics (stats.grad_stats, whose docstring has the data: "steps", the
checked backward calls; "parameters" and "modules", each with one gradient norm per step, the
ratio to the tensor's own norm, the change across the block and the flags "vanishing",
"exploding", "nan-or-inf", "never-updated"; "thresholds"). A trace without it (no backward
call, or made by a version without statistics) shows no bars.
"""
from __future__ import annotations

import math
from typing import Dict, List, Optional

FLAG_WORDS = {"nan-or-inf": "NaN/Inf", "never-updated": "never updated", "vanishing": "vanishing",
              "exploding": "exploding"}


def usable(data) -> Optional[Dict]:
    """The statistics when they hold anything to show, else None."""
    return data if isinstance(data, dict) and (data.get("parameters") or data.get("modules")) else None


def _by_name(data: Dict, key: str) -> Dict[str, Dict]:
    return {entry["name"]: entry for entry in data.get(key) or () if isinstance(entry, dict) and "name" in entry}


def _number(v) -> str:
    if v is None:
        return "none"
    v = float(v)
    return str(v) if not math.isfinite(v) else "%.3g" % v


def _last(norms) -> Optional[float]:
    finite = [float(v) for v in norms or () if v is not None and math.isfinite(float(v))]
    return finite[-1] if finite else None


def _flags(entry: Dict) -> List[str]:
    return [FLAG_WORDS.get(f, f) for f in entry.get("flags") or ()]


def _why(entry: Dict, thresholds: Dict, data: Optional[Dict] = None) -> str:
    """What the flags mean for this tensor, with the thresholds that raised them. A module's flags are
    its parameters': it names those that raised each (its own ratio, over all of them, may be fine)."""
    if "parameters" in entry and data is not None:
        params = _by_name(data, "parameters")
        out = []
        for flag in entry.get("flags") or ():
            raised = [n for n in entry["parameters"] if flag in (params.get(n, {}).get("flags") or ())]
            shown = ", ".join(raised[:4]) + (" and %d more" % (len(raised) - 4) if len(raised) > 4 else "")
            out.append("%s: %s (of %d parameters)" % (FLAG_WORDS.get(flag, flag), shown, len(entry["parameters"])))
        return "; ".join(out)
    out = []
    flags = entry.get("flags") or ()
    if "vanishing" in flags:
        ratio, floor = entry.get("ratio"), thresholds.get("vanishing_ratio", 2 ** -24)
        out.append("vanishing: |grad| / |param| = %s, %s" % (_number(ratio), (
            "below %s (an update at learning rate 1 is lost to float32 rounding)" % _number(floor)
            if ratio is not None and ratio < floor else
            "more than %s times below the median of the model's parameters" % _number(
                thresholds.get("vanishing_below_median", 1000)))))
    if "exploding" in flags:
        out.append("exploding: |grad| / |param| = %s, above %s" % (_number(entry.get("ratio")),
                                                                  _number(thresholds.get("exploding_ratio", 100))))
    if "nan-or-inf" in flags:
        out.append("NaN/Inf from backward call %s on" % ("?" if entry.get("nonfinite_at") is None
                                                         else entry["nonfinite_at"] + 1))
    if "never-updated" in flags:
        out.append("never updated: no backward gave it a gradient, or only zeros")
    return "; ".join(out)


def describe(entry: Dict, data: Dict) -> List[List[str]]:
    """Rows for a details table: the norm after each checked backward, the ratio, the change,
    the flags and why they were raised."""
    steps = data.get("steps") or ()
    norms = list(entry.get("norms") or ())
    rows = []
    if norms:
        calls = [str(i + 1) for i in range(len(norms))]
        pairs = list(zip(calls, norms))
        if len(pairs) > 6:
            pairs = pairs[:3] + [("...", None)] + pairs[-2:]
        rows.append(["grad norm", ", ".join("..." if c == "..." else "%s: %s" % (c, _number(v)) for c, v in pairs)])
        if steps and len(steps) == len(norms):
            rows.append(["after backward", ", ".join(str(s.get("place", "")) for s in list(steps)[-1:])
                         + (" (the last of %d checked)" % len(steps) if len(steps) > 1 else "")])
    for key, label in (("ratio", "|grad| / |param|"), ("change", "change (last / first)"),
                       ("param_norm", "param norm")):
        if entry.get(key) is not None:
            rows.append([label, _number(entry[key])])
    flags = _flags(entry)
    rows.append(["health", ", ".join(flags) if flags else "ok"])
    why = _why(entry, data.get("thresholds") or {}, data)
    if why:
        rows.append(["why", why])
    return rows


def module_health(data: Optional[Dict]) -> Dict[str, List]:
    """Module name -> [last finite norm, flags (words), tooltip], for the bars on the boxes."""
    data = usable(data)
    if data is None:
        return {}
    out = {}
    for name, entry in _by_name(data, "modules").items():
        flags = _flags(entry)
        norms = entry.get("norms") or ()
        tip = "%s: gradient %s; norm %s after each checked backward; %s" % (
            name, ", ".join(flags) if flags else "ok", ", ".join(_number(v) for v in list(norms)[-4:]),
            _why(entry, data.get("thresholds") or {}, data) if flags else "|grad| / |param| = %s" % _number(entry.get("ratio")))
        out[name] = [_last(norms), flags, tip]
    return out


def parameter_health(data: Optional[Dict], name: str) -> List[List[str]]:
    data = usable(data)
    entry = _by_name(data, "parameters").get(name) if data else None
    return describe(entry, data) if entry else []


def module_rows(data: Optional[Dict], name: str) -> List[List[str]]:
    data = usable(data)
    entry = _by_name(data, "modules").get(name) if data else None
    return describe(entry, data) if entry else []


def module_parameters(data: Optional[Dict], name: str) -> List[List[str]]:
    """[parameter (relative to the module), last grad norm, health] for a module's parameters."""
    data = usable(data)
    module = _by_name(data, "modules").get(name) if data else None
    if module is None:
        return []
    params = _by_name(data, "parameters")
    rows = []
    for pname in module.get("parameters") or ():
        entry = params.get(pname, {})
        short = pname[len(name) + 1:] if pname.startswith(name + ".") else pname
        rows.append([short, _number(_last(entry.get("norms"))), ", ".join(_flags(entry)) or "ok"])
    return rows
