"""Recording chosen training steps from a framework's hooks: which steps, one capture() open from
the hook that starts a step to the hook that ends it, and the traces kept. No framework here."""
from __future__ import annotations

import threading
from typing import Dict, Iterable, Optional, Tuple

from ..session import Trace, capture


class StepCapture:
    """Which training steps to record, and the capture of the one being recorded.

    begin(step) at the framework's first hook of every step opens a capture() for a chosen step,
    end() at its last hook closes it; fail(exc) closes it with the exception that ended the step,
    so the diagnosis that explains the exception goes on it as a note, as with capture(). Between
    the steps it records, nothing of jupyter_autograd is installed: for a step not chosen,
    begin() only remembers its number.
    """

    def __init__(self, steps: Optional[Iterable[int]] = None, every_n_steps: Optional[int] = None,
                 on_exception: bool = True, check_nan: bool = False):
        if every_n_steps is not None and (isinstance(every_n_steps, bool) or not isinstance(every_n_steps, int)
                                          or every_n_steps < 1):
            raise ValueError("every_n_steps takes a positive int (record steps 0, n, 2n, ...), got %r"
                             % (every_n_steps,))
        if steps is None:
            steps = () if every_n_steps else (0,)
        steps = frozenset(steps)
        bad = [s for s in steps if isinstance(s, bool) or not isinstance(s, int) or s < 0]
        if bad:
            raise ValueError("steps takes training step numbers (ints from 0), got %r" % (bad[0],))
        if not isinstance(on_exception, bool) or not isinstance(check_nan, bool):
            raise TypeError("on_exception and check_nan take True or False")
        self.steps = steps
        self.every_n_steps = every_n_steps
        self.on_exception = on_exception
        self.check_nan = check_nan
        self.traces: Dict[int, Trace] = {}
        self.step: Optional[int] = None  # the step under way, recorded or not
        self._open: Optional[capture] = None
        self._open_step: Optional[int] = None
        self._thread: Optional[int] = None

    def wanted(self, step: int) -> bool:
        return step in self.steps or (self.every_n_steps is not None and step % self.every_n_steps == 0)

    @property
    def recording(self) -> bool:
        return self._open is not None

    @property
    def recording_step(self) -> Optional[int]:
        return self._open_step

    def begin(self, step: int) -> bool:
        """A step starts: record it if it is chosen and not recorded yet. True if it is recorded."""
        self.step = step
        if self._open is not None or step in self.traces or not self.wanted(step):
            return False
        recording = capture(namespace=[], check_nan=self.check_nan, note_exceptions=self.on_exception)
        recording.__enter__()
        self._open, self._open_step, self._thread = recording, step, threading.get_ident()
        return True

    def end(self, exc: Optional[BaseException] = None) -> Optional[Tuple[int, Trace]]:
        """The step ends (with exc, if it raised): close its capture. (step, trace) if it was recorded."""
        self.step = None
        recording = self._open
        if recording is None:
            return None
        if threading.get_ident() != self._thread:
            # The mode is on the stack of the thread that entered; only that thread can take it off.
            raise RuntimeError("jupyter_autograd: the framework ended training step %d on another thread than the "
                               "one that started it; the capture can only be closed where it was opened"
                               % self._open_step)
        step, self._open, self._open_step = self._open_step, None, None
        if exc is None:
            recording.__exit__(None, None, None)
        else:
            recording.__exit__(type(exc), exc, exc.__traceback__)
        self.traces[step] = recording.trace
        return step, recording.trace

    def fail(self, exc: BaseException, callback: str = "AutogradCallback") -> Optional[Tuple[int, Trace]]:
        """The step under way raised exc. A recorded step ends with it; an unrecorded one says, in a
        note on exc, which step raised and how to record it on the next run."""
        step, recorded = self.step, self.recording
        ended = self.end(exc)
        if (not recorded and step is not None and self.on_exception and isinstance(exc, Exception)
                and hasattr(exc, "add_note")):
            exc.add_note("jupyter-autograd: training step %d raised and was not recorded; to see why, run again from "
                         "the same seed with %s(steps=[%d])" % (step, callback, step))
        return ended

    @property
    def last_trace(self) -> Optional[Trace]:
        """The trace of the step recorded last."""
        return next(reversed(self.traces.values()), None)
