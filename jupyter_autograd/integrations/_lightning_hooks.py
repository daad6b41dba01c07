"""The Lightning callback's hooks, shared by `lightning.pytorch` and `pytorch_lightning` (two
packages with one API, whose Trainers each accept only their own Callback class)."""
from __future__ import annotations

from typing import Dict, Iterable, Optional

from ..session import Trace, warn
from ._steps import StepCapture


class LightningHooks:
    """Record chosen training steps of `Trainer.fit` with jupyter_autograd, and say what breaks autograd there.

    >>> callback = AutogradCallback()                 # the first training step
    >>> trainer = Trainer(callbacks=[callback]); trainer.fit(model)
    >>> callback.last_trace.diagnoses

    steps: the steps to record, by `trainer.global_step` at their start (default: [0]).
    every_n_steps: also record steps 0, n, 2n, ...
    on_exception: when a step raises, put the diagnosis that explains the exception on it as a
    note (PEP 678); when the step was not recorded, a note that says which step to record.
    check_nan: as capture(check_nan=True): name the first backward node that made a NaN or Inf.

    A step is the batches up to an optimizer step (one, or `accumulate_grad_batches`), recorded
    from this callback's `on_train_batch_start` of its first batch to `on_train_batch_end` of its
    last: `training_step`, backward and the optimizer step, automatic or manual optimization;
    `on_exception` ends it when it raises. Steps not recorded run with nothing of
    jupyter_autograd installed.

    The report of each recorded step is logged with Lightning's `rank_zero_warn` when it found a
    problem (`rank_zero_info` otherwise), and `autograd/problems` goes to every `trainer.loggers`.
    `callback.traces` keeps each recorded step's trace by step number.
    """

    # _info(message) and _warn(message): the framework's rank-zero logging, set by the class that
    # picks the framework.

    def __init__(self, steps: Optional[Iterable[int]] = None, every_n_steps: Optional[int] = None,
                 on_exception: bool = True, check_nan: bool = False):
        super().__init__()
        self._steps = StepCapture(steps, every_n_steps, on_exception, check_nan)

    @property
    def traces(self) -> Dict[int, Trace]:
        """The trace of each recorded step, by step number."""
        return self._steps.traces

    @property
    def last_trace(self) -> Optional[Trace]:
        return self._steps.last_trace

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        if not self._steps.recording:  # else: a later batch of the step being recorded
            self._steps.begin(trainer.global_step)

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        steps = self._steps
        if steps.recording and trainer.global_step == steps.recording_step \
                and (batch_idx + 1) % trainer.accumulate_grad_batches:
            return  # the step goes on: its optimizer has not stepped yet
        self._report(trainer, steps.end())

    def on_train_epoch_end(self, trainer, pl_module):
        # An epoch can end without on_train_batch_end: on_train_batch_start returned -1.
        self._report(trainer, self._steps.end())

    def on_exception(self, trainer, pl_module, exception):
        self._report(trainer, self._steps.fail(exception))

    def teardown(self, trainer, pl_module, stage):
        self._report(trainer, self._steps.end())

    def _report(self, trainer, ended):
        if ended is None:
            return
        step, trace = ended
        try:
            problems = len(trace.diagnoses)
            for logger in trainer.loggers:
                logger.log_metrics({"autograd/problems": problems}, step=step)
            message = "jupyter-autograd, training step %d: %s" % (step, trace.report())
            if problems:
                self._warn(message)
            else:
                self._info(message)
        except Exception as exc:  # the training, and an exception it raised, matter more than our report
            warn("jupyter_autograd could not log the report of training step %d (%s: %s); it is in "
                 "callback.traces[%d]" % (step, type(exc).__name__, exc, step))
