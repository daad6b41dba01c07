"""Where backward turns finite gradients into NaN or Inf.

Cheap, always: after each backward call, one flag per leaf gradient ("not all finite"), kept on
the gradient's device and read once when the block ends, so the per-op path never waits for a
device. With capture(check_nan=True): a post-hook on every node of the graph about to run finds
the first node whose outgoing gradients are not finite (all before it were), and reads its
saved inputs to say which values did it (sqrt at 0, log of 0, division by zero, ...). The hooks
are removed as soon as the backward call returns or raises.
"""
from __future__ import annotations

import torch

_ACCUMULATE_GRAD = torch._C._functions.AccumulateGrad
_no_subclass_dispatch = torch._C.DisableTorchFunctionSubclass


def nonfinite_flags(grads):
    """[(tid, 0-d bool tensor on the gradient's device: some value is NaN or Inf)] without a sync.
    A sum is one reduction with no temporary the size of the gradient; it is non-finite when a
    value is (NaN and Inf propagate) or, for float32 and wider, essentially never otherwise."""
    with _no_subclass_dispatch():
        return [(tid, ~torch.isfinite(_total(g))) for tid, g in grads]


def _total(g):
    # Detached, not under no_grad(): a grad-mode switch that an interrupt splits would stay off.
    g = g.detach()
    if g.is_sparse or g.layout != torch.strided:
        return g.to_dense().sum() if g.is_sparse else g.sum()
    return g.sum(dtype=torch.float32) if g.dtype in (torch.float16, torch.bfloat16) else g.sum()


def read_flags(flags):
    """The tids whose flag is set (one device sync per flag, at the end of the block only)."""
    with _no_subclass_dispatch():
        return [tid for tid, flag in flags if bool(flag)]


def _all_finite(tensors) -> bool:
    """Exact, but cheap in the common case: the sum is checked first, the elements only when the
    sum is not finite (an overflowing sum of finite values)."""
    return all(g is None or bool(torch.isfinite(_total(g))) or bool(torch.isfinite(g.detach()).all()) for g in tensors)


class NanWatch:
    """Post-hooks on the nodes of one backward call; the first node that makes a non-finite
    gradient out of finite ones is stored in recorder.nan_origin."""

    def __init__(self, recorder, backward_index):
        self.recorder = recorder
        self.backward_index = backward_index
        self.handles = []

    def attach(self, nodes):
        from .graph import node_key

        for fn in nodes:
            if type(fn) is _ACCUMULATE_GRAD:
                continue
            key = node_key(fn, self.recorder)
            self.handles.append(fn.register_hook(self._hook_for(fn, key)))

    def detach(self):
        handles, self.handles = self.handles, []
        for handle in handles:
            handle.remove()

    def _hook_for(self, fn, key):
        def hook(grad_inputs, grad_outputs):
            if self.recorder.nan_origin is not None:
                return None
            # Nodes run in order and every earlier node's outputs were finite, so this node's
            # incoming gradients are: the first non-finite output seen is where it starts.
            with _no_subclass_dispatch():
                if _all_finite(grad_inputs):
                    return None
                self.recorder.nan_origin = (self.backward_index, key, fn.name().rpartition("::")[2],
                                            describe_inputs(fn, grad_inputs))
            return None
        return hook


def describe_inputs(fn, grad_inputs):
    """What the node saved, summarised where it explains a non-finite gradient: for each saved
    tensor, how many values are 0, negative, or +-1, and a few of them. Never runs an unpack hook."""
    from .graph import saved_names

    facts = {"bad_outputs": sum(1 for g in grad_inputs if g is not None and not bool(torch.isfinite(g).all()))}
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
        values = data.detach()  # a saved tensor read as data: no graph, no unpack hook
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
        value = getattr(fn, attr, None)
        if isinstance(value, (int, float)):
            facts[attr[len("_saved_"):]] = value
    return facts
