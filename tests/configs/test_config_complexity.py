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
from mmevo.models import ACmixResNet

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


@pytest.mark.parametrize('build,shape', [
    (lambda: ACmix(8, 8), (2, 8, 5, 7)),
    (lambda: Involution(16, 3, 2), (2, 16, 9, 6)),
    (lambda: ACmixResNet(26, stem_channels=16, base_channels=16),
     (1, 3, 64, 48)),
])
def test_counter_sees_the_stock_convs(build, shape):
    """FLOP counting traces the model: the stock graph runs, every conv
    module (ACmix's projections, fc and dep_conv; the involution's
    generation convs; the bottlenecks' 1x1 convs) is counted as a conv,
    and no CPU fast-path matmul is left in the count."""
    model = build().eval()
    macs = _conv_macs_by_hooks(model)
    analyzer = get_flops.FlopAnalyzer(model, (torch.randn(shape), ))
    analyzer.set_op_handle(**get_flops.MMEVO_FLOP_HANDLES)
    analyzer.unsupported_ops_warnings(False)
    flops = analyzer.by_operator()
    convs = [m for m in model.modules() if isinstance(m, nn.Conv2d)]
    assert len(macs) == len(convs)  # each traced once
    assert flops['conv'] == sum(macs)
    assert not {'bmm', 'baddbmm', 'matmul', 'einsum'} & set(flops)


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
