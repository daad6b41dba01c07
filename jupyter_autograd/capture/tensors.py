"""The tensors of a block: each gets a tid (an index) when first seen, a row of what it was then, and a
weak reference; never a strong one (the tool must not keep a user's tensor alive)."""
from __future__ import annotations

import operator
import weakref
from array import array

import torch

_Tensor = torch.Tensor
_Parameter = torch.nn.Parameter
_SEQUENCES = (list, tuple)
_SCALARS = frozenset({int, float, bool, complex, type(None), str, torch.dtype, torch.device, torch.Size})
_all_torch_function_off = torch._C.DisableTorchFunction  # modes too: our hooks' reads are no ops
_weakref = weakref.ref

# A row of TensorTable.meta: (shape tuple, dtype, device, requires_grad, is_leaf, created_by, base tid,
# data alias of): what the tensor was when first seen.
META_SHAPE, META_CREATED, META_BASE, META_ALIAS = 0, 5, 6, 7


def _dead():
    return None


DEAD = _dead  # stands for the weak reference of a tensor that is gone or never looked up
_NO_OP = array("q", [-1])  # folded_created's entry for a tensor no op made


class TensorTable:
    __slots__ = ("meta", "tid_of", "refs", "parameters", "folded_created", "interned_rows", "interned_shapes")

    def __init__(self):
        self.meta = []              # per tid: see META_*
        self.tid_of = {}            # id(tensor) -> tid (check refs: ids are reused)
        self.refs = []              # per tid: a weak reference to the tensor
        self.parameters = set()     # tids of the nn.Parameters seen
        # Made by the first folding pass (most blocks never fold; every block would pay for them):
        self.folded_created = ()    # array: per tid, for rows folding shared, the op that made it, or -1
        self.interned_rows = {}     # equal rows of folded tensors, kept once
        self.interned_shapes = {}   # equal shapes of those rows, kept once

    def known(self, t):
        """The tid of a tensor seen before, or None. An id can be reused once its tensor is gone:
        the weak reference tells the same tensor from a new one at the same address."""
        t_id = self.tid_of.get(id(t))
        if t_id is not None and self.refs[t_id]() is t:
            return t_id
        return None

    def tid(self, t):
        t_id = self.tid_of.get(id(t))
        if t_id is not None and self.refs[t_id]() is t:
            return t_id
        return self.register(t, None, None)

    def quiet_tid(self, t):
        """tid() from a hook, where our mode is on: registering a tensor reads it, and those reads
        are no ops of the user's. A tensor already seen (the usual case) reads nothing."""
        t_id = self.tid_of.get(id(t))
        if t_id is not None and self.refs[t_id]() is t:
            return t_id
        with _all_torch_function_off():
            return self.register(t, None, None)

    def register(self, t, created_by, alias_of):
        base = t._base
        # The base first: registering it takes the next row, which must not be this tensor's.
        base_tid = None if base is None else self.tid(base)
        refs = self.refs
        t_id = len(refs)
        # No t.grad_fn here: a Python wrapper on every node makes PyTorch 2.13 free deep graphs
        # recursively (a segfault past ~40,000 nodes). Names of nodes are read once, at the end.
        # An inference tensor has no version counter (None wherever one is read), but it is looked
        # up again like any other: a loss computed from one is cut off the graph where it was made.
        refs.append(_weakref(t))
        # The shape as a plain tuple (as folding keeps it): a torch.Size stays tracked by the cyclic GC,
        # a tuple of ints does not, and in a long loop every tracked row makes each full collection longer.
        try:
            shape = tuple(t.shape)
        except Exception:
            shape = shape_in_parts(t)
        self.meta.append((shape, t.dtype, t.device, t.requires_grad, t.is_leaf, created_by, base_tid, alias_of))
        if type(t) is _Parameter:
            self.parameters.add(t_id)
        self.tid_of[id(t)] = t_id
        return t_id

    def argument_tids(self, args):
        """The tids of the tensors among a call's positional arguments, and inside tuples and lists
        of them (an LSTM's `(h, c)`)."""
        tids = []
        for a in args:
            if isinstance(a, _Tensor):
                tids.append(self.quiet_tid(a))
            elif isinstance(a, _SEQUENCES):
                tids.extend(self.quiet_tid(t) for t in a if isinstance(t, _Tensor))
        return tuple(tids)

    def add_row(self, row):
        """A tensor of the tool's own, with no tensor behind it (a value made inside a compiled region): its row."""
        self.refs.append(DEAD)
        self.meta.append(row)
        return len(self.refs) - 1

    def set_created_by(self, t_id, index):
        meta = self.meta[t_id]
        self.meta[t_id] = meta[:META_CREATED] + (index,) + meta[META_CREATED + 1:]

    def root(self, t_id):
        """The tensor whose memory (and version counter) tensor t_id views: the end of its chain of bases."""
        meta = self.meta
        seen = 0
        while meta[t_id][META_BASE] is not None and seen < 64:
            t_id = meta[t_id][META_BASE]
            seen += 1
        return t_id

    def created_by(self, t_id):
        """The op that made tensor t_id, or None (folded rows keep it in a column of their own)."""
        made = self.meta[t_id][META_CREATED]
        if made is None and t_id < len(self.folded_created):
            made = self.folded_created[t_id]
            return made if made >= 0 else None
        return made

    # -- folding (folding.py) -----------------------------------------------------------------
    def fold(self, t_id):
        """Tensor t_id is gone and the op that made it was folded: drop its weak reference, keep its
        row once among equal rows (the op that made it moves to folded_created)."""
        if type(self.folded_created) is not array:
            self.folded_created = array("q")
        self.refs[t_id] = DEAD
        meta = self.meta[t_id]
        shape = self.interned_shapes.setdefault(tuple(meta[0]), tuple(meta[0]))
        row = (shape,) + meta[1:5] + (None,) + meta[6:]
        if meta[META_BASE] is None and meta[META_ALIAS] is None:  # a view's or alias's row names its base: its own
            row = self.interned_rows.setdefault(row, row)
        self.meta[t_id] = row
        if meta[META_CREATED] is not None:
            made_by = self.folded_created
            if len(made_by) <= t_id:
                made_by.extend(_NO_OP * (t_id + 1 - len(made_by)))
            made_by[t_id] = meta[META_CREATED]

    def forget_gone_ids(self):
        """Ids of tensors that are gone: known() and tid() check the weak reference anyway, and the
        map would otherwise keep an entry for every address a long loop ever used."""
        refs, tid_of = self.refs, self.tid_of
        for obj_id in [obj_id for obj_id, t_id in tid_of.items() if refs[t_id]() is None]:
            del tid_of[obj_id]

    # -- a nested capture's share -------------------------------------------------------------
    def shifted(self, start, end):
        """The table as a capture nested in this block sees it, whose op indices start again at 0 at
        op `start`: the same tids, made-by indices shifted, own lists."""
        part = TensorTable()

        def shift(index):
            return index - start if index is not None and start <= index < end else None

        part.meta = [meta if meta[META_CREATED] is None else meta[:5] + (shift(meta[META_CREATED]),) + meta[6:]
                     for meta in self.meta]
        part.refs = list(self.refs)
        part.tid_of = dict(self.tid_of)
        part.parameters = set(self.parameters)
        part.folded_created = array("q", [-1 if made < start or made >= end else made - start
                                          for made in self.folded_created])
        return part


def tensors_in(args, kwargs):
    """The tensors among the arguments, one level into lists and tuples (torch.cat, _foreach_*).
    On every recorded call: a plain tensor or a number is told by its exact type first, since
    isinstance on torch.Tensor goes through its metaclass and costs several times more."""
    found = []
    for a in args:
        cls = type(a)
        if cls is _Tensor:
            found.append(a)
        elif cls in _SCALARS:
            pass
        elif isinstance(a, _Tensor):
            found.append(a)
        elif isinstance(a, _SEQUENCES):
            for b in a:
                if isinstance(b, _Tensor):
                    found.append(b)
    if kwargs:
        for a in kwargs.values():
            if isinstance(a, _Tensor):
                found.append(a)
            elif isinstance(a, _SEQUENCES):
                for b in a:
                    if isinstance(b, _Tensor):
                        found.append(b)
    return found


_version_of = operator.attrgetter("_version")


def current_versions(tensors):
    """Version counters as the hot path reads them: one or two tensors (most calls) without a
    loop; with an inference tensor among them (it has no counter), through versions()."""
    try:
        n = len(tensors)
        if n == 1:
            return (tensors[0]._version,)
        if n == 2:
            return (tensors[0]._version, tensors[1]._version)
        return tuple(map(_version_of, tensors))
    except RuntimeError as exc:
        if isinstance(exc, RecursionError):
            raise
        return versions(tensors)


def versions(tensors):
    """Version counters, None for an inference tensor (it has none)."""
    return tuple([None if t.is_inference() else t._version for t in tensors])


TENSOR, MODULE = "tensor", "module"
_value_kinds = {}  # exact type -> TENSOR, MODULE or "" (neither)


def value_kind(value):
    """TENSOR, MODULE or "" for a value of a user's namespace. A notebook's namespace holds
    hundreds of names, scanned before every backward call and at every block's end: the kind is
    looked up by exact type (isinstance on torch.Tensor goes through a metaclass)."""
    cls = type(value)
    kind = _value_kinds.get(cls)
    if kind is None:
        kind = TENSOR if issubclass(cls, _Tensor) else MODULE if issubclass(cls, torch.nn.Module) else ""
        if len(_value_kinds) < 10_000:  # types made on the fly (one per call) must not grow it for ever
            _value_kinds[cls] = kind
    return kind


def shape_of(t) -> tuple:
    """A tensor's shape as a tuple, also for one without a shape as a whole (see shape_in_parts)."""
    try:
        return tuple(t.shape)
    except Exception:
        return shape_in_parts(t)


def shape_in_parts(t) -> tuple:
    """The shape of a tensor that has none as a whole: a strided nested tensor (a dimension whose
    size differs between its components is "ragged"), or a lazy module's parameter before its
    first call ("uninitialized")."""
    try:
        sizes = []
        for dim in range(t.dim()):
            try:
                sizes.append(t.size(dim))
            except RuntimeError:
                sizes.append("ragged")
        return tuple(sizes)
    except Exception:
        return ("uninitialized",)


def byte_range(t):
    """The bytes of memory a tensor spans (start, end): overlap finds writes through any alias."""
    try:
        start = t.data_ptr()
        if start == 0 or t.is_meta:
            return None  # no real storage (meta tensors, empty allocations): nothing to overlap
        if t.is_contiguous():
            nbytes = t.nbytes
            return (start, start + nbytes) if nbytes else None
        if t.numel() == 0:
            return None
        extent = 1 + sum((size - 1) * abs(stride) for size, stride in zip(t.shape, t.stride()))
        return (start, start + extent * t.element_size())
    except Exception:  # sparse, meta or other layouts without plain memory
        return None
