"""The CPU fast paths of the backbones equal their stock graph.

Both backbones (and their blocks) run with ``use_cpu_fastpath`` on and off
on the same float64 input: outputs and all gradients agree
(``tests/fastpath_helpers.py``, shared with the layer tests).
"""

import copy

import pytest
import torch
from torch import nn

from mmevo.layers import set_cpu_fastpath
from mmevo.models import ACmixResNet, RedNet

import fastpath_helpers as helpers

TINY_RED = dict(stem_channels=32, base_channels=16)
TINY_ACMIX = dict(stem_channels=16, base_channels=16)
BACKBONES = [(RedNet, TINY_RED), (ACmixResNet, TINY_ACMIX)]


@pytest.mark.parametrize('mode', ['train', 'eval'])
@pytest.mark.parametrize('cls,tiny', BACKBONES)
def test_backbone_fast_path_equals_stock(cls, tiny, mode):
    torch.manual_seed(0)
    model = helpers.randomised(cls(26, **tiny)).double()
    x = torch.rand(2, 3, 41, 37, dtype=torch.float64)
    helpers.assert_paths_equal(model.train(mode == 'train'), x)


@pytest.mark.parametrize('cls,tiny', BACKBONES)
def test_backbone_fast_path_equals_stock_with_checkpointing(cls, tiny):
    """``with_cp=True`` (activations recomputed in the backward) changes
    neither path: in float64 the gradients agree as without it. (In fp32
    both paths are as far from float64 as each other: ~3% relative on the
    last stage's weights at batch 2, BN over 2x2 maps.)"""
    torch.manual_seed(0)
    model = helpers.randomised(cls(26, with_cp=True, **tiny)).double()
    x = torch.rand(2, 3, 41, 37, dtype=torch.float64)
    helpers.assert_paths_equal(model.train(), x)


def test_fast_paths_keep_nchw_outputs_and_gradient():
    """The channels_last stem hands the caller NCHW outputs and an NCHW
    input gradient, as the stock graph does."""
    for model in (RedNet(26, **TINY_RED), ACmixResNet(26, **TINY_ACMIX)):
        x = torch.rand(2, 3, 40, 36, requires_grad=True)
        outs = model.eval()(x)
        assert all(o.is_contiguous() for o in outs)
        sum(o.sum() for o in outs).backward()
        assert x.grad.is_contiguous()


def test_stock_path_calls_every_conv_module():
    """Switch off: every nn.Conv2d of the backbones runs as a module (its
    forward hook fires), the ACmix projections, fc and dep_conv included."""
    for model in (RedNet(26, **TINY_RED), ACmixResNet(26, **TINY_ACMIX)):
        calls = helpers.count_conv_calls(set_cpu_fastpath(model, False))
        with torch.no_grad():
            model.eval()(torch.rand(1, 3, 32, 32))
        convs = [m for m in model.modules() if isinstance(m, nn.Conv2d)]
        assert set(map(id, calls)) == set(map(id, convs))
        assert len(calls) == len(convs)


def test_every_block_and_layer_has_the_switch():
    model = RedNet(26, **TINY_RED)
    switches = [m for m in model.modules() if hasattr(m, 'use_cpu_fastpath')]
    # the backbone, 8 blocks, their 8 involutions and the stem's
    assert len(switches) == 1 + 8 + 8 + 1
    assert all(m.use_cpu_fastpath for m in switches)
    set_cpu_fastpath(model, False)
    assert not any(m.use_cpu_fastpath for m in switches)


@pytest.mark.parametrize('size', [48, 64])
@pytest.mark.parametrize('cls,tiny', BACKBONES)
def test_fast_path_saves_no_more_than_stock(cls, tiny, size):
    """The channels_last copies of the fast path are not kept beside the
    NCHW maps they copy: at 48² (every involution unfused) RedNet's fast
    path saves what the stock graph saves, at 64² (fused stem) less."""
    torch.manual_seed(0)
    model = cls(26, **tiny).train()
    x = torch.rand(2, 3, size, size)
    fast = helpers.saved_bytes(set_cpu_fastpath(model, True), x)
    stock = helpers.saved_bytes(set_cpu_fastpath(model, False), x)
    assert fast <= stock, (fast, stock)


def test_float32_fast_path_is_as_accurate_as_stock(threads):
    """RedNet in float32, its blocks' 1x1 convs on oneDNN: every output and
    gradient is as close to the float64 stock graph as the float32 stock
    graph's (float32 BatchNorm over a small batch amplifies rounding)."""
    torch.manual_seed(0)
    model = helpers.randomised(RedNet(26, **TINY_RED)).train()
    ref = copy.deepcopy(model).double()
    stock = set_cpu_fastpath(copy.deepcopy(model), False)
    set_cpu_fastpath(ref, False)
    x = torch.randn(2, 3, 35, 29, dtype=torch.float64)
    helpers.assert_float32_as_accurate(model, stock, ref, x)


@pytest.mark.parametrize('cls,tiny', BACKBONES)
def test_forward_stem_is_the_input_of_layer1(cls, tiny):
    """``forward_stem`` on either path: the stock stem and max pool, in
    float64, values and the input gradient."""
    torch.manual_seed(0)
    model = helpers.randomised(cls(26, **tiny)).double().train()
    x = torch.rand(2, 3, 41, 37, dtype=torch.float64)
    got = []
    for on in (True, False):
        inp = x.clone().requires_grad_()
        set_cpu_fastpath(model, on)
        out = model.forward_stem(inp)
        (out * out).sum().backward()
        got.append((out, inp.grad))
    set_cpu_fastpath(model, True)
    stem = (
        model.stem
        if model.deep_stem
        else nn.Sequential(model.conv1, model.norm1, model.relu)
    )
    torch.testing.assert_close(
        got[1][0], model.maxpool(stem(x)), rtol=1e-12, atol=1e-12
    )
    for a, b in zip(got[0], got[1], strict=True):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-12)
