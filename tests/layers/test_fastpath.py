"""The CPU fast paths of the layers equal their stock graph; the switch.

Every layer runs twice on the same float64 input, with ``use_cpu_fastpath``
on and off (``fastpath_helpers.assert_paths_equal``).
"""

import contextlib
import copy
import functools
import os
import subprocess
import sys

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from mmevo.layers import (
    ELSA,
    ACmix,
    DynamicFilter,
    EvolutionConv,
    Involution,
    LocalSelfAttention,
    set_cpu_fastpath,
)
from mmevo.layers.fastpath import (
    avg_pool,
    call_cpu_kernel,
    conv1x1,
    cpu_fastpath_scope,
    pointwise,
    takes_avg_pool_conv,
    takes_cpu_fastpath,
    takes_onednn_conv1x1,
)
from mmevo.ops import cpp_backend

from fastpath_helpers import (
    assert_float32_as_accurate,
    assert_paths_equal,
    count_conv_calls,
    randomised,
)

ROOT = os.path.dirname(
    os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
)


LAYERS = {
    'evolution_conv_s2': (
        lambda: EvolutionConv(8, 3, stride=2),
        8,
        (7, 6),
        False,
    ),
    'involution': (lambda: Involution(16, 7), 16, (9, 7), True),
    'involution_s2_odd': (lambda: Involution(32, 3, 2), 32, (7, 9), True),
    'involution_no_norm_act': (
        lambda: Involution(16, 3, norm_cfg=None, act_cfg=None),
        16,
        (5, 6),
        True,
    ),
    # conv1's in-place ReLU straight on the matmul's output
    'involution_no_norm': (
        lambda: Involution(16, 3, norm_cfg=None),
        16,
        (5, 6),
        True,
    ),
    'involution_gn_gelu': (
        lambda: Involution(
            16,
            3,
            norm_cfg=dict(type='GN', num_groups=2),
            act_cfg=dict(type='GELU'),
        ),
        16,
        (5, 6),
        True,
    ),
    'dynamic_filter_s2': (
        lambda: DynamicFilter(8, stride=2),
        8,
        (7, 8),
        False,
    ),
    'local_self_attention_s2': (
        lambda: LocalSelfAttention(8, num_heads=2, kernel_size=3, stride=2),
        8,
        (7, 6),
        False,
    ),
    'elsa_s2': (
        lambda: ELSA(24, 2, kernel_size=3, stride=2),
        24,
        (7, 6),
        False,
    ),
    # ELSA's fast path calls the same conv modules; the saved-tensor test
    # below tells that it ran.
    'elsa_swin_block': (
        lambda: ELSA(24, 3, kernel_size=5, qk_scale=1.0, group_width=4, lam=0),
        24,
        (9, 7),
        False,
    ),
    'elsa_s2_dilated_additive': (
        lambda: ELSA(24, 2, kernel_size=3, stride=2, dilation=2, lam=0),
        24,
        (7, 9),
        False,
    ),
    'acmix': (lambda: ACmix(8, 8, 5, 2), 8, (9, 7), True),
    'acmix_in_ne_out': (lambda: ACmix(8, 12, 5, 3), 8, (6, 7), True),
    'acmix_s2_odd': (lambda: ACmix(8, 8, 5, 2, stride=2), 8, (7, 9), True),
    'acmix_dilated_kc5': (
        lambda: ACmix(8, 8, 3, 2, kernel_conv=5, dilation=2),
        8,
        (9, 8),
        True,
    ),
    # maps not larger than the reflection padding (3 for kernel 7)
    'acmix_tiny_map': (lambda: ACmix(8, 8, 7, 2), 8, (3, 2), True),
    'acmix_s2_tiny_map': (
        lambda: ACmix(8, 8, 7, 2, stride=2),
        8,
        (2, 3),
        True,
    ),
}


@pytest.mark.parametrize('mode', ['train', 'eval'])
@pytest.mark.parametrize('name', sorted(LAYERS))
def test_layer_fast_path_equals_stock(name, mode):
    build, channels, size, has_fast_path = LAYERS[name]
    torch.manual_seed(0)
    layer = randomised(build()).double().train(mode == 'train')
    x = torch.randn(2, channels, *size, dtype=torch.float64)
    assert_paths_equal(layer, x, has_fast_path)


def test_acmix_generate_is_the_stock_graph():
    """``generate`` (the kernel of the attention path) is the published
    graph whatever the switch, and equals the kernel the fast forward
    aggregates."""
    torch.manual_seed(0)
    layer = randomised(ACmix(8, 8, 5, 2, stride=2)).double()
    x = torch.randn(2, 8, 7, 9, dtype=torch.float64)
    calls = count_conv_calls(layer)
    seen = []
    layer.register_kernel_hook(lambda m, k: seen.append(k))
    value, kernel = layer.generate(x)
    assert len(calls) == 4  # conv1..3 and conv_p, as modules
    torch.testing.assert_close(value, layer.conv3(x))
    del calls[:]
    layer(x)  # the fast path
    assert len(calls) == 0
    torch.testing.assert_close(seen[0], kernel, rtol=1e-9, atol=1e-12)


def _saved_shapes(layer, x):
    shapes = []

    def pack(t):
        shapes.append(tuple(t.shape))
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        layer(x).sum().backward()
    return shapes


def test_elsa_fast_path_never_stores_the_per_channel_kernel():
    """With the additive ghost head alone (lam = 0, ELSA-Swin), the fast
    path keeps only the per-head maps for the backward; the stock path and
    a kernel hook, which must see the published kernel, keep it."""
    torch.manual_seed(0)
    layer = ELSA(24, 3, kernel_size=5, lam=0, gamma=1)
    x = torch.randn(2, 24, 9, 7)
    per_channel = (2, 24, 5, 5, 9, 7)
    per_head = (2, 3, 5, 5, 9, 7)
    fast = _saved_shapes(layer, x)
    assert per_head in fast and per_channel not in fast
    stock = _saved_shapes(set_cpu_fastpath(layer, False), x)
    assert per_channel in stock
    set_cpu_fastpath(layer, True)
    seen = []
    handle = layer.register_kernel_hook(lambda m, k: seen.append(k))
    assert per_channel in _saved_shapes(layer, x)
    assert [tuple(k.shape) for k in seen] == [per_channel]
    handle.remove()
    with torch.no_grad():
        _, kernel = layer.generate(x)
    torch.testing.assert_close(seen[0], kernel)


def test_elsa_fast_path_low_precision_and_empty_batch():
    """bf16 / fp16 follow the float64 stock path; an empty batch runs."""
    torch.manual_seed(0)
    layer = ELSA(24, 3, kernel_size=5, lam=0)
    x = torch.randn(2, 24, 9, 7)
    ref = set_cpu_fastpath(layer.double(), False)(x.double())
    set_cpu_fastpath(layer, True)
    for dtype, tol in ((torch.bfloat16, 5e-2), (torch.float16, 5e-3)):
        out = layer.to(dtype)(x.to(dtype))
        assert out.dtype == dtype
        torch.testing.assert_close(out.double(), ref, atol=tol, rtol=tol)
    empty = torch.zeros(0, 24, 9, 7, requires_grad=True)
    out = layer.float()(empty)
    assert out.shape == (0, 24, 9, 7)
    out.sum().backward()
    assert empty.grad.shape == empty.shape


def test_switch_defaults_on_and_set_cpu_fastpath_reaches_every_layer():
    model = nn.Sequential(Involution(16, 3), nn.ReLU(), ACmix(16, 16, 3, 2))
    x = torch.zeros(1, 16, 4, 4)
    layers = [model[0], model[2]]
    assert all(m.use_cpu_fastpath for m in layers)
    assert all(takes_cpu_fastpath(m, x) for m in layers)
    assert set_cpu_fastpath(model, False) is model
    assert not any(
        m.use_cpu_fastpath or takes_cpu_fastpath(m, x) for m in layers
    )
    assert not hasattr(model[1], 'use_cpu_fastpath')
    with pytest.raises(TypeError, match='on must be a bool, got str'):
        set_cpu_fastpath(model, '0')


def test_tracing_inside_a_fast_path_body_runs_the_stock_graph():
    """A layer traced while a fast-path body runs (a submodule traced on
    its own inside an eager forward) still traces the stock graph."""
    layer = ACmix(8, 8, 5, 2).eval()
    x = torch.randn(1, 8, 6, 7)
    with cpu_fastpath_scope():
        traced = torch.jit.trace(layer, x)
    graph = str(traced.inlined_graph)
    assert 'baddbmm' not in graph and 'aten::_convolution' in graph


def test_tracing_runs_the_stock_graph():
    """Under torch.jit.trace the stock path runs even with the switch on:
    the hooks fire and the trace holds the published convs."""
    layer = ACmix(8, 8, 5, 2).eval()
    assert layer.use_cpu_fastpath
    calls = count_conv_calls(layer)
    x = torch.randn(1, 8, 6, 7)
    traced = torch.jit.trace(layer, x)
    assert {id(m) for m in calls} == {
        id(m) for m in layer.modules() if isinstance(m, nn.Conv2d)
    }
    graph = str(traced.inlined_graph)
    assert 'baddbmm' not in graph and 'aten::_convolution' in graph
    torch.testing.assert_close(traced(x), layer(x), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize(
    'build', [lambda: Involution(16, 3), lambda: ACmix(16, 16, 3, 2)]
)
@pytest.mark.slow
def test_compiling_runs_the_stock_graph(build):
    """torch.compile captures the stock graph (convolutions, no matmuls)
    even with the switch on, and computes what eager mode computes."""
    graphs = []

    def backend(gm, example_inputs):
        graphs.append(gm.code)
        return gm.forward

    torch.manual_seed(0)
    layer = build().eval()
    assert layer.use_cpu_fastpath
    x = torch.randn(1, 16, 5, 4)
    out = torch.compile(layer, backend=backend)(x)
    assert graphs and 'conv' in graphs[0]
    assert not any('bmm' in code for code in graphs)
    torch.testing.assert_close(out, layer(x), rtol=1e-5, atol=1e-5)


def test_other_devices_run_the_stock_graph():
    """A meta tensor is not a CPU tensor: the stock path runs on it."""
    layer = Involution(16, 3).to('meta')
    assert not takes_cpu_fastpath(layer, torch.zeros(1, device='meta'))
    calls = count_conv_calls(layer)
    out = layer(torch.zeros(2, 16, 5, 4, device='meta'))
    assert out.shape == (2, 16, 5, 4) and len(calls) == 2


def _python(code, **env):
    return subprocess.run(
        [sys.executable, '-c', code],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        env=dict(os.environ, PYTHONPATH=ROOT, **env),
    )


@pytest.mark.slow
def test_environment_variable_sets_the_default():
    code = (
        'import torch\n'
        'from mmevo.layers import Involution\n'
        'layer = Involution(16, 3)\n'
        'calls = []\n'
        'conv = layer.conv2.conv\n'
        '# counted without a hook: a hook makes the fast path step aside\n'
        'forward = type(conv).forward\n'
        'conv.forward = lambda x: calls.append(1) or forward(conv, x)\n'
        'layer(torch.randn(1, 16, 4, 4))\n'
        'print(layer.use_cpu_fastpath, len(calls))\n'
    )
    off = _python(code, MMEVO_CPU_FASTPATH='0')
    assert off.returncode == 0, off.stderr[-2000:]
    assert off.stdout.split() == ['False', '1']
    on = _python(code, MMEVO_CPU_FASTPATH='1')
    assert on.stdout.split() == ['True', '0'], on.stderr[-2000:]
    bad = _python(code, MMEVO_CPU_FASTPATH='yes')
    assert bad.returncode != 0
    assert "MMEVO_CPU_FASTPATH must be '0' or '1', got 'yes'" in bad.stderr
    # The ops hold no model knowledge: the variable is not theirs.
    ops = _python('import mmevo.ops', MMEVO_CPU_FASTPATH='yes')
    assert ops.returncode == 0, ops.stderr[-2000:]


# The matmul 1x1 convolution on its own: maps of 1 to 1280 pixels, so both
# weight-gradient branches (one matmul for small maps, one per image for
# large ones) whatever the threshold between them.
@pytest.mark.parametrize('size', [(1, 1), (7, 7), (3, 50), (13, 11), (32, 40)])
@pytest.mark.parametrize('bias', [True, False])
def test_pointwise_equals_conv2d_with_gradients(size, bias):
    gen = torch.Generator().manual_seed(size[0])
    x = torch.randn(
        3, 6, *size, generator=gen, dtype=torch.float64, requires_grad=True
    )
    w = torch.randn(
        5, 6, 1, 1, generator=gen, dtype=torch.float64, requires_grad=True
    )
    b = (
        torch.randn(5, generator=gen, dtype=torch.float64, requires_grad=True)
        if bias
        else None
    )
    inputs = [t for t in (x, w, b) if t is not None]
    g = torch.randn(3, 5, *size, generator=gen, dtype=torch.float64)
    ours = pointwise(x, w, b)
    ref = F.conv2d(x, w, b)
    torch.testing.assert_close(ours, ref)
    for a, r in zip(
        torch.autograd.grad(ours, inputs, g),
        torch.autograd.grad(ref, inputs, g),
        strict=True,
    ):
        torch.testing.assert_close(a, r)
    assert torch.autograd.gradgradcheck(pointwise, (x, w, b), fast_mode=True)


def test_pointwise_empty_batch():
    x = torch.randn(0, 6, 4, 3, requires_grad=True)
    conv = nn.Conv2d(6, 5, 1)
    y = pointwise(x, conv.weight, conv.bias)
    assert y.shape == (0, 5, 4, 3)
    y.sum().backward()
    assert x.grad.shape == x.shape
    assert torch.equal(conv.weight.grad, torch.zeros_like(conv.weight))


@pytest.mark.parametrize(
    'shape, c_out, strided',
    [
        ((3, 64, 5, 7), 72, False),
        ((2, 64, 11, 9), 96, True),  # a downsample's x[::2, ::2]
        ((2, 64, 12, 11), 64, False),  # > 100 pixels: B weight matmuls
        ((2, 64, 1, 1), 80, False),
        ((0, 64, 4, 4), 64, False),
        ((2, 16, 6, 5), 64, False),  # the matmul: too few channels
    ],
)
@pytest.mark.parametrize('bias', [True, False])
def test_conv1x1_equals_float64_conv2d(
    threads, onednn_conv1x1, shape, c_out, strided, bias
):
    """Values, gradients and double-backward gradients of the float32 op
    against conv2d in float64, on oneDNN and on the matmul."""
    gen = torch.Generator().manual_seed(shape[1] + c_out)
    x = torch.randn(*shape, generator=gen)
    w = torch.randn(c_out, shape[1], 1, 1, generator=gen) / shape[1] ** 0.5
    b = torch.randn(c_out, generator=gen) if bias else None
    ours = [t.requires_grad_() for t in (x, w, b) if t is not None]
    ref = [t.detach().double().requires_grad_() for t in ours]
    sub = (lambda t: t[:, :, ::2, ::2]) if strided else (lambda t: t)
    assert takes_onednn_conv1x1(x, w) == (shape[1] >= 64)
    y = conv1x1(sub(ours[0]), *ours[1:])
    y_ref = F.conv2d(sub(ref[0]), *ref[1:])
    tol = dict(rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(y, y_ref.float(), **tol)
    g = torch.randn(y.shape, generator=gen)
    grads = torch.autograd.grad(y, ours, g, create_graph=True)
    grads_ref = torch.autograd.grad(y_ref, ref, g.double(), create_graph=True)
    for a, r in zip(grads, grads_ref, strict=True):
        torch.testing.assert_close(a, r.float(), rtol=1e-5, atol=1e-4)
    if not x.numel():
        return  # no second-order graph through an empty batch
    again = torch.autograd.grad(sum(t.sum() for t in grads), ours[:2])
    again_ref = torch.autograd.grad(sum(t.sum() for t in grads_ref), ref[:2])
    for a, r in zip(again, again_ref, strict=True):
        torch.testing.assert_close(a, r.float(), rtol=1e-5, atol=1e-4)


@pytest.mark.parametrize(
    'shape, c_out', [((2, 96, 5, 7), 160), ((3, 64, 1, 1), 64)]
)
@pytest.mark.parametrize('channels_last_grad', [False, True])
def test_conv1x1_plain_backward_equals_float64_conv2d(
    threads, onednn_conv1x1, shape, c_out, channels_last_grad
):
    """The gradients of a plain backward (no ``create_graph``), whose input
    gradient on oneDNN is a transposed convolution by the weight as it is,
    against conv2d in float64, for an NCHW and a channels-last gradient."""
    gen = torch.Generator().manual_seed(c_out)
    x = torch.randn(*shape, generator=gen, requires_grad=True)
    w = torch.randn(c_out, shape[1], 1, 1, generator=gen) / shape[1] ** 0.5
    w.requires_grad_()
    ref = [t.detach().double().requires_grad_() for t in (x, w)]
    y = conv1x1(x, w)
    g = torch.randn(y.shape, generator=gen)
    if channels_last_grad:
        g = g.contiguous(memory_format=torch.channels_last)
    grads = torch.autograd.grad(y, (x, w), g)
    grads_ref = torch.autograd.grad(F.conv2d(*ref), ref, g.double())
    for a, r in zip(grads, grads_ref, strict=True):
        torch.testing.assert_close(a, r.float(), rtol=1e-5, atol=1e-4)


def test_conv1x1_takes_onednn_in_float32_at_64_channels(onednn_conv1x1):
    """Other dtypes, narrower convs, autocast and oneDNN switched off take
    the matmul."""
    x, w = torch.randn(1, 64, 3, 3), torch.randn(64, 64, 1, 1)
    assert takes_onednn_conv1x1(x, w)
    assert not takes_onednn_conv1x1(x.double(), w.double())
    assert not takes_onednn_conv1x1(x.bfloat16(), w.bfloat16())
    assert not takes_onednn_conv1x1(x, w[:63])
    assert not takes_onednn_conv1x1(x[:, :63], w[:, :63])
    meta = x.to('meta'), w.to('meta')
    assert not takes_onednn_conv1x1(*meta)
    assert conv1x1(*meta).shape == (1, 64, 3, 3)
    with torch.autocast('cpu', dtype=torch.bfloat16):
        assert not takes_onednn_conv1x1(x, w)
        assert conv1x1(x, w).dtype == torch.bfloat16  # autocast's matmul
    with torch.backends.mkldnn.flags(enabled=False):
        assert not takes_onednn_conv1x1(x, w)
        torch.testing.assert_close(conv1x1(x, w), F.conv2d(x, w))


def _vendor():
    with open('/proc/cpuinfo') as f:
        return next(
            (line.split(':')[1].strip() for line in f if 'vendor_id' in line),
            '',
        )


def test_conv1x1_backend_follows_mmevo_conv1x1(monkeypatch):
    """``MMEVO_CONV1X1``: 'onednn' and 'matmul' choose for every host,
    'auto' (or unset) takes oneDNN on AMD CPUs only, where it was measured
    to beat PyTorch's matmul; anything else is refused, naming it. Either
    way the numbers are the convolution's."""
    x, w = torch.randn(2, 64, 3, 3), torch.randn(64, 64, 1, 1)
    w.requires_grad_()  # training: the inference choice is the next test's
    monkeypatch.setenv('MMEVO_CONV1X1', 'matmul')
    assert not takes_onednn_conv1x1(x, w)
    torch.testing.assert_close(conv1x1(x, w), F.conv2d(x, w))
    monkeypatch.setenv('MMEVO_CONV1X1', 'onednn')
    assert takes_onednn_conv1x1(x, w)
    for value in ('auto', None):
        if value is None:
            monkeypatch.delenv('MMEVO_CONV1X1')
        else:
            monkeypatch.setenv('MMEVO_CONV1X1', value)
        want = _vendor() == 'AuthenticAMD'
        assert takes_onednn_conv1x1(x, w) == want
    monkeypatch.setenv('MMEVO_CONV1X1', 'mkldnn')
    with pytest.raises(ValueError, match="MMEVO_CONV1X1 must be 'auto'"):
        conv1x1(x, w)


@pytest.mark.parametrize(
    'shape, c_out, onednn',
    [
        ((1, 256, 14, 14), 64, False),  # 3.2M multiply-adds
        ((1, 64, 56, 56), 256, False),  # 64 input channels
        ((1, 128, 28, 28), 512, True),
        ((4, 512, 7, 7), 2048, True),
        ((1, 2048, 3, 3), 512, False),  # 9.4M multiply-adds
        ((0, 512, 7, 7), 128, False),
    ],
)
@pytest.mark.parametrize('bias', [True, False])
def test_conv1x1_inference_takes_the_faster_forward(
    monkeypatch, threads, shape, c_out, onednn, bias
):
    """With nothing to differentiate (``no_grad``, ``inference_mode``, or
    frozen weights) and ``MMEVO_CONV1X1`` 'auto' on a host that takes
    oneDNN, the matmul runs the convolutions with too little work or too
    few input channels to pay for oneDNN's weight re-layout; values equal
    conv2d in float64 either way, NCHW and channels-last. Forced 'onednn'
    and training keep oneDNN (where 'auto' takes oneDNN at all: AMD)."""
    amd = _vendor() == 'AuthenticAMD'
    monkeypatch.setenv('MMEVO_CONV1X1', 'auto')
    gen = torch.Generator().manual_seed(c_out)
    x = torch.randn(*shape, generator=gen)
    w = torch.randn(c_out, shape[1], 1, 1, generator=gen) / shape[1] ** 0.5
    b = torch.randn(c_out, generator=gen) if bias else None
    ref = F.conv2d(x.double(), w.double(), None if b is None else b.double())
    tol = dict(rtol=1e-5, atol=1e-5)
    frozen = nn.Parameter(w, requires_grad=False)
    for context, weight in [
        (torch.no_grad, w.requires_grad_()),
        (torch.inference_mode, w),
        (contextlib.nullcontext, frozen),
    ]:
        with context():
            assert takes_onednn_conv1x1(x, weight, b) == (onednn and amd)
            for fmt in (torch.contiguous_format, torch.channels_last):
                y = conv1x1(x.contiguous(memory_format=fmt), weight, b)
                torch.testing.assert_close(y, ref.float(), **tol)
        w = w.detach()
    assert takes_onednn_conv1x1(x, w.requires_grad_(), b) == amd  # training
    monkeypatch.setenv('MMEVO_CONV1X1', 'onednn')
    with torch.no_grad():
        assert takes_onednn_conv1x1(x, w, b)
        torch.testing.assert_close(conv1x1(x, w, b), ref.float(), **tol)


def test_pointwise_autocast_bf16():
    """Under CPU autocast it computes in bf16; gradients keep their dtypes."""
    x = torch.randn(2, 8, 5, 4, requires_grad=True)
    conv = nn.Conv2d(8, 3, 1)
    with torch.autocast('cpu', dtype=torch.bfloat16):
        y = pointwise(x, conv.weight, conv.bias)
    assert y.dtype == torch.bfloat16
    y.float().sum().backward()
    assert x.grad.dtype == conv.weight.grad.dtype == torch.float32
    torch.testing.assert_close(y.float(), conv(x), atol=5e-2, rtol=2e-2)


@pytest.mark.parametrize('size', [(9, 8), (28, 29)], ids=['unfused', 'fused'])
def test_involution_float32_generation_convs_on_onednn(
    threads, onednn_conv1x1, size
):
    """An involution whose reduce conv (and, unfused, the span conv) is wide
    enough for oneDNN: in float32 as close to the float64 stock graph as
    the float32 stock graph."""
    channels = 256
    torch.manual_seed(0)
    layer = randomised(Involution(channels, 7)).train()
    ref = set_cpu_fastpath(copy.deepcopy(layer).double(), False)
    stock = set_cpu_fastpath(copy.deepcopy(layer), False)
    x = torch.randn(2, channels, *size, dtype=torch.float64)
    assert_float32_as_accurate(layer, stock, ref, x)


@pytest.mark.parametrize('conv1x1', ['onednn', 'matmul'])
@pytest.mark.parametrize(
    'memory_format', [torch.contiguous_format, torch.channels_last]
)
def test_acmix_input_gradient_has_the_stock_layout(
    monkeypatch, conv1x1, memory_format
):
    """ACmix's fast path gives its input's gradient in the layout of the
    input, as the stock convolutions do: a channels_last gradient of an
    NCHW map sends the ReLU before the layer to a 17x slower mixed-layout
    backward (``threshold_backward``, (4, 64, 56, 56), two threads); the
    values are the stock ones."""
    monkeypatch.setenv('MMEVO_CONV1X1', conv1x1)
    torch.manual_seed(0)
    layer = randomised(ACmix(64, 64, 7, 4)).train()
    stock = set_cpu_fastpath(copy.deepcopy(layer), False)
    x = torch.randn(2, 64, 9, 10).contiguous(memory_format=memory_format)
    grads = []
    for module in (layer, stock):
        xi = x.clone().requires_grad_()
        y = module(xi)
        (gx,) = torch.autograd.grad(y, xi, torch.ones_like(y))
        assert gx.is_contiguous(memory_format=memory_format)
        grads.append(gx)
    torch.testing.assert_close(grads[0], grads[1], rtol=1e-4, atol=1e-4)


def test_acmix_fast_path_double_backward_equals_stock():
    """A double backward through ACmix's fast path (its C++ conv path and
    gradient adds step aside for differentiable formulas under
    ``create_graph``) gives the stock path's second-order gradients."""
    torch.manual_seed(0)
    layer = randomised(ACmix(8, 8, 5, 2, stride=2)).double()
    stock = set_cpu_fastpath(copy.deepcopy(layer), False)
    x = torch.randn(2, 8, 7, 9, dtype=torch.float64)
    results = []
    for module in (layer, stock):
        xi = x.clone().requires_grad_()
        (gx,) = torch.autograd.grad(
            module(xi).square().sum(), xi, create_graph=True
        )
        params = [xi, *module.parameters()]
        second = torch.autograd.grad(
            gx.square().sum(), params, allow_unused=True
        )
        results.append([gx, *second])
    for fast, ref in zip(*results, strict=True):
        if ref is None:
            assert fast is None or not fast.any()
        else:
            scale = max(1.0, float(ref.detach().abs().max()))
            torch.testing.assert_close(
                fast, ref, rtol=1e-9, atol=1e-10 * scale
            )


def test_acmix_fast_path_under_autocast_follows_stock():
    """Under CPU autocast the fast path's conv path runs ``F.conv2d`` in
    bf16 as the stock graph does: the same dtype, bf16-close numbers and
    gradients."""
    torch.manual_seed(0)
    layer = randomised(ACmix(16, 16, 5, 2))
    stock = set_cpu_fastpath(copy.deepcopy(layer), False)
    x = torch.randn(2, 16, 9, 7)
    outs = []
    for module in (layer, stock):
        xi = x.clone().requires_grad_()
        with torch.autocast('cpu', dtype=torch.bfloat16):
            y = module(xi)
        (gx,) = torch.autograd.grad(y.float().sum(), xi)
        outs.append((y, gx))
    (y, gx), (y_ref, gx_ref) = outs
    assert y.dtype == y_ref.dtype
    for got, want in ((y, y_ref), (gx, gx_ref)):
        scale = float(want.abs().max())
        torch.testing.assert_close(
            got.float(), want.float(), rtol=5e-2, atol=5e-2 * scale
        )


@pytest.mark.parametrize('k, size', [(2, (6, 8)), (3, (9, 3)), (2, (2, 2))])
def test_avg_pool_equals_the_module_with_gradients(threads, k, size):
    """Whole windows in float32: the depthwise convolution by 1 / k² gives
    the pool's output and input gradient (sums of the same terms, to
    float32 rounding), an empty batch included."""
    pool = nn.AvgPool2d(k, k, ceil_mode=True)
    gen = torch.Generator().manual_seed(k)
    for B in (3, 0):
        x = torch.randn(B, 5, *size, generator=gen)
        assert takes_avg_pool_conv(x, pool)
        xa, xb = x.clone().requires_grad_(), x.clone().requires_grad_()
        y, y_ref = avg_pool(xa, pool), pool(xb)
        g = torch.randn(y.shape, generator=gen)
        torch.testing.assert_close(y, y_ref, rtol=1e-6, atol=1e-6)
        y.backward(g)
        y_ref.backward(g)
        torch.testing.assert_close(xa.grad, xb.grad, rtol=1e-6, atol=1e-6)


def test_avg_pool_steps_aside_where_the_conv_differs():
    """Partial windows (ceil_mode), padding, unequal stride, a divisor,
    float64 (no oneDNN kernel), another layout or autocast: the module's
    own result, bit for bit."""
    x = torch.randn(2, 4, 6, 8)
    cases = [
        (x[..., :7], nn.AvgPool2d(2, 2, ceil_mode=True)),
        (x, nn.AvgPool2d(2, 2, padding=1)),
        (x, nn.AvgPool2d(2, 1)),
        (x, nn.AvgPool2d(2, 2, divisor_override=3)),
        (x.double(), nn.AvgPool2d(2, 2)),
        (x.contiguous(memory_format=torch.channels_last), nn.AvgPool2d(2, 2)),
        (x, nn.MaxPool2d(2, 2)),
        (x, nn.Identity()),
    ]
    for t, pool in cases:
        assert not takes_avg_pool_conv(t, pool), pool
        assert torch.equal(avg_pool(t, pool), pool(t))
    with torch.autocast('cpu', dtype=torch.bfloat16):
        assert not takes_avg_pool_conv(x, nn.AvgPool2d(2, 2))


@pytest.mark.parametrize(
    'size', [(28, 30), (16, 14)], ids=['fused', 'unfused']
)
def test_involution_s2_float32_pool_as_accurate_as_stock(threads, size):
    """A strided involution on whole pooling windows (its pool a depthwise
    convolution on the fast path), fused and unfused: in float32 as close
    to the float64 stock graph as the float32 stock graph."""
    torch.manual_seed(0)
    layer = randomised(Involution(32, 3, 2, group_channels=8)).train()
    ref = set_cpu_fastpath(copy.deepcopy(layer).double(), False)
    stock = set_cpu_fastpath(copy.deepcopy(layer), False)
    x = torch.randn(2, 32, *size, dtype=torch.float64)
    assert takes_avg_pool_conv(x.float(), layer.avgpool)
    assert_float32_as_accurate(layer, stock, ref, x)


@pytest.mark.skipif(
    not cpp_backend.available(), reason='call_cpu_kernel calls C++ kernels'
)
@pytest.mark.parametrize(
    'change, error, match',
    [
        (dict(z=torch.randn(1, 4, 4, 5)), ValueError, r'^z must be \(B, C_r'),
        (dict(groups=3), ValueError, r'must be divisible by groups=3'),
        (
            dict(span_weight=torch.randn(9, 4, 1, 1, dtype=torch.float64)),
            TypeError,
            r'^input and span_weight must have the same dtype',
        ),
        (dict(kernel_size=2), ValueError, r'^kernel_size must be odd'),
    ],
)
def test_call_cpu_kernel_checks_its_arguments(change, error, match):
    """Without autograd the kernel is called directly; it names the bad
    argument as the operator does."""
    op = torch.ops.mmevo.fused_involution.default
    args = dict(
        input=torch.randn(1, 16, 5, 5),
        z=torch.randn(1, 4, 5, 5),
        span_weight=torch.randn(9, 4, 1, 1),
        span_bias=None,
        kernel_size=3,
        stride=1,
        dilation=1,
        groups=1,
    )
    args.update(change)
    with torch.no_grad():
        for call in (op, functools.partial(call_cpu_kernel, op)):
            with pytest.raises(error, match=match):
                call(*args.values())
