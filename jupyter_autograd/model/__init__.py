"""Plain data of a captured block: the records (records.py), the kinds of problem and their words
(kinds.py), the trace that holds them (trace.py) and the queries over its graph (queries.py).

The bottom layer: it imports nothing else of the package, nor torch, IPython or ipywidgets.
"""
from .kinds import EXPLAINS, PROBLEM_KINDS, SECOND_LINE_LABELS, Diagnosis, is_description
from .records import (DATA_SWAP, FREEZE_SETTER, GRAD_MODE_SWITCHES, Checkpoint, CompiledCall, DistributedModel,
                      GraphNode, Location, ModuleCall, OpRecord, SavedSlot, TensorInfo)
from .trace import TraceData, node_id, tensor_id, to_networkx

__all__ = ["EXPLAINS", "PROBLEM_KINDS", "SECOND_LINE_LABELS", "Diagnosis", "is_description", "DATA_SWAP",
           "FREEZE_SETTER", "GRAD_MODE_SWITCHES", "Checkpoint", "CompiledCall", "DistributedModel", "GraphNode", "Location",
           "ModuleCall", "OpRecord", "SavedSlot", "TensorInfo", "TraceData", "node_id", "tensor_id", "to_networkx"]
