"""Synthetic demo data sets and data-root checks."""

from .checks import (
    MissingDataError,
    check_data_exists,
    check_pretrained_exists,
)
from .synthetic import DET_CLASSES, make_synthetic_coco
from .synthetic_cls import CLS_CLASSES, make_synthetic_imagenet
from .synthetic_seg import SEG_TRAIN_IDS, make_synthetic_cityscapes

__all__ = [
    'MissingDataError',
    'check_data_exists',
    'check_pretrained_exists',
    'DET_CLASSES',
    'SEG_TRAIN_IDS',
    'make_synthetic_coco',
    'make_synthetic_cityscapes',
    'CLS_CLASSES',
    'make_synthetic_imagenet',
]
