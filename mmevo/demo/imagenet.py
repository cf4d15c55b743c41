"""A deterministic synthetic classification set in the ImageNet layout.

``make demo-cls`` trains on it: ten classes, six shapes drawn on textured
backgrounds and four textures, every image of its own size (64 to 96 px a
side) and colours, so that neither the size nor the colour gives the class
away. The layout is ImageNet's folder layout (``{train,val}/<class>/*.png``),
read by mmpretrain's ``ImageNet`` dataset with ``split='train'`` / ``'val'``
(and by ``CustomDataset``, which ``ImageNet`` is).

Every image is drawn from its own random stream seeded by (seed, split,
index), as the detection and segmentation sets of :mod:`.coco` are.
"""

import os
import os.path as osp

import cv2
import numpy as np

from .coco import (
    _rng,
    _start_set,
    _texture,
    _to_uint8,
    _write_stamp,
    synthetic_set_ready,
)

# None of the ten changes class under a horizontal flip (the demo's
# augmentation), and none is a colour.
_SHAPES = ('circle', 'cross', 'ring', 'square', 'star', 'triangle')
_TEXTURES = ('checker', 'dots', 'hstripes', 'vstripes')
# In sorted order: the label of a folder-layout sample is its folder's index
# among the sorted folder names (mmpretrain's CustomDataset).
CLS_CLASSES = tuple(sorted(_SHAPES + _TEXTURES))


def _polygon(cls, cx, cy, radius, angle):
    """Vertices (N, 2) int32 of a filled shape (circle: 48-gon)."""
    if cls in ('circle', 'ring'):
        angles = np.linspace(0, 2 * np.pi, 48, endpoint=False)
        radii = np.full(48, radius)
    elif cls == 'square':
        angles = angle + np.pi / 4 + np.arange(4) * np.pi / 2
        radii = np.full(4, radius)
    elif cls == 'triangle':
        angles = angle - np.pi / 2 + np.arange(3) * 2 * np.pi / 3
        radii = np.full(3, radius)
    else:  # star: five points, inner radius 0.45
        angles = angle - np.pi / 2 + np.arange(10) * np.pi / 5
        radii = np.where(np.arange(10) % 2 == 0, radius, 0.45 * radius)
    pts = np.stack(
        [cx + radii * np.cos(angles), cy + radii * np.sin(angles)], axis=1
    )
    return np.rint(pts).astype(np.int32)


def _shape_mask(rng, cls, h, w):
    """A (h, w) bool mask of one shape, 45-75 % of the short side across,
    near the centre."""
    radius = rng.uniform(0.22, 0.37) * min(h, w)
    cx = w / 2 + rng.uniform(-0.1, 0.1) * w
    cy = h / 2 + rng.uniform(-0.1, 0.1) * h
    angle = np.deg2rad(rng.uniform(-12, 12))
    mask = np.zeros((h, w), np.uint8)
    if cls == 'cross':
        arm = radius * rng.uniform(0.3, 0.45)
        for dx, dy in ((radius, arm), (arm, radius)):
            box = cv2.boxPoints(
                ((cx, cy), (2 * dx, 2 * dy), np.rad2deg(angle))
            )
            cv2.fillPoly(mask, [np.rint(box).astype(np.int32)], 1)
    else:
        cv2.fillPoly(mask, [_polygon(cls, cx, cy, radius, angle)], 1)
        if cls == 'ring':
            cv2.fillPoly(
                mask, [_polygon(cls, cx, cy, 0.55 * radius, angle)], 0
            )
    return mask.astype(bool)


def _pattern(rng, cls, h, w):
    """A (h, w) float pattern in [0, 1] of one texture class."""
    yy, xx = np.mgrid[0:h, 0:w].astype(np.float64)
    theta = np.deg2rad(rng.uniform(-10, 10))  # a slight tilt
    u = xx * np.cos(theta) + yy * np.sin(theta)
    v = -xx * np.sin(theta) + yy * np.cos(theta)
    period = rng.uniform(7, 14)
    phase = rng.uniform(0, 2 * np.pi, size=2)
    wave_u = np.sin(2 * np.pi * u / period + phase[0])
    wave_v = np.sin(2 * np.pi * v / period + phase[1])
    if cls == 'hstripes':
        return (wave_v > 0).astype(np.float64)
    if cls == 'vstripes':
        return (wave_u > 0).astype(np.float64)
    if cls == 'checker':
        return (wave_u * wave_v > 0).astype(np.float64)
    # dots: a disc in every cell of the grid
    cu = np.mod(u / period + phase[0], 1.0) - 0.5
    cv = np.mod(v / period + phase[1], 1.0) - 0.5
    return (cu**2 + cv**2 < rng.uniform(0.05, 0.1)).astype(np.float64)


def _two_colours(rng):
    """Two random BGR colours at least 80 apart (mean over channels)."""
    first = rng.uniform(0, 255, size=3)
    second = rng.uniform(0, 255, size=3)
    if np.abs(first - second).mean() < 80:
        second = 255 - first
    return first, second


def draw_classification_image(rng, cls_id):
    """One image of class ``cls_id``: BGR uint8, (h, w, 3) with h and w in
    [64, 96] drawn from ``rng``.

    Args:
        rng (numpy.random.RandomState): the image's random stream.
        cls_id (int): index into ``CLS_CLASSES``.

    Returns:
        numpy.ndarray: the image.

    Example:
        >>> img = draw_classification_image(np.random.RandomState(0), 3)
        >>> img.dtype, img.ndim
        (dtype('uint8'), 3)
    """
    if not 0 <= cls_id < len(CLS_CLASSES):
        raise ValueError(
            f'cls_id must be in [0, {len(CLS_CLASSES)}), got {cls_id!r}'
        )
    h, w = rng.randint(64, 97, size=2)
    cls = CLS_CLASSES[cls_id]
    back, fore = _two_colours(rng)
    if cls in _SHAPES:
        img = _texture(rng, h, w, back, amp=25, cell=12)
        mask = _shape_mask(rng, cls, h, w)
        shade = _texture(rng, h, w, fore, amp=10, cell=8)
        img[mask] = shade[mask]
    else:
        pattern = _pattern(rng, cls, h, w)[..., None]
        img = back * (1 - pattern) + fore * pattern
        img = img + rng.normal(0.0, 10.0, size=img.shape)
    return _to_uint8(img)


def make_synthetic_imagenet(
    out_dir, num_train=400, num_val=100, seed=0, skip_if_ready=False
):
    """Write the synthetic classification set in ImageNet's folder layout.

    Layout::

        out_dir/train/<class>/000000.png ...
        out_dir/val/<class>/000003.png ...

    Image ``i`` of a split is of class ``i % 10`` (``CLS_CLASSES``), so the
    classes are balanced; its file name is ``i``.

    Args:
        out_dir (str): Root directory (created).
        num_train (int): Number of training images.
        num_val (int): Number of validation images.
        seed (int): Seed of the whole set.
        skip_if_ready (bool): Write nothing if ``out_dir`` already holds a
            complete set made with the same arguments.

    Returns:
        dict: ``{'train': n, 'val': n}`` images per split.

    Example:
        >>> make_synthetic_imagenet('data/synthetic_imagenet', 20, 10)
        {'train': 20, 'val': 10}
    """
    for name, value in (('num_train', num_train), ('num_val', num_val)):
        if not isinstance(value, int) or value < 0:
            raise ValueError(f'{name} must be an int >= 0, got {value!r}')
    params = dict(
        kind='imagenet', num_train=num_train, num_val=num_val, seed=seed
    )
    if skip_if_ready and synthetic_set_ready(out_dir, **params):
        return dict(train=num_train, val=num_val)
    _start_set(out_dir, ('train', 'val'))
    for split, num in (('train', num_train), ('val', num_val)):
        for name in CLS_CLASSES:
            os.makedirs(osp.join(out_dir, split, name))
        for idx in range(num):
            cls_id = idx % len(CLS_CLASSES)
            img = draw_classification_image(_rng(seed, split, idx), cls_id)
            cv2.imwrite(
                osp.join(
                    out_dir, split, CLS_CLASSES[cls_id], f'{idx:06d}.png'
                ),
                img,
            )
    _write_stamp(out_dir, **params)
    return dict(train=num_train, val=num_val)
