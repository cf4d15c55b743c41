"""The synthetic Cityscapes-layout segmentation set: street-like scenes in
``leftImg8bit/{train,val}/<city>/*_leftImg8bit.png`` with label maps
``gtFine/{train,val}/<city>/*_gtFine_labelTrainIds.png`` in Cityscapes'
19-class train-id space (a subset of the ids occurs), read by mmseg's
``CityscapesDataset``; drawn as :mod:`.coco` draws (one seeded
``RandomState`` per image)."""

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
