"""--resume under torch >= 2.6 ("Weights only load failed" before mmevo's
fix): 3 epochs straight and 2 epochs + a resumed third give bit-identical
weights."""
import glob
import os.path as osp

import torch
from tool_utils import DEMO_DET, load_tool

# The demo detector on 8 images of 64 px, with a deterministic pipeline
# (RandomFlip draws from the global RNG, which a checkpoint does not hold)
# and no validation. Two iterations per epoch.
CONFIG = """
_base_ = '{base}'
data_root = '{root}/'
pipeline = [
    dict(type='LoadImageFromFile'),
    dict(type='LoadAnnotations', with_bbox=True),
    dict(type='Resize', scale=(64, 64), keep_ratio=True),
    dict(type='PackDetInputs'),
]
train_dataloader = dict(
    batch_size=4, num_workers=0, persistent_workers=False,
    dataset=dict(data_root=data_root, pipeline=pipeline))
val_dataloader = None
val_cfg = None
val_evaluator = None
test_dataloader = None
test_cfg = None
test_evaluator = None
# ``end`` fixed: the 2-epoch run is the first part of the same 3-epoch
# schedule (by default ``end`` follows max_epochs)
param_scheduler = [
    dict(type='MultiStepLR', by_epoch=True, begin=0, end=3,
         milestones=[1, 2], gamma=0.5)
]
default_hooks = dict(
    logger=dict(interval=1),
    checkpoint=dict(interval=1, max_keep_ckpts=-1))
"""


def _train(train, cfg_file, work_dir, epochs, name, resume=None):
    argv = [cfg_file, '--work-dir', work_dir, '--cfg-options',
            f'train_cfg.max_epochs={epochs}', f'experiment_name={name}',
            f'visualizer.name={name}']
    if resume:
        argv += ['--resume', resume]
    train.main(argv)
    return torch.load(osp.join(work_dir, f'epoch_{epochs}.pth'))


def test_resume_is_bit_exact(tiny_coco, tmp_path):
    cfg_file = str(tmp_path / 'cfg.py')
    with open(cfg_file, 'w') as f:
        f.write(CONFIG.format(base=DEMO_DET, root=tiny_coco))
    train = load_tool('train')
    straight = _train(train, cfg_file, str(tmp_path / 'a'), 3, 'resume_a')
    split = str(tmp_path / 'b')
    second = _train(train, cfg_file, split, 2, 'resume_b')
    # plain torch.load (weights_only=True by default) of a full checkpoint
    resumed = _train(
        train, cfg_file, split, 3, 'resume_c',
        resume=osp.join(split, 'epoch_2.pth'))

    assert resumed['meta']['epoch'] == 3 and resumed['meta']['iter'] == 6
    logs = ''.join(
        open(p).read() for p in glob.glob(osp.join(split, '*', '*.log')))
    assert 'resumed epoch: 2, iter: 4' in logs
    a, b = straight['state_dict'], resumed['state_dict']
    assert a.keys() == b.keys()
    for key in a:
        assert torch.equal(a[key], b[key]), key
    # the third epoch did change the weights (the check above is not vacuous)
    assert any(not torch.equal(a[k], second['state_dict'][k]) for k in a)
    # the optimizer state was resumed too
    for sa, sb in zip(straight['optimizer']['state'].values(),
                      resumed['optimizer']['state'].values()):
        assert all(torch.equal(sa[k], sb[k]) for k in sa)
