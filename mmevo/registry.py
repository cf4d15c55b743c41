"""mmevo's registry.

mmevo registers its modules in mmengine's *root* model registry. mmdet's and
mmseg's registries are children of it and fall back to their parent on a miss,
so ``dict(type='RedNet')`` builds under ``default_scope='mmdet'`` and
``default_scope='mmseg'`` alike, with the plain name and no scope prefix.
"""

from mmengine.registry import MODELS

__all__ = ['MODELS']
