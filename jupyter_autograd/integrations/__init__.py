"""Callbacks that record chosen training steps inside a training framework's own loop.

    from jupyter_autograd.integrations.lightning import AutogradCallback      # Lightning
    from jupyter_autograd.integrations.pytorch_lightning import AutogradCallback  # pytorch_lightning
    from jupyter_autograd.integrations.transformers import AutogradCallback   # HF Trainer

Each module imports its framework itself (`pip install jupyter-autograd[lightning]`,
`[transformers]`); importing this package imports neither.
"""
