"""Properties every evolution layer shares: sizes, gradients, registries,
kernel hooks and build-time errors."""

import pytest
import torch
from torch.func import functional_call

from mmevo.layers import EvolutionLayer
from mmevo.registry import MODELS

# Small configurations of every layer (K = 3 keeps the reference op fast).
CONFIGS = {
    'EvolutionConv': dict(channels=4, kernel_size=3, groups=2),
    'Involution': dict(
        channels=8, kernel_size=3, reduction_ratio=2, group_channels=4
    ),
    'DynamicFilter': dict(channels=5, kernel_size=3),
    'LocalSelfAttention': dict(
        in_channels=4,
        out_channels=6,
        kernel_size=3,
        num_heads=2,
        rel_pos_bias=True,
    ),
    'ELSA': dict(dim=6, num_heads=2, kernel_size=3, group_width=2),
    'ACmix': dict(in_planes=4, out_planes=6, kernel_att=3, head=2),
}
IN_CHANNELS = {
    'EvolutionConv': 4,
    'Involution': 8,
    'DynamicFilter': 5,
    'LocalSelfAttention': 4,
    'ELSA': 6,
    'ACmix': 4,
}
OUT_CHANNELS = {**IN_CHANNELS, 'LocalSelfAttention': 6, 'ACmix': 6}
# The published defaults (K = 7 where published), for the size sweep.
DEFAULTS = {
    'EvolutionConv': dict(channels=16, kernel_size=7),
    'Involution': dict(channels=16),
    'DynamicFilter': dict(channels=16, kernel_size=5),
    'LocalSelfAttention': dict(in_channels=16),
    'ELSA': dict(dim=16, num_heads=2),
    'ACmix': dict(in_planes=16, out_planes=16),
}


def build(name, registry=MODELS, **overrides):
    return registry.build(dict(type=name, **{**CONFIGS[name], **overrides}))


def ceil_div(a, b):
    return -(-a // b)


@pytest.mark.parametrize('name', sorted(CONFIGS))
@pytest.mark.parametrize('stride', [1, 2])
@pytest.mark.parametrize('size', [(1, 1), (2, 3), (5, 7), (4, 6), (3, 1)])
def test_every_size_and_stride(name, stride, size):
    torch.manual_seed(0)
    layer = MODELS.build(dict(type=name, stride=stride, **DEFAULTS[name]))
    channels = next(iter(DEFAULTS[name].values()))
    out = layer(torch.randn(2, channels, *size))
    expected = (
        2,
        channels,
        ceil_div(size[0], stride),
        ceil_div(size[1], stride),
    )
    assert out.shape == expected
    assert torch.isfinite(out).all()


@pytest.mark.parametrize('name', sorted(CONFIGS))
@pytest.mark.parametrize('stride, size', [(1, (3, 4)), (2, (5, 4))])
def test_gradcheck(name, stride, size):
    """float64 gradients of the input and of every parameter."""
    torch.manual_seed(0)
    layer = build(name, stride=stride).double()
    params = dict(layer.named_parameters())
    if name == 'ELSA':
        with torch.no_grad():  # give the ghost head its full effect
            params['ghost_head'].normal_()
    x = torch.randn(
        2, IN_CHANNELS[name], *size, dtype=torch.float64, requires_grad=True
    )
    names = list(params)

    def fn(x, *values):
        return functional_call(
            layer, dict(zip(names, values, strict=True)), (x,)
        )

    values = [p.detach().clone().requires_grad_() for p in params.values()]
    assert torch.autograd.gradcheck(fn, (x, *values), fast_mode=True)


@pytest.mark.parametrize('name', sorted(CONFIGS))
def test_builds_under_mmdet_and_mmseg(name):
    from mmdet.registry import MODELS as DET_MODELS
    from mmseg.registry import MODELS as SEG_MODELS

    x = torch.randn(2, IN_CHANNELS[name], 4, 5)
    for registry in (MODELS, DET_MODELS, SEG_MODELS):
        layer = build(name, registry)
        assert type(layer).__name__ == name
        assert layer(x).shape == (2, OUT_CHANNELS[name], 4, 5)


@pytest.mark.parametrize('name', sorted(CONFIGS))
def test_kernel_hook_sees_the_kernel(name):
    layer = build(name, stride=2).eval()
    assert isinstance(layer, EvolutionLayer)
    seen = []
    handle = layer.register_kernel_hook(lambda m, k: seen.append((m, k)))
    x = torch.randn(1, IN_CHANNELS[name], 5, 6)
    layer(x)
    assert len(seen) == 1 and seen[0][0] is layer
    kernel = seen[0][1]
    assert kernel.shape[0] == 1 and kernel.shape[2:] == (3, 3, 3, 3)
    torch.testing.assert_close(kernel, layer.generate_kernel(x))
    handle.remove()
    layer(x)
    assert len(seen) == 1


@pytest.mark.parametrize('name', sorted(CONFIGS))
def test_kernel_hook_removed_after_an_export(name):
    """``torch.export`` (non-strict) puts back a copy of each module
    attribute after tracing: the handle still removes the hook, and so does
    leaving its ``with`` block."""
    layer = build(name, stride=2).eval()
    seen = []
    x = torch.randn(1, IN_CHANNELS[name], 5, 6)
    handle = layer.register_kernel_hook(lambda m, k: seen.append(k))
    with torch.no_grad():
        torch.export.export(layer, (x,), strict=False)
    seen.clear()
    layer(x)
    assert len(seen) == 1
    handle.remove()
    layer(x)
    assert len(seen) == 1
    with layer.register_kernel_hook(lambda m, k: seen.append(k)):
        torch.export.export(layer, (x,), strict=False)
    layer(x)
    assert len(seen) == 2  # the export's call only


@pytest.mark.parametrize(
    'cfg, error, match',
    [
        (
            dict(type='Involution', channels=24),
            ValueError,
            r'channels \(24\) must be divisible by group_channels \(16\)',
        ),
        (
            dict(type='Involution', channels=32, kernel_size=4),
            ValueError,
            'odd kernel_size',
        ),
        (
            dict(type='Involution', channels=16, reduction_ratio=32),
            ValueError,
            'reduction_ratio',
        ),
        (dict(type='Involution', channels=32.0), TypeError, 'channels'),
        (dict(type='Involution', channels=32, stride=0), ValueError, 'stride'),
        (
            dict(type='EvolutionConv', channels=6, groups=4),
            ValueError,
            r'channels \(6\) must be divisible by groups \(4\)',
        ),
        (
            dict(type='EvolutionConv', channels=6, kernel_size=2),
            ValueError,
            'odd kernel_size',
        ),
        (
            dict(type='EvolutionConv', channels=6, padding_mode='circular'),
            ValueError,
            'padding_mode',
        ),
        (
            dict(type='ACmix', in_planes=8, out_planes=10, head=4),
            ValueError,
            r'out_planes \(10\) must be divisible by head \(4\)',
        ),
        (
            dict(type='ACmix', in_planes=8, out_planes=8, kernel_att=6),
            ValueError,
            'odd kernel_size',
        ),
        (
            dict(type='ACmix', in_planes=8, out_planes=8, kernel_conv=2),
            ValueError,
            'kernel_conv must be odd',
        ),
        (
            dict(type='LocalSelfAttention', in_channels=10, num_heads=4),
            ValueError,
            r'out_channels \(10\) must be divisible by num_heads',
        ),
        (
            dict(type='ELSA', dim=10, num_heads=4),
            ValueError,
            r'dim_v \(10\) must be divisible by num_heads \(4\)',
        ),
        (
            dict(type='DynamicFilter', channels=8, kernel_combine='max'),
            ValueError,
            'kernel_combine',
        ),
        (
            dict(type='DynamicFilter', channels=8, kernel_size=1),
            ValueError,
            'kernel_size must be >= 3',
        ),
        (dict(type='DynamicFilter', channels=2), ValueError, 'se_ratio'),
        (
            dict(type='Involution', channels=16, norm_cfg='BN'),
            TypeError,
            r"^norm_cfg must be a dict such as dict\(type='BN'\) or None, "
            r"got 'BN'$",
        ),
        (
            dict(type='Involution', channels=16, norm_cfg=dict(type='Foo')),
            ValueError,
            r"^norm_cfg has type 'Foo', which is not registered in "
            r"mmengine's MODELS registry \(e.g. 'BN'\)$",
        ),
        (
            dict(type='Involution', channels=16, norm_cfg=dict(eps=1e-3)),
            ValueError,
            r'^norm_cfg must be a dict with a "type"',
        ),
        (
            dict(type='Involution', channels=16, act_cfg=dict(type='Relu')),
            ValueError,
            r"^act_cfg has type 'Relu', which is not registered",
        ),
        (
            dict(type='Involution', channels=16, act_cfg=dict(type=3)),
            TypeError,
            r'^act_cfg type must be a str or a class, got 3$',
        ),
        # Kernel sizes whose weights no tensor can hold (more than 2**63
        # bytes in float64): PyTorch's allocator would fail naming no
        # argument.
        *(
            (
                {**cfg, name: size},
                ValueError,
                rf'^{name}={size} gives a weight of shape .*: too large',
            )
            for name, size, cfg in [
                (
                    'kernel_size',
                    2**31 + 1,
                    dict(type='Involution', channels=16),
                ),
                (
                    'kernel_size',
                    2**60 + 1,
                    dict(type='LocalSelfAttention', in_channels=8),
                ),
                (
                    'kernel_size',
                    2**31 + 1,
                    dict(
                        type='LocalSelfAttention',
                        in_channels=8,
                        rel_pos_embed=False,
                        rel_pos_bias=True,
                    ),
                ),
                (
                    'kernel_conv',
                    2**15 + 1,
                    dict(type='ACmix', in_planes=4, out_planes=4),
                ),
                (
                    'kernel_size',
                    2**31 + 1,
                    dict(type='ELSA', dim=24, num_heads=2),
                ),
                (
                    'kernel_size',
                    2**31 + 1,
                    dict(type='DynamicFilter', channels=8),
                ),
                (
                    'kernel_size',
                    2**31 + 1,
                    dict(type='EvolutionConv', channels=4),
                ),
            ]
        ),
    ],
)
def test_bad_configuration_fails_at_build(cfg, error, match):
    with pytest.raises(error, match=match):
        MODELS.build(cfg)


@pytest.mark.parametrize('name', sorted(CONFIGS))
def test_wrong_input_channels_is_a_clear_error(name):
    layer = build(name)
    channels = IN_CHANNELS[name]
    with pytest.raises(
        ValueError,
        match=rf'\(B, {channels}, H, W\), got '
        rf'\(1, {channels + 1}, 4, 4\)',
    ):
        layer(torch.randn(1, channels + 1, 4, 4))


@pytest.mark.parametrize(
    'cfg, formula',
    [
        # The parameter formulas of docs/operators.md, in C, K, G, r.
        (
            dict(type='EvolutionConv', channels=12, kernel_size=5, groups=4),
            lambda C, K, G: G * K * K + C,
        ),
        (
            dict(type='Involution', channels=64, kernel_size=7),
            lambda C, K, G, r=4: (
                C * C // r + 2 * C // r + (C // r + 1) * K * K * G
            ),
        ),
        (
            dict(type='DynamicFilter', channels=20, kernel_size=3),
            lambda C, K, G, s=4: (
                (C + 1) * K * K + s * C + s + (s + 1) * C * K * K + C * K * K
            ),
        ),  # s = int(0.2 * C)
        (
            dict(
                type='LocalSelfAttention',
                in_channels=12,
                kernel_size=5,
                num_heads=4,
                rel_pos_bias=True,
            ),
            lambda C, K, G: 3 * C * C + C * K + G * K * K,
        ),
        (
            dict(type='ELSA', dim=24, num_heads=3, kernel_size=5),
            lambda C, K, G, qk=16, w=8: (
                C * (2 * qk + C)
                + qk * (w * K * K + 1)
                + (qk + 1) * K * K * G
                + 2 * C * K * K
                + C * C
                + C
            ),
        ),
        (
            dict(
                type='ACmix', in_planes=16, out_planes=16, kernel_att=7, head=4
            ),
            lambda C, K, G, kc=3: (
                3 * (C * C + C) + 3 * C // G + 3 * G * kc * kc + C * kc**4 + 2
            ),
        ),
    ],
)
def test_parameter_formulas_of_the_docs(cfg, formula):
    layer = MODELS.build(cfg)
    C = next(v for k, v in cfg.items() if k != 'type')
    K = layer.kernel_size
    G = {
        'EvolutionConv': 4,
        'Involution': C // 16,
        'DynamicFilter': C,
        'LocalSelfAttention': 4,
        'ELSA': 3,
        'ACmix': 4,
    }[cfg['type']]
    assert sum(p.numel() for p in layer.parameters()) == formula(C, K, G)
