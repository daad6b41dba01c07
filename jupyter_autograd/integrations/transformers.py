"""`AutogradCallback` for the Hugging Face `transformers.Trainer`: `pip install jupyter-autograd[transformers]`."""
from __future__ import annotations

import functools
import inspect
import sys
from typing import Dict, Iterable, Optional

from transformers import Trainer, TrainerCallback
from transformers.utils import logging

from ..session import Trace, warn
from ._steps import StepCapture

__all__ = ["AutogradCallback"]

logger = logging.get_logger(__name__)

_TRAINER_INIT = inspect.unwrap(Trainer.__init__).__code__


class AutogradCallback(TrainerCallback):
    """Record chosen training steps of `Trainer.train` with jupyter_autograd, and say what breaks autograd there.

    >>> callback = AutogradCallback()                 # the first training step
    >>> trainer = Trainer(model, args, train_dataset=data, callbacks=[callback]); trainer.train()
    >>> callback.last_trace.diagnoses

    steps: the steps to record, by `state.global_step` at their start (default: [0]).
    every_n_steps: also record steps 0, n, 2n, ...
    on_exception: when a step raises, put the diagnosis that explains the exception on it as a
    note (PEP 678); when the step was not recorded, a note that says which step to record.
    check_nan: as capture(check_nan=True): name the first backward node that made a NaN or Inf.

    A step is recorded from this callback's `on_step_begin` to its `on_step_end`: every micro-batch
    of gradient accumulation (forward, loss, backward), clipping and the optimizer step. Steps not
    recorded run with nothing of jupyter_autograd installed.

    The Trainer has no hook for an exception, so the callback wraps the `train` method of the
    Trainer it was given to (an attribute of that one instance, set when the Trainer is made): an
    exception that leaves a recorded step, from whatever line, ends its capture on its way out.
    Give the callback to `Trainer(callbacks=[...])`: one added later with `trainer.add_callback`
    never sees the Trainer being made, records nothing and says so.

    The report of each recorded step is logged with transformers' logging (a warning when it found
    a problem, info otherwise) and an entry `{"autograd_problems": n, "step": step}` (with
    `"autograd_report"` when n > 0) goes into `state.log_history`. `callback.traces` keeps each
    recorded step's trace by step number.
    """

    def __init__(self, steps: Optional[Iterable[int]] = None, every_n_steps: Optional[int] = None,
                 on_exception: bool = True, check_nan: bool = False):
        self._steps = StepCapture(steps, every_n_steps, on_exception, check_nan)
        self._guarding = False  # whether the train() now running goes through our wrapper

    @property
    def traces(self) -> Dict[int, Trace]:
        """The trace of each recorded step, by step number."""
        return self._steps.traces

    @property
    def last_trace(self) -> Optional[Trace]:
        return self._steps.last_trace

    def on_init_end(self, args, state, control, **kwargs):
        trainer = _trainer_being_made()
        if trainer is not None:
            self._guard(trainer)

    def on_train_begin(self, args, state, control, **kwargs):
        if not self._guarding:
            logger.warning("jupyter-autograd: AutogradCallback was added after the Trainer was made, so it cannot "
                           "end a recorded step that raises in this train() call: it records nothing in it. Give it "
                           "to Trainer(callbacks=[AutogradCallback()]).")

    def on_step_begin(self, args, state, control, **kwargs):
        if self._guarding:
            self._steps.begin(state.global_step)

    def on_step_end(self, args, state, control, **kwargs):
        self._report(state, self._steps.end())

    def on_train_end(self, args, state, control, **kwargs):
        self._report(state, self._steps.end())

    def _guard(self, trainer) -> None:
        """Wrap this Trainer's `train` so that an exception leaving a step ends its capture."""
        train = trainer.train

        @functools.wraps(train)
        def train_recording_steps(*args, **kwargs):
            outer, self._guarding = self._guarding, True
            try:
                return train(*args, **kwargs)
            except BaseException as exc:
                self._report(trainer.state, self._steps.fail(exc))
                # Without this frame, the traceback reads as without the callback (a bare raise
                # adds no entry for the frame that re-raises).
                if exc.__traceback__ is not None and exc.__traceback__.tb_frame is sys._getframe():
                    exc.__traceback__ = exc.__traceback__.tb_next
                raise
            finally:
                self._guarding = outer

        trainer.train = train_recording_steps

    def _report(self, state, ended) -> None:
        if ended is None:
            return
        step, trace = ended
        try:
            problems = len(trace.diagnoses)
            entry = {"autograd_problems": problems, "step": step}
            report = trace.report()
            if problems:
                entry["autograd_report"] = report
            state.log_history.append(entry)
            message = "jupyter-autograd, training step %d: %s" % (step, report)
            if problems:
                logger.warning(message)
            else:
                logger.info(message)
        except Exception as exc:  # the training, and an exception it raised, matter more than our report
            warn("jupyter_autograd could not log the report of training step %d (%s: %s); it is in "
                 "callback.traces[%d]" % (step, type(exc).__name__, exc, step))


def _trainer_being_made():
    """The Trainer whose __init__ called this hook (the callback handler does not pass it).
    Only that one frame's locals are read, as it ends: on Python < 3.13 reading them keeps a copy
    of them until the frame is gone."""
    frame = sys._getframe(2)
    while frame is not None:
        if frame.f_code is _TRAINER_INIT:
            trainer = frame.f_locals.get("self")
            return trainer if isinstance(trainer, Trainer) else None
        frame = frame.f_back
    return None
