"""mmseg's modules rewritten for an export (see
:mod:`mmevo.deploy.rewrites`): ``Upsample`` by its scale factor."""

import torch.nn.functional as F
from mmseg.models.utils import Upsample


def _upsample(module, x, stock):
    """mmseg's ``Upsample(scale_factor=s)`` while exporting: interpolates by
    ``s`` itself, as its own forward turns ``H * s`` into a Python int. The
    same numbers for an integer ``s`` (output size and sampling grid are
    then those of the size); any other ``Upsample`` stock."""
    s = module.scale_factor
    if module.size or not isinstance(s, float) or not s.is_integer():
        return stock(x)
    return F.interpolate(
        x, scale_factor=s, mode=module.mode, align_corners=module.align_corners
    )


#: ``{class: rewrite(module, x, stock)}`` for :func:`export_rewrites`
REWRITES = {Upsample: _upsample}
