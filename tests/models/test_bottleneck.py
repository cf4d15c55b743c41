"""mmevo's bottleneck forward equals mmdet's ``Bottleneck.forward``.

mmevo owns the one bottleneck forward it needs (no plugins); these tests
hold it to mmdet's, in float64, values and gradients, on both CPU paths,
with and without ``with_cp`` and a (strided) downsample:

* with a 3x3 convolution as the middle layer, against a genuine mmdet
  ``Bottleneck`` carrying the same weights;
* with an involution as the middle layer, against mmdet's forward called on
  a copy of mmevo's block.
"""

import copy
import warnings

import pytest
import torch
from mmdet.models.backbones.resnet import Bottleneck
from torch import nn
from torch.nn.modules.batchnorm import _BatchNorm

from mmevo.layers import Involution, set_cpu_fastpath
from mmevo.models.backbones.bottleneck import MiddleLayerBottleneck


def conv3x3(planes, stride, dilation):
    """The 3x3 conv mmdet's Bottleneck builds as its conv2."""
    return nn.Conv2d(planes, planes, 3, stride, dilation, dilation, bias=False)


def involution(planes, stride, dilation):
    return Involution(planes, 3, stride, dilation=dilation)


def downsample(inplanes, planes, stride):
    """ResLayer's shortcut: strided 1x1 conv and BN."""
    return nn.Sequential(
        nn.Conv2d(inplanes, planes * 4, 1, stride, bias=False),
        nn.BatchNorm2d(planes * 4),
    )


def randomised(block):
    with torch.no_grad():
        for m in block.modules():
            if isinstance(m, _BatchNorm):
                nn.init.uniform_(m.weight, 0.5, 1.5)
                nn.init.uniform_(m.bias, -0.2, 0.2)
                nn.init.uniform_(m.running_var, 0.5, 1.5)
                nn.init.normal_(m.running_mean, 0, 0.1)
    return block.double()


def step(block, x, forward):
    """Output, input and parameter gradients and buffers of one train step
    of ``forward(x)``."""
    x = x.clone().requires_grad_()
    with warnings.catch_warnings():
        # mmdet's reentrant checkpoint warns about use_reentrant
        warnings.simplefilter('ignore')
        out = forward(x)
    gen = torch.Generator().manual_seed(1)
    (
        out * torch.randn(out.shape, generator=gen, dtype=out.dtype)
    ).sum().backward()
    grads = {n: p.grad for n, p in block.named_parameters()}
    return out, x.grad, grads, dict(block.named_buffers())


def assert_steps_equal(ours, theirs, buffers=True):
    torch.testing.assert_close(ours[0], theirs[0], rtol=1e-9, atol=1e-12)
    torch.testing.assert_close(ours[1], theirs[1], rtol=1e-9, atol=1e-12)
    assert set(ours[2]) == set(theirs[2])
    for name, grad in theirs[2].items():
        assert grad is not None, name
        torch.testing.assert_close(
            ours[2][name], grad, rtol=1e-9, atol=1e-12, msg=name
        )
    if buffers:
        for name, buf in theirs[3].items():
            torch.testing.assert_close(
                ours[3][name], buf, rtol=1e-9, atol=1e-12, msg=name
            )


GEOMETRIES = {
    'identity': dict(inplanes=64, stride=1, shortcut=False, size=(9, 7)),
    'downsample': dict(inplanes=32, stride=1, shortcut=True, size=(8, 7)),
    'strided_downsample': dict(
        inplanes=32, stride=2, shortcut=True, size=(9, 10)
    ),
}


def build_pair(geometry, middle, with_cp):
    """mmevo's block and a reference with mmdet's forward, same weights."""
    g = GEOMETRIES[geometry]
    torch.manual_seed(0)
    kwargs = dict(
        stride=g['stride'],
        dilation=2 if middle is involution else 1,
        with_cp=with_cp,
        downsample=downsample(g['inplanes'], 16, g['stride'])
        if g['shortcut']
        else None,
    )
    ours = randomised(
        MiddleLayerBottleneck(g['inplanes'], 16, middle, **kwargs)
    )
    if middle is conv3x3:
        # its own shortcut module: gradients must not accumulate in ours
        kwargs['downsample'] = copy.deepcopy(kwargs['downsample'])
        theirs = Bottleneck(g['inplanes'], 16, **kwargs).double()
        theirs.load_state_dict(ours.state_dict())
    else:
        theirs = copy.deepcopy(ours)
    x = torch.randn(2, g['inplanes'], *g['size'], dtype=torch.float64)
    return ours, theirs, x


@pytest.mark.parametrize('fast', [True, False])
@pytest.mark.parametrize('with_cp', [False, True])
@pytest.mark.parametrize('middle', [conv3x3, involution])
@pytest.mark.parametrize('geometry', sorted(GEOMETRIES))
def test_forward_equals_mmdet(geometry, middle, with_cp, fast):
    ours, theirs, x = build_pair(geometry, middle, with_cp)
    set_cpu_fastpath(ours, fast)
    set_cpu_fastpath(theirs, False)
    mine = step(ours.train(), x, ours)
    reference = step(
        theirs.train(), x, lambda t: Bottleneck.forward(theirs, t)
    )
    # mmdet's checkpoint recomputes its BNs in train mode, updating their
    # statistics twice: those are compared below, against no checkpoint.
    assert_steps_equal(mine, reference, buffers=not with_cp)
    if with_cp:
        _, plain, x = build_pair(geometry, middle, False)
        set_cpu_fastpath(plain, False)
        once = step(plain.train(), x, lambda t: Bottleneck.forward(plain, t))
        assert_steps_equal(mine, once)
        assert all(
            buf == 1
            for name, buf in mine[3].items()
            if name.endswith('num_batches_tracked')
        )


@pytest.mark.parametrize('middle', [conv3x3, involution])
def test_eval_forward_equals_mmdet(middle):
    ours, theirs, x = build_pair('strided_downsample', middle, False)
    with torch.no_grad():
        torch.testing.assert_close(
            ours.eval()(x), Bottleneck.forward(theirs.eval(), x)
        )


def test_with_cp_recomputes_the_block():
    """with_cp really checkpoints: the middle layer runs again in the
    backward, and not at all without an input gradient."""
    ours, _, x = build_pair('downsample', involution, True)
    calls = []
    ours.conv2.register_forward_pre_hook(lambda *args: calls.append(1))
    ours.train()(x.requires_grad_()).sum().backward()
    assert len(calls) == 2
    with torch.no_grad():
        ours(x)
    assert len(calls) == 3


@pytest.mark.parametrize(
    'name, value',
    [
        (
            'plugins',
            [
                dict(
                    cfg=dict(type='ContextBlock', ratio=0.25),
                    position='after_conv3',
                )
            ],
        ),
        ('dcn', dict(type='DCN', deform_groups=1)),
    ],
)
def test_plugins_and_dcn_are_refused(name, value):
    with pytest.raises(
        ValueError, match=f'{name} must be None for a dynamic middle'
    ):
        MiddleLayerBottleneck(64, 16, conv3x3, **{name: value})
