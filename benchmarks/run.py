"""Benchmark: capture overhead, graph scale and memory, side by side with the alternatives.

    python benchmarks/run.py            # the full table (a few minutes on 2 cores)
    python benchmarks/run.py --quick    # a smoke test that CI runs so this cannot rot (no verdicts)

Every ratio is measured in this one process, with runs interleaved (plain, capture, anomaly,
plain, ...) and medians taken, on one CPU thread. The full run ends with each goal (issue #5),
met or missed; they are goals for this script, never timed assertions in the tests.
"""
from __future__ import annotations

import argparse
import gc
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
import weakref

import torch
from torch import nn

import jupyter_autograd as ja


# -- workloads: each returns a function doing one training step ------------------------------------

def _training(model, opt, loss_of):
    """One step: forward, backward, optimizer step."""
    def step():
        loss = loss_of(model)
        opt.zero_grad()
        loss.backward()
        opt.step()
        return loss
    return step


def mlp_step():
    torch.manual_seed(0)
    layers = []
    for i in range(6):
        layers += [nn.Linear(512, 512), nn.ReLU()]
    model = nn.Sequential(*layers[:-1])
    x, y = torch.randn(64, 512), torch.randn(64, 512)
    return _training(model, torch.optim.SGD(model.parameters(), lr=1e-3),
                     lambda m: nn.functional.mse_loss(m(x), y))


def cnn_step():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, 16, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
                          nn.Conv2d(16, 32, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
                          nn.Flatten(), nn.Linear(32 * 8 * 8, 10))
    x, y = torch.randn(8, 3, 32, 32), torch.randint(0, 10, (8,))
    return _training(model, torch.optim.SGD(model.parameters(), lr=1e-3),
                     lambda m: nn.functional.cross_entropy(m(x), y))


def transformer_step():
    torch.manual_seed(0)
    layer = nn.TransformerEncoderLayer(d_model=256, nhead=4, dim_feedforward=512, batch_first=True, dropout=0.0)
    model = nn.TransformerEncoder(layer, num_layers=2, enable_nested_tensor=False)
    x = torch.randn(8, 64, 256)
    return _training(model, torch.optim.Adam(model.parameters(), lr=1e-4), lambda m: m(x).pow(2).mean())


def recurrent_step(steps=2000):
    torch.manual_seed(0)
    w = torch.randn(16, requires_grad=True)
    xs = torch.randn(steps, 16)

    def step():
        h = torch.zeros(16)
        for t in range(steps):
            h = torch.tanh(h * w + xs[t])
        loss = h.sum()
        loss.backward()
        w.grad = None
        return loss
    return step


WORKLOADS = {"MLP 6x512, batch 64": mlp_step, "CNN 8x3x32x32": cnn_step,
             "Transformer 2 layers d=256": transformer_step, "Recurrent chain 2000 steps": recurrent_step}


# -- measurements -------------------------------------------------------------------------------------

def time_modes(step, reps):
    """Median seconds per step for each mode, runs interleaved so drift hits all modes alike."""
    def plain():
        step()

    def captured():
        with ja.capture():
            step()

    def diagnosed():
        with ja.capture() as trace:
            step()
        trace.diagnoses  # noqa: B018 (the analysis runs when the trace is first read)

    def anomaly():
        with torch.autograd.detect_anomaly(check_nan=False):
            step()

    return interleaved_medians({"plain": plain, "capture": captured, "diagnosed": diagnosed, "anomaly": anomaly},
                               reps)


def interleaved_medians(modes, reps):
    """Median seconds per call of each mode (see interleaved_samples)."""
    return {k: statistics.median(v) for k, v in interleaved_samples(modes, reps).items()}


def interleaved_samples(modes, reps):
    """Seconds per call of each mode, one per repetition, after one warm-up call each; runs
    interleaved, in a rotating order, so drift on a shared machine hits all modes alike."""
    for fn in modes.values():
        fn()
    samples = {k: [] for k in modes}
    order = list(modes)
    for rep in range(reps):
        for name in order[rep % len(order):] + order[:rep % len(order)]:
            gc.collect()
            start = time.perf_counter()
            modes[name]()
            samples[name].append(time.perf_counter() - start)
    return samples


def torchviz_time(step_factory):
    try:
        from torchviz import make_dot
    except ImportError:
        return None, "torchviz not installed"
    step = step_factory()
    import warnings
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        loss = _forward_only(step)
        start = time.perf_counter()
        try:
            dot = make_dot(loss)
            dot.source  # noqa: B018 (force the traversal and the text)
        except RecursionError:
            return None, "RecursionError"
        return time.perf_counter() - start, ""


def _forward_only(step):
    """The loss of one step with its graph still alive (backward is what we want to draw)."""
    holder = {}
    real_backward = torch.Tensor.backward

    def keep(self, *args, **kwargs):
        holder["loss"] = self
        raise _Stop

    torch.Tensor.backward = keep
    try:
        step()
    except _Stop:
        pass
    finally:
        torch.Tensor.backward = real_backward
    return holder["loss"]


class _Stop(Exception):
    pass


def graph_scale(n_nodes):
    from jupyter_autograd.widget import AutogradWidget
    x = torch.randn(8, requires_grad=True)
    start = time.perf_counter()
    with ja.capture() as trace:
        h = x
        for _ in range(n_nodes // 2):
            h = torch.tanh(h * 1.01)
    captured = time.perf_counter() - start
    widget = AutogradWidget(trace)
    opened = time.perf_counter() - start
    click = time.perf_counter()
    widget.selected = "fn%d" % next(iter(trace.nodes))
    click = time.perf_counter() - click
    result = {"nodes": len(trace.nodes), "capture_s": captured, "open_widget_s": opened,
              "render_ms": widget.render_ms, "click_ms": click * 1000, "grouped": widget.grouped}
    del h, trace, widget
    return result


def retained_tensors():
    """Tensors of the block that are still alive after the user dropped them."""
    refs = []
    step = transformer_step()
    with ja.capture() as trace:
        loss = step()
        extra = loss.detach().clone()
        refs += [weakref.ref(loss), weakref.ref(extra)]
    del loss, extra, step
    gc.collect()
    return sum(r() is not None for r in refs)


def peak_rss_mb(mode, steps):
    code = ("import sys, resource, torch; sys.path.insert(0, %r); torch.set_num_threads(1)\n"
            "import run as b, jupyter_autograd as ja\n"
            "step = b.transformer_step()\n"
            "for _ in range(%d):\n"
            "    if %r == 'capture':\n"
            "        with ja.capture():\n            step()\n"
            "    else:\n        step()\n"
            "print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024)\n"
            % (os.path.dirname(os.path.abspath(__file__)), steps, mode))
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    return float(out.stdout.strip().splitlines()[-1])


def cuda_sync_check():
    if not torch.cuda.is_available():
        return "no CUDA device on this machine"
    model = nn.Sequential(nn.Linear(256, 256), nn.ReLU(), nn.Linear(256, 1)).cuda()
    x = torch.randn(64, 256, device="cuda")
    model(x).sum().backward()  # warm up outside the check
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        with ja.capture() as trace:
            loss = model(x).sum()
            loss.backward()
        torch.cuda.set_sync_debug_mode(0)
        return "no synchronisation (%d ops recorded)" % len(trace.ops)
    except RuntimeError as exc:
        torch.cuda.set_sync_debug_mode(0)
        return "SYNCHRONISED: %s" % exc


# -- report ---------------------------------------------------------------------------------------

STEP_GOAL = 1.10  # capture's time over the plain step, for the MLP, CNN and transformer


def goals(results):
    """[(goal, what was measured, met: True / False / None when not measured)], one per goal."""
    out = []
    for name, row in results["workloads"].items():
        if not name.startswith("Recurrent"):
            out.append(("capture <= %.2fx, %s" % (STEP_GOAL, name), "%.2fx" % row["capture_x"],
                        row["capture_x"] <= STEP_GOAL))
    for name, row in results["workloads"].items():
        out.append(("capture below anomaly mode, %s" % name, "%.2fx vs %.2fx" % (row["capture_x"], row["anomaly_x"]),
                    row["capture_x"] < row["anomaly_x"]))
        out.append(("capture + diagnose below anomaly mode, %s" % name,
                    "%.2fx vs %.2fx" % (row["diagnose_x"], row["anomaly_x"]), row["diagnose_x"] < row["anomaly_x"]))
    by_size = {r["nodes"] // 1000 * 1000: r for r in results["scale"]}
    for size, limit in ((10_000, 2.0), (100_000, 10.0)):
        r = by_size.get(size)
        out.append(("%s nodes captured, diagnosed and opened < %d s" % (format(size, ","), limit),
                    "%.2f s" % r["open_widget_s"] if r else "not run", r["open_widget_s"] < limit if r else None))
    clicks = [r["click_ms"] for r in results["scale"]]
    out.append(("a click answered < 100 ms", "%.2f ms at most" % max(clicks) if clicks else "not run",
                max(clicks) < 100 if clicks else None))
    memory = results["memory"]
    out.append(("peak memory under capture <= 1.10x", "%.2fx" % memory["ratio"], memory["ratio"] <= 1.10))
    out.append(("no user tensor kept alive", "%d" % memory["retained_tensors"], memory["retained_tensors"] == 0))
    cuda = results.get("cuda", "")
    out.append(("no CUDA synchronisation", cuda, None if cuda.startswith("no CUDA") else cuda.startswith("no sync")))
    return out


def write_json(path, results):
    """The results as JSON, the whole file or none: written beside it, then renamed over it."""
    fd, temporary = tempfile.mkstemp(dir=os.path.dirname(os.path.abspath(path)), suffix=".tmp")
    try:
        with os.fdopen(fd, "w") as f:
            json.dump(results, f, indent=1)
        os.replace(temporary, path)
    except BaseException:
        os.unlink(temporary)
        raise


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="small sizes and few repetitions (CI)")
    parser.add_argument("--json", metavar="FILE", help="also write the results as JSON")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    import warnings
    warnings.filterwarnings("ignore", message="Anomaly Detection has been enabled")
    reps = 5 if args.quick else 21
    scales = (1_000, 10_000) if args.quick else (1_000, 10_000, 100_000)
    results = {"date": time.strftime("%Y-%m-%d"), "machine": "%s, %d CPUs, torch %s, Python %s" % (
        platform.processor() or platform.machine(), os.cpu_count(), torch.__version__, platform.python_version()),
               "workloads": {}, "scale": [], "memory": {}}
    print("jupyter-autograd benchmark, %s, %s%s" % (results["date"], results["machine"], " (quick)" if args.quick else ""))
    print()
    print("%-30s %9s %9s %11s %9s %14s" % ("one training step", "plain ms", "capture", "+diagnose", "anomaly",
                                          "torchviz draw"))
    for name, factory in WORKLOADS.items():
        if args.quick and "Recurrent" in name:
            factory = lambda: recurrent_step(200)  # noqa: E731
            name = "Recurrent chain 200 steps"
        times = time_modes(factory(), reps)
        viz, viz_error = torchviz_time(factory)
        row = {"plain_ms": times["plain"] * 1000, "capture_x": times["capture"] / times["plain"],
               "diagnose_x": times["diagnosed"] / times["plain"], "anomaly_x": times["anomaly"] / times["plain"],
               "torchviz": ("%.3fx" % (viz / times["plain"])) if viz is not None else "failed: " + viz_error}
        results["workloads"][name] = row
        print("%-30s %9.2f %8.2fx %10.2fx %8.2fx %14s" % (name, row["plain_ms"], row["capture_x"],
                                                         row["diagnose_x"], row["anomaly_x"], row["torchviz"]))
    print()
    print("%-10s %14s %20s %10s %10s %8s" % ("graph nodes", "capture s", "+diagnose+widget s", "render ms",
                                             "click ms", "grouped"))
    for n in scales:
        r = graph_scale(n)
        results["scale"].append(r)
        print("%-11d %14.2f %20.2f %10.0f %10.2f %8s" % (r["nodes"], r["capture_s"], r["open_widget_s"],
                                                        r["render_ms"], r["click_ms"], r["grouped"]))
    print()
    steps = 3 if args.quick else 10
    plain_mb, capture_mb = peak_rss_mb("plain", steps), peak_rss_mb("capture", steps)
    results["memory"] = {"plain_mb": plain_mb, "capture_mb": capture_mb, "ratio": capture_mb / plain_mb,
                         "retained_tensors": retained_tensors()}
    print("memory, transformer step x%d: peak RSS %.0f MB plain, %.0f MB under capture (%.2fx)"
          % (steps, plain_mb, capture_mb, capture_mb / plain_mb))
    print("user tensors kept alive by the capture after `del`: %d" % results["memory"]["retained_tensors"])
    results["cuda"] = cuda_sync_check()
    print("CUDA synchronisation check: %s" % results["cuda"])
    print()
    results["goals"] = [{"goal": g, "measured": m, "met": ok} for g, m, ok in goals(results)]
    if args.quick:
        print("--quick is a smoke test: it checks that every number is produced, with sizes and repetitions too")
        print("small for the ratios to mean anything (a 0.6x can appear). Run without --quick to judge the goals.")
    else:
        print("goals (issue #5):")
        for g in results["goals"]:
            verdict = {True: "met", False: "MISSED", None: "not measured"}[g["met"]]
            print("  %-13s %-62s %s" % (verdict, g["goal"], g["measured"]))
    if args.json:
        write_json(args.json, results)
    return results


if __name__ == "__main__":
    main()
