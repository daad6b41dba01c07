"""The cost of finding where a NaN gradient starts: capture(check_nan=True) against PyTorch's
detect_anomaly(check_nan=True), on the training steps of benchmarks/run.py.

    python benchmarks/nan.py            # 15 interleaved repetitions per mode
    python benchmarks/nan.py --quick    # a smoke test: 3 repetitions, numbers are noise

Modes: plain; capture() (the always-on cheap check of leaf gradients); capture(check_nan=True)
(a post-hook on every backward node); detect_anomaly(check_nan=True). One process, runs
interleaved, medians, one CPU thread. Goal (issue "every common autograd error"): check_nan
costs less than anomaly mode on every workload.
"""
from __future__ import annotations

import argparse
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from run import WORKLOADS, interleaved_medians  # noqa: E402  (the main benchmark's steps and timing)

import jupyter_autograd as ja  # noqa: E402


def modes_for(step):
    def plain():
        step()

    def capture():
        with ja.capture() as trace:
            step()
        trace.diagnoses  # noqa: B018

    def check_nan():
        with ja.capture(check_nan=True) as trace:
            step()
        trace.diagnoses  # noqa: B018

    def anomaly():
        with torch.autograd.detect_anomaly(check_nan=True):
            step()

    return {"plain": plain, "capture": capture, "check_nan": check_nan, "anomaly(check_nan)": anomaly}


def measure(step, reps):
    return interleaved_medians(modes_for(step), reps)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="3 repetitions: a smoke test, not a measurement")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    import warnings
    warnings.simplefilter("ignore", UserWarning)  # anomaly mode warns that it is slow
    reps = 3 if args.quick else 15
    if args.quick:
        print("(--quick: a smoke test; the ratios below are noise)")
    print("| one training step | plain | capture | capture(check_nan) | detect_anomaly(check_nan) | goal: check_nan < anomaly |")
    print("| --- | --- | --- | --- | --- | --- |")
    met = True
    for name, factory in WORKLOADS.items():
        if args.quick and "Recurrent" in name:
            continue
        t = measure(factory(), reps)
        base = t["plain"]
        ok = t["check_nan"] < t["anomaly(check_nan)"]
        met &= ok
        print("| %s | %.2f ms | %.2fx | %.2fx | %.2fx | %s |" % (
            name, base * 1e3, t["capture"] / base, t["check_nan"] / base, t["anomaly(check_nan)"] / base,
            "met" if ok else "missed"))
    print("check_nan below anomaly mode on every workload:", "met" if met else "missed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
