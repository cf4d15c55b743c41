"""Every layer takes an empty batch, forward and backward, on both paths."""

import pytest
import torch

from mmevo.layers import (
    ELSA,
    ACmix,
    DynamicFilter,
    EvolutionConv,
    Involution,
    LocalSelfAttention,
    set_cpu_fastpath,
)

LAYERS = {
    'evolution_conv': (lambda: EvolutionConv(8, 3, stride=2), 8, 8),
    'involution': (lambda: Involution(16, 7, 2), 16, 16),
    'dynamic_filter': (lambda: DynamicFilter(8, stride=2), 8, 8),
    'local_self_attention': (
        lambda: LocalSelfAttention(8, num_heads=2, kernel_size=3, stride=2),
        8,
        8,
    ),
    'elsa': (lambda: ELSA(24, 2, kernel_size=3, stride=2), 24, 24),
    'acmix': (lambda: ACmix(8, 12, 5, 3, stride=2), 8, 12),
    # wide enough for oneDNN: its projection, the involution's 1x1 convs
    'acmix_onednn': (lambda: ACmix(64, 64, 5, 4, stride=2), 64, 64),
    'involution_onednn': (lambda: Involution(256, 7, 2), 256, 256),
}


@pytest.mark.parametrize('fast', [True, False])
@pytest.mark.parametrize('mode', ['train', 'eval'])
@pytest.mark.parametrize('name', sorted(LAYERS))
def test_empty_batch(name, mode, fast, monkeypatch):
    if name.endswith('_onednn'):
        monkeypatch.setenv('MMEVO_CONV1X1', 'onednn')
    build, c_in, c_out = LAYERS[name]
    layer = set_cpu_fastpath(build(), fast).train(mode == 'train')
    x = torch.randn(0, c_in, 7, 6, requires_grad=True)
    out = layer(x)
    assert out.shape == (0, c_out, 4, 3)
    out.sum().backward()
    assert x.grad.shape == x.shape
