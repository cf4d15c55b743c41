"""The FLOP-counting rules of the mmevo ops (mmevo.ops.flops) in mmengine's
FlopAnalyzer, against counts written out from the shapes."""

import torch
from mmengine.analysis import FlopAnalyzer
from torch import nn

import mmevo
from mmevo.ops import output_size
from mmevo.ops.flops import FLOP_HANDLES, MMEVO_OPS


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
    analyzer.set_op_handle(**FLOP_HANDLES)
    flops = analyzer.by_operator()
    assert set(flops) == set(MMEVO_OPS)
    assert flops['evolution_aggregate'] == b * c * ho * wo * k * k
    assert flops['local_correlation'] == b * 16 * 7 * 9 * 5 * 5
    assert flops['local_attention_weights'] == b * 16 * 7 * 9 * 3 * 3
    assert not analyzer.unsupported_ops()
