"""Fixtures of the tool tests: tiny synthetic data sets, made once per
session."""

import pytest

from mmevo.demo import make_synthetic_cityscapes, make_synthetic_coco


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
