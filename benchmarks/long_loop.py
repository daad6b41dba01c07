"""Benchmark: a long loop of tiny ops under capture (issue 9, "Long loops").

    python benchmarks/long_loop.py              # 1,000,000 ops
    python benchmarks/long_loop.py --ops 100000  # smaller

Prints time per op and memory kept per op, plain against captured, measured in this one
process. Memory is the growth of the process's resident set while the block runs and what is
still held after the trace is dropped (after gc and malloc_trim), so it counts what the tool
keeps per op, not what the loop itself makes and frees.
"""
from __future__ import annotations

import argparse
import ctypes
import gc
import os
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import jupyter_autograd as ja  # noqa: E402


def rss() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def trim() -> None:
    gc.collect()
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except OSError:
        pass


def tiny_loop(n: int) -> None:
    x = torch.ones(4)
    for _ in range(n):
        x = x * 1.0001


def mlp_loop(steps: int) -> None:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 1))
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    x, y = torch.randn(16, 32), torch.randn(16, 1)
    for _ in range(steps):
        loss = torch.nn.functional.mse_loss(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()


def measure(label: str, work, n_ops: int, captured: bool) -> dict:
    trim()
    start_rss = rss()
    t0 = time.perf_counter()
    trace = None
    if captured:
        with ja.capture() as trace:
            work()
    else:
        work()
    seconds = time.perf_counter() - t0
    trim()
    during = rss() - start_rss
    build = None
    if trace is not None:
        t1 = time.perf_counter()
        n_recorded = len(trace.ops)
        build = time.perf_counter() - t1
        trim()
        built = rss() - start_rss
        notes = list(trace.notes) + list(trace.warnings)
        del trace
    else:
        n_recorded, built, notes = None, None, []
    trim()
    after = rss() - start_rss
    return dict(label=label, seconds=seconds, per_op_us=seconds / n_ops * 1e6, kept_bytes_per_op=during / n_ops,
                built_bytes_per_op=None if built is None else built / n_ops, after_del=after,
                recorded=n_recorded, build_s=build, notes=notes)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--ops", type=int, default=1_000_000, help="tiny ops in the long loop")
    parser.add_argument("--steps", type=int, default=2_000, help="steps of the MLP training loop")
    args = parser.parse_args()
    torch.set_num_threads(1)
    print("long loops under capture, torch %s, Python %s" % (torch.__version__, sys.version.split()[0]))
    print("%-30s %10s %10s %14s %14s %12s" % ("", "s", "us/op", "bytes/op kept", "after build", "after del"))
    for captured in (False, True):
        r = measure("tiny op x%d %s" % (args.ops, "capture" if captured else "plain"),
                    lambda: tiny_loop(args.ops), args.ops, captured)
        _row(r)
    # ops per MLP step: two captured steps less one (the model's construction is in both)
    counts = []
    for steps in (1, 2):
        with ja.capture() as probe:
            mlp_loop(steps)
        counts.append(len(probe.ops))
        del probe
    mlp_ops = max(1, counts[1] - counts[0])
    for captured in (False, True):
        r = measure("MLP x%d steps %s" % (args.steps, "capture" if captured else "plain"),
                    lambda: mlp_loop(args.steps), args.steps * mlp_ops, captured)
        _row(r)
    print("(MLP: %d ops per step, an optimizer step being one; bytes/op kept = RSS growth while the block ran, "
          "after gc + malloc_trim)" % mlp_ops)
    # Per step, over a loop long enough to fold: what a training loop keeps for each extra step.
    steps = (args.steps, 4 * args.steps)
    kept = []
    for n in steps:
        trim()
        start = rss()
        with ja.capture() as trace:
            mlp_loop(n)
        trim()
        kept.append(rss() - start)
        del trace
        trim()
    print("MLP kept per extra step, %d -> %d steps: %.0f bytes (%.0f per op)" % (
        steps[0], steps[1], (kept[1] - kept[0]) / (steps[1] - steps[0]),
        (kept[1] - kept[0]) / (steps[1] - steps[0]) / mlp_ops))
    # What stays after `del trace` is the allocator keeping the peak's pages (Python's arenas and
    # glibc's heap cannot always give them back), not objects we hold: the same block run again
    # reuses them, so it does not grow.
    trim()
    start = rss()
    after = []
    for _ in range(3):
        with ja.capture() as trace:
            mlp_loop(args.steps)
        len(trace.ops)
        del trace
        trim()
        after.append((rss() - start) / 2**20)
    print("MLP x%d steps captured 3 times in a row: after del %s MiB (flat: reused, not leaked)"
          % (args.steps, ", ".join("%.1f" % a for a in after)))


def _row(r: dict) -> None:
    built = "" if r["built_bytes_per_op"] is None else "%.0f" % r["built_bytes_per_op"]
    print("%-30s %10.2f %10.2f %14.0f %14s %9.1f MiB" % (r["label"], r["seconds"], r["per_op_us"], r["kept_bytes_per_op"],
                                                          built, r["after_del"] / 2**20))
    if r["recorded"] is not None:
        print("%-30s recorded ops in the trace: %d; notes: %s" % ("", r["recorded"], "; ".join(r["notes"]) or "-"))


if __name__ == "__main__":
    main()
