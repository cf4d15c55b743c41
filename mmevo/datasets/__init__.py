"""Data-root checks: a run's data sets and checkpoints exist before any
work starts. The synthetic demo sets are :mod:`mmevo.demo`'s."""

import warnings

from .checks import (
    MissingDataError,
    check_data_exists,
    check_pretrained_exists,
)

__all__ = [
    'MissingDataError',
    'check_data_exists',
    'check_pretrained_exists',
]

# moved to mmevo.demo; the old names warn for one release
_MOVED = (
    'CLS_CLASSES',
    'DET_CLASSES',
    'SEG_TRAIN_IDS',
    'make_synthetic_cityscapes',
    'make_synthetic_coco',
    'make_synthetic_imagenet',
)


def __getattr__(name):
    if name not in _MOVED:
        raise AttributeError(f'module {__name__!r} has no attribute {name!r}')
    warnings.warn(
        f'mmevo.datasets.{name} moved to mmevo.demo.{name}; the old name '
        'goes in the next release',
        DeprecationWarning,
        stacklevel=2,
    )
    from mmevo import demo

    return getattr(demo, name)
