"""The libraries' own tools on mmevo's demo configs.

mmdet's, mmseg's and mmpretrain's ``tools/train.py`` and ``tools/test.py``,
as shipped inside the packages (``<package>/.mim/tools/``), each in a fresh
interpreter that finds mmevo only through the config's ``custom_imports``:
a short training run of each demo, then the same library's ``test.py`` on
the checkpoint it wrote; and mmpretrain's
``tools/visualization/vis_cam.py`` drawing a Grad-CAM heat map of a RedNet
layer from the classification checkpoint.
"""

import importlib.util
import os
import os.path as osp
import re
import subprocess
import sys

import cv2
import numpy as np
import pytest

from mmevo.datasets import CLS_CLASSES, make_synthetic_imagenet

from tool_utils import DEMO_DET, DEMO_SEG, REPO

pytestmark = pytest.mark.slow

DEMO_CLS = osp.join(
    REPO,
    'configs',
    'demo',
    'rednet26-tiny_1xb32-warmup-coslr-30e_synthetic-imagenet-64px.py',
)

# The demo config, shortened, on a tiny set. The libraries' test.py reads
# the runner's checkpoint under torch >= 2.6's weights_only default only
# with mmevo's allowlist, which the config asks for by name.
SHORT = """
_base_ = '{base}'
custom_imports = dict(
    imports=['mmevo.models', 'mmevo.integrations.mmengine.enable_all'],
    allow_failed_imports=False)
data_root = '{root}/'
train_dataloader = dict(
    batch_size={batch}, num_workers=0, persistent_workers=False,
    dataset=dict(data_root=data_root))
val_dataloader = dict(
    batch_size={batch}, num_workers=0, persistent_workers=False,
    dataset=dict(data_root=data_root))
test_dataloader = val_dataloader
"""

DEMOS = dict(
    det=dict(
        package='mmdet',
        base=DEMO_DET,
        data='tiny_coco',
        batch=4,
        schedule="""
val_evaluator = dict(ann_file=data_root + 'annotations/instances_val.json')
test_evaluator = val_evaluator
train_cfg = dict(max_epochs=1, val_interval=1)
default_hooks = dict(checkpoint=dict(interval=1))
# an untrained detector scores below the usual 0.05: keep every box so the
# COCO evaluation has detections to score
model = dict(test_cfg=dict(score_thr=0.0))
""",
        checkpoint='epoch_1.pth',
        metric='coco/bbox_mAP',
        score_range=(0, 1),
    ),
    seg=dict(
        package='mmseg',
        base=DEMO_SEG,
        data='tiny_cityscapes',
        batch=2,
        schedule="""
train_cfg = dict(max_iters=2, val_interval=2)
default_hooks = dict(checkpoint=dict(interval=2))
""",
        checkpoint='iter_2.pth',
        metric='mIoU',
        score_range=(0, 100),
    ),
    cls=dict(
        package='mmpretrain',
        base=DEMO_CLS,
        data='tiny_imagenet',
        batch=4,
        schedule="""
train_cfg = dict(max_epochs=1, val_interval=1)
default_hooks = dict(checkpoint=dict(interval=1))
""",
        checkpoint='epoch_1.pth',
        metric='accuracy/top1',
        score_range=(0, 100),
    ),
)

# Grad-CAM target: the first convolution of the last block of RedNet's
# second stage (an 8 x 8 map at the demo's 64 px), one of the module calls
# that the CPU fast path skips unless it steps aside for hooks.
CAM_LAYER = 'backbone.layer2.1.conv1'

# vis_cam.py, run as `python vis_cam.py ...` runs it, with a spy on the
# grad-cam function it draws with: what the tool passes it (the image and
# the CAM) is saved for the test to check.
VIS_CAM = """
import runpy
import sys

import numpy as np
from pytorch_grad_cam.utils import image

record, tool = sys.argv[1:3]
draw = image.show_cam_on_image


def spy(img, mask, *args, **kwargs):
    np.savez(record, img=img, mask=mask)
    return draw(img, mask, *args, **kwargs)


image.show_cam_on_image = spy
assert 'mmevo' not in sys.modules
sys.argv = sys.argv[2:]
runpy.run_path(tool, run_name='__main__')
assert 'mmevo.models' in sys.modules  # through the config's custom_imports
"""


def package_tool(package, name):
    """``<package>/.mim/tools/<name>`` of the installed package (found,
    not imported)."""
    init = importlib.util.find_spec(package).origin
    tool = osp.join(osp.dirname(init), '.mim', 'tools', name)
    assert osp.isfile(tool), f'{package} ships no {name}'
    return tool


def run_fresh(argv, cwd):
    """``argv`` in a fresh interpreter; its output (stdout and stderr)."""
    out = subprocess.run(
        [sys.executable, *argv],
        cwd=str(cwd),  # not the repository: nothing found by accident
        env=dict(os.environ, PYTHONPATH=REPO),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        timeout=600,
    )
    assert out.returncode == 0, out.stdout[-4000:]
    return out.stdout


def logged_metric(log, mode, metric):
    """The value of ``metric`` in the last ``Epoch(mode)`` / ``Iter(mode)``
    line of an mmengine log."""
    found = re.findall(
        rf'\({mode}\) \[.*?\s{re.escape(metric)}: (-?\d+\.\d+)', log
    )
    assert found, f'no {mode} {metric} in the log:\n{log[-4000:]}'
    return float(found[-1])


@pytest.fixture(scope='module')
def tiny_imagenet(tmp_path_factory):
    """20 train / 10 val images in the ImageNet folder layout."""
    root = str(tmp_path_factory.mktemp('tiny_imagenet'))
    make_synthetic_imagenet(root, num_train=20, num_val=10)
    return root


@pytest.fixture(scope='module')
def trained(request, tmp_path_factory):
    """``trained(kind)``: the short demo config of ``kind`` trained by its
    library's own ``tools/train.py``, once per module; returns
    ``(config, work_dir, log)``."""
    runs = {}

    def train(kind):
        if kind not in runs:
            demo = DEMOS[kind]
            tmp = tmp_path_factory.mktemp(f'upstream_{kind}')
            config = tmp / 'config.py'
            config.write_text(
                SHORT.format(
                    base=demo['base'],
                    root=request.getfixturevalue(demo['data']),
                    batch=demo['batch'],
                )
                + demo['schedule']
            )
            work_dir = tmp / 'work'
            log = run_fresh(
                [
                    package_tool(demo['package'], 'train.py'),
                    str(config),
                    '--work-dir',
                    str(work_dir),
                ],
                tmp,
            )
            runs[kind] = (config, work_dir, log)
        return runs[kind]

    return train


@pytest.mark.parametrize('kind', ['det', 'seg', 'cls'])
def test_train_then_test(kind, trained):
    """Slow (30-45 s each on 2 busy cores): two fresh interpreters that
    import torch and the OpenMMLab stack, a short training run and an
    evaluation."""
    demo = DEMOS[kind]
    config, work_dir, train_log = trained(kind)
    checkpoint = work_dir / demo['checkpoint']
    assert checkpoint.is_file()
    assert (work_dir / 'last_checkpoint').read_text().strip() == str(
        checkpoint
    )
    val_score = logged_metric(train_log, 'val', demo['metric'])

    test_log = run_fresh(
        [
            package_tool(demo['package'], 'test.py'),
            str(config),
            str(checkpoint),
            '--work-dir',
            str(work_dir.parent / 'test'),
        ],
        work_dir.parent,
    )
    # mmengine's warning of a checkpoint that does not fit the model
    assert 'do not match exactly' not in test_log
    score = logged_metric(test_log, 'test', demo['metric'])
    low, high = demo['score_range']
    assert low <= score <= high
    # test.py evaluated the model that was validated after training
    assert score == pytest.approx(val_score)


def test_vis_cam_draws_a_rednet_heat_map(trained, tiny_imagenet, tmp_path):
    """Slow (about 15 s on 2 busy cores, and the classification training it
    shares with ``test_train_then_test[cls]``): a fresh interpreter running
    mmpretrain's vis_cam.py, a forward and a backward pass."""
    config, work_dir, _ = trained('cls')
    circle = CLS_CLASSES.index('circle')  # val image i is of class i % 10
    image = osp.join(tiny_imagenet, 'val', 'circle', f'{circle:06d}.png')
    record = tmp_path / 'cam.npz'
    save_path = tmp_path / 'cam.png'
    run_fresh(
        [
            '-c',
            VIS_CAM,
            str(record),
            package_tool('mmpretrain', 'visualization/vis_cam.py'),
            image,
            str(config),
            str(work_dir / 'epoch_1.pth'),
            '--target-layers',
            CAM_LAYER,
            '--method',
            'GradCAM',
            '--target-category',
            str(circle),
            '--save-path',
            str(save_path),
        ],
        tmp_path,
    )
    drawn = np.load(record)
    src, cam = drawn['img'], drawn['mask']
    assert src.shape == (64, 64, 3)  # the test pipeline's centre crop
    assert cam.shape == (64, 64) and np.isfinite(cam).all()
    # grad-cam scales the CAM to [0, 1]; one that saw nothing (no
    # activations or no gradient through the layer) is 0 everywhere
    assert cam.min() >= 0 and cam.max() <= 1
    assert cam.max() - cam.min() > 0.5
    assert len(np.unique(cam)) > 16
    # the file holds that heat map over the image
    from pytorch_grad_cam.utils.image import show_cam_on_image

    saved = cv2.imread(str(save_path))
    np.testing.assert_array_equal(
        saved, show_cam_on_image(src, cam, use_rgb=False)
    )
