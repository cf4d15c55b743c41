"""Parameter counts against the published table, and the FLOP counter.

The published counts come from mmcv 1.x's ``get_model_complexity_info``,
which counts the parameters with ``requires_grad``: a detector's frozen stem
and stage 1 (``frozen_stages=1``) are not in them. ``count_parameters``
returns both numbers; the trainable one must agree within 1%.
"""
import importlib.util
import os
import re
import subprocess
import sys

import pytest
import torch
import yaml
from torch import nn

import mmevo
from configs_helpers import ROOT, load
from mmevo.layers import ACmix, Involution
from mmevo.layers.pointwise import pointwise

_spec = importlib.util.spec_from_file_location(
    'get_flops', ROOT / 'tools' / 'analysis' / 'get_flops.py')
get_flops = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(get_flops)

# Published parameters (M), shared/reference/published_results.md.
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
    model = get_flops.build_model(load(f'configs/rednet/{name}.py'))
    total, trainable = get_flops.count_parameters(model)
    published = PUBLISHED_PARAMS_M[name] * 1e6
    assert abs(trainable - published) <= 0.01 * published, (
        f'{name}: {trainable / 1e6:.3f} M trainable ({total / 1e6:.3f} M in '
        f'all) vs {published / 1e6:.1f} M published')
    if 'cityscapes' in name:
        assert total == trainable  # nothing is frozen in segmentation
    else:
        # What frozen_stages=1 leaves out: the stem and stage 1.
        frozen = sum(p.numel() for n, p in model.named_parameters()
                     if n.startswith(('backbone.stem', 'backbone.layer1.')))
        assert total - trainable == frozen > 0


class _OpsModule(nn.Module):
    """Calls the mmevo ops through their public API."""

    def forward(self, x, kernel, query, key):
        out = mmevo.ops.evolution_aggregate(x, kernel, stride=2, dilation=2)
        corr = mmevo.ops.local_correlation(query, key, 4, 5, stride=1)
        attn = mmevo.ops.local_attention_weights(query, key, 2, 3)
        return out, corr, attn


def _out_size(size, k, s, d):
    p = d * (k - 1) // 2  # "same" padding
    return (size + 2 * p - d * (k - 1) - 1) // s + 1


def test_flop_handles_count_the_ops():
    b, c, g, k, h, w = 2, 24, 3, 3, 13, 10
    ho, wo = _out_size(h, k, 2, 2), _out_size(w, k, 2, 2)
    x = torch.randn(b, c, h, w)
    kernel = torch.randn(b, g, k, k, ho, wo)
    query, key = torch.randn(b, 16, 7, 9), torch.randn(b, 16, 7, 9)
    analyzer = get_flops.FlopAnalyzer(_OpsModule(), (x, kernel, query, key))
    analyzer.set_op_handle(**get_flops.MMEVO_FLOP_HANDLES)
    flops = analyzer.by_operator()
    assert flops['evolution_aggregate'] == b * c * ho * wo * k * k
    assert flops['local_correlation'] == b * 16 * 7 * 9 * 5 * 5
    assert flops['local_attention_weights'] == b * 16 * 7 * 9 * 3 * 3
    assert not analyzer.unsupported_ops()


class _MatmulLayers(nn.Module):
    """A 1x1 conv as ``pointwise`` (a custom autograd op outside tracing)
    and as ``nn.Conv2d``, and an ACmix layer (its projection is a baddbmm)."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(8, 6, 1)
        self.acmix = ACmix(8, 8)

    def forward(self, x):
        return (pointwise(x, self.conv.weight, self.conv.bias), self.conv(x),
                self.acmix(x))


def test_matmul_layers_are_counted():
    """The counter sees the generation / projection matmuls: pointwise
    counts as the 1x1 conv it equals, ACmix's q/k/v projection as 3 * C *
    C_in multiply-adds per pixel."""
    x = torch.randn(2, 8, 5, 7)
    model = _MatmulLayers()
    analyzer = get_flops.FlopAnalyzer(model, (x, ))
    analyzer.set_op_handle(**get_flops.MMEVO_FLOP_HANDLES,
                           **{'aten::baddbmm': get_flops.baddbmm_flop})
    flops = analyzer.by_operator()
    pixels = 2 * 5 * 7
    # pointwise once, ACmix's positional map (2 -> 2 channels, one image).
    assert flops['bmm'] == 6 * 8 * pixels + 2 * 2 * 5 * 7
    assert flops['baddbmm'] == 3 * 8 * 8 * pixels
    assert flops['conv'] > 0  # the 1x1 conv and ACmix's grouped conv path


def test_model_flops_include_every_involution():
    # Independent reference: each Involution's output size times K*K.
    model = get_flops.build_model(
        load('configs/rednet/faster-rcnn_rednet50_inv-neck-head_1x_coco.py'))
    expected = []

    def hook(module, inputs, output):
        b, c, h, w = output.shape
        expected.append(b * c * h * w * module.kernel_size**2)

    for m in model.modules():
        if isinstance(m, Involution):
            m.register_forward_hook(hook)
    flops = get_flops.count_flops(model, (96, 160))
    # Traced once by the analyzer (hooks fire once per call).
    assert expected and flops['evolution_aggregate'] == sum(expected)
    assert flops['conv'] > 0 and flops['linear'] > 0


def test_cli_prints_parameters_and_flops():
    config = 'configs/rednet/retinanet_rednet50_inv-neck_1x_coco.py'
    out = subprocess.run(
        [sys.executable, 'tools/analysis/get_flops.py', config, '--shape',
         '128', '160'],
        cwd=ROOT, env=dict(os.environ, PYTHONPATH=str(ROOT)),
        capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    params = re.search(r'Params: ([\d.]+) M trainable .*, ([\d.]+) M in all',
                       out.stdout)
    flops = re.search(
        r'FLOPs: ([\d.]+) G \(([\d.]+) G without mmevo ops.*; ([\d.]+) G in '
        r'mmevo ops', out.stdout)
    assert params and flops, out.stdout
    assert abs(float(params.group(1)) - 26.3) <= 0.01 * 26.3
    total, without, in_ops = (float(flops.group(i)) for i in (1, 2, 3))
    assert in_ops > 0 and without > 0
    assert abs(total - without - in_ops) <= 0.1  # printed to 0.1 G
    assert 'Input shape: (1, 3, 128, 160)' in out.stdout


def test_metafile_lists_every_rednet_config():
    meta = yaml.safe_load((ROOT / 'configs/rednet/metafile.yml').read_text())
    models = {m['Name']: m for m in meta['Models']}
    assert set(models) == set(PUBLISHED_PARAMS_M)
    for name, model in models.items():
        assert model['Config'] == f'configs/rednet/{name}.py'
        assert (ROOT / model['Config']).is_file()
        assert model['Metadata']['Parameters'] == round(
            PUBLISHED_PARAMS_M[name] * 1e6)
