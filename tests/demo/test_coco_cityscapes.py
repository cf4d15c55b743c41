"""The synthetic demo sets: deterministic, exact annotations, and read by
mmdet's CocoDataset / mmseg's CityscapesDataset unchanged."""

import filecmp
import glob
import json
import os
import os.path as osp

import cv2
import numpy as np
import pytest

from mmevo.demo import (
    DET_CLASSES,
    SEG_TRAIN_IDS,
    make_synthetic_cityscapes,
    make_synthetic_coco,
)


def _tree(root):
    return sorted(
        osp.relpath(p, root)
        for p in glob.glob(osp.join(root, '**', '*'), recursive=True)
        if osp.isfile(p)
    )


@pytest.fixture(scope='module')
def coco(tmp_path_factory):
    root = str(tmp_path_factory.mktemp('coco'))
    make_synthetic_coco(root, num_train=12, num_val=4, img_size=96)
    return root


@pytest.fixture(scope='module')
def cityscapes(tmp_path_factory):
    root = str(tmp_path_factory.mktemp('cityscapes'))
    make_synthetic_cityscapes(root, num_train=4, num_val=2, img_size=(64, 128))
    return root


def test_coco_is_deterministic(coco, tmp_path):
    again, other = str(tmp_path / 'again'), str(tmp_path / 'other')
    make_synthetic_coco(again, num_train=12, num_val=4, img_size=96)
    make_synthetic_coco(other, num_train=12, num_val=4, img_size=96, seed=1)
    files = _tree(coco)
    assert files == _tree(again)
    _, mismatch, errors = filecmp.cmpfiles(coco, again, files, shallow=False)
    assert not mismatch and not errors
    # the seed matters: another seed draws other images
    assert not filecmp.cmp(
        osp.join(coco, 'train', '000000.png'),
        osp.join(other, 'train', '000000.png'),
        shallow=False,
    )


def test_coco_annotations_match_the_pixels(coco):
    with open(osp.join(coco, 'annotations', 'instances_train.json')) as f:
        data = json.load(f)
    assert [c['name'] for c in data['categories']] == list(DET_CLASSES)
    assert len(data['images']) == 12
    assert len({a['id'] for a in data['annotations']}) == len(
        data['annotations']
    )
    # fill ratio area / box area fits the shape: pi/4 for a circle,
    # 1 to 1/(cos 15 + sin 15)^2 = 0.67 for a square rotated at most 15
    # degrees, ~1/2 for a triangle
    ratio_range = dict(
        circle=(0.7, 0.86), square=(0.62, 1.0), triangle=(0.3, 0.62)
    )
    by_image = {}
    for ann in data['annotations']:
        x, y, w, h = ann['bbox']
        assert 0 <= x and 0 <= y and x + w <= 96 and y + h <= 96
        assert w >= 8 and h >= 8
        low, high = ratio_range[DET_CLASSES[ann['category_id'] - 1]]
        assert low <= ann['area'] / (w * h) <= high, ann
        by_image.setdefault(ann['image_id'], []).append(ann)
    # every box is tight: the rows/columns just inside the box edge differ
    # from the background just outside it (the shape touches all 4 sides)
    for image in data['images']:
        img = cv2.imread(osp.join(coco, 'train', image['file_name']))
        img = img.astype(np.float64)
        for ann in by_image[image['id']]:
            x, y, w, h = ann['bbox']
            poly = np.array(ann['segmentation'][0]).reshape(-1, 2)
            # the box spans the pixels of the polygon drawn at rounded vertices
            assert np.allclose(poly.min(0), [x, y], atol=0.51)
            assert np.allclose(poly.max(0), [x + w - 1, y + h - 1], atol=0.51)
            inside = img[
                y + h // 4 : y + 3 * h // 4, x + w // 4 : x + 3 * w // 4
            ]
            ring = np.concatenate(
                [
                    img[max(y - 3, 0) : y, x : x + w].reshape(-1, 3),
                    img[y + h : y + h + 3, x : x + w].reshape(-1, 3),
                ]
            )
            if len(ring) and ann['category_id'] != 3:  # triangle centre may
                # be background in the box's middle half
                assert np.abs(inside.mean((0, 1)) - ring.mean(0)).mean() > 20


def test_coco_loads_in_mmdet(coco):
    from mmdet.datasets import CocoDataset

    ds = CocoDataset(
        data_root=coco,
        ann_file='annotations/instances_val.json',
        data_prefix=dict(img='val/'),
        metainfo=dict(classes=DET_CLASSES),
        test_mode=True,
        pipeline=[],
    )
    with open(osp.join(coco, 'annotations', 'instances_val.json')) as f:
        num_anns = len(json.load(f)['annotations'])
    assert len(ds) == 4
    infos = [ds.get_data_info(i) for i in range(len(ds))]
    assert sum(len(i['instances']) for i in infos) == num_anns
    assert all(osp.isfile(i['img_path']) for i in infos)
    assert {
        inst['bbox_label'] for i in infos for inst in i['instances']
    } <= set(range(len(DET_CLASSES)))


def test_cityscapes_layout_loads_in_mmseg(cityscapes):
    from mmseg.datasets import CityscapesDataset

    ds = CityscapesDataset(
        data_root=cityscapes,
        data_prefix=dict(
            img_path='leftImg8bit/train', seg_map_path='gtFine/train'
        ),
        pipeline=[],
    )
    assert len(ds) == 4
    for i in range(len(ds)):
        info = ds.get_data_info(i)
        img = cv2.imread(info['img_path'])
        label = cv2.imread(info['seg_map_path'], cv2.IMREAD_UNCHANGED)
        assert img.shape == (64, 128, 3) and label.shape == (64, 128)
        assert set(np.unique(label)) <= set(SEG_TRAIN_IDS)
        # every scene has sky over road
        assert label[0].tolist().count(10) > 0 and 0 in label[-1]
    assert len(CityscapesDataset.METAINFO['classes']) == 19
    assert max(SEG_TRAIN_IDS) < 19


def test_cityscapes_labels_align_with_pixels(cityscapes):
    """A nearest-class-mean colour classifier fitted on one scene labels
    another scene well: image and label map agree pixel by pixel."""

    def load(i):
        img = sorted(
            glob.glob(
                osp.join(cityscapes, 'leftImg8bit', 'train', '*', '*.png')
            )
        )[i]
        lbl = img.replace('leftImg8bit', 'gtFine', 1).replace(
            '_leftImg8bit.png', '_gtFine_labelTrainIds.png'
        )
        return (
            cv2.imread(img).reshape(-1, 3).astype(np.float64),
            cv2.imread(lbl, cv2.IMREAD_UNCHANGED).ravel(),
        )

    fit_img, fit_lbl = load(0)
    ids = [c for c in (0, 1, 2, 10) if (fit_lbl == c).sum() > 50]
    means = np.stack([fit_img[fit_lbl == c].mean(0) for c in ids])
    img, lbl = load(1)
    keep = np.isin(lbl, ids)
    pred = np.array(ids)[
        np.argmin(((img[keep, None] - means[None]) ** 2).sum(-1), axis=1)
    ]
    assert (pred == lbl[keep]).mean() > 0.8
    # the same classifier on a misaligned (flipped) label map does badly
    flipped = lbl.reshape(64, 128)[::-1].ravel()
    keep_f = np.isin(flipped, ids)
    pred_f = np.array(ids)[
        np.argmin(((img[keep_f, None] - means[None]) ** 2).sum(-1), axis=1)
    ]
    assert (pred_f == flipped[keep_f]).mean() < 0.5


def test_regeneration_replaces_and_refuses_foreign_dirs(tmp_path):
    root = str(tmp_path / 'cs')
    make_synthetic_cityscapes(root, num_train=4, num_val=1, img_size=(32, 64))
    stamp = osp.getmtime(osp.join(root, '.synthetic.json'))
    # same arguments: nothing is rewritten
    make_synthetic_cityscapes(
        root, num_train=4, num_val=1, img_size=(32, 64), skip_if_ready=True
    )
    assert osp.getmtime(osp.join(root, '.synthetic.json')) == stamp
    # a smaller set leaves no stale scene of the larger one behind
    make_synthetic_cityscapes(
        root, num_train=2, num_val=1, img_size=(32, 64), skip_if_ready=True
    )
    assert (
        len(glob.glob(osp.join(root, 'leftImg8bit', 'train', '*', '*.png')))
        == 2
    )
    foreign = tmp_path / 'mine'
    foreign.mkdir()
    (foreign / 'keep.txt').write_text('user data')
    with pytest.raises(FileExistsError, match='not a synthetic set'):
        make_synthetic_coco(str(foreign), num_train=1, num_val=1)
    assert os.listdir(foreign) == ['keep.txt']
