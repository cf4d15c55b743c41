"""ACmix equals the published forward (unfold + reflection padding)."""

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from mmevo.layers import ACmix


def reflect_pad(x, pad):
    """numpy-style reflection (repeats for pads not smaller than the map),
    as a differentiable gather of numpy's padded indices."""
    rows, cols = (
        torch.from_numpy(np.pad(np.arange(n), pad, mode='reflect'))
        for n in x.shape[-2:]
    )
    return x[..., rows, :][..., cols]


def published_acmix(layer, x):
    """The published ``ACmix.forward`` (ResNet/test_bottleneck.py) with the
    window dilated by ``dilation`` and numpy-style reflection, so it also
    runs where the published code cannot (odd sizes with stride, tiny maps).
    """
    K, s, d = layer.kernel_att, layer.stride, layer.dilation
    head, hd = layer.head, layer.head_dim
    pad = d * (K - 1) // 2
    q, k, v = layer.conv1(x), layer.conv2(x), layer.conv3(x)
    b, c, h, w = q.shape
    loc_w = torch.linspace(-1.0, 1.0, w).unsqueeze(0).repeat(h, 1)
    loc_h = torch.linspace(-1.0, 1.0, h).unsqueeze(1).repeat(1, w)
    loc = torch.cat([loc_w.unsqueeze(0), loc_h.unsqueeze(0)], 0)
    pe = layer.conv_p(loc.unsqueeze(0).to(x.dtype))

    def unfold(t):
        out = F.unfold(reflect_pad(t, pad), K, dilation=d, stride=s)
        return out.view(t.shape[0], t.shape[1], K * K, -1)

    q_att = (q.view(b * head, hd, h, w) * hd**-0.5)[:, :, ::s, ::s]
    q_pe = pe[:, :, ::s, ::s]
    h_out, w_out = q_att.shape[-2:]
    unfold_k = unfold(k.view(b * head, hd, h, w)).view(
        b * head, hd, K * K, h_out, w_out
    )
    unfold_rpe = unfold(pe).view(1, hd, K * K, h_out, w_out)
    att = (
        q_att.unsqueeze(2) * (unfold_k + q_pe.unsqueeze(2) - unfold_rpe)
    ).sum(1)
    att = att.softmax(1)
    out_att = unfold(v.view(b * head, hd, h, w)).view(
        b * head, hd, K * K, h_out, w_out
    )
    out_att = (att.unsqueeze(1) * out_att).sum(2).view(b, c, h_out, w_out)

    f_all = layer.fc(
        torch.cat(
            [
                q.view(b, head, hd, h * w),
                k.view(b, head, hd, h * w),
                v.view(b, head, hd, h * w),
            ],
            1,
        )
    )
    f_conv = f_all.permute(0, 2, 1, 3).reshape(b, -1, h, w)
    out_conv = F.conv2d(f_conv, layer.dep_conv.weight, None, s, 1, groups=hd)
    return layer.rate1 * out_att + layer.rate2 * out_conv


def randomised(layer):
    """Random rates and conv path, so both paths and the mix are tested."""
    with torch.no_grad():
        layer.rate1.uniform_(0.2, 1.0)
        layer.rate2.uniform_(0.2, 1.0)
        layer.dep_conv.weight.normal_()
    return layer


@pytest.mark.parametrize(
    'in_planes, out_planes, kernel_att, head, stride, dilation, size',
    [
        (16, 16, 7, 4, 1, 1, (8, 10)),  # published sizes: pad 3 < map
        (16, 16, 7, 4, 2, 1, (8, 6)),  # stride 2, even
        (8, 16, 5, 2, 1, 1, (6, 7)),  # in != out, odd
        (16, 16, 7, 4, 2, 1, (7, 9)),  # stride 2, odd (published breaks)
        (16, 8, 7, 4, 1, 1, (3, 2)),  # map smaller than the padding
        (16, 16, 7, 4, 2, 1, (2, 3)),
        (8, 8, 3, 2, 1, 2, (6, 5)),  # dilated window
        (8, 8, 7, 4, 1, 1, (1, 1)),
    ],
)
def test_equals_published(
    in_planes, out_planes, kernel_att, head, stride, dilation, size
):
    torch.manual_seed(0)
    layer = randomised(
        ACmix(in_planes, out_planes, kernel_att, head, 3, stride, dilation)
    ).double()
    x = torch.randn(2, in_planes, *size, dtype=torch.float64)
    out = layer(x)
    assert out.shape == (2, out_planes, *tuple(-(-n // stride) for n in size))
    torch.testing.assert_close(out, published_acmix(layer, x))


@pytest.mark.parametrize(
    'stride, size', [(1, (9, 7)), (2, (9, 10)), (2, (3, 4)), (1, (2, 3))]
)
def test_gradients_equal_published(stride, size):
    """Every parameter's and the input's gradient, through the fused
    projection split with its reflection (padding 2: maps just larger than
    it, and not larger), the folded conv path and the rate1 mix."""
    torch.manual_seed(0)
    layer = randomised(ACmix(8, 12, 5, 3, 3, stride)).double()
    x = torch.randn(2, 8, *size, dtype=torch.float64, requires_grad=True)
    weight = torch.randn(
        2, 12, *(-(-n // stride) for n in size), dtype=torch.float64
    )
    inputs = [x, *list(layer.parameters())]
    ours = torch.autograd.grad((layer(x) * weight).sum(), inputs)
    theirs = torch.autograd.grad(
        (published_acmix(layer, x) * weight).sum(), inputs
    )
    names = ['x'] + [name for name, _ in layer.named_parameters()]
    for name, a, b in zip(names, ours, theirs, strict=True):
        if name == 'conv_p.bias':  # shifts every logit of a window alike:
            torch.testing.assert_close(a, torch.zeros_like(a))  # exactly 0
            continue
        torch.testing.assert_close(a, b, msg=name)


@pytest.mark.slow
def test_torch_compile_matches_eager():
    """The layer (its autograd functions and the fused ops) compiles, and
    the compiled forward and gradients are the eager ones."""
    torch.manual_seed(0)
    layer = randomised(ACmix(8, 8, 5, 2, 3, 2))
    x = torch.randn(2, 8, 9, 10, requires_grad=True)
    inputs = [x, *list(layer.parameters())]
    outs = []
    for fn in (torch.compile(layer), layer):
        y = fn(x)
        outs.append([y, *list(torch.autograd.grad(y.square().sum(), inputs))])
    for a, b in zip(*outs, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-4)


def test_reflection_pad2d_where_published_runs():
    """On the published sizes our numpy-style pad is ReflectionPad2d."""
    x = torch.randn(1, 2, 8, 9, dtype=torch.float64)
    torch.testing.assert_close(
        reflect_pad(x, 3), torch.nn.ReflectionPad2d(3)(x)
    )


def test_published_init_and_names():
    layer = ACmix(64, 64)
    shapes = {k: tuple(v.shape) for k, v in layer.state_dict().items()}
    assert shapes == {
        'rate1': (1,),
        'rate2': (1,),
        'conv1.weight': (64, 64, 1, 1),
        'conv1.bias': (64,),
        'conv2.weight': (64, 64, 1, 1),
        'conv2.bias': (64,),
        'conv3.weight': (64, 64, 1, 1),
        'conv3.bias': (64,),
        'conv_p.weight': (16, 2, 1, 1),
        'conv_p.bias': (16,),
        'fc.weight': (9, 12, 1, 1),
        'dep_conv.weight': (64, 9, 3, 3),
    }
    assert layer.rate1.item() == layer.rate2.item() == 0.5
    # Shift init: input channel t of each group is one-hot at (t//3, t%3).
    w = layer.dep_conv.weight
    for t in range(9):
        onehot = torch.zeros(3, 3)
        onehot[t // 3, t % 3] = 1
        assert torch.equal(w[:, t], onehot.expand(64, 3, 3))


def test_shift_init_survives_parent_init():
    """A parent's generic conv init must not wipe the shift kernels."""
    from mmengine.model import BaseModule

    class Parent(BaseModule):
        def __init__(self):
            super().__init__(
                init_cfg=dict(type='Normal', layer='Conv2d', std=1.0)
            )
            self.mix = ACmix(8, 8, 3, 2)

    parent = Parent()
    parent.init_weights()
    assert parent.mix.rate1.item() == 0.5
    assert parent.mix.dep_conv.weight.sum().item() == 8 * 9
