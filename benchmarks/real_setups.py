"""Benchmark: the tool in real setups, plain against captured, measured in one run.

    python benchmarks/real_setups.py            # everything
    python benchmarks/real_setups.py --quick    # fewer epochs and cells

Worker processes: a DataLoader with two forked workers, each item a little torch work. One
epoch iterated inside a captured block against one iterated plain; with persistent workers,
one epoch inside the block and then 30 after it, against the same plain, and how much each
worker's resident memory grew over the 30 epochs (workers that went on recording would grow).

Kernel memory: a real IPython kernel (jupyter_client), cells sent as JupyterLab sends them
(with their cell id). A 1,000-step %%autograd cell re-run 10 times, then 40 more: the growth of
the Python heap (tracemalloc) and of the resident set per re-run; 100 small %%autograd cells,
each with its own output, then 400 more: growth per cell (each output keeps its widget, and so its trace). The same
cells without %%autograd give what the kernel itself keeps (its history).

Failing cells: the reply time of the first failing cell of a fresh kernel, and of a later one,
with and without %%autograd (the report is drawn before the reply).
"""
from __future__ import annotations

import argparse
import os
import sys
import time

import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
import jupyter_autograd as ja  # noqa: E402


class Items(torch.utils.data.Dataset):
    """Items that cost a little torch work each, as a real dataset's transforms do."""

    def __len__(self):
        return 512

    def __getitem__(self, i):
        g = torch.Generator().manual_seed(i)
        x = torch.randn(32, 32, generator=g)
        for _ in range(20):
            x = torch.tanh(x @ x.T / 32)
        return x.mean(0)


def loader(persistent: bool) -> torch.utils.data.DataLoader:
    return torch.utils.data.DataLoader(Items(), batch_size=32, num_workers=2, multiprocessing_context="fork",
                                       persistent_workers=persistent)


def epoch(data) -> float:
    t0 = time.perf_counter()
    for batch in data:
        batch.sum()
    return time.perf_counter() - t0


def worker_rss(data) -> list[int]:
    pids = [w.pid for w in data._iterator._workers]
    out = []
    for pid in pids:
        with open("/proc/%d/status" % pid) as f:
            out.append(next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmRSS")))
    return out


def workers(epochs_after: int) -> dict:
    results = {}
    for captured in (False, True):
        label = "captured" if captured else "plain"
        data = loader(persistent=False)
        epoch(data)  # warm: imports, allocator
        times = []
        for _ in range(3):
            if captured:
                with ja.capture():
                    times.append(epoch(data))
            else:
                times.append(epoch(data))
        results["epoch " + label] = min(times)
        data = loader(persistent=True)
        if captured:
            with ja.capture():
                epoch(data)
        else:
            epoch(data)
        before = worker_rss(data)
        after_block = sum(epoch(data) for _ in range(epochs_after))
        grown = [b - a for a, b in zip(before, worker_rss(data))]
        data._iterator._shutdown_workers()
        results["persistent %s: %d epochs after" % (label, epochs_after)] = after_block
        results["persistent %s: worker growth MiB" % label] = max(grown) / 2**20
    return results


LONG_CELL = """%%autograd
import torch
torch.manual_seed({i})
net = torch.nn.Linear(8, 1)
opt = torch.optim.SGD(net.parameters(), lr=0.01)
for step in range(1000):
    loss = net(torch.randn(4, 8)).pow(2).mean()
    opt.zero_grad()
    loss.backward()
    opt.step()
"""

SMALL_CELL = "%%autograd\nimport torch\nw = torch.ones(3, requires_grad=True)\n(w * {i}).sum().backward()\n"


def kernel_memory(reruns: int, cells: int) -> dict:
    from jupyter_client.manager import start_new_kernel

    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [ROOT, os.environ.get("PYTHONPATH")])))
    manager, client = start_new_kernel(kernel_name="python3", env=env, startup_timeout=120)

    def run(code, cell_id):
        content = {"code": code, "silent": False, "store_history": True, "user_expressions": {},
                   "allow_stdin": False, "stop_on_error": True}
        message = client.session.msg("execute_request", content, metadata={"cellId": cell_id})
        client.shell_channel.send(message)
        while True:
            reply = client.get_shell_msg(timeout=600)
            if reply["parent_header"]["msg_id"] == message["header"]["msg_id"]:
                assert reply["content"]["status"] == "ok", reply["content"]
                break
        result = None
        while True:  # the cell's own iopub messages, up to its idle status
            msg = client.get_iopub_msg(timeout=600)
            if msg["parent_header"].get("msg_id") != message["header"]["msg_id"]:
                continue
            if msg["msg_type"] == "execute_result":
                result = msg["content"]["data"]["text/plain"]
            if msg["msg_type"] == "status" and msg["content"]["execution_state"] == "idle":
                return result

    def held():
        text = run("import gc as _gc, tracemalloc as _tm, ctypes as _ct\n_gc.collect()\n"
                   "_ct.CDLL('libc.so.6').malloc_trim(0)\n"
                   "(_tm.get_traced_memory()[0], int(open('/proc/self/statm').read().split()[1]) * 4096)", "measure")
        return tuple(int(v) for v in text.strip("()").split(","))

    def growth(cell, runs, same_cell):
        """KiB per run of the heap and the resident set: over the first `runs` runs after two warm
        ones, and over the next 4 x `runs` (where the allocator's own growth has levelled off)."""
        for _ in range(2):  # warm; a re-run's cell id is the same as the warm runs'
            run(cell.format(i=0), "again" if same_cell else "warm-%d" % len(cell))
        marks = [held()]
        for phase, count in enumerate((runs, 4 * runs)):
            for i in range(1, count + 1):
                run(cell.format(i=i), "again" if same_cell else "cell-%d-%d-%d" % (phase, i, len(cell)))
            marks.append(held())
        return [((b[0] - a[0]) / count / 1024, (b[1] - a[1]) / count / 1024)
                for (a, b, count) in ((marks[0], marks[1], runs), (marks[1], marks[2], 4 * runs))]

    results = {}
    try:
        run("import tracemalloc\ntracemalloc.start()\n%load_ext jupyter_autograd", "setup")
        for label, magic in (("plain", False), ("captured", True)):
            strip = (lambda cell: cell) if magic else (lambda cell: cell.split("\n", 1)[1])
            for name, cell, count, same in (("1,000-step cell re-run", LONG_CELL, reruns, True),
                                            ("small cells", SMALL_CELL, cells, False)):
                first, then = growth(strip(cell), count, same_cell=same)
                for (heap, rss), over in ((first, "first %d" % count), (then, "next %d" % (4 * count))):
                    results["%s, %s, %s: heap KiB per run" % (name, label, over)] = heap
                    results["%s, %s, %s: RSS KiB per run" % (name, label, over)] = rss
    finally:
        client.stop_channels()
        manager.shutdown_kernel(now=True)
    return results


FAILING_BODY = "import torch\nx = torch.ones(2, requires_grad=True)\ny = x.exp()\ny += 1\ny.sum().backward()\n"


def failing_cell_replies(kernels: int) -> dict:
    """Seconds from request to reply of the first failing cell of a fresh kernel, and of a later
    one: a slow reply lets more of the cells queued behind it be aborted (stop_on_error)."""
    import statistics

    from jupyter_client.manager import start_new_kernel

    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [ROOT, os.environ.get("PYTHONPATH")])))
    times = {}
    for k in range(2 * kernels):
        manager, client = start_new_kernel(kernel_name="python3", env=env, startup_timeout=120)
        try:
            client.execute_interactive("%load_ext jupyter_autograd\nimport torch", timeout=120)
            label = "captured" if k % 2 else "plain"
            for when in ("first", "later"):
                cell = ("%%autograd\n" if k % 2 else "# plain\n") + FAILING_BODY
                t0 = time.perf_counter()
                reply = client.execute_interactive(cell, timeout=120, output_hook=lambda msg: None)
                assert reply["content"]["status"] == "error", reply["content"]
                times.setdefault("failing cell reply, %s, %s: s" % (when, label), []).append(time.perf_counter() - t0)
        finally:
            client.stop_channels()
            manager.shutdown_kernel(now=True)
    return {name: statistics.median(values) for name, values in sorted(times.items())}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="10 epochs after the block, 5 (+20) re-runs, 30 (+120) cells")
    args = parser.parse_args()
    torch.set_num_threads(1)
    results = workers(10 if args.quick else 30)
    results.update(kernel_memory(5 if args.quick else 10, 30 if args.quick else 100))
    results.update(failing_cell_replies(1 if args.quick else 3))
    width = max(map(len, results))
    for name, value in results.items():
        print("%-*s  %10.3f" % (width, name, value))
    plain, captured = results["epoch plain"], results["epoch captured"]
    print("epoch with workers: captured/plain %.2fx" % (captured / plain))


if __name__ == "__main__":
    main()
