"""The FLOP-counting rules of the mmevo ops (mmevo.ops.flops) in mmengine's
FlopAnalyzer, against counts written out from the shapes."""
import torch
from mmengine.analysis import FlopAnalyzer
from torch import nn

import mmevo
from mmevo.layers import ACmix
from mmevo.layers.pointwise import pointwise
from mmevo.ops import output_size
from mmevo.ops.flops import FLOP_HANDLES, MMEVO_FLOP_HANDLES, MMEVO_OPS


class _OpsModule(nn.Module):
    """Calls the mmevo ops through their public API."""

    def forward(self, x, kernel, query, key):
        out = mmevo.ops.evolution_aggregate(x, kernel, stride=2, dilation=2)
        corr = mmevo.ops.local_correlation(query, key, 4, 5, stride=1)
        attn = mmevo.ops.local_attention_weights(query, key, 2, 3)
        return out, corr, attn


def test_flop_handles_count_the_ops():
    b, c, g, k, h, w = 2, 24, 3, 3, 13, 10
    # "same" padding, dilation 2, stride 2
    ho, wo = output_size(h, k, 2, 2, 2), output_size(w, k, 2, 2, 2)
    x = torch.randn(b, c, h, w)
    kernel = torch.randn(b, g, k, k, ho, wo)
    query, key = torch.randn(b, 16, 7, 9), torch.randn(b, 16, 7, 9)
    analyzer = FlopAnalyzer(_OpsModule(), (x, kernel, query, key))
    analyzer.set_op_handle(**MMEVO_FLOP_HANDLES)
    flops = analyzer.by_operator()
    assert set(flops) == set(MMEVO_OPS)
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
        return (pointwise(x, self.conv.weight,
                          self.conv.bias), self.conv(x), self.acmix(x))


def test_matmul_layers_are_counted():
    """The counter sees the generation / projection matmuls: pointwise
    counts as the 1x1 conv it equals, ACmix's q/k/v projection as 3 * C *
    C_in multiply-adds per pixel."""
    x = torch.randn(2, 8, 5, 7)
    analyzer = FlopAnalyzer(_MatmulLayers(), (x, ))
    analyzer.set_op_handle(**FLOP_HANDLES)
    flops = analyzer.by_operator()
    pixels = 2 * 5 * 7
    # pointwise once, ACmix's positional map (2 -> 2 channels, one image).
    assert flops['bmm'] == 6 * 8 * pixels + 2 * 2 * 5 * 7
    assert flops['baddbmm'] == 3 * 8 * 8 * pixels
    assert flops['conv'] > 0  # the 1x1 conv and ACmix's grouped conv path
    assert 'aten::baddbmm' not in analyzer.unsupported_ops()
