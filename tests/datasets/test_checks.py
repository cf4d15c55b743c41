"""A config whose data is missing stops with one clear line."""
import os
import subprocess
import sys

import pytest
from mmengine.config import Config

from mmevo.datasets import (MissingDataError, check_data_exists,
                            check_pretrained_exists, exit_if_data_missing)

REPO = os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__))))


def _coco_cfg(root, **dataset):
    ds = dict(type='CocoDataset', data_root=root,
              ann_file='annotations/instances_train.json',
              data_prefix=dict(img='train/'))
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
        _coco_cfg(coco_root), ['train_dataloader', 'val_dataloader'])


@pytest.mark.parametrize('missing, what', [
    ('root', 'data_root'),
    ('annotations/instances_train.json', 'ann_file'),
    ('train/', 'data_prefix.img'),
])
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
    inner = dict(type='CityscapesDataset', data_root=str(tmp_path / 'cs'),
                 data_prefix=dict(img_path='leftImg8bit/train'))
    cfg = Config(dict(val_dataloader=dict(dataset=dict(
        type='ConcatDataset', datasets=[
            _coco_cfg(coco_root).train_dataloader.dataset,
            dict(type='RepeatDataset', times=2, dataset=inner)
        ]))))
    with pytest.raises(MissingDataError, match=(
            r"val_dataloader: data_root '.*/cs' does not exist; download and "
            r'convert Cityscapes .* --cfg-options '
            r'val_dataloader\.dataset\.datasets\.1\.dataset\.data_root=PATH')):
        check_data_exists(cfg, ['val_dataloader'])
    cfg.val_dataloader.dataset.datasets[1].dataset.data_root = 's3://bucket/cs'
    check_data_exists(cfg, ['val_dataloader'])


def test_synthetic_sets_point_to_the_generator(tmp_path):
    cfg = _coco_cfg(str(tmp_path / 'synthetic_coco/'))
    with pytest.raises(MissingDataError,
                       match=r'make_synthetic_data.py` \(or `make demo`\)'):
        check_data_exists(cfg)
    cfg.train_dataloader.dataset.type = 'CityscapesDataset'
    with pytest.raises(MissingDataError, match='or `make demo-seg`'):
        check_data_exists(cfg)


@pytest.mark.parametrize('rank', ['0', '1'])
def test_exit_prints_one_line_on_rank_zero(tmp_path, capsys, monkeypatch,
                                           rank):
    monkeypatch.setenv('RANK', rank)
    with pytest.raises(SystemExit) as info:
        exit_if_data_missing(_coco_cfg(str(tmp_path / 'none/')),
                             ['train_dataloader'])
    assert info.value.code == 2
    err = capsys.readouterr().err
    assert err.count('\n') == (1 if rank == '0' else 0)
    if rank == '0':
        assert err.startswith("error: train_dataloader: data_root '")


@pytest.mark.parametrize('tool', ['train', 'test'])
def test_tools_stop_without_a_trace(tool, tmp_path):
    config = os.path.join(
        REPO, 'configs', 'demo',
        'retinanet_rednet26-tiny_fpn_1xb8-20e_synthetic-coco.py')
    loader = f'{tool}_dataloader'
    args = [sys.executable, os.path.join(REPO, 'tools', f'{tool}.py'), config]
    if tool == 'test':  # a checkpoint is there, the data is not
        (tmp_path / 'model.pth').write_bytes(b'')
        args.append(str(tmp_path / 'model.pth'))
    # run from an empty directory: the relative data root is missing there
    out = subprocess.run(
        args, cwd=tmp_path, capture_output=True, text=True, timeout=300,
        env=dict({k: v for k, v in os.environ.items()
                  if k not in ('RANK', 'SLURM_PROCID')}, PYTHONPATH=REPO))
    assert out.returncode == 2
    assert 'Traceback' not in out.stderr
    assert out.stderr.strip() == (
        f"error: {loader}: data_root 'data/synthetic_coco/' does not exist; "
        'generate it with `python tools/misc/make_synthetic_data.py` (or '
        '`make demo`), or point the config at your copy with --cfg-options '
        f'{loader}.dataset.data_root=PATH')
    assert not (tmp_path / 'work_dirs').exists()


def _pretrained_cfg(checkpoint, as_list=False):
    init = dict(type='Pretrained', checkpoint=checkpoint, prefix='backbone.')
    return Config(dict(model=dict(
        type='FasterRCNN',
        backbone=dict(type='RedNet', init_cfg=[init] if as_list else init),
        neck=dict(type='FPN', init_cfg=dict(type='Xavier')))))


@pytest.mark.parametrize('as_list', [False, True])
def test_missing_pretrained_checkpoint_is_named(tmp_path, as_list):
    path = str(tmp_path / 'rednet50.pth')
    with pytest.raises(MissingDataError) as info:
        check_pretrained_exists(_pretrained_cfg(path, as_list))
    key = 'model.backbone.init_cfg' + ('[0]' if as_list else '')
    assert str(info.value).startswith(f"{key}.checkpoint '{path}' does not "
                                      'exist;')
    assert f'--cfg-options {key}.checkpoint=PATH' in str(info.value)
    (tmp_path / 'rednet50.pth').write_bytes(b'')
    check_pretrained_exists(_pretrained_cfg(path, as_list))  # present: fine
    # remote checkpoints are mmengine's business
    check_pretrained_exists(_pretrained_cfg('torchvision://resnet50'))


def test_train_stops_on_missing_pretrained_checkpoint(tmp_path):
    """COCO is there (as far as paths go), the ImageNet checkpoint is not."""
    root = tmp_path / 'coco'
    for d in ('annotations', 'train2017', 'val2017'):
        (root / d).mkdir(parents=True)
    for f in ('instances_train2017.json', 'instances_val2017.json'):
        (root / 'annotations' / f).write_text('{}')
    config = os.path.join(REPO, 'configs', 'rednet50_fpn_coco.py')
    out = subprocess.run(
        [sys.executable, os.path.join(REPO, 'tools', 'train.py'), config,
         '--cfg-options', f'train_dataloader.dataset.data_root={root}/',
         f'val_dataloader.dataset.data_root={root}/'],
        cwd=tmp_path, capture_output=True, text=True, timeout=300,
        env=dict({k: v for k, v in os.environ.items()
                  if k not in ('RANK', 'SLURM_PROCID')}, PYTHONPATH=REPO))
    assert out.returncode == 2, out.stderr[-2000:]
    assert 'Traceback' not in out.stderr
    assert out.stderr.strip().startswith(
        "error: model.backbone.init_cfg.checkpoint "
        "'checkpoints/rednet50_imagenet.pth' does not exist;")
