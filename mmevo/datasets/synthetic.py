"""Deterministic synthetic data sets for the demos and the tests.

Two small data sets that the project generates itself, so that ``make demo``
and the tests need no download:

* a COCO-format detection set: coloured circles, squares and triangles on
  textured backgrounds (``annotations/instances_{train,val}.json`` plus
  ``{train,val}/*.png``), read by mmdet's ``CocoDataset`` and scored by the
  real ``CocoMetric``;
* a Cityscapes-layout segmentation set: street-like scenes in
  ``leftImg8bit/{train,val}/<city>/*_leftImg8bit.png`` with label maps
  ``gtFine/{train,val}/<city>/*_gtFine_labelTrainIds.png`` in Cityscapes'
  19-class train-id space (a subset of the ids occurs), read by mmseg's
  ``CityscapesDataset``.

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

# Cityscapes train ids (mmseg ``CityscapesDataset.METAINFO['classes']`` order)
# of the classes the street scenes contain.
ROAD, SIDEWALK, BUILDING, POLE, SIGN, VEGETATION, SKY, PERSON, CAR = (
    0,
    1,
    2,
    5,
    7,
    8,
    10,
    11,
    13,
)
SEG_TRAIN_IDS = (
    ROAD,
    SIDEWALK,
    BUILDING,
    POLE,
    SIGN,
    VEGETATION,
    SKY,
    PERSON,
    CAR,
)
SEG_CITIES = {'train': ('aachen', 'bochum'), 'val': ('frankfurt',)}

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


# Mean BGR colour, colour-noise amplitude and stripe strength per class: each
# class has its own look, as in a street scene, but none is a flat colour.
_SEG_LOOKS = {
    ROAD: ((128, 64, 110), 12, 0),
    SIDEWALK: ((200, 170, 220), 15, 15),
    BUILDING: ((90, 90, 90), 25, 25),
    POLE: ((150, 150, 150), 10, 0),
    SIGN: ((30, 210, 220), 10, 0),
    VEGETATION: ((40, 140, 70), 35, 0),
    SKY: ((210, 160, 110), 15, 0),
    PERSON: ((70, 40, 200), 30, 0),
    CAR: ((140, 30, 20), 40, 0),
}


def _draw_street_scene(rng, h, w):
    """One street-like scene: BGR uint8 image and uint8 train-id label map."""
    img = np.zeros((h, w, 3), np.float64)
    label = np.zeros((h, w), np.uint8)

    def paint(mask, train_id):
        mean, amp, stripes = _SEG_LOOKS[train_id]
        jitter = rng.uniform(-25, 25, size=3)
        tex = _texture(
            rng, h, w, np.add(mean, jitter), amp=amp, stripes=stripes
        )
        img[mask] = tex[mask]
        label[mask] = train_id

    yy, xx = np.mgrid[0:h, 0:w]
    horizon = int(rng.uniform(0.3, 0.45) * h)
    ground = int(rng.uniform(0.55, 0.7) * h)
    paint(yy < ground, SKY)
    # buildings stand on the ground line
    x = int(rng.uniform(-0.1, 0.05) * w)
    while x < w:
        bw = int(rng.uniform(0.12, 0.3) * w)
        top = int(rng.uniform(0.05, 0.9) * horizon)
        if rng.rand() < 0.8:
            paint(
                (xx >= x) & (xx < x + bw) & (yy >= top) & (yy < ground),
                BUILDING,
            )
        x += bw + int(rng.uniform(0, 0.08) * w)
    for _ in range(rng.randint(1, 4)):  # trees
        mask = np.zeros((h, w), np.uint8)
        cv2.ellipse(
            mask,
            (int(rng.uniform(0, w)), int(rng.uniform(horizon, ground))),
            (
                int(rng.uniform(0.05, 0.12) * w),
                int(rng.uniform(0.1, 0.25) * h),
            ),
            0,
            0,
            360,
            1,
            -1,
        )
        paint(mask.astype(bool), VEGETATION)
    # the road narrows towards the horizon, sidewalks run along it
    half = (yy - ground) / max(h - ground, 1) * 0.45 * w + 0.2 * w
    centre = w / 2 + rng.uniform(-0.1, 0.1) * w
    below = yy >= ground
    paint(below, SIDEWALK)
    paint(below & (np.abs(xx - centre) < half), ROAD)
    for _ in range(rng.randint(0, 3)):  # poles with a sign on top
        px = int(rng.uniform(0.02, 0.98) * w)
        ptop = int(rng.uniform(0.2, 0.5) * h)
        pbot = int(rng.uniform(ground, h))
        paint((xx >= px) & (xx < px + 3) & (yy >= ptop) & (yy < pbot), POLE)
        paint(
            (np.abs(xx - px - 1) < 6) & (yy >= ptop - 8) & (yy < ptop + 2),
            SIGN,
        )
    for _ in range(rng.randint(1, 4)):  # cars on the road
        cy = int(rng.uniform(ground + 4, h))
        scale = 0.4 + 0.6 * (cy - ground) / max(h - ground, 1)
        cw, ch = int(0.2 * w * scale), int(0.18 * h * scale)
        cx = int(
            centre + rng.uniform(-1, 1) * (half[min(cy, h - 1), 0] - cw / 2)
        )
        body = (np.abs(xx - cx) < cw / 2) & (yy < cy) & (yy >= cy - ch)
        roof = (
            (np.abs(xx - cx) < cw / 3) & (yy < cy - ch) & (yy >= cy - 1.5 * ch)
        )
        paint(body | roof, CAR)
    for _ in range(rng.randint(0, 5)):  # pedestrians on the sidewalks
        py = int(rng.uniform(ground + 2, h))
        scale = 0.5 + 0.5 * (py - ground) / max(h - ground, 1)
        ph, pw = int(0.22 * h * scale), max(int(0.02 * w * scale), 2)
        px = int(
            rng.choice(
                [
                    rng.uniform(0, centre - half[py - 1, 0]),
                    rng.uniform(centre + half[py - 1, 0], w),
                ]
            )
        )
        mask = np.zeros((h, w), np.uint8)
        cv2.ellipse(mask, (px, py - ph // 2), (pw, ph // 2), 0, 0, 360, 1, -1)
        cv2.circle(mask, (px, py - ph - pw), pw, 1, -1)
        paint(mask.astype(bool), PERSON)
    return _to_uint8(img), label


def make_synthetic_cityscapes(
    out_dir,
    num_train=200,
    num_val=50,
    img_size=(128, 256),
    seed=0,
    skip_if_ready=False,
):
    """Write the synthetic Cityscapes-layout segmentation set.

    Layout (as Cityscapes after ``tools/dataset_converters/cityscapes.py``)::

        out_dir/leftImg8bit/{train,val}/<city>/
            <city>_000000_000019_leftImg8bit.png
        out_dir/gtFine/{train,val}/<city>/
            <city>_000000_000019_gtFine_labelTrainIds.png

    Labels are Cityscapes train ids (``SEG_TRAIN_IDS`` occur; the other ids of
    the 19 classes do not), so mmseg's ``CityscapesDataset`` reads the set
    unchanged.

    Args:
        out_dir (str): Root directory (created).
        num_train (int): Number of training scenes.
        num_val (int): Number of validation scenes.
        img_size (tuple[int, int]): (H, W) of every scene.
        seed (int): Seed of the whole set.
        skip_if_ready (bool): Write nothing if ``out_dir`` already holds a
            complete set made with the same arguments.

    Returns:
        dict: ``{'train': n, 'val': n}`` scenes per split.

    Example:
        >>> make_synthetic_cityscapes('data/synthetic_cityscapes', 4, 2)
        {'train': 4, 'val': 2}
    """
    params = dict(
        kind='cityscapes',
        num_train=num_train,
        num_val=num_val,
        img_size=list(img_size),
        seed=seed,
    )
    if skip_if_ready and synthetic_set_ready(out_dir, **params):
        return dict(train=num_train, val=num_val)
    _start_set(out_dir, ('leftImg8bit', 'gtFine'))
    h, w = img_size
    for split, num in (('train', num_train), ('val', num_val)):
        cities = SEG_CITIES[split]
        for idx in range(num):
            city = cities[idx % len(cities)]
            stem = f'{city}_{idx // len(cities):06d}_000019'
            img, label = _draw_street_scene(_rng(seed, split, idx), h, w)
            for sub, suffix, data in (
                ('leftImg8bit', '_leftImg8bit.png', img),
                ('gtFine', '_gtFine_labelTrainIds.png', label),
            ):
                d = osp.join(out_dir, sub, split, city)
                os.makedirs(d, exist_ok=True)
                cv2.imwrite(osp.join(d, stem + suffix), data)
    _write_stamp(out_dir, **params)
    return dict(train=num_train, val=num_val)
