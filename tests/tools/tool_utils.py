"""Helpers of the tool tests: tiny synthetic data sets (fixtures) and the
``tools/*.py`` scripts imported as modules (so runs happen in-process)."""
import importlib.util
import os.path as osp
import sys

import pytest

from mmevo.datasets import make_synthetic_cityscapes, make_synthetic_coco

REPO = osp.dirname(osp.dirname(osp.dirname(osp.abspath(__file__))))
DEMO_DET = osp.join(REPO, 'configs', 'demo',
                    'retinanet_rednet26-tiny_fpn_1xb8-20e_synthetic-coco.py')
DEMO_SEG = osp.join(
    REPO, 'configs', 'demo',
    'fpn_rednet26-tiny_1xb8-500iter_synthetic-cityscapes-128x256.py')


# as when a tool runs as a script: its folder (tools/_cli.py) is importable
if osp.join(REPO, 'tools') not in sys.path:
    sys.path.insert(0, osp.join(REPO, 'tools'))


def load_tool(name):
    """``tools/<name>.py`` as a module (its ``main(argv)`` runs a job)."""
    spec = importlib.util.spec_from_file_location(
        f'mmevo_tool_{name}', osp.join(REPO, 'tools', f'{name}.py'))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope='session')
def tiny_coco(tmp_path_factory):
    """8 train / 4 val images of 64 x 64 px."""
    root = str(tmp_path_factory.mktemp('tiny_coco'))
    make_synthetic_coco(root, num_train=8, num_val=4, img_size=64)
    return root


@pytest.fixture(scope='session')
def tiny_cityscapes(tmp_path_factory):
    """4 train / 2 val scenes of 64 x 128 px."""
    root = str(tmp_path_factory.mktemp('tiny_cityscapes'))
    make_synthetic_cityscapes(root, num_train=4, num_val=2, img_size=(64, 128))
    return root
