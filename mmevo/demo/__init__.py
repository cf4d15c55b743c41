"""Synthetic demo data: small, deterministic data sets that mmevo generates
itself, so that the CPU demos (``configs/demo``) and the tests need no
download. Not data to measure a model on.

* :func:`make_synthetic_coco`: a COCO-format detection set (:mod:`.coco`);
* :func:`make_synthetic_cityscapes`: a Cityscapes-layout segmentation set
  (:mod:`.cityscapes`);
* :func:`make_synthetic_imagenet`: an ImageNet-layout classification set
  (:mod:`.imagenet`).

``tools/misc/make_synthetic_data.py`` writes them where the demo configs
read them. They need OpenCV (cv2) and numpy.

Example:
    >>> from mmevo.demo import make_synthetic_coco
    >>> make_synthetic_coco('data/synthetic_coco', num_train=32, num_val=8)
"""

from .cityscapes import SEG_TRAIN_IDS, make_synthetic_cityscapes
from .coco import DET_CLASSES, make_synthetic_coco
from .imagenet import CLS_CLASSES, make_synthetic_imagenet

__all__ = [
    'CLS_CLASSES',
    'DET_CLASSES',
    'SEG_TRAIN_IDS',
    'make_synthetic_cityscapes',
    'make_synthetic_coco',
    'make_synthetic_imagenet',
]
