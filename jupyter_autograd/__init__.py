"""jupyter-autograd: see PyTorch's autograd graph and the line that broke backward.

    import jupyter_autograd as ja
    with ja.capture() as trace:
        ...
    trace.diagnoses

In Jupyter: `%load_ext jupyter_autograd`, then `%%autograd` on top of a cell.
Importing this package does not import IPython or ipywidgets.
"""
from .model import Diagnosis
from .session import Trace, capture

__version__ = "0.1.0"
__all__ = ["capture", "Trace", "Diagnosis", "load_ipython_extension", "unload_ipython_extension"]


def load_ipython_extension(ipython):
    from .magic import load
    load(ipython)


def unload_ipython_extension(ipython):
    from .magic import unload
    unload(ipython)
