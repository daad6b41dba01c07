"""A block runs under capture() exactly as without it (issue "Invisible"), in plain Python.

Each test runs the same code plain and captured, from the same state, and compares what the
user can observe: result, printed output, exception and its formatted traceback frames,
warnings and where they point, gradients, buffers, RNG state, torch's global state after.
"""
import contextlib
import io
import random
import signal
import sys
import time
import traceback
import warnings

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import jupyter_autograd as ja
from jupyter_autograd.capture import folding, mode, patches, tensors, warning_lines
from jupyter_autograd.capture import state as capture_state

HERE = __file__


# -- helpers -------------------------------------------------------------------------------------

def _global_state():
    """Everything the capture touches outside the block."""
    from torch.nn.modules import module as nn_module
    from torch.optim import optimizer as optim_module

    return dict(
        mode_stack=torch._C._len_torch_function_stack(),
        grad=torch.is_grad_enabled(),
        anomaly=torch.is_anomaly_enabled(),
        apply=torch.autograd.function.Function.__dict__["apply"],
        profiler_scope_exit=torch.autograd.profiler.record_function.__dict__["__exit__"],
        forward_pre_hooks=len(nn_module._global_forward_pre_hooks),
        forward_hooks=len(nn_module._global_forward_hooks),
        optimizer_pre_hooks=len(optim_module._global_optimizer_pre_hooks),
        optimizer_post_hooks=len(optim_module._global_optimizer_post_hooks),
        forward_hooks_always_called=len(nn_module._global_forward_hooks_always_called),
        has_any_global_hook=nn_module._has_any_global_hook,
        has_torch_function=torch.overrides.has_torch_function,
        recorder=getattr(capture_state.thread_state, "recorder", None),
        hook_users=patches.hook_users[0],
        warning_filters=warnings.filters,
        showwarnmsg=warnings._showwarnmsg,
        sigint=signal.getsignal(signal.SIGINT),
        recursion_limit=sys.getrecursionlimit(),
        torch_function=(torch._C._is_torch_function_enabled(), torch._C._is_torch_function_all_disabled()),
    )


def _frames(exc):
    """The formatted traceback frames below this test's own frame (where the runs differ)."""
    frames = traceback.extract_tb(exc.__traceback__)
    return [(f.filename, f.lineno, f.name, f.line) for f in frames][1:]


def _run(work, captured):
    """Run work() plain or captured, from the same seed; return everything observable."""
    torch.manual_seed(0)
    out = io.StringIO()
    result = exc = trace = None
    # C++ warnings that torch gives once per process would otherwise reach only the first run.
    warn_always = torch.is_warn_always_enabled()
    torch.set_warn_always(True)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with contextlib.redirect_stdout(out):
            try:
                if captured:
                    with ja.capture() as trace:
                        result = work()
                else:
                    result = work()
            except Exception as e:  # compared below
                exc = e
            finally:
                torch.set_warn_always(warn_always)
    return dict(
        result=result, out=out.getvalue(), trace=trace,
        error=None if exc is None else (type(exc), str(exc)),
        frames=None if exc is None else _frames(exc),
        warnings=[(w.category, str(w.message), w.filename, w.lineno) for w in caught],
        rng=torch.get_rng_state(),
    )


def _same(a, b):
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and a.shape == b.shape and torch.equal(a, b)
    if isinstance(a, (list, tuple)):
        return type(a) is type(b) and len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    return a == b


def _assert_invisible(work, once=()):
    """`once`: warnings whose count alone may differ (each is compared as if given once)."""
    before = _global_state()
    plain = _run(work, captured=False)
    assert _global_state() == before
    captured = _run(work, captured=True)
    assert _global_state() == before
    for key in ("result", "out", "error", "frames", "warnings", "rng"):
        a, b = plain[key], captured[key]
        if key == "warnings" and once:
            a, b = _once_each(a, once), _once_each(b, once)
        assert _same(a, b), (key, plain[key], captured[key])
    return plain, captured


def _once_each(caught, messages):
    seen = set()
    kept = []
    for w in caught:
        if w[1] in messages:
            if w[1] in seen:
                continue
            seen.add(w[1])
        kept.append(w)
    return kept


# -- tracebacks (item 3) ---------------------------------------------------------------------------

def _backward_through_a_modified_tensor():
    x = torch.ones(3, requires_grad=True)
    y = x.exp()
    y += 1
    y.sum().backward()


def _failing_c_op():
    return torch.ones(2, 3) @ torch.ones(2, 3)


def _failing_python_function():
    return F.softmax(torch.ones(3), dim=5)


class _Broken(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        raise ValueError("broken forward")

    @staticmethod
    def backward(ctx, g):
        return g


def _failing_custom_function():
    return _Broken.apply(torch.ones(2, requires_grad=True))


@torch.library.custom_op("jupyter_autograd_tests::fails", mutates_args=())
def _custom_library_op(x: torch.Tensor) -> torch.Tensor:
    raise ValueError("inside a torch.library op")


def _failing_custom_library_op():
    # Dispatched to the mode from C, straight out of OpOverload.__call__: the call the mode makes
    # runs that frame's code again.
    return _custom_library_op(torch.ones(2))


def _failing_backward_hook():
    x = torch.ones(2, requires_grad=True)
    y = x * 2

    def hook(grad):
        raise KeyError("from the user's hook")

    y.register_hook(hook)
    y.sum().backward()


@pytest.mark.parametrize("work", [_backward_through_a_modified_tensor, _failing_c_op, _failing_python_function,
                                  _failing_custom_function, _failing_custom_library_op, _failing_backward_hook])
def test_traceback_frames_are_those_of_a_plain_run(work):
    plain, captured = _assert_invisible(work)
    assert plain["frames"] and plain["frames"][0][2] == work.__name__
    assert captured["trace"].error is not None


def test_an_exception_caught_inside_the_block_shows_no_frame_of_ours():
    def work():
        try:
            torch.ones(2, 3) @ torch.ones(2, 3)
        except RuntimeError as exc:
            return [f.filename for f in traceback.extract_tb(exc.__traceback__)]

    plain, captured = _assert_invisible(work)
    assert plain["result"] == [HERE]


def test_an_interrupt_inside_the_tool_shows_no_frame_of_ours():
    """A SIGINT delivered on each line our hot path runs: the traceback is the user's only."""
    record_lines = {mode.Recorder.record.__code__, tensors.TensorTable.register.__code__,
                    tensors.tensors_in.__code__}
    tried = 0
    for target in range(1, 60):
        seen = [0]

        def tracer(frame, event, arg):
            if frame.f_code in record_lines:
                def on_line(frame, event, arg):
                    if event == "line":
                        seen[0] += 1
                        if seen[0] == target:
                            signal.raise_signal(signal.SIGINT)
                    return on_line
                return on_line
            return None

        x = torch.ones(2, requires_grad=True)
        interrupted = None
        sys.settrace(tracer)
        try:
            with ja.capture():
                y = x * 2
                y = y + 1
        except KeyboardInterrupt as exc:
            interrupted = exc
        finally:
            sys.settrace(None)
        if interrupted is None:
            break
        tried += 1
        frames = traceback.extract_tb(interrupted.__traceback__)
        # the test's own frame at the user's line, then the tracer that raised the signal
        assert {f.filename for f in frames} == {HERE} and frames[0].line.startswith("y = "), frames
    assert tried > 10


# -- Tensor subclasses (item 4) ------------------------------------------------------------------------

class _Counted(torch.Tensor):
    calls = []

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        cls.calls.append(getattr(func, "__name__", repr(func)))
        return super().__torch_function__(func, types, args, kwargs or {})


def test_a_tensor_subclass_sees_the_same_calls():
    def work():
        _Counted.calls = []
        w = torch.randn(3, 3).as_subclass(_Counted)
        h = torch.relu(w @ w)
        h.add_(1)
        with torch.no_grad():
            h.mul_(2)
        v = h.view(9)[2:]
        return _Counted.calls, v.sum()

    plain, captured = _assert_invisible(work)
    assert len(plain["result"][0]) >= 6
    assert [op.name for op in captured["trace"].ops].count("Tensor.add_") == 1


# -- warnings (item 5) -------------------------------------------------------------------------------

def _warn_from_c_and_python():
    x = torch.ones(3)
    torch.tensor(x)                       # a C++ warning: copy construct from a tensor
    F.softmax(torch.ones(2, 2))           # a Python warning with a stacklevel: implicit dim
    y = x.requires_grad_() * 2
    return y.grad                         # a C++ warning in a property getter: not a leaf


def test_warnings_point_at_the_user_line():
    plain, captured = _assert_invisible(_warn_from_c_and_python)
    assert len(plain["warnings"]) == 3
    assert {(w[2], w[3]) for w in plain["warnings"]} == {
        (HERE, _warn_from_c_and_python.__code__.co_firstlineno + n) for n in (2, 3, 5)}


def _float_of_a_loss_that_requires_grad():
    loss = nn.Linear(2, 1)(torch.ones(2)).sum()
    return float(loss)                    # a C++ warning that torch gives once per process


def test_a_warning_torch_gives_once_per_process_is_shown_by_the_captured_run():
    """Both runs see it (_run sets torch.set_warn_always), at the user's line: the capture neither
    swallows it nor moves it."""
    plain, captured = _assert_invisible(_float_of_a_loss_that_requires_grad)
    assert [(w[0], w[2], w[3]) for w in plain["warnings"]] == [
        (UserWarning, HERE, _float_of_a_loss_that_requires_grad.__code__.co_firstlineno + 2)]
    assert "requires_grad=True to a scalar" in plain["warnings"][0][1]


def _count_shown(work, action, module=None):
    """Warnings shown with the user's filters: `action` for everything, "ignore" for `module`."""
    shown = []
    with warnings.catch_warnings():
        warnings.resetwarnings()
        warnings.simplefilter(action)
        if module is not None:
            warnings.filterwarnings("ignore", module=module)
        previous = warnings.showwarning
        warnings.showwarning = lambda message, category, filename, lineno, *a: shown.append((filename, lineno))
        try:
            work()
        finally:
            warnings.showwarning = previous
    return shown


def _twice_on_two_lines():
    x = torch.ones(3)
    for _ in range(2):
        torch.tensor(x)
        torch.tensor(x)


@pytest.mark.parametrize("action,module", [("default", None), ("once", None), ("module", None), ("always", None),
                                           ("always", __name__), ("always", "somewhere.else")])
def test_warning_filters_and_registries_behave_as_plain(action, module):
    plain = _count_shown(_twice_on_two_lines, action, module)

    def captured_work():
        with ja.capture():
            _twice_on_two_lines()

    captured = _count_shown(captured_work, action, module)
    assert captured == plain
    expected = {"default": 2, "once": 1, "module": 1, "always": 4}[action]
    assert len(plain) == (0 if module == __name__ else expected)


def test_a_warning_turned_into_an_error_raises_from_the_user_line():
    def work():
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            torch.tensor(torch.ones(2))

    plain, captured = _assert_invisible(work)
    assert plain["error"][0] is UserWarning and plain["frames"][-1][0] == HERE


def test_filters_added_inside_a_call_are_kept():
    """A module imported inside a torch call may add filters; they outlive the call, as plain."""
    class Adds(torch.Tensor):
        @classmethod
        def __torch_function__(cls, func, types, args=(), kwargs=None):
            warnings.filterwarnings("ignore", message="added inside a call")
            return super().__torch_function__(func, types, args, kwargs or {})

    with warnings.catch_warnings():
        before = len(warnings.filters)
        with ja.capture():
            torch.ones(2).as_subclass(Adds) * 2
        assert len(warnings.filters) == before + 1 and warnings.filters[0][1].pattern == "added inside a call"


# -- entry and exit are atomic (item 6) -------------------------------------------------------------

def _check_nothing_left(before):
    after = _global_state()
    assert after == before, {k: (before[k], after[k]) for k in before if before[k] != after[k]}


def _enter_exit_code():
    session = sys.modules["jupyter_autograd.session"]
    lifecycle = sys.modules["jupyter_autograd.capture.lifecycle"]

    codes = set()
    for owner in (session.capture, lifecycle.InterruptsHeld):
        for value in vars(owner).values():
            if hasattr(value, "__code__"):
                codes.add(value.__code__)
    for fn in (lifecycle.take_off_stack, lifecycle.release, lifecycle.finish_interrupted_mode_stashes,
               session.finish, patches.install_hooks, patches.remove_hooks,
               patches.remove_all_hooks, warning_lines.put_back, lifecycle.start,
               lifecycle.heal_thread, lifecycle._hold_headroom, lifecycle._release_headroom, lifecycle.watch_block,
               lifecycle.guard, lifecycle.unguard, lifecycle.ExitLookup.__get__):
        codes.add(fn.__code__)
    return codes


_UNREACHABLE = {}


def _a_signal_can_land_here(frame):
    """Whether a real SIGINT can interrupt the frame where a line event stops it. Python runs a
    signal's handler at a function's start, on a loop's jump and after a call, never between a
    `with` statement's __enter__ and the first instruction of its body, nor between the body's
    last instruction and the __exit__ call (three LOAD_CONST None, then the call): a line event
    there is a test's artefact, and would leave a C context manager (ours hide our reads from
    tensor subclasses) entered for good."""
    import dis

    code = frame.f_code
    unreachable = _UNREACHABLE.get(code)
    if unreachable is None:
        ins = [x for x in dis.get_instructions(code) if x.opname != "CACHE"]
        unreachable = set()
        for i, x in enumerate(ins):
            if x.opname == "BEFORE_WITH":
                for y in ins[i + 1:]:
                    unreachable.add(y.offset)
                    if y.opname not in ("POP_TOP", "NOP", "STORE_FAST", "STORE_NAME"):
                        break
            # The __exit__ call: PRECALL then CALL on Python 3.11, CALL alone from 3.12 on.
            if ([y.opname for y in ins[i:i + 3]] == ["LOAD_CONST"] * 3 and len(ins) > i + 3
                    and ins[i + 3].opname in ("PRECALL", "CALL") and all(y.argval is None for y in ins[i:i + 3])):
                unreachable.add(x.offset)
        _UNREACHABLE[code] = unreachable
    return frame.f_lasti not in unreachable


def _interrupt_at_each_point(block, tracer, limit):
    """Run `block` again and again, with a SIGINT raised at its n-th point (n = 1, 2, ...), where
    the sys.settrace function tracer(hit) calls hit() at each point it counts; after every run,
    nothing of ours is left. Stops when a run has fewer points than n. Returns (points aimed
    at, interrupts that got out, whether every point was reached before `limit`)."""
    before = _global_state()
    delivered = 0
    for target in range(1, limit):
        seen = [0]

        def hit():
            seen[0] += 1
            if seen[0] == target:
                signal.raise_signal(signal.SIGINT)

        sys.settrace(tracer(hit))
        try:
            block()
        except KeyboardInterrupt:
            delivered += 1
        finally:
            sys.settrace(None)
        _check_nothing_left(before)
        if seen[0] < target:
            return target, delivered, True
    return limit, delivered, False


def test_an_interrupt_on_any_line_of_entry_or_exit_leaves_nothing():
    """A real SIGINT raised at every call and every line of the capture's own enter/exit code,
    one at a time: afterwards nothing of ours is left, whatever the interrupt interrupted."""
    codes = _enter_exit_code()
    x = torch.ones(2, requires_grad=True)

    def tracer(hit):
        def trace(frame, event, arg):
            if frame.f_code not in codes:
                return None

            def local(frame, event, arg):
                if event == "call" or (event == "line" and _a_signal_can_land_here(frame)):
                    hit()
                return local
            return local(frame, event, arg)
        return trace

    def block():
        with ja.capture():
            (x * 2).sum()

    target, delivered, covered = _interrupt_at_each_point(block, tracer, 3000)
    print("interrupts aimed at entry and exit: %d, delivered: %d" % (target - 1, delivered))
    assert covered and target > 30 and delivered >= 1  # every line was hit, and interrupts got out


@pytest.mark.parametrize("ops,runs", [(1, 600), (300, 150)], ids=["tiny-blocks", "long-blocks"])
def test_random_interrupts_leave_nothing(ops, runs):
    """SIGINTs at random instants of the block's run: in tiny blocks most land in entry or
    exit, in long ones anywhere in the recording."""
    before = _global_state()
    rng = random.Random(ops)
    x = torch.ones(2, requires_grad=True)
    interrupts = 0

    def block():
        with ja.capture():
            y = x
            for _ in range(ops):
                y = y * 1.0
            y.sum().backward()

    durations = []
    for _ in range(9):
        start = time.perf_counter()
        block()
        durations.append(time.perf_counter() - start)
    longest = 1.5 * sorted(durations)[4]  # aim within the block's usual duration, and a little past it

    def alarm(signum, frame):
        signal.raise_signal(signal.SIGINT)

    previous = signal.signal(signal.SIGALRM, alarm)
    try:
        for _ in range(runs):
            try:
                signal.setitimer(signal.ITIMER_REAL, rng.uniform(1e-6, longest))
                block()
                signal.setitimer(signal.ITIMER_REAL, 0)
            except KeyboardInterrupt:
                interrupts += 1
            signal.setitimer(signal.ITIMER_REAL, 0)
            _check_nothing_left(before)
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
    print("%d random interrupts in %d blocks of %d ops" % (interrupts, runs, ops))
    assert interrupts > runs // 4
    _check_nothing_left(before)


class _RefusingHooks(dict):
    """A global hook dict of torch's that refuses an insertion, or a removal by pop, once."""

    def __init__(self, refuse):
        super().__init__()
        self.refuse, self.refused = refuse, 0

    def __setitem__(self, key, value):
        if self.refuse == "insert" and not self.refused:
            self.refused += 1
            raise RuntimeError("no more hooks")
        super().__setitem__(key, value)

    def pop(self, *args):
        if self.refuse == "pop" and not self.refused:
            self.refused += 1
            raise RuntimeError("cannot remove")
        return super().pop(*args)


def test_if_the_hooks_cannot_be_installed_the_block_runs_unrecorded(monkeypatch):
    from torch.optim import optimizer as optim_module

    refusing = _RefusingHooks("insert")
    monkeypatch.setattr(optim_module, "_global_optimizer_pre_hooks", refusing)
    x = torch.ones(3, requires_grad=True)
    with pytest.warns(RuntimeWarning, match="could not start recording"):
        before = _global_state()
        with ja.capture() as trace:
            assert _global_state() == before  # untouched while the block runs
            y = (x * 2).sum()
            y.backward()
        _check_nothing_left(before)
    assert refusing.refused == 1
    assert torch.equal(x.grad, torch.full((3,), 2.0))
    assert any("no more hooks" in w for w in trace.warnings)


def test_if_removing_a_hook_fails_everything_else_is_still_removed(monkeypatch):
    from torch.optim import optimizer as optim_module

    refusing = _RefusingHooks("pop")
    monkeypatch.setattr(optim_module, "_global_optimizer_post_hooks", refusing)
    before = _global_state()
    with pytest.warns(RuntimeWarning, match="could not remove all its hooks"):
        with ja.capture() as trace:
            torch.ones(2) * 2
    assert refusing.refused == 1 and dict(refusing) == {}
    _check_nothing_left(before)
    assert trace.warnings


def test_state_restored_after_an_exception_whatever_apply_is():
    """Function.apply is compared by identity in the class dict: a classmethod in torch 2.13,
    possibly something else in later versions."""
    before = _global_state()
    with pytest.raises(ZeroDivisionError):
        with ja.capture():
            torch.ones(2) * 2
            1 / 0
    _check_nothing_left(before)


# -- headroom (item 7) -----------------------------------------------------------------------------

def _at_depth(n, op):
    return op() if n == 0 else _at_depth(n - 1, op)


def _deepest(op, captured):
    lo, hi = 0, sys.getrecursionlimit()
    while lo < hi:
        mid = (lo + hi + 1) // 2
        try:
            if captured:
                with ja.capture():
                    _at_depth(mid, op)
            else:
                _at_depth(mid, op)
            lo = mid
        except RecursionError:
            hi = mid - 1
    return lo


@pytest.mark.parametrize("op", [lambda: torch.ones(3) + 1, lambda: F.softmax(torch.ones(3), 0),
                                lambda: (torch.ones(2, requires_grad=True) * 2).sum().backward()],
                         ids=["c-op", "python-function", "backward"])
def test_a_call_near_the_recursion_limit_works_as_plain(op):
    assert _deepest(op, captured=True) >= _deepest(op, captured=False)


# -- training code: gradients, buffers, RNG, optimizer (items 8.6, 8.7 and the optimizer hook) --------

def _training_with_validation():
    model = nn.Sequential(nn.Linear(4, 8), nn.BatchNorm1d(8), nn.Dropout(0.3), nn.ReLU(), nn.Linear(8, 1))
    opt = torch.optim.Adam(model.parameters(), lr=0.01)
    x, target = torch.randn(16, 4), torch.randn(16, 1)
    for _ in range(3):
        loss = F.mse_loss(model(x), target)
        opt.zero_grad()
        loss.backward()
        opt.step()
    with torch.inference_mode():
        model.eval()
        val = model(x).mean()
        model.train()
    print("loss %.6f" % loss.item())
    return ([p.grad.clone() for p in model.parameters()] + [p.detach().clone() for p in model.parameters()]
            + [b.clone() for b in model.buffers()] + [val.clone()])


def test_a_training_loop_with_an_inference_pass_is_unchanged():
    plain, captured = _assert_invisible(_training_with_validation)
    trace = captured["trace"]
    assert trace.warnings == [] and trace.diagnoses == []


def test_an_inference_pass_does_not_switch_recording_off():
    x = torch.tensor([1.0, 2.0], requires_grad=True)
    with pytest.raises(RuntimeError):
        with ja.capture() as trace:
            with torch.inference_mode():
                frozen = torch.ones(2) * 3
            y = x.exp() + frozen.sum()
            y = y.exp()
            y += 1
            y.sum().backward()
    assert trace.warnings == []
    assert [d.kind for d in trace.diagnoses] == ["saved-tensor-modified"]
    assert any(op.name == "Tensor.mul" and op.versions_before == (None,) for op in trace.ops)


def test_optimizer_steps_note_their_parameters():
    model = nn.Linear(3, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with ja.capture():
        recorder = capture_state.thread_state.recorder
        model(torch.ones(1, 3)).sum().backward()
        opt.step()
    assert recorder.steps.optimized == {recorder.tensors.known(model.weight), recorder.tensors.known(model.bias)}
    assert None not in recorder.steps.optimized


def test_nested_captures_each_get_their_own_block():
    x = torch.ones(2, requires_grad=True)
    with pytest.raises(RuntimeError):
        with ja.capture() as outer:
            a = x * 2
            with ja.capture() as inner:
                b = a.exp()
                c = b * 3
            b += 1
            (b + c).sum().backward()
    assert [op.name for op in inner.ops] == ["Tensor.exp", "Tensor.mul"]
    assert [op.name for op in outer.ops] == ["Tensor.mul", "Tensor.exp", "Tensor.mul", "Tensor.add_",
                                             "Tensor.add", "Tensor.sum", "Tensor.backward"]
    assert [d.kind for d in outer.diagnoses] == ["saved-tensor-modified"] and outer.warnings == []
    assert inner.warnings == [] and inner.error is None
    assert inner.tensors[inner.ops[0].outputs[0]].name == "b"


def test_a_capture_inside_a_module_forward_keeps_the_outer_module_names():
    net = nn.Sequential(nn.Linear(2, 2), nn.ReLU())
    with ja.capture(namespace={"net": net}) as outer:
        with ja.capture(namespace={"net": net}) as inner:
            net(torch.ones(1, 2))
        net(torch.ones(1, 2))
    assert outer.warnings == [] and inner.warnings == []
    assert [op.module for op in inner.ops if op.name == "F.linear"] == [("net", "net.0")]
    assert [op.module for op in outer.ops if op.name == "F.linear"] == [("net", "net.0")] * 2


def test_namespace_keys_must_be_names():
    with pytest.raises(TypeError, match="keys must be str"):
        ja.capture(namespace={1: 2})


def test_namespace_says_which_element_is_not_a_dict():
    with pytest.raises(TypeError, match="the list holds a 'int'"):
        ja.capture(namespace=[{}, 3])


def test_a_capture_records_one_block():
    capture = ja.capture()
    with capture as first:
        torch.ones(2) * 2
    with pytest.raises(RuntimeError, match="already recorded a block.*Make a new one"):
        with capture:
            torch.ones(2) * 3
    assert [op.name for op in first.ops] == ["torch.ones", "Tensor.mul"]
    assert _global_state()["recorder"] is None and _global_state()["mode_stack"] == 0


# -- compilers, fast paths and odd tensors: code that checks what is on the stack ------------------

def test_torch_jit_trace_of_a_model_works_as_plain():
    model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))  # made before the block
    x = torch.randn(3, 4)

    def traced_model():
        traced = torch.jit.trace(model, x)  # its sanity check runs the model twice and compares the graphs
        return traced(x), model(x)

    plain, captured = _assert_invisible(traced_model)
    assert plain["error"] is None and _same(captured["result"][0], captured["result"][1])


def _compiled_models():
    torch._dynamo.reset()
    model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))
    x = torch.randn(3, 4)
    whole = torch.compile(model, backend="eager")(x)  # torch warns here if global module hooks exist
    # A hook Dynamo cannot trace breaks the graph, and fullgraph=True makes that an error.
    calling = torch.compile(lambda t: model(t).relu(), backend="eager", fullgraph=True)(x)
    return whole, calling


# On Python 3.13.0 only, Dynamo warns once for each dict it guards (torch/_dynamo/guards.py: a
# CPython 3.13.0 bug). The block's global module hooks are dicts Dynamo guards too: more of that one
# warning (as plain PyTorch gives with any global module hook), for the same compiled graphs.
SLOW_GUARDS_3_13_0 = "Guards may run slower on Python 3.13.0. Consider upgrading to Python 3.13.1+."


def _compiled_models_and_their_graphs():
    from torch._dynamo.utils import counters

    before = counters["stats"]["unique_graphs"]
    result = _compiled_models()
    return result, counters["stats"]["unique_graphs"] - before


def test_torch_compile_of_a_module_and_of_a_function_calling_one_works_as_plain():
    plain, captured = _assert_invisible(_compiled_models_and_their_graphs, once=[SLOW_GUARDS_3_13_0])
    assert plain["error"] is None and [w for w in plain["warnings"] if w[1] != SLOW_GUARDS_3_13_0] == []
    assert plain["result"][1] == captured["result"][1] == 2  # compiled as often: no recompile
    trace = captured["trace"]
    assert trace.warnings == []
    # Dynamo's own work while it compiles (fake tensors, guards, inference_mode) is not recorded; the
    # graphs it made, run by the eager backend, are (a function mode sees their calls).
    assert [op.name for op in trace.ops if op.name in ("F.linear", "F.relu", "torch.inference_mode",
                                                        "Tensor.stride")] == ["F.linear", "F.relu", "F.linear"] * 2


def _eval_transformer():
    layer = nn.TransformerEncoderLayer(8, 2, 16, batch_first=True)
    encoder = nn.TransformerEncoder(layer, 2).eval()
    attention = nn.MultiheadAttention(8, 2, batch_first=True).eval()
    x = torch.randn(2, 5, 8)
    padding = torch.tensor([[False] * 5, [False] * 3 + [True] * 2])
    with torch.no_grad():
        # The fused fast path (a nested tensor for the padded batch) gives 0 at padded positions,
        # the slow path that any function mode used to force gives other values there.
        encoded = encoder(x, src_key_padding_mask=padding)
        attended, _ = attention(x, x, x, need_weights=False)
    return encoded, attended


def test_eval_mode_attention_takes_the_same_fast_path_as_plain():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        _eval_transformer()  # torch warns once per process about nested tensors: not in one run only
    plain, captured = _assert_invisible(_eval_transformer)
    assert plain["result"][0][1, 3:].abs().sum() == 0  # the fast path ran
    trace = captured["trace"]
    assert trace.warnings == []
    assert {"torch._transformer_encoder_layer_fwd", "torch._native_multi_head_attention"} <= {op.name for op in trace.ops}


def test_tensors_without_a_whole_shape_are_recorded():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the nested tensor prototype's warning
        with ja.capture() as trace:
            lazy = nn.LazyLinear(3)  # its parameters have no shape before the first call
            y = lazy(torch.randn(2, 5))
            y.sum().backward()
            nested = torch.nested.nested_tensor([torch.randn(2, 3), torch.randn(4, 3)])
            doubled = nested * 2
    assert trace.warnings == [] and trace.diagnoses == []
    assert trace.tensors[trace.ops[-1].outputs[0]].shape == (2, "ragged", 3)
    assert lazy.weight.grad is not None and doubled.is_nested


class _LoggingMode(torch.utils._python_dispatch.TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.calls = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.calls.append(str(func))
        return func(*args, **(kwargs or {}))


class _Wrapped(torch.Tensor):
    """A wrapper subclass: its __torch_dispatch__ sees every op run on it."""
    calls = []

    @staticmethod
    def __new__(cls, elem):
        return torch.Tensor._make_wrapper_subclass(cls, elem.shape, dtype=elem.dtype, requires_grad=elem.requires_grad)

    def __init__(self, elem):
        self.elem = elem

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        _Wrapped.calls.append(str(func))
        unwrap = lambda t: t.elem if isinstance(t, _Wrapped) else t  # noqa: E731
        wrap = lambda t: _Wrapped(t) if isinstance(t, torch.Tensor) else t  # noqa: E731
        out = func(*torch.utils._pytree.tree_map(unwrap, args), **torch.utils._pytree.tree_map(unwrap, kwargs or {}))
        return torch.utils._pytree.tree_map(wrap, out)


def _dispatch_seen():
    model = nn.Linear(3, 1)
    with _LoggingMode() as mode:  # a FlopCounterMode or a debugging mode around backward
        model(torch.ones(2, 3)).sum().backward()
    _Wrapped.calls = []
    w = _Wrapped(torch.ones(3)).requires_grad_()
    (w * 3).sum().backward()
    return mode.calls, list(_Wrapped.calls)


@pytest.mark.parametrize("check_nan", [False, True])
def test_reads_of_gradients_are_hidden_from_dispatch_modes_and_subclasses(check_nan):
    plain = _dispatch_seen()
    with ja.capture(check_nan=check_nan) as trace:
        captured = _dispatch_seen()
    assert captured[1] == plain[1]
    if check_nan:
        # The watch holds small gradients until it reads them, so AccumulateGrad copies one where
        # it would have taken it over: the engine's ops differ, none of ours shows.
        engine = {"aten.new_empty_strided.default", "aten.copy_.default", "aten.detach.default"}
        assert [c for c in captured[0] if c not in engine] == [c for c in plain[0] if c not in engine]
    else:
        assert captured[0] == plain[0]
    assert trace.warnings == []


# -- long loops (item 8) ---------------------------------------------------------------------------

def test_a_long_loop_folds_dead_ops_and_says_so():
    fold = folding.FOLD_EVERY
    x = torch.ones(3)
    w = torch.ones(3, requires_grad=True)
    with ja.capture() as trace:
        recorder = capture_state.thread_state.recorder
        first = x * 2
        for i in range(4 * fold):
            x = x * 1.0
            if i == 2 * fold:
                x.add_(1)           # a write: kept
                loss = (w * x).sum()  # made autograd nodes: kept
        last = x * 3
    assert recorder.folding.count > fold
    ops = trace.ops
    assert len(ops) == 4 * fold + 5  # every op keeps its slot
    assert ops[0].outputs and ops[-1].outputs  # the first and the last are whole
    assert [op.name for op in ops if op.writes] == ["Tensor.add_"]
    assert any("folded" in note for note in trace.notes)
    # Tensors that only folded ops made and used are left out of the trace; those that kept
    # records mention are all there, with their names.
    assert len(trace.tensors) < len(ops) - recorder.folding.count + 10
    mentioned = {t for op in ops for t in op.inputs + op.outputs}
    assert mentioned <= set(trace.tensors)
    assert {trace.tensors[t].name for t in ops[-1].outputs} == {"last"}
    assert trace.diagnoses == [] and trace.warnings == []
    assert first is not None and last is not None and loss is not None


def _train(steps, retain, planted_at=-1):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x, target = torch.randn(16, 4), torch.randn(16, 1)
    for step in range(steps):
        loss = F.mse_loss(model(x), target)
        if step == planted_at:
            model[2].weight.data.mul_(0.5)  # PLANTED: after the forward saved it
        opt.zero_grad()
        loss.backward(retain_graph=retain)
        opt.step()
    return [p.detach().clone() for p in model.parameters()]


# A training step is about 7 recorded ops (an optimizer step is one): a smaller folding window
# keeps these loops a few windows long without thousands of steps.
_TRAINING_WINDOW = 512


@pytest.mark.parametrize("retain", [False, True])
def test_a_long_training_loop_folds_only_graphs_backward_has_freed(retain, monkeypatch):
    monkeypatch.setattr(folding, "FOLD_EVERY", _TRAINING_WINDOW)
    steps = _TRAINING_WINDOW
    plain = _train(steps, retain)
    with ja.capture(namespace={}) as trace:
        recorder = capture_state.thread_state.recorder
        captured = _train(steps, retain)
    assert _same(plain, captured)
    with_nodes = [op for op in trace.ops if op.node is not None and not op.is_backward]
    folded_with_nodes = [op for op in with_nodes if not op.inputs and not op.outputs]
    if retain:  # a kept graph may be run again: nothing that made it is folded
        assert folded_with_nodes == []
    else:
        assert len(folded_with_nodes) > len(with_nodes) // 3 and recorder.folding.count >= len(folded_with_nodes)
        assert all(op.location is not None for op in folded_with_nodes)
    assert trace.diagnoses == [] and trace.warnings == []
    linears = [op for op in trace.ops if op.name == "F.linear"]
    first, last = linears[0], linears[-1]
    assert first.inputs and first.outputs and last.inputs and last.outputs  # first and last iterations whole


@pytest.mark.parametrize("planted", [False, True])
def test_a_long_training_loop_keeps_the_backward_calls_that_matter(planted, monkeypatch):
    """Backward calls that found nothing lose their saved-tensor slots; the first one, the
    latest ones and one whose saved bytes were written (a silent .data write in the middle of
    the loop, long folded) keep theirs, and the write is still diagnosed at its line."""
    monkeypatch.setattr(folding, "FOLD_EVERY", _TRAINING_WINDOW)
    steps = 4 * _TRAINING_WINDOW // 3
    planted_at = steps // 2 if planted else -1
    with ja.capture(namespace={}) as trace:
        recorder = capture_state.thread_state.recorder
        trained = _train(steps, False, planted_at)
    backward = [cp for cp in trace.checkpoints if cp.kind == "backward"]
    assert len(backward) == steps
    emptied = [i for i, cp in enumerate(backward) if not cp.slots]
    assert recorder.folding.backwards == len(emptied) > steps // 3
    assert 0 not in emptied and steps - 1 not in emptied  # the first and the latest stay whole
    assert any("backward calls that found nothing" in note for note in trace.notes)
    assert trace.warnings == []
    if planted:
        assert planted_at not in emptied
        [found] = trace.diagnoses
        assert found.kind == "silent-data-mutation"
        assert found.source == "model[2].weight.data.mul_(0.5)" and found.tensor == "model.2.weight"
    else:
        assert trace.diagnoses == []
    assert trained


def test_folding_keeps_little_per_step_and_changes_nothing_the_trace_says(monkeypatch):
    """What a folded training step leaves behind is shared or packed: one record per line for
    every folded op (node ranges live in columns), one row for equal tensors (the op that made
    each in a column), no map entry for a tensor that is gone, and a parameter's list of
    backward runs that does not grow with the loop. The trace says the same about every op and
    tensor as without folding."""
    steps = 3 * _TRAINING_WINDOW
    monkeypatch.setattr(folding, "FOLD_EVERY", 1 << 40)  # nothing is folded
    with ja.capture(namespace={}) as whole:
        _train(steps, False)
    monkeypatch.setattr(folding, "FOLD_EVERY", _TRAINING_WINDOW)
    with ja.capture(namespace={}) as trace:
        recorder = capture_state.thread_state.recorder
        _train(steps, False)
        folded_ops = [rec for rec in recorder.ops[:recorder.folding.upto] if not rec[3] and not rec[6]
                      and rec[0] >= len(folding.KEPT_FUNCS)]
        live_tids = sum(ref() is not None for ref in recorder.tensors.refs)
        tid_map, rows = len(recorder.tensors.tid_of), {id(row) for row in recorder.tensors.meta}
        leaf_runs = [len(e[3]) for key, e in recorder.graph.nodes.items() if key < 0]
    assert recorder.folding.count > steps and whole.notes == []
    assert len({id(rec) for rec in folded_ops}) <= 8  # one per (function, line): the loop has six
    assert len(rows) < len(recorder.tensors.meta) // 4
    assert tid_map <= live_tids + 2 * 7 * _TRAINING_WINDOW  # at most the two windows not yet folded
    assert leaf_runs and max(leaf_runs) < steps // 2
    assert len(trace.ops) == len(whole.ops)

    def relative(t):
        base = next(op.node for op in t.ops if op.node is not None)  # the node each op made, by key
        return [(op.name, op.location and op.location.line, op.is_backward,
                 None if op.node is None else op.node - base) for op in t.ops]

    assert relative(trace) == relative(whole)
    for t_id, info in trace.tensors.items():
        assert info.created_by == whole.tensors[t_id].created_by and info.shape == whole.tensors[t_id].shape
    assert trace.diagnoses == whole.diagnoses == [] and trace.warnings == []


def test_a_dropped_node_met_again_by_a_later_backward():
    """As below, with the graph made after the first window: the node of `h = w * w` (its tensor
    gone, its graph freed) is dropped from the recorder, keeping only which backward ran it. It
    is the only node with saved tensors (an addition saves none): without that record, its empty
    slots would read as never saved, and nothing would be predicted."""
    fold = folding.FOLD_EVERY
    w = torch.ones(3, requires_grad=True)
    x = torch.ones(3)
    with ja.capture(namespace={}) as trace:
        recorder = capture_state.thread_state.recorder
        (w * 2).sum().backward()  # the first backward of a block is always kept whole
        for _ in range(2 * fold):
            x = x * 1.0
        h = w * w
        carried = h + 1
        del h
        carried.sum().backward()
        for _ in range(4 * fold):
            x = x * 1.0
        dropped = list(recorder.folding.nodes)
        with pytest.raises(RuntimeError, match="backward through the graph a second time"):
            carried.sum().backward()  # SECOND
    assert dropped, "the node of h was not dropped: this test no longer covers the lookup"
    assert [d.kind for d in trace.diagnoses] == ["graph-freed"]
    assert trace.warnings == []


def test_a_folded_node_met_again_by_a_later_backward():
    """A graph carried past many folded windows: its nodes were compacted after the first
    backward freed them; the second backward through them is still predicted as graph-freed."""
    fold = folding.FOLD_EVERY
    w = torch.ones(3, requires_grad=True)
    x = torch.ones(3)
    with ja.capture(namespace={}) as trace:
        recorder = capture_state.thread_state.recorder
        h = w * w
        carried = h * 3
        del h
        carried.sum().backward()
        for _ in range(4 * fold):
            x = x * 1.0
        with pytest.raises(RuntimeError, match="backward through the graph a second time"):
            carried.sum().backward()  # SECOND
    assert recorder.folding.count > fold
    assert [d.kind for d in trace.diagnoses] == ["graph-freed"]
    assert trace.warnings == []


def test_op_records_and_graph_nodes_leave_the_cyclic_gc_alone():
    """Every full collection walks every tracked object: in a long loop, records that stayed
    tracked made the collections, not the recording, a fifth of the cost per op. A record holds
    ints, tuples and code objects only, so the collector untracks it within its first passes,
    before it reaches the oldest generation."""
    import gc
    x = torch.ones(3)
    w = torch.ones(3, requires_grad=True)
    with ja.capture(namespace={}):
        recorder = capture_state.thread_state.recorder
        for _ in range(50):
            x = x * 1.0
        (w * x).sum().backward()
        x.data.add_(1)
        for _ in range(4):  # a pass may untrack one level of nested tuples (a write record has four)
            gc.collect()
        tracked = [rec for rec in recorder.ops if gc.is_tracked(rec)]
        metas = [meta for meta in recorder.tensors.meta if gc.is_tracked(meta)]
        nodes = [e for key, e in recorder.graph.nodes.items() if key >= 0 and gc.is_tracked(e)]
    assert len(recorder.ops) > 50 and tracked == [] and metas == []
    assert len(recorder.graph.nodes) >= 2 and nodes == []  # a leaf's entry is a list, the others tuples
