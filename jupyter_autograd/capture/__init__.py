"""Recording a block of PyTorch code: the only package that touches torch internals.

`recorder` holds the mode whose per-op method records each call, `lifecycle` installs and takes
back what a block needs, `build` turns a finished recorder into a TraceData. The session
(session.py) drives them.
"""
