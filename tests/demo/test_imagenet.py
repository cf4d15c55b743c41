"""The synthetic classification set, and ImageNet through mmpretrain.

The set is deterministic and in ImageNet's folder layout; mmpretrain's
``ImageNet`` dataset (as the ImageNet configs build it, ``split='train'``)
reads it, and reads the same images from the list layout (``meta/*.txt``,
flat validation folder) into the same samples. The missing-data check names
ImageNet and the synthetic set as it names COCO and Cityscapes.
"""

import filecmp
import glob
import os
import os.path as osp
import shutil

import cv2
import numpy as np
import pytest
from mmengine.config import Config

from mmevo.datasets import MissingDataError, check_data_exists
from mmevo.demo import CLS_CLASSES, make_synthetic_imagenet
from mmevo.demo.imagenet import draw_classification_image

ROOT = osp.dirname(osp.dirname(osp.dirname(osp.abspath(__file__))))
DEMO = osp.join(
    ROOT,
    'configs',
    'demo',
    'rednet26-tiny_1xb32-warmup-coslr-30e_synthetic-imagenet-64px.py',
)


def _tree(root):
    return sorted(
        osp.relpath(p, root)
        for p in glob.glob(osp.join(root, '**', '*'), recursive=True)
        if osp.isfile(p)
    )


@pytest.fixture(scope='module')
def imagenet(tmp_path_factory):
    root = str(tmp_path_factory.mktemp('imagenet'))
    make_synthetic_imagenet(root, num_train=23, num_val=10)
    return root


def test_layout_sizes_and_balance(imagenet):
    for split, num in (('train', 23), ('val', 10)):
        assert sorted(os.listdir(osp.join(imagenet, split))) == list(
            CLS_CLASSES
        )
        files = glob.glob(osp.join(imagenet, split, '*', '*.png'))
        assert len(files) == num
        for i in range(num):
            path = osp.join(
                imagenet, split, CLS_CLASSES[i % 10], f'{i:06d}.png'
            )
            img = cv2.imread(path)
            assert img is not None and img.shape[2] == 3
            assert 64 <= img.shape[0] <= 96 and 64 <= img.shape[1] <= 96
    counts = [
        len(os.listdir(osp.join(imagenet, 'train', c))) for c in CLS_CLASSES
    ]
    assert counts == [3, 3, 3] + [2] * 7


def test_is_deterministic(imagenet, tmp_path):
    again, other = str(tmp_path / 'again'), str(tmp_path / 'other')
    make_synthetic_imagenet(again, num_train=23, num_val=10)
    make_synthetic_imagenet(other, num_train=23, num_val=10, seed=1)
    files = _tree(imagenet)
    assert files == _tree(again)
    _, mismatch, errors = filecmp.cmpfiles(
        imagenet, again, files, shallow=False
    )
    assert not mismatch and not errors
    assert not filecmp.cmp(
        osp.join(imagenet, 'train', CLS_CLASSES[0], '000000.png'),
        osp.join(other, 'train', CLS_CLASSES[0], '000000.png'),
        shallow=False,
    )
    # skip_if_ready keeps a complete set; other arguments rewrite it
    stamp = osp.getmtime(osp.join(again, 'val', CLS_CLASSES[3], '000003.png'))
    make_synthetic_imagenet(
        again, num_train=23, num_val=10, skip_if_ready=True
    )
    assert (
        osp.getmtime(osp.join(again, 'val', CLS_CLASSES[3], '000003.png'))
        == stamp
    )
    make_synthetic_imagenet(again, num_train=5, num_val=2, skip_if_ready=True)
    assert len(glob.glob(osp.join(again, 'train', '*', '*.png'))) == 5


def test_classes_differ_by_shape_not_by_colour():
    """Shape classes: a foreground region covering 15-45% of the image;
    textures: two colours everywhere (no single background). Colours are
    random per image, so the mean colour does not tell the class."""
    means = {}
    for cls_id, name in enumerate(CLS_CLASSES):
        imgs = [
            draw_classification_image(np.random.RandomState(s), cls_id)
            for s in range(8)
        ]
        means[name] = np.stack([img.reshape(-1, 3).mean(0) for img in imgs])
        # the colour varies more within a class than the class means do
        assert means[name].std(0).mean() > 15
    spread = np.stack([m.mean(0) for m in means.values()]).std(0).mean()
    within = np.mean([m.std(0).mean() for m in means.values()])
    assert spread < within
    with pytest.raises(ValueError, match='cls_id must be in'):
        draw_classification_image(np.random.RandomState(0), 10)


def test_bad_sizes_are_named(tmp_path):
    with pytest.raises(ValueError, match='num_train must be an int >= 0'):
        make_synthetic_imagenet(str(tmp_path / 'x'), num_train=-1)
    with pytest.raises(ValueError, match='num_val must be an int >= 0'):
        make_synthetic_imagenet(str(tmp_path / 'x'), num_val=2.5)


def _imagenet(root, split, **kwargs):
    from mmpretrain.datasets import ImageNet

    return ImageNet(
        data_root=root,
        split=split,
        metainfo=dict(classes=CLS_CLASSES),
        pipeline=[],
        **kwargs,
    )


def _samples(dataset, root):
    """(image bytes, label) of every sample, sorted."""
    out = []
    for i in range(len(dataset)):
        info = dataset.get_data_info(i)
        with open(info['img_path'], 'rb') as f:
            out.append((f.read(), info['gt_label']))
    return sorted(out)


def _list_layout(folder_root, root):
    """The same images in mmpretrain's list layout: meta/{train,val}.txt,
    train/ in class folders, val/ flat (as the official validation
    archive)."""
    os.makedirs(osp.join(root, 'meta'))
    for split in ('train', 'val'):
        lines = []
        for label, name in enumerate(CLS_CLASSES):
            for file in sorted(os.listdir(osp.join(folder_root, split, name))):
                src = osp.join(folder_root, split, name, file)
                if split == 'train':
                    rel = f'{name}/{file}'
                else:
                    rel = f'ILSVRC2012_val_{name}_{file}'
                os.makedirs(
                    osp.dirname(osp.join(root, split, rel)), exist_ok=True
                )
                shutil.copy(src, osp.join(root, split, rel))
                lines.append(f'{rel} {label}\n')
        with open(osp.join(root, 'meta', f'{split}.txt'), 'w') as f:
            f.writelines(lines)


@pytest.mark.parametrize('split', ['train', 'val'])
def test_imagenet_reads_both_layouts_alike(imagenet, tmp_path, split):
    folder = _imagenet(imagenet, split)
    assert folder.ann_file == ''  # scanned the class folders
    expected = sorted(
        (open(p, 'rb').read(), CLS_CLASSES.index(osp.basename(osp.dirname(p))))
        for p in glob.glob(osp.join(imagenet, split, '*', '*.png'))
    )
    assert _samples(folder, imagenet) == expected
    listed_root = str(tmp_path / 'listed')
    _list_layout(imagenet, listed_root)
    listed = _imagenet(listed_root, split)
    assert listed.ann_file.endswith(osp.join('meta', f'{split}.txt'))
    assert _samples(listed, listed_root) == expected
    assert listed.metainfo['classes'] == folder.metainfo['classes']


def test_folder_layout_labels_follow_sorted_folders(imagenet):
    dataset = _imagenet(imagenet, 'train')
    for i in range(len(dataset)):
        info = dataset.get_data_info(i)
        name = osp.basename(osp.dirname(info['img_path']))
        assert CLS_CLASSES[info['gt_label']] == name


def _imagenet_cfg(root, **dataset):
    return Config(
        dict(
            train_dataloader=dict(
                dataset=dict(
                    type='ImageNet', data_root=root, split='train', **dataset
                )
            ),
            val_dataloader=dict(
                dataset=dict(type='ImageNet', data_root=root, split='val')
            ),
        )
    )


def test_missing_imagenet_is_named(imagenet, tmp_path):
    nowhere = str(tmp_path / 'imagenet')
    with pytest.raises(
        MissingDataError,
        match=r"train_dataloader: data_root '.*imagenet' does not exist; "
        r'download ImageNet \(ILSVRC 2012\) .* docs/datasets.md '
        r'\(ImageNet\), .*train_dataloader\.dataset\.data_root=PATH',
    ) as info:
        check_data_exists(_imagenet_cfg(nowhere))
    assert info.value.synthetic is None
    # a root without the split's folder
    os.makedirs(osp.join(nowhere, 'train'))
    check_data_exists(_imagenet_cfg(nowhere))
    with pytest.raises(
        MissingDataError,
        match=r"val_dataloader: split 'val' folder '.*imagenet/val' does "
        r'not exist',
    ):
        check_data_exists(
            _imagenet_cfg(nowhere), ['train_dataloader', 'val_dataloader']
        )
    # an explicit list file and image folder (mmpretrain's older style)
    cfg = _imagenet_cfg(
        imagenet, ann_file='meta/train.txt', data_prefix='train'
    )
    with pytest.raises(MissingDataError, match=r"ann_file '.*meta/train.txt'"):
        check_data_exists(cfg)
    check_data_exists(
        _imagenet_cfg(imagenet), ['train_dataloader', 'val_dataloader']
    )


def test_missing_synthetic_set_points_to_the_generator(tmp_path):
    cfg = Config.fromfile(DEMO)
    cfg.train_dataloader.dataset.data_root = str(tmp_path / 'synthetic_in')
    with pytest.raises(
        MissingDataError, match=r'make_synthetic_data.py cls`, or point'
    ) as info:
        check_data_exists(cfg)
    assert info.value.synthetic == 'cls'


def test_demo_config_names_the_generated_classes():
    cfg = Config.fromfile(DEMO)
    for loader in ('train_dataloader', 'val_dataloader', 'test_dataloader'):
        dataset = cfg[loader].dataset
        assert tuple(dataset.metainfo.classes) == CLS_CLASSES
        assert dataset.data_root == 'data/synthetic_imagenet'
    assert cfg.model.head.num_classes == len(CLS_CLASSES)
    assert cfg.data_preprocessor.num_classes == len(CLS_CLASSES)
