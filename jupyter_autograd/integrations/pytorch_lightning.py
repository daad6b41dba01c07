"""`AutogradCallback` for the `pytorch_lightning` package (Lightning under its older name).
With `import lightning.pytorch`, import it from `jupyter_autograd.integrations.lightning`."""
from pytorch_lightning import Callback
from pytorch_lightning.utilities.rank_zero import rank_zero_info, rank_zero_warn

from ._lightning_hooks import LightningHooks

__all__ = ["AutogradCallback"]


class AutogradCallback(LightningHooks, Callback):
    __doc__ = LightningHooks.__doc__
    _info = staticmethod(rank_zero_info)
    _warn = staticmethod(rank_zero_warn)
