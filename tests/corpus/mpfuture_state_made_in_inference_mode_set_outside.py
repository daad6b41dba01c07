# learning-at-home/hivemind#521: an MPFuture keeps its state in a small shared tensor. A future
# created inside torch.inference_mode() (a server running its experts under it) gets an inference
# tensor, and setting its result later, outside inference mode, writes into it in place.
# expect: view-inplace tensor=self._shared_state_code
# outcome: raises RuntimeError
import torch

PENDING, FINISHED = 0, 2


class MPFuture:
    def __init__(self):
        self._shared_state_code = torch.empty([], dtype=torch.uint8)  # @saved
        self._shared_state_code[...] = PENDING
        self._result = None

    def set_result(self, result):
        self._shared_state_code[...] = FINISHED  # @culprit
        self._result = result


with torch.inference_mode():
    future = MPFuture()
    output = torch.ones(3) * 2
future.set_result(output)
