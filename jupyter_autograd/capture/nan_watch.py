"""Where backward turns finite gradients into NaN or Inf.

Cheap, always: after each checked backward call, the L2 norm of each leaf gradient (a norm is not
finite exactly when the gradient holds a NaN or an Inf), kept on the gradient's device and read
once when the block ends, so the per-op path never waits for a device; the norms are also the
data of Trace.grad_stats(). With capture(check_nan=True): a post-hook on every node of the graph about to run finds
the first node whose outgoing gradients are not finite (all before it were), and reads its
saved inputs to say which values did it (sqrt at 0, log of 0, division by zero, ...). The hooks
are removed as soon as the backward call returns or raises.
"""
from __future__ import annotations

import gc
import math

import torch

from .graph import saved_names
from .records import OP_OUT, OP_WR

_ACCUMULATE_GRAD = torch._C._functions.AccumulateGrad
_no_subclass_dispatch = torch._C.DisableTorchFunctionSubclass
_Tensor = torch.Tensor
_STRIDED = torch.strided
_SUMMED = frozenset((torch.float32, torch.float64))  # summed and read in the hook (CPU only)
_dispatch_modes = torch._C._len_torch_dispatch_stack
_NO_DISPATCH = torch._C._disabled_torch_dispatch_impl  # Tensor's own __torch_dispatch__: none


def _unseen(read):
    """Run read() hidden from the user's TorchDispatchModes (FlopCounterMode, a logging mode): our
    reads of gradients are no ops of theirs. Their modes are taken off the stack and put back."""
    if not _dispatch_modes():
        return read()
    from torch.utils._python_dispatch import _disable_current_modes
    with _disable_current_modes():
        return read()


def _dispatches(g) -> bool:
    """A tensor subclass with its own __torch_dispatch__ (a wrapper, DTensor, ...) sees every op run
    on it, ours too: its gradients are not read."""
    return getattr(type(g), "__torch_dispatch__", _NO_DISPATCH) is not _NO_DISPATCH


def norms_of(grads):
    """[(tid, its L2 norm)]: one pass over each gradient's memory, which also says whether it holds
    NaN or Inf (the norm is then not finite). A CPU float32/float64 gradient is read now, where
    that costs no sync; on another device the norm stays a 0-d device tensor, read with read_norm_lists
    when the block ends, so no backward waits for the device. Plain strided gradients of one device
    and dtype take one `_foreach_norm` call (one or two kernels on a GPU, not one per parameter)."""
    def read():
        with _no_subclass_dispatch():
            return _norms(grads)
    return _unseen(read)


def _norms(grads):
    out = []
    groups = {}  # (device, dtype) -> positions in out of plain strided real gradients
    for tid, g in grads:
        if type(g) is not _Tensor and _dispatches(g):
            continue
        if g.layout is _STRIDED and g.is_floating_point() and not g.is_nested:
            groups.setdefault((g.device, g.dtype), []).append(len(out))
            out.append((tid, g))
        else:
            out.append((tid, _device_norm(g)))
    for (device, dtype), positions in groups.items():
        tensors = [out[i][1] for i in positions]
        # A parameter, or a gradient with create_graph=True: no graph for our read.
        tensors = [g.detach() if g.requires_grad else g for g in tensors]
        if device.type == "cpu":
            # An nn.Parameter too (a subclass without a dispatch of its own): summed in float64 on
            # the CPU, 6 MB of parameters took 20 ms instead of 0.3.
            values = _stacked_norms(tensors, None if dtype in _SUMMED else torch.float32).tolist()
            for i, g, norm in zip(positions, tensors, values):
                if norm == math.inf and bool(torch.isfinite(g).all()):
                    # The squares of finite values past 1.8e19 overflow float32: the same norm, summed in
                    # float64 (thirty times slower on the CPU, so only here).
                    norm = float(torch.linalg.vector_norm(g, dtype=torch.float64))
                out[i] = (out[i][0], norm)
        else:
            # Summed in float64 where the device has it, so no finite float32 or half gradient overflows:
            # the norm is not finite exactly when a value is not.
            norms = _foreach_norms(tensors, torch.float32 if device.type == "mps" else torch.float64)
            for i, norm in zip(positions, norms):
                out[i] = (out[i][0], norm)
    return out


def first_nonfinite(records, table, any_device=False):
    return _unseen(lambda: _first_nonfinite(records, table, any_device))


def _first_nonfinite(records, table, any_device=False):
    """The index of the first op among `records` (op records, in order) whose output, still alive and
    holding what that op left in it, holds a NaN or an Inf: where the forward pass first left the
    finite numbers (a `-inf` fill, a log of 0), or None. A tensor written in place later (itself or
    through a view of the memory it shares) holds what the last write left: that write is its op.
    CPU tensors only, read one by one: reading a device's would wait for it. With `any_device` (at
    the block's end, where one wait is allowed) every device's, their flags read in one copy per device."""
    refs = table.refs
    last_write = {}  # the tensor whose memory a written tensor views (the end of its bases) -> the last op writing it
    for index, rec in enumerate(records):
        for t_id, _ in rec[OP_WR] or ():
            last_write[table.root(t_id)] = index
    flags = {}  # device -> [(op index, 0-d flag: all finite)]
    for index, rec in enumerate(records):
        for t_id in rec[OP_OUT]:
            if last_write.get(table.root(t_id), index) > index:
                continue  # what it holds now, a later write left
            t = refs[t_id]() if t_id < len(refs) else None
            if t is None or not (t.is_cpu or any_device) or t.layout is not _STRIDED or t.is_nested or not (
                    t.is_floating_point() or t.is_complex()):
                continue
            if any_device:
                flags.setdefault(t.device, []).append((index, torch.isfinite(t.detach()).all()))
            elif not bool(torch.isfinite(t.detach()).all()):
                return index
    found = [index for entries in flags.values()
             for (index, _), finite in zip(entries, torch.stack([flag for _, flag in entries]).tolist()) if not finite]
    return min(found) if found else None


def _foreach_norms(tensors, dtype):
    """The 0-d L2 norms of same-device tensors, summed in `dtype` (None: their own)."""
    try:
        return torch._foreach_norm(tensors, 2, dtype=dtype)
    except (TypeError, RuntimeError, AttributeError):  # a torch without it, or a device it does not cover
        return [torch.linalg.vector_norm(g, dtype=dtype) for g in tensors]


def _stacked_norms(tensors, dtype):
    norms = _foreach_norms(tensors, dtype)
    return torch.stack(norms) if len(norms) > 1 else norms[0].reshape(1)


def _device_norm(g):
    """A 0-d tensor on g's device, without a sync. Summed in float64 where the device has it, so no
    finite float32 or half gradient overflows: the norm is not finite exactly when a value is not."""
    g = _values(g.detach())  # a nested tensor's components are padded with zeros: the same norm
    if g.is_complex():
        g = torch.view_as_real(g)
    if g.numel() == 0:
        return torch.zeros((), dtype=torch.float32, device=g.device)
    if g.device.type == "mps":  # no float64 there: an overflowing finite gradient reads as Inf
        return torch.linalg.vector_norm(g, dtype=torch.float32)
    return torch.linalg.vector_norm(g, dtype=torch.float64)


def _nonfinite(g):
    """A 0-d bool tensor on g's device, without a sync. The smallest and the largest value, one
    reduction with no temporary the size of the gradient: NaN propagates to both, an Inf is one
    of them, and unlike a sum they cannot overflow (large finite gradients are not NaN)."""
    g = _values(g.detach())
    if g.is_complex():
        g = torch.view_as_real(g)
    if g.numel() == 0:
        return torch.zeros((), dtype=torch.bool, device=g.device)
    low, high = torch.aminmax(g)
    return torch.isnan(low * 0 + high * 0)  # 0 * Inf and 0 * NaN are NaN, 0 * a finite value is 0


def _values(g):
    """The stored values of a tensor as one strided tensor: those of sparse layouts and of jagged
    nested tensors, the components of a strided nested tensor padded with zeros (finite)."""
    if g.layout != torch.strided:  # sparse COO, CSR and friends, jagged nested tensors
        return g._values() if g.is_sparse else g.values()
    if g.is_nested:
        return torch.nested.to_padded_tensor(g, 0.0)
    return g


def _total(g):
    # Detached, not under no_grad(): a grad-mode switch that an interrupt splits would stay off.
    g = g.detach()
    if g.is_nested:
        g = _values(g)
    if g.is_sparse or g.layout != torch.strided:
        return g.to_dense().sum() if g.is_sparse else g.sum()
    return g.sum(dtype=torch.float32) if g.dtype in (torch.float16, torch.bfloat16) else g.sum()


def read_norm_lists(lists):
    """Lists of [(tid, norm)] of norms_of (those of each checked backward, and the leaves' own) as
    [(tid, norm as a float)], the device norms read with one copy to the host per device for them
    all: at the end of the block only."""
    def read():
        with _no_subclass_dispatch():
            on_device = {}  # device -> dtype -> [(list number, position, norm)]
            out = [list(norms) for norms in lists]
            for number, norms in enumerate(out):
                for position, (_, norm) in enumerate(norms):
                    if isinstance(norm, _Tensor):
                        on_device.setdefault(norm.device, {}).setdefault(norm.dtype, []).append(
                            (number, position, norm))
            for by_dtype in on_device.values():
                parts = [(entries, torch.stack([n for _, _, n in entries]).to(torch.float64))
                         for entries in by_dtype.values()]
                values = torch.cat([stacked for _, stacked in parts]).tolist()
                at = 0
                for entries, _ in parts:
                    for number, position, _ in entries:
                        out[number][position] = (out[number][position][0], values[at])
                        at += 1
            return out
    return _unseen(read)


def _all_finite(tensors) -> bool:
    """Exact, but cheap in the common case: the sum is checked first, the elements only when the
    sum is not finite (an overflowing sum of finite values)."""
    return all(g is None or bool(torch.isfinite(_total(g))) or bool(torch.isfinite(g.detach()).all()) for g in tensors)


class NanWatch:
    """Post-hooks on the nodes of one backward call; the first node that makes a non-finite
    gradient out of finite ones is stored in `origin`: (backward index, node key, node name, what its
    saved inputs held).

    What one hook costs is what check_nan costs (thousands of nodes in a recurrent chain), so
    no hook reads much. Small CPU float gradients (up to _BATCHED_NUMEL elements) are kept and
    read in batches: one flatten and one sum per dtype; only a batch whose sum is not finite (a
    NaN, an Inf, or an overflow) is looked at node by node, in the order the nodes ran. A larger
    CPU gradient is summed on its own, after the batch before it. A gradient on another device
    is never read in the hook, which would wait for the device at every node: its flag stays a
    device tensor, and the flags are read together, once, when the backward call returns (every
    later node of the call takes the same path, so the order still decides). For nodes read
    after they ran, the saved inputs that explain a NaN (FACT_NODES) are taken in the hook, as
    the node frees them once it ran."""

    def __init__(self, fail, backward_index):
        self.fail = fail  # the recorder's: an internal error switches recording off
        self.origin = None
        self.backward_index = backward_index
        self.handles = []
        self.deferred = []  # (node, [device flags: gradient not finite], saved values), in the order nodes ran
        self.pending = []   # (node, its small CPU gradients, saved values), not read yet, in the order nodes ran
        self.pending_numel = 0

    def attach(self, nodes):
        # A closure and a handle per node, thousands of them: a collection of the whole heap (the
        # recording) that they set off in the middle costs more than all of them (see build.py).
        enabled = gc.isenabled()
        gc.disable()
        try:
            handles, hook_for = self.handles, self._hook_for
            for fn in nodes:
                if type(fn) is not _ACCUMULATE_GRAD and not _passes_through(fn):
                    handles.append(fn.register_hook(hook_for(fn)))
        finally:
            if enabled:
                gc.enable()

    def detach(self):
        """Remove the hooks; then read the device flags of the call, if any (one wait per device)."""
        handles, self.handles = self.handles, []
        for handle in handles:
            handle.remove()
        pending, deferred = self.pending, self.deferred
        self.pending, self.pending_numel, self.deferred = [], 0, []
        try:
            _unseen(lambda: self._read_left(pending, deferred))
        except Exception as exc:  # the user's backward has returned: its result matters more
            self.fail(exc)

    def _read_left(self, pending, deferred):
        if pending and self.origin is None:
            self.pending = pending
            self._flush()
        if deferred and self.origin is None:
            with _no_subclass_dispatch():
                self._read_deferred(deferred)

    def _hook_for(self, fn):
        def hook(grad_inputs, grad_outputs):
            try:
                if _dispatch_modes():
                    return _unseen(lambda: check(grad_inputs))
                return check(grad_inputs)
            except Exception as exc:  # never let the tool break the user's backward
                self.fail(exc)
                return None

        def check(grad_inputs):
            if self.origin is not None:
                return None
            if self.deferred:  # an earlier node's flags are unread: this one cannot be judged alone
                with _no_subclass_dispatch():
                    return self._defer(fn, grad_inputs)
            # Nodes run in order and every earlier node's outputs were finite, so this node's
            # incoming gradients are: the first non-finite output seen is where it starts.
            small = True
            for g in grad_inputs:
                if g is not None and not (type(g) is _Tensor and g.is_cpu and g.dtype in _SUMMED
                                          and g.layout is _STRIDED and g.numel() <= _BATCHED_NUMEL):
                    small = False
                    break
            if small:  # read later, with the others of its batch (one sum for them all)
                grads = [g for g in grad_inputs if g is not None]
                if grads:
                    self.pending.append((fn, grads, _saved_if_explaining(fn)))
                    self.pending_numel += sum(g.numel() for g in grads)
                    if len(self.pending) >= _BATCH or self.pending_numel >= _BATCH_NUMEL:
                        self._flush()
                return None
            if self.pending and self._flush():
                return None
            for g in grad_inputs:
                if g is None or (type(g) is not _Tensor and _dispatches(g)):
                    continue
                if type(g) is _Tensor and g.is_cpu and g.dtype in _SUMMED and g.layout is _STRIDED:
                    if math.isfinite(g.detach().sum() if g.requires_grad else g.sum()):
                        continue
                    with _no_subclass_dispatch():
                        if bool(torch.isfinite(g.detach()).all()):  # an overflowing sum of finite values
                            continue
                    return self._found(fn, grad_inputs)
                with _no_subclass_dispatch():
                    if not g.is_cpu:
                        return self._defer(fn, grad_inputs)
                    if not _all_finite((g,)):
                        return self._found(fn, grad_inputs)
            return None
        return hook

    def _flush(self) -> bool:
        """Read the pending small CPU gradients: one flatten and one sum per dtype. Only if a sum
        is not finite (a NaN or Inf, or an overflow) are they looked at node by node, in order.
        True if a node was found."""
        pending, self.pending, self.pending_numel = self.pending, [], 0
        by_dtype = {}
        for _, grads, _ in pending:
            for g in grads:
                by_dtype.setdefault(g.dtype, []).append(g)
        with _no_subclass_dispatch(), torch.no_grad():
            if all(math.isfinite(_flatten(grads).sum()) for grads in by_dtype.values()):
                return False
            for fn, grads, saved in pending:
                bad = sum(1 for g in grads if not bool(torch.isfinite(g).all()))
                if bad:
                    self.origin = (self.backward_index, fn._sequence_nr(), _short_name(fn),
                                                describe(saved, bad, fn))
                    return True
        return False

    def _found(self, fn, grad_inputs):
        with _no_subclass_dispatch():
            self.origin = (self.backward_index, fn._sequence_nr(), _short_name(fn),
                                        describe_inputs(fn, grad_inputs))

    def _defer(self, fn, grad_inputs):
        if self.pending and self._flush():
            return None
        flags = [_nonfinite(g) for g in grad_inputs if g is not None]
        saved = _saved_if_explaining(fn)
        self.deferred.append((fn, flags, saved))

    def _read_deferred(self, deferred):
        by_device = {}
        for _, flags, _ in deferred:
            for flag in flags:
                by_device.setdefault(flag.device, []).append(flag)
        read = {device: iter(torch.stack(flags).tolist()) for device, flags in by_device.items()}
        for fn, flags, saved in deferred:
            bad = [next(read[flag.device]) for flag in flags]
            if any(bad):
                self.origin = (self.backward_index, fn._sequence_nr(), _short_name(fn),
                                            describe(saved, bad.count(True), fn))
                return


def _short_name(fn):
    return fn.name().rpartition("::")[2]


def _saved_if_explaining(fn):
    """The node's saved inputs, read while it still holds them, if they can explain a NaN."""
    explains = _explaining.get(type(fn))
    if explains is None:
        explains = _explaining[type(fn)] = _short_name(fn).rstrip("0123456789").removesuffix("Backward") in FACT_NODES
    return saved_values(fn) if explains else ()


_explaining = {}  # node type -> whether FACT_NODES has it


def _passes_through(fn) -> bool:
    """A node whose outgoing gradients are its incoming ones moved, selected or negated: it
    cannot make a NaN or Inf out of finite values, so it needs no hook (the first non-finite
    output is still found, at the node that made it). Sums (expand, overlapping pools) and
    casts (an overflow to Inf) are not in this list."""
    cls = type(fn)
    passes = _passing.get(cls)
    if passes is None:
        passes = _passing[cls] = _short_name(fn).rstrip("0123456789").removesuffix("Backward") in _PASS_THROUGH
    if passes and cls in _SCALED:  # x + alpha * y: alpha scales one gradient
        try:
            return fn._saved_alpha == 1
        except Exception:
            return False
    return passes


_passing = {}  # node type -> whether its name is in _PASS_THROUGH
_PASS_THROUGH = frozenset(("View", "ReshapeAlias", "UnsafeView", "Permute", "Transpose", "T", "Squeeze",
                           "Unsqueeze", "Select", "Slice", "Clone", "Relu", "Threshold", "Cat", "Split",
                           "SplitWithSizes", "Unbind", "Stack", "Neg", "Add", "Sub", "Alias"))
_SCALED = frozenset(getattr(torch._C._functions, name) for name in ("AddBackward0", "SubBackward0")
                    if hasattr(torch._C._functions, name))
_flatten = torch._C._nn.flatten_dense_tensors  # many tensors into one, in one call
# Small CPU gradients are read in batches: per node, a sum and a float read cost more than the node.
_BATCHED_NUMEL = 4096  # elements of a gradient read in a batch; a larger one is read on its own
_BATCH = 256           # nodes per batch
_BATCH_NUMEL = 1 << 20  # elements held per batch at most


# The nodes whose saved inputs explain a NaN (diagnose/flow.py's table of causes): Sqrt, Log, ...
FACT_NODES = frozenset(("Sqrt", "Rsqrt", "Log", "Div", "Pow", "LinalgVectorNorm", "Norm", "Acos", "Asin"))


def describe_inputs(fn, grad_inputs):
    """What the node saved, summarised where it explains a non-finite gradient: for each saved
    tensor, how many values are 0, negative, or +-1, and a few of them. Never runs an unpack hook."""
    bad = sum(1 for g in grad_inputs if g is not None and not bool(torch.isfinite(g).all()))
    return describe(saved_values(fn), bad, fn)


def saved_values(fn):
    """[(slot, the saved floating tensor, read as data)] while the node still holds them."""
    values = []
    for name, raw_attr, check_attr in saved_names(fn):
        try:
            raw = getattr(fn, raw_attr)
        except RuntimeError:
            continue
        if isinstance(raw, (list, tuple)) or raw.unpack_hook is not None:
            continue
        data = raw.data
        if data is None or not (data.is_floating_point() or data.is_complex()):
            continue
        values.append((name, data.detach()))  # a saved tensor read as data: no graph, no unpack hook
    return values


def describe(saved, bad_outputs, fn):
    facts = {"bad_outputs": bad_outputs}
    for name, values in saved:
        facts[name] = {
            "shape": tuple(values.shape),
            "zeros": int((values == 0).sum()),
            "negative": int((values < 0).sum()) if not values.is_complex() else 0,
            "unit": int((values.abs() == 1).sum()),
            "nonfinite": int((~torch.isfinite(values)).sum()),
            "numel": values.numel(),
            "min": float(values.min()) if values.numel() and not values.is_complex() else None,
        }
    for attr in ("_saved_exponent", "_saved_other", "_saved_p", "_saved_ord"):
        try:
            value = getattr(fn, attr, None)
        except RuntimeError:  # a saved tensor the node already freed (it ran before we read it)
            continue
        if isinstance(value, (int, float)):
            facts[attr[len("_saved_"):]] = value
    return facts
