"""The fast paths: the tool's reads of gradients are batched per device (on a GPU each read of a
value is a synchronisation and each small reduction a kernel launch, so a model's hundreds of
parameters must not cost one apiece; counted here on the CPU through the calls that would cost
them), and indexed lookups give the answers of the scans they replace."""
import torch
from torch import nn

import jupyter_autograd as ja


def _model(n=12):
    torch.manual_seed(0)
    return nn.Sequential(*[nn.Linear(4, 4) for _ in range(n)])


class _Counted:
    def __init__(self, owner, name):
        self.owner, self.name, self.calls = owner, name, 0
        self.original = getattr(owner, name)

    def __enter__(self):
        original = self.original

        def counted(*args, **kwargs):
            self.calls += 1
            return original(*args, **kwargs)
        setattr(self.owner, self.name, counted)
        return self

    def __exit__(self, *exc):
        setattr(self.owner, self.name, self.original)


def test_the_gradient_norms_of_a_backward_are_one_reduction_per_device_not_one_per_parameter():
    model = _model()
    x = torch.randn(2, 4)
    with _Counted(torch.linalg, "vector_norm") as one_by_one, _Counted(torch, "_foreach_norm") as batched:
        with ja.capture() as trace:
            model(x).sum().backward()
    assert len(list(model.parameters())) == 24
    assert one_by_one.calls == 0
    assert batched.calls == 3  # the loss, the gradients after the backward, the leaves themselves at the end
    stats = trace.grad_stats()
    assert len(stats["parameters"]) == 24
    for name, p in model.named_parameters():
        row = next(r for r in stats["parameters"] if r["name"].endswith(name))
        assert abs(row["norms"][-1] - float(p.grad.norm())) <= 1e-5 * max(1.0, float(p.grad.norm()))
        assert abs(row["param_norm"] - float(p.detach().norm())) <= 1e-5 * max(1.0, float(p.detach().norm()))


def test_the_gradient_summaries_are_read_in_one_copy_per_device():
    model = _model()
    x = torch.randn(2, 4)
    with ja.capture() as trace:
        model(x).sum().backward()
    with _Counted(torch.Tensor, "tolist") as reads:
        tensors = trace.tensors
    assert reads.calls == 1
    for name, p in model.named_parameters():
        info = next(t for t in tensors.values() if t.name and t.name.endswith(name))
        first = ", ".join("%.4g" % v for v in p.grad.reshape(-1)[:6].tolist())
        assert info.grad.startswith("tensor([%s" % first), (info.grad, first)
        assert info.grad.endswith("shape=%s" % (tuple(p.shape),))


def test_gradient_summaries_of_other_dtypes_and_layouts_read_as_their_values():
    half = torch.randn(3, 5, dtype=torch.float64).to(torch.float16).requires_grad_()
    wide = torch.randn(8, dtype=torch.float64, requires_grad=True)
    z = torch.randn(2, dtype=torch.complex64, requires_grad=True)
    emb = nn.Embedding(10, 3, sparse=True)
    with ja.capture() as trace:
        (half.float().t() * 2).sum().backward()
        (wide ** 2).sum().backward()
        (z * z.conj()).real.sum().backward()
        emb(torch.tensor([1, 2])).sum().backward()
    by_tid = {t.tid: t for t in trace.tensors.values() if t.grad}
    texts = sorted(t.grad for t in by_tid.values())
    assert any(text.startswith("tensor([%s, ..." % ", ".join("%.4g" % v for v in half.grad.reshape(-1)[:6].tolist()))
               for text in texts), texts
    assert any(text.startswith("tensor([%s, ..." % ", ".join("%.4g" % v for v in wide.grad[:6].tolist()))
               for text in texts), texts
    assert any("j" in text for text in texts)
    assert any("layout=sparse_coo" in text for text in texts), texts


def test_the_writes_a_saved_tensor_overlaps_are_found_by_address_as_by_a_scan():
    """saved_tensor_writes looks writes up by address (rules/writes._Windows); the answers are those of
    the scan over every write after the save, on random writes with reused memory, long buffers,
    several tensors per op and `.data =` swaps."""
    import random
    from types import SimpleNamespace

    from jupyter_autograd.diagnose.rules import writes as rules
    from jupyter_autograd.model import DATA_SWAP

    rng = random.Random(0)
    for trial in range(40):
        ops = []
        for index in range(300):
            if rng.random() < 0.5:
                ops.append(SimpleNamespace(index=index, name="Tensor.add", writes=(), write_ranges=()))
                continue
            tids = tuple(rng.randrange(50) for _ in range(rng.choice((1, 1, 2, 3))))
            ranges = []
            for _ in tids:
                start = rng.randrange(0, 1 << 22, 64)
                length = rng.choice((64, 256, 4096, 1 << 21)) if rng.random() < 0.9 else None
                ranges.append(None if length is None else (start, start + length))
            name = DATA_SWAP if rng.random() < 0.05 else "Tensor.mul_"
            ops.append(SimpleNamespace(index=index, name=name, writes=tids, write_ranges=tuple(ranges)))
        trace = SimpleNamespace(ops=ops, tensors={})
        index = rules._WriteIndex(trace)
        before = rng.randrange(100, 300)
        earliest = rng.randrange(-1, before)
        windows = rules._Windows(index, before, earliest)
        for _ in range(60):
            after = rng.randrange(earliest, before)
            start = rng.randrange(0, 1 << 22, 64)
            byte_range = (start, start + rng.choice((64, 1024, 1 << 16, 1 << 21)))
            held = rng.choice((None, rng.randrange(50)))
            got = [(op.index, t) for op, t in windows.between(byte_range, after, held)]
            want = [(op.index, t) for op, t in rules._WriteIndex.between(trace, index, byte_range, after, before,
                                                                          None, held)]
            assert got == want, (trial, byte_range, after, held)


def test_norms_left_on_a_device_are_read_in_one_copy_for_every_backward_of_the_block():
    """On a GPU the norms stay device tensors until the block ends; those of every checked backward
    and the leaves' own are then read with one copy per device (one synchronisation), whatever
    their dtypes. CPU 0-d tensors stand in for them here."""
    from jupyter_autograd.capture import nan_watch

    lists = [[(1, torch.tensor(3.0, dtype=torch.float64)), (2, 0.5)],
             [(1, torch.tensor(float("inf"))), (3, torch.tensor(2.0, dtype=torch.float64))],
             [(4, torch.tensor(1.5, dtype=torch.float16))]]
    with _Counted(torch.Tensor, "tolist") as reads:
        out = nan_watch.read_norm_lists(lists)
    assert reads.calls == 1
    assert out == [[(1, 3.0), (2, 0.5)], [(1, float("inf")), (3, 2.0)], [(4, 1.5)]]


class _CountedKinds(dict):
    """UserLines.kinds counting its lookups: one per frame a walk to the user's line passes."""
    gets = 0

    def get(self, key, default=None):
        _CountedKinds.gets += 1
        return dict.get(self, key, default)


def _deep_library_model(depth):
    """A transformer layer of torch's (a few dozen ops in its forward) nested `depth` modules deep
    (each module call adds four frames to the stack)."""
    torch.manual_seed(0)
    model = nn.TransformerEncoderLayer(8, 2, dim_feedforward=8, dropout=0.0, batch_first=True)
    for _ in range(depth):
        model = nn.Sequential(model)
    return model


def _ops_and_walk(model, shortcut):
    """(each recorded op's name and line, frames the walks passed per recorded op); `shortcut` False:
    the module calls running are not handed to the walk, which then goes all the way up."""
    from jupyter_autograd.capture import frames
    from jupyter_autograd.capture.state import thread_state

    x = torch.randn(2, 3, 8)
    original = frames.UserLines.user_line

    def full_walk(self, frame, calls=None):
        return original(self, frame)
    if not shortcut:
        frames.UserLines.user_line = full_walk
    try:
        with ja.capture(namespace={}) as trace:
            recorder = thread_state.recorder
            counted = _CountedKinds(recorder.lines.kinds)
            recorder.lines.kinds = counted
            _CountedKinds.gets = 0
            y = model(x)  # the line every op of the model belongs to
            walked = _CountedKinds.gets / len(recorder.ops)
            y.sum().backward()
    finally:
        frames.UserLines.user_line = original
    return [(op.name, op.location.line) for op in trace.ops], walked


def test_an_op_deep_inside_a_library_model_stops_its_walk_at_the_innermost_module_call():
    """Each op is placed at the innermost line of the user's code above it. Inside a library model (HF's
    GPT-2: 26 frames above each op) the walk stops at the innermost module call running, whose caller's
    line was resolved once, when that call began: the same lines as the walk to the top, at a cost per
    op that does not grow with the depth of the model."""
    for depth in (2, 12):
        model = _deep_library_model(depth)
        short, short_frames = _ops_and_walk(model, shortcut=True)
        full, full_frames = _ops_and_walk(model, shortcut=False)
        assert short == full and len(short) > 10 and len({line for _, line in short}) == 2
        assert full_frames > 3 * depth  # each walk passes the frames of every module call above it
        assert short_frames < 12  # a few frames per op and per module call, whatever the depth
