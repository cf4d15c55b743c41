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


@pytest.mark.parametrize('layout', ['nchw', 'channels_last'])
@pytest.mark.parametrize('cls,tiny', BACKBONES)
def test_backbone_inference_fast_path_equals_stock(cls, tiny, layout):
    """Eval mode under ``torch.no_grad`` (where the BNs with their
    shortcuts and ReLUs take the inference kernel, over the convolutions'
    outputs), NCHW and a channels_last model and input: the stock outputs,
    from fewer conv module calls (the fast path ran); the input
    untouched."""
    torch.manual_seed(0)
    fmt = getattr(torch, layout, torch.contiguous_format)
    model = helpers.randomised(cls(26, **tiny)).double().eval()
    model = model.to(memory_format=fmt)
    x = torch.rand(2, 3, 41, 37, dtype=torch.float64)
    x = x.contiguous(memory_format=fmt)
    x0 = x.clone()
    outs, calls = [], []
    for on in (True, False):
        set_cpu_fastpath(model, on)
        counted = helpers.count_conv_calls(model)
        with torch.no_grad():
            outs.append(model(x))
        calls.append(len(counted))
        helpers.uncount_conv_calls(model)
    assert calls[0] < calls[1]
    for a, b in zip(*outs, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12)
    assert torch.equal(x, x0)


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


@pytest.mark.parametrize('mode', ['train', 'eval'])
@pytest.mark.parametrize('cls,tiny', BACKBONES)
def test_channels_last_model_fast_path_equals_stock(cls, tiny, mode):
    """A model and input in channels_last (``model.to(memory_format=
    torch.channels_last)``, a common CPU setting) train and infer on the
    fast path to the stock numbers and gradients (the stem's in-place ReLU
    must not meet its channels_last input as a custom Function's view),
    and the input's gradient keeps the input's layout."""
    torch.manual_seed(0)
    model = helpers.randomised(cls(26, **tiny)).double()
    model = model.to(memory_format=torch.channels_last)
    x = torch.rand(2, 3, 41, 37, dtype=torch.float64)
    x = x.contiguous(memory_format=torch.channels_last)
    helpers.assert_paths_equal(model.train(mode == 'train'), x)
    for on in (True, False):
        grad = helpers.run(model, x, on)[1]
        assert grad.is_contiguous(memory_format=torch.channels_last)


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


@pytest.mark.parametrize('backend', ['onednn', 'matmul'])
def test_float32_fast_path_is_as_accurate_as_stock(
    threads, backend, monkeypatch
):
    """RedNet in float32, its blocks' 1x1 convs on oneDNN or the matmul
    (``MMEVO_CONV1X1``): every output and gradient is as close to the
    float64 stock graph as the float32 stock graph's (float32 BatchNorm
    over a small batch amplifies rounding)."""
    monkeypatch.setenv('MMEVO_CONV1X1', backend)
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


class _Stem(nn.Module):
    """A backbone's ``forward_stem`` as a module (for ``saved_bytes``)."""

    def __init__(self, backbone):
        super().__init__()
        self.backbone = backbone

    def forward(self, x):
        return self.backbone.forward_stem(x)


def _stem_step(model, x, double):
    """Stem output, input gradient, stem parameter gradients and buffers
    after one backward (of a gradient penalty if ``double``)."""
    x = x.clone().requires_grad_()
    y = model.forward_stem(x)
    w = torch.randn(y.shape, generator=torch.Generator().manual_seed(1))
    loss = (y * w.to(y.dtype)).sum()
    if double:
        (g,) = torch.autograd.grad(loss * loss, x, create_graph=True)
        loss = (g * g).sum()
    loss.backward()
    grads = {
        n: p.grad for n, p in model.named_parameters() if p.grad is not None
    }
    buffers = {n: b.clone() for n, b in model.named_buffers()}
    return y, x.grad, grads, buffers


@pytest.mark.parametrize('double', [False, True], ids=['backward', 'double'])
@pytest.mark.parametrize('norm_eval', [False, True])
@pytest.mark.parametrize('cls,tiny', BACKBONES)
def test_stem_fast_path_recomputes_like_the_stock_stem(
    cls, tiny, norm_eval, double
):
    """The fast stem keeps only the inputs of its BN-ReLU(-pool) runs and
    recomputes the rest in the backward: in float64 its output, the input
    gradient, every stem parameter's gradient (twice differentiated too)
    and the BN buffers (running statistics updated once, counted once)
    equal the stock stem's, in a train step and with ``norm_eval``."""
    torch.manual_seed(0)
    model = helpers.randomised(cls(26, norm_eval=norm_eval, **tiny))
    model = model.double().train()
    x = torch.rand(2, 3, 41, 37, dtype=torch.float64)
    fast = _stem_step(set_cpu_fastpath(copy.deepcopy(model), True), x, double)
    stock = _stem_step(set_cpu_fastpath(model, False), x, double)
    for a, b in zip(fast[:2], stock[:2], strict=True):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-12)
    assert set(fast[2]) == set(stock[2]) and stock[2]
    for name, g in stock[2].items():
        scale = max(1.0, float(g.abs().max()))
        torch.testing.assert_close(
            fast[2][name], g, rtol=1e-10, atol=1e-12 * scale, msg=name
        )
    assert set(fast[3]) == set(stock[3])
    for name, b in stock[3].items():
        torch.testing.assert_close(fast[3][name], b, rtol=1e-12, atol=0)
    tracked = stock[3][next(n for n in stock[3] if 'num_batches' in n)]
    assert int(tracked) == (0 if norm_eval else 1)


@pytest.mark.parametrize('cls,tiny', BACKBONES)
def test_stem_fast_path_keeps_less_for_the_backward(cls, tiny):
    """In a train step the fast stem does not keep the last ReLU's output
    nor the max-pool's int64 indices, nor a deep stem's first conv output
    (its input, the image, is all it keeps of that conv, BN and ReLU):
    at least those bytes fewer than the stock stem saves. The stem's
    involution runs stock on both paths, to leave it out of the count."""
    torch.manual_seed(0)
    model = cls(26, **tiny).train()
    x = torch.rand(2, 3, 64, 64)
    stem = _Stem(model)
    if model.deep_stem:
        set_cpu_fastpath(model.stem[1], False)
    fast = helpers.saved_bytes(stem, x)
    stock = helpers.saved_bytes(set_cpu_fastpath(stem, False), x)
    channels = tiny['stem_channels']
    relu_out = 2 * channels * 32 * 32 * 4
    indices = 2 * channels * 16 * 16 * 8
    first_conv_out = (
        2 * (channels // 2) * 32 * 32 * 4 if model.deep_stem else 0
    )
    assert fast <= stock - relu_out - indices - first_conv_out, (fast, stock)


def test_stem_with_group_norm_runs_its_modules():
    """A norm other than BatchNorm (GN here), which the fast stem does not
    recompute: it runs the modules as they are, the stock numbers."""
    torch.manual_seed(0)
    model = RedNet(26, norm_cfg=dict(type='GN', num_groups=4), **TINY_RED)
    model = helpers.randomised(model).double().train()
    x = torch.rand(2, 3, 41, 37, dtype=torch.float64)
    fast = _stem_step(set_cpu_fastpath(copy.deepcopy(model), True), x, False)
    stock = _stem_step(set_cpu_fastpath(model, False), x, False)
    for a, b in zip(fast[:2], stock[:2], strict=True):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-12)
    for name, g in stock[2].items():
        torch.testing.assert_close(fast[2][name], g, rtol=1e-9, atol=1e-10)


def test_stem_fast_path_recomputes_under_the_forwards_autocast():
    """Under CPU autocast (bfloat16) the backward recomputes the stem's
    first conv, BN and ReLU in the forward's dtypes: its gradients are the
    stock graph's to a few bfloat16 roundings (2^-8 each), where they were
    2.6% off when the recomputation ran in float32. Measured: under 0.4% on an
    AVX-512 host, 0.77% on one without, where both paths are 9.3% from
    the float64 gradient. The stem's involution runs stock on both paths,
    to compare the recomputation alone."""
    torch.manual_seed(0)
    model = RedNet(26, **TINY_RED).train()
    x = torch.rand(2, 3, 41, 37)
    got = []
    for on in (True, False):
        net = set_cpu_fastpath(copy.deepcopy(model), on)
        set_cpu_fastpath(net.stem[1], False)
        inp = x.clone().requires_grad_()
        with torch.autocast('cpu', dtype=torch.bfloat16):
            y = net.forward_stem(inp)
        assert y.dtype == torch.bfloat16
        (y.float() ** 2).sum().backward()
        grads = {n: p.grad for n, p in net.named_parameters()}
        got.append((y.float(), inp.grad, grads))
    (y_fast, gx_fast, fast), (y_stock, gx_stock, stock) = got
    torch.testing.assert_close(y_fast, y_stock, rtol=0, atol=0)

    def rel(a, b):
        return float((a - b).norm() / b.norm())

    assert rel(gx_fast, gx_stock) < 1.2e-2
    for name, g in stock.items():
        if g is not None:
            assert rel(fast[name], g) < 1.2e-2, (name, rel(fast[name], g))
