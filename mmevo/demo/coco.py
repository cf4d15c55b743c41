"""Deterministic synthetic data sets for the demos and the tests.

Small data sets that the project generates itself, so that the demos and the
tests need no download (this module, the shared drawing helpers and):

* a COCO-format detection set: coloured circles, squares and triangles on
  textured backgrounds (``annotations/instances_{train,val}.json`` plus
  ``{train,val}/*.png``), read by mmdet's ``CocoDataset`` and scored by the
  real ``CocoMetric``;
* a Cityscapes-layout segmentation set (:mod:`.cityscapes`);
* an ImageNet-layout classification set (:mod:`.imagenet`).

Every image is drawn from its own ``numpy.random.RandomState`` seeded by
(seed, split, index), so a file's bytes depend only on those three numbers:
two generations give identical files, whatever the order or the machine.
``RandomState`` is used on purpose: its stream is frozen by numpy's
compatibility policy, unlike ``Generator``'s.
"""

import json
import os
import os.path as osp
import shutil

import cv2
import numpy as np

DET_CLASSES = ('circle', 'square', 'triangle')

_SPLIT_IDS = {'train': 0, 'val': 1}

STAMP = '.synthetic.json'


def _start_set(out_dir, subdirs):
    """Empty ``out_dir``'s ``subdirs`` of an earlier synthetic set (so no stale
    file of a larger set stays), refusing to touch a directory that is not
    one of ours, and mark the set as incomplete until :func:`_write_stamp`."""
    if (
        osp.isdir(out_dir)
        and os.listdir(out_dir)
        and not osp.exists(osp.join(out_dir, STAMP))
    ):
        raise FileExistsError(
            f'{out_dir} exists and is not a synthetic set; choose another '
            'output directory'
        )
    os.makedirs(out_dir, exist_ok=True)
    _write_stamp(out_dir, complete=False)
    for sub in subdirs:
        shutil.rmtree(osp.join(out_dir, sub), ignore_errors=True)


def _write_stamp(out_dir, **params):
    """Record the set's parameters (``_start_set`` marks it incomplete)."""
    with open(osp.join(out_dir, STAMP), 'w') as f:
        json.dump(params, f, sort_keys=True)


def synthetic_set_ready(out_dir, **params):
    """Whether ``out_dir`` holds a completely written set made with
    ``params`` (the keyword arguments of the ``make_*`` function).

    Example:
        >>> synthetic_set_ready('data/nowhere', kind='coco')
        False
    """
    try:
        with open(osp.join(out_dir, STAMP)) as f:
            return json.load(f) == json.loads(json.dumps(params))
    except (OSError, ValueError):
        return False


def _rng(seed, split, index):
    """The image's own random stream (see the module docstring)."""
    return np.random.RandomState(
        (seed * 1_000_003 + _SPLIT_IDS[split] * 100_003 + index) % 2**32
    )


def _texture(rng, h, w, mean, amp=30.0, cell=16, stripes=0.0):
    """A float (h, w, 3) texture: ``mean`` colour + low-frequency colour noise
    + optional oriented stripes + pixel noise."""
    coarse = rng.normal(0.0, amp, size=(h // cell + 2, w // cell + 2, 3))
    img = np.asarray(mean, np.float64) + cv2.resize(
        coarse, (w, h), interpolation=cv2.INTER_CUBIC
    )
    if stripes:
        yy, xx = np.mgrid[0:h, 0:w]
        theta = rng.uniform(0, np.pi)
        period = rng.uniform(5, 18)
        wave = np.sin(
            2 * np.pi * (xx * np.cos(theta) + yy * np.sin(theta)) / period
        )
        img += stripes * wave[..., None] * rng.uniform(0.3, 1.0, size=3)
    return img + rng.normal(0.0, 6.0, size=(h, w, 3))


def _to_uint8(img):
    return np.clip(np.rint(img), 0, 255).astype(np.uint8)


def _shape_polygon(rng, cls, cx, cy, size):
    """Vertices (N, 2) of a shape of class ``cls`` centred at (cx, cy)."""
    if cls == 'circle':
        angles = np.linspace(0, 2 * np.pi, 32, endpoint=False)
        radius = size / 2
    elif cls == 'square':
        angles = (
            np.deg2rad(rng.uniform(-15, 15))
            + np.pi / 4
            + np.arange(4) * np.pi / 2
        )
        radius = size / 2 * np.sqrt(2) * rng.uniform(0.8, 1.0)
    else:  # triangle
        angles = rng.uniform(0, 2 * np.pi) + np.arange(3) * 2 * np.pi / 3
        radius = size / 2 * rng.uniform(0.9, 1.1)
    return np.stack(
        [cx + radius * np.cos(angles), cy + radius * np.sin(angles)], axis=1
    )


def _draw_detection_image(rng, size, max_objects):
    """One image (H, W, 3) uint8 BGR and its objects."""
    h = w = size
    img = _texture(
        rng, h, w, rng.uniform(50, 200, size=3), stripes=rng.uniform(0, 30)
    )
    objects = []
    for _ in range(rng.randint(1, max_objects + 1)):
        cls_id = rng.randint(len(DET_CLASSES))
        for _attempt in range(20):
            s = rng.uniform(0.12, 0.35) * size
            cx, cy = rng.uniform(s / 2 + 1, size - s / 2 - 1, size=2)
            poly = _shape_polygon(rng, DET_CLASSES[cls_id], cx, cy, s)
            mask = np.zeros((h, w), np.uint8)
            cv2.fillPoly(mask, [np.rint(poly).astype(np.int32)], 1)
            ys, xs = np.nonzero(mask)
            box = [xs.min(), ys.min(), xs.max() + 1, ys.max() + 1]
            # objects do not touch (2 px apart), so every box is exact
            if all(
                box[0] > b[2] + 1
                or b[0] > box[2] + 1
                or box[1] > b[3] + 1
                or b[1] > box[3] + 1
                for b, _, _, _ in objects
            ):
                break
        else:
            continue
        # a colour far from the background under the shape
        bg = img[mask.astype(bool)].mean(0)
        colour = rng.uniform(0, 255, size=3)
        if np.abs(colour - bg).mean() < 60:
            colour = 255 - bg
        shade = _texture(rng, h, w, colour, amp=10, cell=8)
        img[mask.astype(bool)] = shade[mask.astype(bool)]
        objects.append((box, cls_id, poly, int(mask.sum())))
    return _to_uint8(img), objects


def make_synthetic_coco(
    out_dir,
    num_train=400,
    num_val=100,
    img_size=128,
    max_objects=4,
    seed=0,
    skip_if_ready=False,
):
    """Write the synthetic COCO-format detection set.

    Layout::

        out_dir/annotations/instances_train.json
        out_dir/annotations/instances_val.json
        out_dir/train/000000.png ...
        out_dir/val/000000.png ...

    Categories are ``DET_CLASSES`` with COCO ids 1, 2, 3. Boxes are exact
    (objects never touch), ``segmentation`` holds the drawn polygon.

    Args:
        out_dir (str): Root directory (created).
        num_train (int): Number of training images.
        num_val (int): Number of validation images.
        img_size (int): Images are ``img_size`` x ``img_size``.
        max_objects (int): Each image holds 1 to ``max_objects`` shapes.
        seed (int): Seed of the whole set.
        skip_if_ready (bool): Write nothing if ``out_dir`` already holds a
            complete set made with the same arguments.

    Returns:
        dict: ``{'train': ann_file, 'val': ann_file}`` paths.

    Example:
        >>> files = make_synthetic_coco('data/synthetic_coco', 8, 4)
        >>> sorted(files)
        ['train', 'val']
    """
    params = dict(
        kind='coco',
        num_train=num_train,
        num_val=num_val,
        img_size=img_size,
        max_objects=max_objects,
        seed=seed,
    )
    ann_files = {
        split: osp.join(out_dir, 'annotations', f'instances_{split}.json')
        for split in ('train', 'val')
    }
    if skip_if_ready and synthetic_set_ready(out_dir, **params):
        return ann_files
    _start_set(out_dir, ('annotations', 'train', 'val'))
    os.makedirs(osp.join(out_dir, 'annotations'))
    categories = [
        dict(id=i + 1, name=name, supercategory='shape')
        for i, name in enumerate(DET_CLASSES)
    ]
    for split, num in (('train', num_train), ('val', num_val)):
        os.makedirs(osp.join(out_dir, split))
        images, annotations = [], []
        for idx in range(num):
            img, objects = _draw_detection_image(
                _rng(seed, split, idx), img_size, max_objects
            )
            file_name = f'{idx:06d}.png'
            cv2.imwrite(osp.join(out_dir, split, file_name), img)
            images.append(
                dict(
                    id=idx,
                    file_name=file_name,
                    height=img_size,
                    width=img_size,
                )
            )
            for box, cls_id, poly, area in objects:
                x1, y1, x2, y2 = (int(v) for v in box)
                annotations.append(
                    dict(
                        id=len(annotations) + 1,
                        image_id=idx,
                        category_id=cls_id + 1,
                        bbox=[x1, y1, x2 - x1, y2 - y1],
                        area=area,
                        iscrowd=0,
                        segmentation=[np.round(poly, 2).ravel().tolist()],
                    )
                )
        with open(ann_files[split], 'w') as f:
            json.dump(
                dict(
                    images=images,
                    annotations=annotations,
                    categories=categories,
                ),
                f,
            )
    _write_stamp(out_dir, **params)
    return ann_files
