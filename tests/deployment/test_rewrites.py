"""The export rewrites (mmevo/deploy/rewrites.py) patch the module
instances of the model being exported, for the block only, never their
classes; and exporting a layer needs no mmdet."""

import os.path as osp
import subprocess
import sys
import textwrap

import pytest
import torch
import torch.nn.functional as F
from mmseg.models.utils import Upsample
from torch import nn
from torch.fx.experimental.proxy_tensor import make_fx

from mmevo.deploy import ceil_avg_pool2d, export_rewrites
from mmevo.deploy.rewrites import AOTI_REWRITES

REPO = osp.dirname(osp.dirname(osp.dirname(osp.abspath(__file__))))


def aten_ops(module, x):
    """The aten operators a trace of ``module(x)`` runs."""
    graph = make_fx(module)(x).graph
    return {str(n.target) for n in graph.nodes if n.op == 'call_function'}


class OwnPool(nn.AdaptiveAvgPool2d):
    """A subclass with a forward of its own: kept, as on the class."""

    def forward(self, x):
        return super().forward(x) * 2


def test_instances_are_rewritten_for_the_block_only():
    model = nn.Sequential(
        nn.AdaptiveAvgPool2d(3),
        Upsample(scale_factor=2.0, mode='nearest'),
        OwnPool(2),
    )
    other = nn.Sequential(nn.AdaptiveAvgPool2d(3), Upsample(scale_factor=2.0))
    classes = (nn.AdaptiveAvgPool2d, Upsample, OwnPool)
    stock = {cls: vars(cls)['forward'] for cls in classes}
    x = torch.randn(1, 2, 7, 5)
    expected = model(x)
    with export_rewrites(model):
        assert 'forward' in vars(model[0]) and 'forward' in vars(model[1])
        assert 'forward' not in vars(model[2])
        assert not any('forward' in vars(m) for m in other)
        assert {cls: vars(cls)['forward'] for cls in stock} == stock
        # the rewrite runs: bins as matmuls, not aten's adaptive pooling
        assert 'aten._adaptive_avg_pool2d.default' not in aten_ops(model[0], x)
        assert 'aten._adaptive_avg_pool2d.default' in aten_ops(other[0], x)
        torch.testing.assert_close(model(x), expected)
    assert not any('forward' in vars(m) for m in model)
    assert 'aten._adaptive_avg_pool2d.default' in aten_ops(model[0], x)
    assert {cls: vars(cls)['forward'] for cls in stock} == stock


def test_instances_are_restored_after_an_error():
    model = nn.Sequential(nn.AdaptiveAvgPool2d(3), nn.AdaptiveAvgPool2d(2))

    def own(x):  # an instance's own forward (a hook library's) stays
        return x

    model[1].forward = own
    with pytest.raises(RuntimeError, match='export failed'):
        with export_rewrites(model):
            assert model[1].forward is not own
            raise RuntimeError('export failed')
    assert 'forward' not in vars(model[0])
    assert model[1].forward is own


@pytest.mark.slow
def test_layer_export_needs_no_mmdet(tmp_path):
    """In a fresh interpreter where mmdet and mmseg cannot be imported (as
    if not installed), an mmevo layer exports and runs in onnxruntime, and
    neither is imported."""
    script = textwrap.dedent(f"""
        import sys
        from importlib.abc import MetaPathFinder

        class Hidden(MetaPathFinder):
            def find_spec(self, name, path=None, target=None):
                if name.split('.')[0] in ('mmdet', 'mmseg'):
                    raise ModuleNotFoundError(name)

        sys.meta_path.insert(0, Hidden())
        import torch
        from mmevo.deploy import OnnxModel, export_onnx
        from mmevo.layers import Involution

        torch.manual_seed(0)
        layer = Involution(16, 3, stride=2).eval()
        path = {str(tmp_path / 'layer.onnx')!r}
        export_onnx(layer, torch.randn(1, 16, 9, 11), path, dynamo=False)
        x = torch.randn(1, 16, 7, 12)
        torch.testing.assert_close(
            OnnxModel(path)(x)[0], layer(x), rtol=1e-4, atol=1e-4)
        loaded = sorted(m for m in sys.modules
                        if m.split('.')[0] in ('mmdet', 'mmseg'))
        assert not loaded, loaded
        print('ok')
    """)
    out = subprocess.run(
        [sys.executable, '-c', script],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert out.returncode == 0 and out.stdout.strip() == 'ok', out.stderr


@pytest.mark.parametrize('stride', [2, 3, (2, 3)])
@pytest.mark.parametrize('hw', [(1, 1), (2, 3), (7, 8), (9, 13), (16, 16)])
def test_ceil_avg_pool2d_equals_pytorch(stride, hw):
    """Values and gradients of the stock ceil-mode pooling, float64."""
    torch.manual_seed(0)
    x = torch.randn(2, 3, *hw, dtype=torch.float64, requires_grad=True)
    ours = ceil_avg_pool2d(x, stride)
    ref = F.avg_pool2d(x, stride, stride, ceil_mode=True)
    assert ours.shape == ref.shape
    torch.testing.assert_close(ours, ref, rtol=1e-12, atol=1e-12)
    g = torch.randn_like(ref)
    torch.testing.assert_close(
        torch.autograd.grad(ours, x, g)[0],
        torch.autograd.grad(ref, x, g)[0],
        rtol=1e-12,
        atol=1e-12,
    )
    unbatched = x[0].detach()
    torch.testing.assert_close(
        ceil_avg_pool2d(unbatched, stride),
        F.avg_pool2d(unbatched, stride, stride, ceil_mode=True),
    )


@pytest.mark.parametrize('stride', [0, -1, 1.5, True, (2, 0), (2, 2, 2), '2'])
def test_ceil_avg_pool2d_refuses_a_bad_stride(stride):
    with pytest.raises(ValueError, match='stride must be a positive int'):
        ceil_avg_pool2d(torch.zeros(1, 2, 4, 4), stride)


def test_ceil_avg_pool2d_refuses_a_bad_rank():
    with pytest.raises(ValueError, match=r'x must be \(B, C, H, W\)'):
        ceil_avg_pool2d(torch.zeros(4, 4), 2)


@pytest.mark.parametrize(
    'pool, rewritten',
    [
        (nn.AvgPool2d(2, 2, ceil_mode=True), True),
        (nn.AvgPool2d(2, ceil_mode=True, count_include_pad=False), True),
        (nn.AvgPool2d(2, 2), False),
        (nn.AvgPool2d(3, 2, ceil_mode=True), False),
        (nn.AvgPool2d(2, 2, padding=1, ceil_mode=True), False),
        (nn.AvgPool2d(2, 2, ceil_mode=True, divisor_override=3), False),
    ],
)
def test_package_rewrites_only_poolings_they_equal(pool, rewritten):
    """In a package's export, a ceil-mode pooling of windows as large as
    the stride runs without aten's avg_pool2d; any other stays stock, and
    the numbers are the stock ones either way (float64)."""
    x = torch.randn(1, 2, 9, 7, dtype=torch.float64)
    ref = pool(x)
    with export_rewrites(pool, AOTI_REWRITES):
        ops = aten_ops(pool, x)
        torch.testing.assert_close(pool(x), ref)
    assert ('aten.avg_pool2d.default' not in ops) == rewritten, ops
    assert 'forward' not in vars(pool)
