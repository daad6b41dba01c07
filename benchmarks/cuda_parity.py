"""The same diagnoses on CUDA as on the CPU: every scenario and real case of the test corpora, run on
the CPU and again with CUDA as torch's default device, each plain and captured.

    python benchmarks/cuda_parity.py                 # needs a CUDA device
    python benchmarks/cuda_parity.py --device cpu    # a smoke test of the script itself (CPU twice)

A case is compared only where it is portable: run plain, it ends the same way on both devices (no
exception, or the same one with the same message but for device names). Some are not: a case that builds a tensor with a CPU-only
constructor (`torch.FloatTensor(...)`) and mixes it with tensors on the default device raises on
CUDA alone. For each portable case the problems found (kind, line, tensor) must be the same on both
devices, and the captured run must end as the plain one did on its device.
"""
from __future__ import annotations

import argparse
import json
import re
import pathlib
import sys
import time

import torch

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from tests import scenario_runner as runner  # noqa: E402
from jupyter_autograd.model import PROBLEM_KINDS  # noqa: E402


def cases(folders):
    for folder in folders:
        yield from sorted(pathlib.Path(folder).glob("*.py"))


_DEVICE_WORDS = re.compile(r"cuda(:\d+)?|cpu|torch\.cuda\.|CUDA|CPU")


def _outcome(exc):
    """An exception as (type, message with device words taken out), or None."""
    return None if exc is None else (exc[0], _DEVICE_WORDS.sub("", exc[1]))


def run_on(device, sc):
    """(plain outcome, captured outcome, the problems found, internal warnings) of a case with `device`
    as the default device (None: as torch starts)."""
    torch.set_default_device(device)
    try:
        plain, _, _ = runner.execute(sc.source, sc.path, captured=False)
        captured, _, trace = runner.execute(sc.source, sc.path, captured=True, options=sc.options)
    finally:
        torch.set_default_device(None)
    found = [d for d in trace.diagnoses if d.kind in PROBLEM_KINDS]
    problems = sorted((d.kind, d.line, d.tensor or "") for d in found)
    details = {"raised": captured and captured[1], "messages": [d.message for d in found]}
    return _outcome(plain), _outcome(captured), problems, list(trace.warnings), details


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cuda", help="the device compared with the CPU (default cuda)")
    parser.add_argument("--json", help="write the results to this file")
    parser.add_argument("folders", nargs="*", default=[str(ROOT / "tests" / "scenarios"), str(ROOT / "tests" / "corpus")])
    args = parser.parse_args(argv)
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        parser.error("no CUDA device here: run with --device cpu for a smoke test of the script")
    results = {"device": torch.cuda.get_device_name() if args.device.startswith("cuda") else "cpu",
               "torch": torch.__version__, "cases": {}}
    counts = {"same": 0, "different": 0, "not portable": 0, "changed outcome": 0}
    start = time.time()
    for path in cases(args.folders):
        if "torch.distributed" in path.read_text():  # gloo and NCCL groups: not a device swap
            continue
        sc = runner.load(str(path))
        cpu = run_on(None, sc)
        other = run_on(args.device, sc)
        if cpu[0] != other[0]:
            verdict = "not portable"
        elif other[1] != other[0] or cpu[1] != cpu[0]:
            verdict = "changed outcome"
        else:
            verdict = "same" if cpu[2] == other[2] else "different"
        counts[verdict] += 1
        results["cases"][path.name] = {"verdict": verdict, "cpu": cpu[2], args.device: other[2],
                                       "plain": [cpu[0], other[0]], "warnings": other[3],
                                       "details": [cpu[4], other[4]] if verdict != "same" else None}
        if verdict in ("different", "changed outcome"):
            print("%s: %s\n  cpu: %s\n  %s: %s" % (verdict.upper(), path.name, cpu[2], args.device, other[2]))
    results["counts"] = counts
    print("%s (%s), torch %s: %d cases in %.0f s: %s" % (args.device, results["device"], torch.__version__,
                                                        sum(counts.values()), time.time() - start, json.dumps(counts)))
    if args.json:
        from run import write_json  # benchmarks/ is on the path of a script run from it
        write_json(args.json, results)
    return 0 if not counts["different"] and not counts["changed outcome"] else 1


if __name__ == "__main__":
    sys.exit(main())
