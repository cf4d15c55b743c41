"""tools/train.py with ``max_keep_ckpts=1`` (the demo configs' setting): a
full disk (ENOSPC) or kill -9 during the save of epoch 2 leaves epoch 1's
checkpoint and ``last_checkpoint`` naming it, and ``--resume`` then
continues from epoch 1 to the same weights as a run that was not stopped;
the 0-byte temporary file the killed save left is removed."""

import errno
import glob
import os
import os.path as osp
import signal
import subprocess
import sys

import pytest
import torch

from mmevo.apis import checkpoint_error

from tool_utils import DEMO_DET, REPO, load_tool

pytestmark = pytest.mark.slow

# The demo detector on tiny_coco (RandomFlip; no worker: the crash happens
# in the main process), two iterations per epoch, one checkpoint kept.
CONFIG = """
_base_ = '{base}'
data_root = '{root}/'
train_dataloader = dict(
    batch_size=4, num_workers=0, persistent_workers=False,
    dataset=dict(data_root=data_root))
val_dataloader = None
val_cfg = None
val_evaluator = None
test_dataloader = None
test_cfg = None
test_evaluator = None
param_scheduler = [
    dict(type='MultiStepLR', by_epoch=True, begin=0, end=2, milestones=[1],
         gamma=0.5)
]
default_hooks = dict(
    logger=dict(interval=1), checkpoint=dict(interval=1, max_keep_ckpts=1))
"""

# imported by the killed run's config: SIGKILL when the save of epoch 2
# opens its temporary file, before it writes a byte
KILL_AT_SAVE = """
import builtins, os, signal

_open = builtins.open


def _killing_open(file, mode='r', *args, **kwargs):
    # the checkpoint's temporary file opened for writing: killed right there
    if (
        isinstance(file, (str, os.PathLike))
        and 'w' in mode
        and '.epoch_2.pth.' in os.fspath(file)
    ):
        os.kill(os.getpid(), signal.SIGKILL)
    return _open(file, mode, *args, **kwargs)


builtins.open = _killing_open
"""


def _argv(cfg, work_dir, name, *extra):
    return [
        cfg,
        '--work-dir',
        work_dir,
        '--cfg-options',
        'train_cfg.max_epochs=2',
        f'experiment_name={name}',
        f'visualizer.name={name}',
        *extra,
    ]


def _weights(work_dir):
    path = osp.join(work_dir, 'epoch_2.pth')
    return torch.load(path)['state_dict']  # the tools installed the globals


@pytest.fixture(scope='module')
def straight(tiny_coco, tmp_path_factory):
    """The config, and the weights of two epochs without a stop."""
    tmp = tmp_path_factory.mktemp('crash')
    cfg = str(tmp / 'cfg.py')
    with open(cfg, 'w') as f:
        f.write(CONFIG.format(base=DEMO_DET, root=tiny_coco))
    load_tool('train').main(_argv(cfg, str(tmp / 'straight'), 'crash_a'))
    assert sorted(os.listdir(tmp / 'straight'))[-2:] == [
        'epoch_2.pth',
        'last_checkpoint',
    ]
    return cfg, _weights(str(tmp / 'straight'))


def _check_kept(work_dir):
    kept = osp.join(work_dir, 'epoch_1.pth')
    with open(osp.join(work_dir, 'last_checkpoint')) as f:
        assert f.read() == kept
    assert checkpoint_error(kept) is None
    assert not osp.exists(osp.join(work_dir, 'epoch_2.pth'))


def _resume_and_compare(cfg, work_dir, expected, name):
    load_tool('train').main(_argv(cfg, work_dir, name, '--resume'))
    logs = ''.join(
        open(p).read() for p in glob.glob(osp.join(work_dir, '*', '*.log'))
    )
    assert 'resumed epoch: 1, iter: 2' in logs
    got = _weights(work_dir)
    assert got.keys() == expected.keys()
    differ = [k for k in got if not torch.equal(got[k], expected[k])]
    assert not differ, f'{len(differ)} of {len(got)} tensors differ'
    assert not osp.exists(osp.join(work_dir, 'epoch_1.pth'))
    assert not [n for n in os.listdir(work_dir) if n.endswith('.tmp')]


def test_full_disk_during_a_save(straight, tmp_path, monkeypatch):
    cfg, expected = straight
    work_dir = str(tmp_path / 'full')
    save = torch.save

    def full_at_epoch_2(obj, *args, **kwargs):
        if isinstance(obj, dict) and obj.get('meta', {}).get('epoch') == 2:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return save(obj, *args, **kwargs)

    with monkeypatch.context() as patch:
        patch.setattr(torch, 'save', full_at_epoch_2)
        with pytest.raises(OSError) as info:
            load_tool('train').main(_argv(cfg, work_dir, 'crash_b'))
    assert info.value.errno == errno.ENOSPC
    _check_kept(work_dir)
    _resume_and_compare(cfg, work_dir, expected, 'crash_c')


def test_kill_during_a_save(straight, tmp_path):
    cfg, expected = straight
    work_dir = str(tmp_path / 'killed')
    (tmp_path / 'kill_at_save.py').write_text(KILL_AT_SAVE)
    killed_cfg = tmp_path / 'killed_cfg.py'
    killed_cfg.write_text(
        f"_base_ = '{cfg}'\ncustom_imports = dict(imports=['kill_at_save'])\n"
    )
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ('RANK', 'SLURM_PROCID')
    }
    out = subprocess.run(
        [
            sys.executable,
            osp.join(REPO, 'tools', 'train.py'),
            *_argv(str(killed_cfg), work_dir, 'crash_d'),
        ],
        env=dict(env, PYTHONPATH=f'{tmp_path}{os.pathsep}{REPO}'),
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert out.returncode == -signal.SIGKILL, out.stderr[-3000:]
    # what the kill left: a 0-byte temporary file beside epoch 1
    tmp = [n for n in os.listdir(work_dir) if n.endswith('.tmp')]
    assert len(tmp) == 1 and tmp[0].startswith('.epoch_2.pth.')
    assert os.path.getsize(osp.join(work_dir, tmp[0])) == 0
    _check_kept(work_dir)
    _resume_and_compare(cfg, work_dir, expected, 'crash_e')
