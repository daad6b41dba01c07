"""`AutogradCallback` for Lightning (`import lightning.pytorch`): `pip install jupyter-autograd[lightning]`.
With the `pytorch_lightning` package, import it from `jupyter_autograd.integrations.pytorch_lightning`."""
from lightning.pytorch import Callback
from lightning.pytorch.utilities.rank_zero import rank_zero_info, rank_zero_warn

from ._lightning_hooks import LightningHooks

__all__ = ["AutogradCallback"]


class AutogradCallback(LightningHooks, Callback):
    __doc__ = LightningHooks.__doc__
    _info = staticmethod(rank_zero_info)
    _warn = staticmethod(rank_zero_warn)
