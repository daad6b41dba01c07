"""Benchmark: has capture's overhead grown since a baseline commit? Both in one process.

    python benchmarks/against_baseline.py                 # against the first session's capture
    python benchmarks/against_baseline.py --rev REV --reps 80 --workloads mlp,cnn
    python benchmarks/against_baseline.py --rev REV --workloads resnet50,gpt2   # gpu.py's real op counts

The package as it was at REV is taken from git (`git archive`, so the checkout needs its history)
into a temporary folder under another name, and imported beside this one. run.py's workloads are
then timed plain, under the baseline's capture and under this capture, with and without reading
the diagnoses, runs interleaved in a rotating order and garbage collected before each, exactly as
run.py times them. Ratios to the same plain step; a verdict from the paired runs (the two
captures of one repetition run back to back): "not grown" when, in half of them or more, this
capture took no longer than the baseline's. A goal for this script, never a timed assertion.
"""
from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)
sys.path.insert(0, ROOT)

import run  # noqa: E402  (the workloads and the interleaved timing)

import jupyter_autograd as ja  # noqa: E402

BASELINE_REV = "47ee298"  # the first session's capture: "capture overhead has not grown" (issue 8)


def _at_real_op_counts(name):
    """gpu.py's step of that name on the CPU (a ResNet-50 or GPT-2 124M at its real op count)."""
    def factory():
        import gpu
        return gpu.workloads(torch.device("cpu"))[name]()
    return factory


WORKLOADS = {"mlp": ("MLP 6x512, batch 64", run.mlp_step), "cnn": ("CNN 8x3x32x32", run.cnn_step),
             "transformer": ("Transformer 2 layers d=256", run.transformer_step),
             "resnet50": ("ResNet-50, 284 ops (gpu.py)", _at_real_op_counts("ResNet-50")),
             "gpt2": ("GPT-2 124M, 637 ops (gpu.py)", _at_real_op_counts("GPT-2 124M"))}
BASELINE_NAME = "jupyter_autograd_baseline"


def import_baseline(rev, into):
    """The package as it was at `rev`, imported as BASELINE_NAME (its imports are relative)."""
    try:
        archive = subprocess.run(["git", "-C", ROOT, "archive", rev, "jupyter_autograd"],
                                 capture_output=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError) as exc:
        detail = getattr(exc, "stderr", b"") or b""
        raise SystemExit("against_baseline: cannot read jupyter_autograd/ at %r from git (%s). Run it in a "
                         "checkout with that commit in its history (git fetch --unshallow)."
                         % (rev, detail.decode(errors="replace").strip() or exc))
    subprocess.run(["tar", "-x", "-C", into], input=archive, check=True)
    os.rename(os.path.join(into, "jupyter_autograd"), os.path.join(into, BASELINE_NAME))
    sys.path.insert(0, into)
    return __import__(BASELINE_NAME)


def timed_modes(step, baseline, reps):
    def plain():
        step()

    def captured_by(package, read):
        def mode():
            with package.capture() as trace:
                step()
            if read:
                trace.diagnoses  # noqa: B018 (the analysis runs when the trace is first read)
        return mode

    modes = {"plain": plain, "baseline": captured_by(baseline, False), "capture": captured_by(ja, False),
             "baseline+diagnose": captured_by(baseline, True), "capture+diagnose": captured_by(ja, True)}
    return run.interleaved_samples(modes, reps)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rev", default=BASELINE_REV, help="the baseline commit (default: %(default)s)")
    parser.add_argument("--reps", type=int, default=60, help="interleaved repetitions (default: %(default)s)")
    parser.add_argument("--workloads", default="mlp,cnn,transformer",
                        help="comma-separated, from: %s" % ", ".join(WORKLOADS))
    args = parser.parse_args(argv)
    chosen = [w.strip() for w in args.workloads.split(",") if w.strip()]
    unknown = [w for w in chosen if w not in WORKLOADS]
    if unknown or not chosen:
        parser.error("unknown workload %s; choose from %s" % (", ".join(unknown) or "(none)", ", ".join(WORKLOADS)))
    if args.reps < 1:
        parser.error("--reps must be at least 1")
    torch.set_num_threads(1)
    folder = tempfile.mkdtemp(prefix="ja-baseline-")
    try:
        baseline = import_baseline(args.rev, folder)
        print("capture against the baseline %s, %d interleaved repetitions, torch %s, one CPU thread\n"
              % (args.rev, args.reps, torch.__version__))
        print("%-28s %9s %9s %9s %11s %11s   %s" % ("one training step", "plain ms", "baseline", "capture",
                                                    "base+diag", "capt+diag", "verdict"))
        verdicts = []
        for key in chosen:
            name, factory = WORKLOADS[key]
            samples = timed_modes(factory(), baseline, args.reps)
            medians = {mode: statistics.median(times) for mode, times in samples.items()}
            plain = medians["plain"]
            faster = sum(c <= b for c, b in zip(samples["capture"], samples["baseline"]))
            grown = faster * 2 < len(samples["capture"])
            verdicts.append(not grown)
            print("%-28s %9.2f %8.3fx %8.3fx %10.3fx %10.3fx   %s (no slower in %d of %d paired runs)"
                  % (name, plain * 1e3, medians["baseline"] / plain, medians["capture"] / plain,
                     medians["baseline+diagnose"] / plain, medians["capture+diagnose"] / plain,
                     "GROWN" if grown else "not grown", faster, len(samples["capture"])))
        print("\ncapture overhead against %s: %s" % (args.rev, "not grown" if all(verdicts) else "GROWN"))
    finally:
        sys.modules.pop(BASELINE_NAME, None)
        shutil.rmtree(folder, ignore_errors=True)


if __name__ == "__main__":
    main()
