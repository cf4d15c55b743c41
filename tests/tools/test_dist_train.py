"""tools/dist_train.sh CONFIG 2 on a machine without a GPU: two processes
train the demo detector over gloo and end with identical weights."""

import os
import socket
import subprocess
import sys

import pytest
import torch

from mmevo.integrations.mmengine import safe_globals

from tool_utils import DEMO_DET, REPO

pytestmark = pytest.mark.slow

# Each rank saves its own model state after training (mmengine's checkpoint
# hook only writes on rank 0).
DUMP_HOOK = """
import os
import torch
from mmengine.dist import get_rank
from mmengine.hooks import Hook
from mmengine.registry import HOOKS


@HOOKS.register_module()
class DumpRankState(Hook):
    def before_train(self, runner):
        self._save(runner, 'init')

    def after_train(self, runner):
        self._save(runner, 'final')

    def _save(self, runner, tag):
        model = runner.model.module
        state = {k: v.detach().clone() for k, v in model.state_dict().items()}
        torch.save(state, os.path.join(runner.work_dir,
                                       f'{tag}_rank{get_rank()}.pth'))
"""

# 8 images, 2 per rank and step: 2 iterations. SyncBN (as the published
# segmentation configs use) must become BN with a warning on the CPU.
CONFIG = """
_base_ = '{base}'
custom_imports = dict(imports=['dump_rank_state'])
custom_hooks = [dict(type='DumpRankState')]
train_dataloader = dict(
    batch_size=2, num_workers=0, persistent_workers=False,
    dataset=dict(data_root='{root}/'))
train_cfg = dict(max_epochs=1)
val_dataloader = None
val_cfg = None
val_evaluator = None
model = dict(backbone=dict(norm_cfg=dict(type='SyncBN', requires_grad=True)))
"""


def _free_port():
    with socket.socket() as s:
        s.bind(('127.0.0.1', 0))
        return s.getsockname()[1]


# two training processes: under xdist, on the worker of the other tests
# that keep both cores busy (tests/conftest.py)
@pytest.mark.xdist_group('two_cores')
def test_two_process_cpu_training(tiny_coco, tmp_path):
    # paths with spaces: the launch script must pass them through intact
    tmp_path = tmp_path / 'dir with space'
    tmp_path.mkdir()
    (tmp_path / 'dump_rank_state.py').write_text(DUMP_HOOK)
    cfg = tmp_path / 'cfg.py'
    cfg.write_text(CONFIG.format(base=DEMO_DET, root=tiny_coco))
    work_dir = tmp_path / 'work dir'
    env = dict(
        os.environ,
        PYTHONPATH=str(tmp_path),
        PORT=str(_free_port()),
        OMP_NUM_THREADS='1',
        PYTHON=sys.executable,
    )
    out = subprocess.run(
        [
            os.path.join(REPO, 'tools', 'dist_train.sh'),
            str(cfg),
            '2',
            '--work-dir',
            str(work_dir),
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    assert 'SyncBN does not run on the CPU, using BN instead' in out.stderr
    assert (work_dir / 'epoch_1.pth').exists()

    init = [torch.load(work_dir / f'init_rank{r}.pth') for r in (0, 1)]
    final = [torch.load(work_dir / f'final_rank{r}.pth') for r in (0, 1)]
    with torch.serialization.safe_globals(safe_globals.safe_globals()):
        model = torch.load(work_dir / 'epoch_1.pth')['state_dict']
    params = [
        k
        for k in final[0]
        if 'running_' not in k and 'num_batches_tracked' not in k
    ]
    # DDP averaged the gradients: every parameter is bit-identical on both
    # ranks, and equal to the checkpoint rank 0 wrote ...
    for k in params:
        assert torch.equal(final[0][k], final[1][k]), k
        assert torch.equal(final[0][k], model[k]), k
    # ... training did move them ...
    moved = sum(not torch.equal(init[0][k], final[0][k]) for k in params)
    assert moved > 0.9 * len(params)
    # ... and the ranks saw different images: BN running statistics (not
    # synchronised, DDP's broadcast_buffers=False) differ between them.
    assert any(
        not torch.equal(final[0][k], final[1][k])
        for k in final[0]
        if k.endswith('running_mean')
    )
