"""A config whose data is missing raises MissingDataError with one clear
line (what the tools do with it: tests/tools/test_cli.py)."""

import os

import pytest
from mmengine.config import Config

from mmevo.datasets import (
    MissingDataError,
    check_data_exists,
    check_pretrained_exists,
)


def _coco_cfg(root, **dataset):
    ds = dict(
        type='CocoDataset',
        data_root=root,
        ann_file='annotations/instances_train.json',
        data_prefix=dict(img='train/'),
    )
    ds.update(dataset)
    return Config(dict(train_dataloader=dict(dataset=ds)))


@pytest.fixture
def coco_root(tmp_path):
    (tmp_path / 'annotations').mkdir()
    (tmp_path / 'annotations' / 'instances_train.json').write_text('{}')
    (tmp_path / 'train').mkdir()
    return str(tmp_path) + '/'


def test_present_data_passes(coco_root):
    check_data_exists(_coco_cfg(coco_root))
    # dataloaders that are absent or None are not checked
    check_data_exists(
        _coco_cfg(coco_root), ['train_dataloader', 'val_dataloader']
    )


@pytest.mark.parametrize(
    'missing, what',
    [
        ('root', 'data_root'),
        ('annotations/instances_train.json', 'ann_file'),
        ('train/', 'data_prefix.img'),
    ],
)
def test_first_missing_path_is_named(coco_root, missing, what):
    if missing == 'root':
        root = coco_root + 'nowhere/'
        expected = root
    else:
        root = coco_root
        expected = os.path.join(coco_root, missing)
        target = os.path.join(coco_root, missing)
        if os.path.isfile(target):
            os.remove(target)
        else:
            os.rmdir(target)
    with pytest.raises(MissingDataError) as info:
        check_data_exists(_coco_cfg(root))
    msg = str(info.value)
    assert '\n' not in msg
    assert f"train_dataloader: {what} '{expected}' does not exist" in msg
    assert 'docs/datasets.md (COCO)' in msg


def test_wrapped_datasets_and_remote_paths(coco_root, tmp_path):
    inner = dict(
        type='CityscapesDataset',
        data_root=str(tmp_path / 'cs'),
        data_prefix=dict(img_path='leftImg8bit/train'),
    )
    cfg = Config(
        dict(
            val_dataloader=dict(
                dataset=dict(
                    type='ConcatDataset',
                    datasets=[
                        _coco_cfg(coco_root).train_dataloader.dataset,
                        dict(type='RepeatDataset', times=2, dataset=inner),
                    ],
                )
            )
        )
    )
    expected = (
        r"val_dataloader: data_root '.*/cs' does not exist; download "
        r'and convert Cityscapes .* --cfg-options '
        r'val_dataloader\.dataset\.datasets\.1\.dataset\.'
        r'data_root=PATH'
    )
    with pytest.raises(MissingDataError, match=expected):
        check_data_exists(cfg, ['val_dataloader'])
    cfg.val_dataloader.dataset.datasets[1].dataset.data_root = 's3://bucket/cs'
    check_data_exists(cfg, ['val_dataloader'])


def test_synthetic_sets_point_to_the_generator(tmp_path):
    cfg = _coco_cfg(str(tmp_path / 'synthetic_coco/'))
    with pytest.raises(
        MissingDataError, match=r'make_synthetic_data.py det`, or point'
    ) as info:
        check_data_exists(cfg)
    assert info.value.synthetic == 'det'
    cfg.train_dataloader.dataset.type = 'CityscapesDataset'
    with pytest.raises(
        MissingDataError, match=r'make_synthetic_data.py seg`'
    ) as info:
        check_data_exists(cfg)
    assert info.value.synthetic == 'seg'
    # a downloaded set is no demo set
    with pytest.raises(MissingDataError) as info:
        check_data_exists(_coco_cfg(str(tmp_path.parent / 'no_coco/')))
    assert info.value.synthetic is None


def _pretrained_cfg(checkpoint, as_list=False):
    init = dict(type='Pretrained', checkpoint=checkpoint, prefix='backbone.')
    return Config(
        dict(
            model=dict(
                type='FasterRCNN',
                backbone=dict(
                    type='RedNet', init_cfg=[init] if as_list else init
                ),
                neck=dict(type='FPN', init_cfg=dict(type='Xavier')),
            )
        )
    )


@pytest.mark.parametrize('as_list', [False, True])
def test_missing_pretrained_checkpoint_is_named(tmp_path, as_list):
    path = str(tmp_path / 'rednet50.pth')
    with pytest.raises(MissingDataError) as info:
        check_pretrained_exists(_pretrained_cfg(path, as_list))
    key = 'model.backbone.init_cfg' + ('[0]' if as_list else '')
    assert str(info.value).startswith(
        f"{key}.checkpoint '{path}' does not exist;"
    )
    assert f'--cfg-options {key}.checkpoint=PATH' in str(info.value)
    (tmp_path / 'rednet50.pth').write_bytes(b'')
    check_pretrained_exists(_pretrained_cfg(path, as_list))  # present: fine
    # remote checkpoints are mmengine's business
    check_pretrained_exists(_pretrained_cfg('torchvision://resnet50'))
