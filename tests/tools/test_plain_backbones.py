"""tools/analysis/plain_backbones.py: the architectures of mmdet's ResNet-50
and mmevo's RedNet-50 without mmdet (for the GPU check's train steps)."""
import importlib.util
import os.path as osp

import torch
from mmdet.models.backbones import ResNet

from mmevo.models import RedNet

REPO = osp.dirname(osp.dirname(osp.dirname(osp.abspath(__file__))))


def load_plain_backbones():
    spec = importlib.util.spec_from_file_location(
        'plain_backbones',
        osp.join(REPO, 'tools', 'analysis', 'plain_backbones.py'))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_same_parameters_and_outputs_as_mmdet_and_mmevo():
    plain = load_plain_backbones()
    x = torch.rand(1, 3, 64, 64)
    for mine, theirs in ((plain.PlainResNet(50, involution=True),
                          RedNet(depth=50)), (plain.PlainResNet(50),
                                              ResNet(50))):
        assert (sum(p.numel() for p in mine.parameters()) == sum(
            p.numel() for p in theirs.parameters()))
        # The same parameter shapes, in the same order.
        assert ([tuple(p.shape) for p in mine.parameters()
                 ] == [tuple(p.shape) for p in theirs.parameters()])
        mine.eval()
        theirs.eval()  # mmdet's ResNet.train returns None
        with torch.no_grad():
            assert [o.shape for o in mine(x)] == [o.shape for o in theirs(x)]
