"""Whether torch.compile is at work, for the parts of the capture that must leave it alone: the code
Dynamo traces (where `torch.compiler.is_compiling()` is a constant True) and Dynamo's own work while
it compiles (fake-tensor propagation, guards), which calls torch functions a function mode sees.
"""
import torch

is_compiling = torch.compiler.is_compiling

if not hasattr(torch.compiler, "_compile_session_context"):
    # Before torch 2.13, is_compiling() is False during Dynamo's own work: a compile is told by the
    # CompileContext it sets around all of it. Tested first, is_compiling() keeps Dynamo, which
    # treats it as a constant, from tracing the lookup.
    # CompileContext.try_get() reads the thread-local attribute with getattr, which fails (slowly) on
    # a thread that never compiled: on every op. The thread-local's own dict answers the same.
    from torch._guards import _TLS

    _flag = torch.compiler.is_compiling

    def is_compiling() -> bool:  # noqa: F811 (the older torch's version)
        return _flag() or _TLS.__dict__.get("compile_context") is not None
