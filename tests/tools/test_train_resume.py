"""--resume: 3 epochs straight and 2 epochs + a resumed third give
bit-identical weights and optimizer state, with the demo's random
augmentation (RandomFlip) in a persistent dataloader worker; the automatic
resume skips a truncated latest checkpoint; a checkpoint that cannot be
loaded, or whose model or optimizer state does not fit, is refused in one
line before training. (Crashes during a save: test_train_crash.py.)"""

import glob
import os.path as osp

import pytest
import torch
from mmengine.config import Config
from mmengine.registry import MODELS, init_default_scope

from tool_utils import DEMO_DET, load_tool

pytestmark = pytest.mark.slow

# The demo detector and its training pipeline (RandomFlip) on 8 images of
# 64 px, one persistent worker (its streams run on from epoch to epoch, the
# hard case), no validation. Two iterations per epoch.
CONFIG = """
_base_ = '{base}'
data_root = '{root}/'
train_dataloader = dict(
    batch_size=4, num_workers=1, persistent_workers=True,
    dataset=dict(data_root=data_root))
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
    argv = [
        cfg_file,
        '--work-dir',
        work_dir,
        '--cfg-options',
        f'train_cfg.max_epochs={epochs}',
        f'experiment_name={name}',
        f'visualizer.name={name}',
    ]
    if resume:
        argv += ['--resume'] + ([] if resume == 'auto' else [resume])
    train.main(argv)
    return torch.load(osp.join(work_dir, f'epoch_{epochs}.pth'))


def _write_cfg(tmp_path, root):
    cfg_file = str(tmp_path / 'cfg.py')
    with open(cfg_file, 'w') as f:
        f.write(CONFIG.format(base=DEMO_DET, root=root))
    return cfg_file


def test_resume_is_bit_exact(tiny_coco, tmp_path):
    cfg_file = _write_cfg(tmp_path, tiny_coco)
    train = load_tool('train')
    tag = 'resume'
    straight = _train(train, cfg_file, str(tmp_path / 'a'), 3, f'{tag}_a')
    split = str(tmp_path / 'b')
    second = _train(train, cfg_file, split, 2, f'{tag}_b')
    # a crash while epoch 3 was written by a writer that is not atomic:
    # the latest checkpoint is truncated, and last_checkpoint points to it
    with open(osp.join(split, 'epoch_2.pth'), 'rb') as f:
        head = f.read(1000)
    with open(osp.join(split, 'epoch_3.pth'), 'wb') as f:
        f.write(head)
    with open(osp.join(split, 'last_checkpoint'), 'w') as f:
        f.write(osp.join(split, 'epoch_3.pth'))
    with pytest.warns(UserWarning, match='cannot resume from .*epoch_3.pth'):
        resumed = _train(train, cfg_file, split, 3, f'{tag}_c', resume='auto')

    assert resumed['meta']['epoch'] == 3 and resumed['meta']['iter'] == 6
    logs = ''.join(
        open(p).read() for p in glob.glob(osp.join(split, '*', '*.log'))
    )
    assert 'resumed epoch: 2, iter: 4' in logs
    a, b = straight['state_dict'], resumed['state_dict']
    assert a.keys() == b.keys()
    differ = [k for k in a if not torch.equal(a[k], b[k])]
    assert not differ, f'{len(differ)} of {len(a)} tensors differ'
    # the third epoch did change the weights (the check above is not vacuous)
    assert any(not torch.equal(a[k], second['state_dict'][k]) for k in a)
    # the optimizer state was resumed too
    sa, sb = straight['optimizer']['state'], resumed['optimizer']['state']
    assert sa.keys() == sb.keys()
    for i in sa:
        assert all(torch.equal(sa[i][k], sb[i][k]) for k in sa[i])


def test_resume_from_a_corrupt_file_is_one_line(tiny_coco, tmp_path, capsys):
    cfg_file = _write_cfg(tmp_path, tiny_coco)
    ckpt = tmp_path / 'epoch_1.pth'
    torch.save(dict(state_dict={}), ckpt)
    with open(ckpt, 'r+b') as f:
        f.truncate(ckpt.stat().st_size // 2)
    with pytest.raises(SystemExit) as info:
        load_tool('train').main([cfg_file, '--resume', str(ckpt)])
    assert info.value.code == 1
    err = capsys.readouterr().err
    assert err.count('\n') == 1
    assert err.startswith(
        f"error: --resume checkpoint '{ckpt}' cannot be "
        'loaded: truncated or not a torch checkpoint'
    )


def test_resume_refuses_a_model_or_optimizer_that_does_not_fit(
    tiny_coco, tmp_path, capsys
):
    cfg_file = _write_cfg(tmp_path, tiny_coco)
    init_default_scope('mmdet')
    model = MODELS.build(Config.fromfile(cfg_file).model)
    state = model.state_dict()
    state['neck.fpn_convs.0.conv.weight'] = torch.zeros(64, 64, 1, 1)
    # the config trains with AdamW
    sgd = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    ckpt = str(tmp_path / 'other.pth')
    torch.save(
        dict(
            meta=dict(epoch=1, iter=2),
            state_dict=state,
            optimizer=sgd.state_dict(),
        ),
        ckpt,
    )
    work_dir = tmp_path / 'w'
    with pytest.raises(SystemExit) as info:
        load_tool('train').main(
            [
                cfg_file,
                '--work-dir',
                str(work_dir),
                '--resume',
                ckpt,
                '--cfg-options',
                'experiment_name=misfit',
                'visualizer.name=misfit',
            ]
        )
    assert info.value.code == 1
    err = capsys.readouterr().err
    assert 'Traceback' not in err and err.count('\n') == 1
    assert err == (
        f"error: --resume checkpoint '{ckpt}' does not fit: model: "
        'mis-shaped keys 1 (neck.fpn_convs.0.conv.weight (checkpoint (64, '
        '64, 1, 1), model (64, 64, 3, 3))); optimizer: param group 0 lacks '
        'betas, eps of AdamW (another optimizer type)\n'
    )
    assert not glob.glob(str(work_dir / '*.pth'))


def test_resume_refuses_a_state_dict_of_floats(tiny_coco, tmp_path, capsys):
    cfg_file = _write_cfg(tmp_path, tiny_coco)
    init_default_scope('mmdet')
    model = MODELS.build(Config.fromfile(cfg_file).model)
    ckpt = str(tmp_path / 'floats.pth')
    torch.save(
        dict(
            meta=dict(epoch=1, iter=2),
            state_dict={k: 0.0 for k in model.state_dict()},
        ),
        ckpt,
    )
    with pytest.raises(SystemExit) as info:
        load_tool('train').main(
            [
                cfg_file,
                '--work-dir',
                str(tmp_path / 'w'),
                '--resume',
                ckpt,
                '--cfg-options',
                'experiment_name=floats',
                'visualizer.name=floats',
            ]
        )
    assert info.value.code == 1
    err = capsys.readouterr().err
    assert err.count('\n') == 1 and err.startswith(
        f"error: --resume checkpoint '{ckpt}' does not fit: model: "
        f'mis-shaped keys {len(model.state_dict())} ('
    )
    assert '(checkpoint float, model (' in err
