"""Parameter counts against the published table, and FLOPs of whole models.

The published counts come from mmcv 1.x's ``get_model_complexity_info``,
which counts the parameters with ``requires_grad``: a detector's frozen stem
and stage 1 (``frozen_stages=1``) are not in them. The trainable count must
agree within 1%. ``tools/analysis/get_flops.py`` is run as a command; the
FLOP rules of the ops themselves are tested in ``tests/ops/test_flops.py``.
"""

import os
import re
import subprocess
import sys

import pytest
import torch
import yaml
from mmengine.analysis import FlopAnalyzer
from mmengine.model import revert_sync_batchnorm
from mmengine.registry import MODELS, init_default_scope
from torch import nn

import mmevo  # noqa: F401  registers mmevo's modules
from mmevo.layers import ACmix, Involution
from mmevo.models import ACmixResNet
from mmevo.ops.flops import FLOP_HANDLES

from configs_helpers import ROOT, load

pytestmark = pytest.mark.slow


def build_model(rel_path):
    """The model of a config on CPU (SyncBN as BN), in eval mode, weights
    not loaded."""
    cfg = load(rel_path)
    init_default_scope(cfg.default_scope)
    return revert_sync_batchnorm(MODELS.build(cfg.model)).eval()


# Published parameters (M), the table of configs/rednet/README.md.
PUBLISHED_PARAMS_M = {
    'faster-rcnn_rednet50_fpn_1x_coco': 31.6,
    'faster-rcnn_rednet50_inv-neck_1x_coco': 29.5,
    'faster-rcnn_rednet50_inv-neck-head_1x_coco': 29.0,
    'mask-rcnn_rednet50_fpn_1x_coco': 34.2,
    'mask-rcnn_rednet50_inv-neck_1x_coco': 32.2,
    'mask-rcnn_rednet50_inv-neck-head_1x_coco': 29.5,
    'retinanet_rednet50_fpn_1x_coco': 27.8,
    'retinanet_rednet50_inv-neck_1x_coco': 26.3,
    'fpn_rednet50_4xb2-80k_cityscapes-512x1024': 18.5,
    'fpn_rednet50-inv-neck_4xb2-80k_cityscapes-512x1024': 16.4,
    'upernet_rednet50_4xb2-80k_cityscapes-512x1024': 56.4,
}


@pytest.mark.parametrize('name', sorted(PUBLISHED_PARAMS_M))
def test_parameters_match_published(name):
    model = build_model(f'configs/rednet/{name}.py')
    total = sum(p.numel() for p in model.parameters())
    trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
    published = PUBLISHED_PARAMS_M[name] * 1e6
    assert abs(trainable - published) <= 0.01 * published, (
        f'{name}: {trainable / 1e6:.3f} M trainable ({total / 1e6:.3f} M in '
        f'all) vs {published / 1e6:.1f} M published'
    )
    if 'cityscapes' in name:
        assert total == trainable  # nothing is frozen in segmentation
    else:
        # What frozen_stages=1 leaves out: the stem and stage 1.
        frozen = sum(
            p.numel()
            for n, p in model.named_parameters()
            if n.startswith(('backbone.stem', 'backbone.layer1.'))
        )
        assert total - trainable == frozen > 0


class _Features(nn.Module):
    """A two-stage detector's backbone, neck and RPN head, tensors out."""

    def __init__(self, detector):
        super().__init__()
        self.detector = detector

    def forward(self, x):
        feats = self.detector.extract_feat(x)
        cls_scores, bbox_preds = self.detector.rpn_head(feats)
        return tuple(feats) + tuple(cls_scores) + tuple(bbox_preds)


def _conv_macs_by_hooks(model):
    """Hook every nn.Conv2d: the multiply-adds of each call, B * weight
    elements * output pixels (an independent count of what ran)."""
    macs = []

    def hook(module, inputs, output):
        b, _, h, w = output.shape
        macs.append(b * module.weight.numel() * h * w)

    for m in model.modules():
        if isinstance(m, nn.Conv2d):
            m.register_forward_hook(hook)
    return macs


@pytest.mark.parametrize(
    'build,shape',
    [
        (lambda: ACmix(8, 8), (2, 8, 5, 7)),
        (lambda: Involution(16, 3, 2), (2, 16, 9, 6)),
        (
            lambda: ACmixResNet(26, stem_channels=16, base_channels=16),
            (1, 3, 64, 48),
        ),
    ],
)
def test_counter_sees_the_stock_convs(build, shape):
    """FLOP counting traces the model: the stock graph runs, every conv
    module (ACmix's projections, fc and dep_conv; the involution's
    generation convs; the bottlenecks' 1x1 convs) is counted as a conv,
    and no CPU fast-path matmul is left in the count."""
    model = build().eval()
    macs = _conv_macs_by_hooks(model)
    analyzer = FlopAnalyzer(model, (torch.randn(shape),))
    analyzer.set_op_handle(**FLOP_HANDLES)
    analyzer.unsupported_ops_warnings(False)
    flops = analyzer.by_operator()
    convs = [m for m in model.modules() if isinstance(m, nn.Conv2d)]
    assert len(macs) == len(convs)  # each traced once
    assert flops['conv'] == sum(macs)
    assert not {'bmm', 'baddbmm', 'matmul', 'einsum'} & set(flops)


def test_model_flops_include_every_involution():
    """With the mmevo FLOP handles, the count of a whole model (involutions
    in the backbone, the neck and the RPN head) has every involution's
    output size times K*K, the independent reference taken by hooks."""
    model = build_model(
        'configs/rednet/faster-rcnn_rednet50_inv-neck-head_1x_coco.py'
    )
    expected, called = [], set()

    def hook(module, inputs, output):
        b, c, h, w = output.shape
        expected.append(b * c * h * w * module.kernel_size**2)
        called.add(module)

    involutions = {
        n: m for n, m in model.named_modules() if isinstance(m, Involution)
    }
    assert {n.split('.')[0] for n in involutions} == {
        'backbone',
        'neck',
        'rpn_head',
    }
    for m in involutions.values():
        m.register_forward_hook(hook)
    analyzer = FlopAnalyzer(_Features(model), (torch.randn(1, 3, 96, 160),))
    analyzer.set_op_handle(**FLOP_HANDLES)
    analyzer.unsupported_ops_warnings(False)
    with torch.no_grad():
        flops = analyzer.by_operator()
    # Traced once by the analyzer (hooks fire once per call; the RPN head
    # runs once per pyramid level).
    assert called == set(involutions.values())
    assert flops['evolution_aggregate'] == sum(expected)
    assert flops['conv'] > 0


def test_cli_prints_parameters_and_flops():
    config = 'configs/rednet/retinanet_rednet50_inv-neck_1x_coco.py'
    out = subprocess.run(
        [
            sys.executable,
            'tools/analysis/get_flops.py',
            config,
            '--shape',
            '128',
            '160',
        ],
        cwd=ROOT,
        env=dict(os.environ, PYTHONPATH=str(ROOT)),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stderr[-2000:]
    params = re.search(
        r'Params: ([\d.]+) M trainable .*, ([\d.]+) M in all', out.stdout
    )
    flops = re.search(
        r'FLOPs: ([\d.]+) G \(([\d.]+) G without mmevo ops.*; ([\d.]+) G in '
        r'mmevo ops',
        out.stdout,
    )
    assert params and flops, out.stdout
    assert abs(float(params.group(1)) - 26.3) <= 0.01 * 26.3
    total, without, in_ops = (float(flops.group(i)) for i in (1, 2, 3))
    assert in_ops > 0 and without > 0
    assert abs(total - without - in_ops) <= 0.1  # printed to 0.1 G
    assert 'Input shape: (1, 3, 128, 160)' in out.stdout


def test_metafile_lists_every_rednet_config():
    meta = yaml.safe_load((ROOT / 'configs/rednet/metafile.yml').read_text())
    # (the ImageNet classifiers, *_in1k: tests/configs/test_config_cls.py)
    models = {
        m['Name']: m for m in meta['Models'] if not m['Name'].endswith('_in1k')
    }
    assert set(models) == set(PUBLISHED_PARAMS_M)
    for name, model in models.items():
        assert model['Config'] == f'configs/rednet/{name}.py'
        assert (ROOT / model['Config']).is_file()
        assert model['Metadata']['Parameters'] == round(
            PUBLISHED_PARAMS_M[name] * 1e6
        )
