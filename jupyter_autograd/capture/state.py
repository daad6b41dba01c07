"""The state of a recording block, shared by every room of the capture.

A block's recorder is in one of the `State`s; the thread that entered the block finds it in
`thread_state.recorder` (PyTorch's function modes are per thread, and so is ours).
"""
from __future__ import annotations

import enum
import os
import threading

from torch.overrides import TorchFunctionMode

thread_state = threading.local()  # .recorder: the Recorder active in this thread, if any


class State(enum.Enum):
    RECORDING = "recording"
    STEPPING = "inside an optimizer step"  # torch.optim's step is recorded as one op (steps.py)
    PAUSED = "paused"                      # the tool's own work runs (building the trace)
    FAILED = "failed"                      # an internal error switched recording off (Recorder.failure)
    ENDED = "ended"                        # the block has ended: every call passes straight through


class Installation:
    """What one block put in place, each part released once (lifecycle.py)."""

    __slots__ = ("thread", "pid", "on_thread", "hooks", "headroom")

    def __init__(self):
        self.thread = threading.get_ident()
        self.pid = os.getpid()
        self.on_thread = False  # its mode on the thread's stack, its recorder in the thread's state
        self.hooks = False      # one of the users of the process-wide hooks
        self.headroom = False   # one of the users of the recursion headroom


class RecordingMode(TorchFunctionMode):
    """The base of our mode (mode.Recorder): what is on a torch-function stack is ours if it is one."""
