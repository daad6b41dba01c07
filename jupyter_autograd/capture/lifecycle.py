"""What a block installs, and taking it back wherever and however the block ends.

A running block has its mode on its thread's torch-function stack and its recorder in that
thread's state (both per thread), and shares with every other running block the process-wide
hooks and the recursion headroom (counted: the last block to leave takes them back). Taking it
all back must work

- when its exit ran, in its own thread or in another one: what is process-wide is taken back at
  once; what belongs to the entering thread can only be taken back there, and is, at that
  thread's next torch call or next capture (`heal`, `heal_thread`);
- when an interrupt landed on the very first instruction of its exit, before any of its code ran:
  the with statement still drops its bound `__exit__` then, and a weak reference's callback, C
  code that no interrupt can split, marks the recorder's block as ended (`watch_block`); the
  state heals as above;
- in a process forked inside it (DataLoader workers, multiprocessing, os.fork): the child takes
  everything back at once and records nothing (`_forget_in_child`).

Torch takes a mode off the stack while its `__torch_function__` runs and pushes it back after:
from inside its own call a mode cannot leave the stack. A recorder whose block ended elsewhere
therefore passes calls straight through from its first call on, and leaves the stack at its
thread's next capture.
"""
from __future__ import annotations

import _signal
import functools
import os
import re
import sys
import threading
import weakref

import torch

from . import warning_lines
from .patches import hook_users, install_hooks, remove_all_hooks, remove_hooks
from .state import RecordingMode, thread_state

# Our frames between a call and the user's: __torch_function__, entered from C (which counts
# twice), and for torch functions written in Python, handle_torch_function and the repeated call
# (Python 3.13 counts one frame more there: F.softmax's deepest working call is 963 with 4, 964 plain).
# A call that works plain at the recursion limit must work under capture; our own bookkeeping
# beyond that, when it does not fit, is skipped (see Recorder.too_deep).
RECURSION_HEADROOM = 5

_stack_length = torch._C._len_torch_function_stack
_stack_at = torch._C._get_function_stack_at
_pop_stack = torch._C._pop_torch_function_stack
_push_stack = torch._C._push_on_torch_function_stack

class _SharedLock:
    """The lock over what blocks share process-wide (hook users, headroom users: blocks start and end
    in several threads), which knows the thread holding it: a collection inside a locked section can
    run a weak reference's callback that takes a block back (_capture_freed), and that callback must
    not wait for the lock its own thread holds. Callers hold interrupts while they hold it."""

    __slots__ = ("_lock", "owner")

    def __init__(self):
        self._lock = threading.Lock()
        self.owner = None

    def __enter__(self):
        self._lock.acquire()
        self.owner = threading.get_ident()

    def __exit__(self, exc_type, exc, tb):
        self.owner = None
        self._lock.release()

    def held_here(self) -> bool:
        return self.owner == threading.get_ident()


_lock = _SharedLock()
_freed_while_locked = []  # recorders of blocks whose capture a collection freed inside a locked section
# Blocks holding the headroom; the limit before the first of them raised it; whether the limit was set
# since (sys.setrecursionlimit, through _limit_set_while_held): then it is the user's, and stays.
_headroom = [0, None, False]
_running = {}             # id(recorder) -> recorder, for every block that holds process-wide parts


def start(recorder):
    """Install what recording needs, all or nothing: on failure, what was installed is taken back
    and the error raised. Callers hold interrupts."""
    installation = recorder.installation
    _running[id(recorder)] = recorder
    try:
        with _lock:
            install_hooks()
            installation.hooks = True
        installation.on_thread = True  # before the push: a failure after it must pop it
        recorder.__enter__()
        thread_state.recorder = recorder
        with _lock:
            _hold_headroom()
            installation.headroom = True
        _release_freed()
    except BaseException:
        try:
            release(recorder)
        except BaseException:
            pass
        raise


def release(recorder, inside_its_call=False):
    """Take back what `start` installed for `recorder` and mark its block ended. What is process-wide
    goes from any thread; its mode and thread state only from the thread that entered the block
    (elsewhere they stay until that thread's next torch call or capture: see `heal`). Each part
    is taken back once; every part is tried, and the first failure raised after all of them.

    inside_its_call: called from the recorder's own __torch_function__, where torch has taken the
    mode off the stack and pushes it back after."""
    recorder.end()
    installation = recorder.installation
    failure = None
    if installation.on_thread and installation.thread == threading.get_ident() and installation.pid == os.getpid():
        if getattr(thread_state, "recorder", None) is recorder:
            thread_state.recorder = None
        if not inside_its_call:
            try:
                take_off_stack(recorder)
                installation.on_thread = False
            except BaseException as exc:
                failure = exc
    with _lock:
        if installation.hooks:
            installation.hooks = False
            try:
                remove_hooks()
            except BaseException as exc:
                failure = failure or exc
        if installation.headroom:
            installation.headroom = False
            _release_headroom()
        if hook_users[0] == 0 and warning_lines.routed():
            warning_lines.put_back()  # a call of ours cut off mid-way, and no other block's call can be running
    if not (installation.hooks or installation.headroom):  # its mode, if still on a stack, is inert
        _running.pop(id(recorder), None)
    _release_freed()
    if failure is not None:
        raise failure


def _release_freed():
    """Take back the blocks whose capture a collection freed while this thread held the lock."""
    while _freed_while_locked and not _lock.held_here():
        recorder = _freed_while_locked.pop()
        try:
            release(recorder)
        except Exception:  # what could not be taken back stays inert (see heal_thread)
            pass


def heal(recorder):
    """Called by a recorder whose block has ended (an exit in another thread, or one that never ran)
    at its next call in its own thread: take back everything but its place on the stack, which
    torch gives back after this call (it stays a pass-through until `heal_thread`)."""
    installation = recorder.installation
    if installation is None or not (installation.hooks or installation.headroom or getattr(thread_state, "recorder", None)
                                    is recorder):
        return
    with InterruptsHeld():
        release(recorder, inside_its_call=True)


def heal_thread():
    """At a capture's start: remove from this thread what blocks that have ended left behind (their
    recorder in the thread's state, their mode on the stack). A failure here is no reason to fail
    the new block: what could not be removed stays inert."""
    try:
        _heal_thread()
    except Exception:
        pass


def _heal_thread():
    current = getattr(thread_state, "recorder", None)
    if current is not None and current.has_ended():
        release(current)
        thread_state.recorder = None
    n = _stack_length()
    if not n:
        return
    for i in range(n - 1, -1, -1):
        mode = _stack_at(i)
        if isinstance(mode, RecordingMode) and mode.has_ended():
            installation = mode.installation
            if installation is not None and installation.on_thread and installation.thread == threading.get_ident():
                release(mode)
            else:  # left in a forked child by a call that was running when the process forked
                take_off_stack(mode)


def take_off_stack(recorder) -> bool:
    """Take the mode off this thread's stack, also when the user left a mode of theirs above it;
    False when it is not there."""
    above = []
    found = False
    try:
        while _stack_length() > 0:
            mode = _pop_stack()
            if mode is recorder:
                found = True
                break
            above.append(mode)
    finally:
        for mode in reversed(above):
            _push_stack(mode)
    return found


def _hold_headroom():
    if _headroom[0] == 0:
        limit = sys.getrecursionlimit()
        _setrecursionlimit(limit + RECURSION_HEADROOM)
        _headroom[1], _headroom[2] = limit, False
        # A limit set inside the block can equal the one we set: only a call tells the user's apart.
        if sys.setrecursionlimit is _setrecursionlimit:
            sys.setrecursionlimit = _limit_set_while_held
    _headroom[0] += 1


def _release_headroom():
    _headroom[0] = max(0, _headroom[0] - 1)
    if _headroom[0] == 0:
        limit, _headroom[1] = _headroom[1], None
        if sys.setrecursionlimit is _limit_set_while_held:
            sys.setrecursionlimit = _setrecursionlimit
        if limit is not None and not _headroom[2] and sys.getrecursionlimit() == limit + RECURSION_HEADROOM:
            try:
                _setrecursionlimit(limit)
            except RecursionError:  # deeper than the user's limit right now: theirs stays raised
                pass


_setrecursionlimit = sys.setrecursionlimit


# sys.setrecursionlimit while blocks hold the headroom (with the builtin's name, doc and signature):
# the limit set is the user's from then on, whoever set it and whatever its value, and stays.
@functools.wraps(_setrecursionlimit)
def _limit_set_while_held(new_limit, /):
    try:
        _setrecursionlimit(new_limit)
    except BaseException as exc:
        exc.__traceback__ = exc.__traceback__.tb_next  # raised by the builtin the user called: not here
        if type(exc) is RecursionError and len(exc.args) == 1 and isinstance(exc.args[0], str):
            # "... at the recursion depth N": N counts this frame, which a plain call does not have.
            exc.args = (_DEPTH.sub(lambda m: m.group(1) + str(int(m.group(2)) - 1), exc.args[0], count=1),)
        raise
    _headroom[2] = True


_DEPTH = re.compile(r"(recursion depth )(\d+)")


def finish_interrupted_mode_stashes(exc):
    """torch's handle_torch_function takes our mode off the stack for the duration of the call
    (`with _pop_mode_temporarily()`, a generator). An interrupt landing in that context
    manager's __enter__ or __exit__ leaves the generator suspended, and it pushes our mode back
    whenever it is finalized, long after the block. Finish those generators now, while we can
    pop the mode."""
    import contextlib

    stash = getattr(torch.overrides._pop_mode_temporarily, "__wrapped__", None)
    manager_codes = (contextlib._GeneratorContextManager.__enter__.__code__,
                     contextlib._GeneratorContextManager.__exit__.__code__)
    if stash is None:
        return
    seen = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        tb = exc.__traceback__
        while tb is not None:
            frame = tb.tb_frame
            if frame.f_code in manager_codes:
                manager = frame.f_locals.get("self")
                gen = getattr(manager, "gen", None)
                if getattr(gen, "gi_code", None) is stash.__code__ and gen.gi_frame is not None:
                    try:
                        gen.close()
                    except Exception:
                        pass
            tb = tb.tb_next
        exc = exc.__cause__ or exc.__context__


# -- the end of a block whose exit never ran --------------------------------------------------------

def watch_block(capture_object, recorder):
    """Mark `recorder`'s block as ended when the with statement drops the bound `__exit__` it looked
    up on entering (see `ExitLookup`): it does so when it calls it, whether or not an interrupt
    lets any of its code run (Recorder.watch_exit)."""
    lookup = capture_object.__dict__.get("_exit_lookup")
    method = lookup() if lookup is not None else None
    if method is None:  # entered without a with statement (ExitStack, explicit calls): its caller exits it
        return
    recorder.watch_exit(method)


class ExitLookup:
    """capture.__exit__: the function, and for the with statement's lookup (which happens just before
    __enter__ is called, and whose result the statement holds until it calls it) a bound method
    that `watch_block` can follow."""

    def __init__(self, function):
        functools.update_wrapper(self, function)
        self.function = function
        self.__code__ = function.__code__  # for tools that trace the exit's code

    def __get__(self, instance, owner=None):
        if instance is None:
            return self.function
        method = self.function.__get__(instance, owner)
        if not instance.__dict__.get("_entered", True):
            instance.__dict__["_exit_lookup"] = weakref.ref(method)
        return method


# -- the capture object freed with its block still installed ------------------------------------------

def guard(capture_object, recorder):
    """When the capture object is freed with its block still installed (its exit never ran, and
    nothing holds it: an interrupt's traceback was dropped), take the block back. A weak
    reference's callback, not __del__: it is dropped on every normal exit, so no interrupt can land
    in it and be lost."""
    net = weakref.ref(capture_object, _capture_freed)
    _left_behind[net] = recorder
    return net


def unguard(net):
    if net is not None:
        _left_behind.pop(net, None)


_left_behind = {}  # the weak reference to each capture whose block is running -> its recorder


def _capture_freed(net):
    recorder = _left_behind.pop(net, None)
    if recorder is None:
        return
    if _lock.held_here():  # a collection inside our own locked section: after that section
        _freed_while_locked.append(recorder)
        return
    with InterruptsHeld():
        release(recorder)


# -- forked children ------------------------------------------------------------------------------

def _forget_in_child():
    """os.fork's after_in_child: a child (a DataLoader worker, a multiprocessing fork) runs as without
    the tool. Nothing recorded, nothing installed, nothing kept: every block of the parent is ended
    here, our modes leave the stack of the one thread the child has, the process-wide hooks,
    headroom and warning routing are taken back. The parent's records are left as they are (they
    are the parent's pages, shared until written: freeing them here would copy them)."""
    global _lock
    _lock = _SharedLock()  # another thread of the parent may have held it at the fork
    _freed_while_locked.clear()
    me = threading.get_ident()
    for recorder in list(_running.values()):
        recorder.end()
        installation = recorder.installation
        installation.pid = os.getpid()
        installation.hooks = installation.headroom = False
        if installation.thread != me:  # that thread does not exist here
            installation.on_thread = False
    thread_state.recorder = None
    try:
        for i in range(_stack_length() - 1, -1, -1):
            mode = _stack_at(i)
            if isinstance(mode, RecordingMode):
                take_off_stack(mode)
                mode.installation.on_thread = False
    except Exception:
        pass
    _running.clear()
    _left_behind.clear()
    hook_users[0] = 0
    try:
        remove_all_hooks()
    except Exception:
        pass
    _headroom[0] = 1
    _release_headroom()
    if warning_lines.routed():
        warning_lines.put_back()


os.register_at_fork(after_in_child=_forget_in_child)


# -- interrupts -------------------------------------------------------------------------------------

class InterruptsHeld:
    """SIGINT is held while the capture installs or removes what it needs, and delivered right
    after, so that an interrupt never leaves half of it in place. Only the main thread receives
    signals; elsewhere, and where the handler was set from C (it could not be put back), this
    does nothing."""

    # The C functions of _signal, not signal's Python wrappers: fewer places to be interrupted.
    def __enter__(self):
        self.previous = self.pending = None
        self.active = True
        try:
            previous = _signal.getsignal(_signal.SIGINT)
        except (ValueError, OSError, AttributeError):
            return self
        if previous is None:
            return self
        self.previous = previous
        try:
            _signal.signal(_signal.SIGINT, self._hold)
        except (ValueError, OSError):
            self.previous = None
        except BaseException:  # an interrupt that arrived just before ours went in: put the old one back
            _signal.signal(_signal.SIGINT, previous)
            self.previous = None
            raise
        return self

    def _hold(self, signum, frame):
        if not self.active:  # left installed by a window that never closed: never swallow an interrupt
            _signal.default_int_handler(signum, frame)
        self.pending = signum

    def __exit__(self, exc_type, exc, tb):
        previous = self.previous
        if previous is None:
            self.active = False
            return False
        _signal.signal(_signal.SIGINT, previous)  # from here on, an interrupt goes to `previous`
        self.previous = None
        self.active = False
        pending, self.pending = self.pending, None
        if pending is not None:
            if callable(previous):
                previous(pending, sys._getframe(1))
            elif previous == _signal.SIG_DFL:
                _signal.raise_signal(_signal.SIGINT)
        return False
