"""The model tests build mmdet's modules as a config with
``default_scope='mmdet'`` is built, whatever scope an earlier test (a
runner) left current."""

import pytest
from mmengine.registry import DefaultScope


@pytest.fixture(autouse=True)
def mmdet_scope():
    with DefaultScope.overwrite_default_scope('mmdet'):
        yield
