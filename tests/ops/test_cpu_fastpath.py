"""The CPU fast paths equal the stock graph; the switch selects between them.

Every layer and both backbones run twice on the same float64 input, with
:mod:`mmevo.ops.cpu_fastpath` on and off: the outputs and the gradients of
the input and of every parameter must agree. Forward hooks on the
``nn.Conv2d`` modules tell which path ran (the fast paths call some convs'
weights directly), so a comparison of the stock path with itself fails.
"""
import os
import subprocess
import sys
import threading

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.modules.batchnorm import _BatchNorm

from mmevo.layers import (ELSA, ACmix, DynamicFilter, EvolutionConv,
                          Involution, LocalSelfAttention)
from mmevo.models import ACmixResNet, RedNet
from mmevo.ops import cpu_fastpath
from mmevo.ops.cpu_fastpath import pointwise

ROOT = os.path.dirname(
    os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

TINY_RED = dict(stem_channels=32, base_channels=16)
TINY_ACMIX = dict(stem_channels=16, base_channels=16)


def count_conv_calls(model):
    """Hook every nn.Conv2d; return the list the hooks append to."""
    calls = []
    for m in model.modules():
        if isinstance(m, nn.Conv2d):
            m.register_forward_hook(lambda mod, i, o: calls.append(mod))
    return calls


def randomised(model):
    """Non-trivial norms, rates and conv path (the defaults zero some)."""
    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, _BatchNorm):
                nn.init.uniform_(m.weight, 0.5, 1.5)
                nn.init.uniform_(m.bias, -0.2, 0.2)
                nn.init.uniform_(m.running_var, 0.5, 1.5)
                nn.init.normal_(m.running_mean, 0, 0.1)
            if isinstance(m, ACmix):
                m.rate1.uniform_(0.2, 1.0)
                m.rate2.uniform_(0.2, 1.0)
                m.dep_conv.weight.normal_()
    return model


def run(model, x, on):
    """Outputs, input gradient and parameter gradients with the switch."""
    x = x.clone().requires_grad_()
    calls = count_conv_calls(model)
    model.zero_grad(set_to_none=True)
    with cpu_fastpath.use(on):
        outs = model(x)
    outs = outs if isinstance(outs, tuple) else (outs, )
    gen = torch.Generator().manual_seed(1)
    loss = sum((o * torch.randn(o.shape, generator=gen, dtype=o.dtype)).sum()
               for o in outs)
    loss.backward()
    grads = {n: p.grad for n, p in model.named_parameters()}
    for m in model.modules():
        m._forward_hooks.clear()
    return outs, x.grad, grads, len(calls)


def assert_paths_equal(model, x, has_fast_path=True):
    fast = run(model, x, True)
    stock = run(model, x, False)
    for a, b in zip(fast[0], stock[0]):
        assert a.shape == b.shape
        torch.testing.assert_close(a, b, rtol=1e-9, atol=1e-10)
    torch.testing.assert_close(fast[1], stock[1], rtol=1e-9, atol=1e-10)
    assert set(fast[2]) == set(stock[2])
    for name, g in stock[2].items():
        assert g is not None, name
        torch.testing.assert_close(
            fast[2][name], g, rtol=1e-9, atol=1e-10, msg=name)
    if has_fast_path:
        assert fast[3] < stock[3]
    else:
        assert fast[3] == stock[3]


LAYERS = {
    'evolution_conv_s2':
    (lambda: EvolutionConv(8, 3, stride=2), 8, (7, 6), False),
    'involution': (lambda: Involution(16, 7), 16, (9, 7), True),
    'involution_s2_odd': (lambda: Involution(32, 3, 2), 32, (7, 9), True),
    'dynamic_filter_s2':
    (lambda: DynamicFilter(8, stride=2), 8, (7, 8), False),
    'local_self_attention_s2':
    (lambda: LocalSelfAttention(8, num_heads=2, kernel_size=3, stride=2), 8,
     (7, 6), False),
    'elsa_s2':
    (lambda: ELSA(24, 2, kernel_size=3, stride=2), 24, (7, 6), False),
    'acmix': (lambda: ACmix(8, 8, 5, 2), 8, (9, 7), True),
    'acmix_in_ne_out': (lambda: ACmix(8, 12, 5, 3), 8, (6, 7), True),
    'acmix_s2_odd': (lambda: ACmix(8, 8, 5, 2, stride=2), 8, (7, 9), True),
    # maps not larger than the reflection padding (3 for kernel 7)
    'acmix_tiny_map': (lambda: ACmix(8, 8, 7, 2), 8, (3, 2), True),
    'acmix_s2_tiny_map': (lambda: ACmix(8, 8, 7, 2, stride=2), 8, (2, 3),
                          True),
}


@pytest.mark.parametrize('mode', ['train', 'eval'])
@pytest.mark.parametrize('name', sorted(LAYERS))
def test_layer_fast_path_equals_stock(name, mode):
    build, channels, size, has_fast_path = LAYERS[name]
    torch.manual_seed(0)
    layer = randomised(build()).double().train(mode == 'train')
    x = torch.randn(2, channels, *size, dtype=torch.float64)
    assert_paths_equal(layer, x, has_fast_path)


@pytest.mark.parametrize('mode', ['train', 'eval'])
@pytest.mark.parametrize('cls,tiny', [(RedNet, TINY_RED),
                                      (ACmixResNet, TINY_ACMIX)])
def test_backbone_fast_path_equals_stock(cls, tiny, mode):
    torch.manual_seed(0)
    model = randomised(cls(26, **tiny)).double().train(mode == 'train')
    x = torch.rand(2, 3, 41, 37, dtype=torch.float64)
    assert_paths_equal(model, x)


def test_fast_paths_keep_nchw_outputs_and_gradient():
    """The channels_last stem hands the caller NCHW outputs and an NCHW
    input gradient, as the stock graph does."""
    model = RedNet(26, **TINY_RED).eval()
    x = torch.rand(2, 3, 40, 36, requires_grad=True)
    outs = model(x)
    assert all(o.is_contiguous() for o in outs)
    sum(o.sum() for o in outs).backward()
    assert x.grad.is_contiguous()


def test_stock_path_calls_every_conv_module():
    """Switch off: every nn.Conv2d of the backbones runs as a module (its
    forward hook fires), the ACmix projections, fc and dep_conv included."""
    for model in (RedNet(26, **TINY_RED), ACmixResNet(26, **TINY_ACMIX)):
        calls = count_conv_calls(model.eval())
        with cpu_fastpath.use(False), torch.no_grad():
            model(torch.rand(1, 3, 32, 32))
        convs = [m for m in model.modules() if isinstance(m, nn.Conv2d)]
        assert set(map(id, calls)) == set(map(id, convs))
        assert len(calls) == len(convs)


def test_tracing_runs_the_stock_graph():
    """Under torch.jit.trace the stock path runs even with the switch on:
    the hooks fire and the trace holds the published convs."""
    layer = ACmix(8, 8, 5, 2).eval()
    calls = count_conv_calls(layer)
    x = torch.randn(1, 8, 6, 7)
    with cpu_fastpath.use(True):
        traced = torch.jit.trace(layer, x)
    assert {id(m)
            for m in calls
            } == {id(m)
                  for m in layer.modules() if isinstance(m, nn.Conv2d)}
    graph = str(traced.inlined_graph)
    assert 'baddbmm' not in graph and 'aten::_convolution' in graph
    torch.testing.assert_close(traced(x), layer(x), rtol=1e-5, atol=1e-5)


def test_other_devices_run_the_stock_graph():
    """A meta tensor is not a CPU tensor: the stock path runs on it."""
    assert cpu_fastpath.enabled(torch.zeros(1))
    assert not cpu_fastpath.enabled(torch.zeros(1, device='meta'))
    layer = Involution(16, 3).to('meta')
    calls = count_conv_calls(layer)
    out = layer(torch.zeros(2, 16, 5, 4, device='meta'))
    assert out.shape == (2, 16, 5, 4) and len(calls) == 2


def test_switch_is_per_thread_and_restored():
    seen = []
    with cpu_fastpath.use(False):
        assert not cpu_fastpath.is_on()
        thread = threading.Thread(
            target=lambda: seen.append(cpu_fastpath.is_on()))
        thread.start()
        thread.join()
    assert seen == [True] and cpu_fastpath.is_on()
    with pytest.raises(TypeError, match='on must be a bool'):
        with cpu_fastpath.use('0'):
            pass


def _python(code, **env):
    return subprocess.run([sys.executable, '-c', code],
                          cwd=ROOT,
                          capture_output=True,
                          text=True,
                          timeout=120,
                          env=dict(os.environ, PYTHONPATH=ROOT, **env))


def test_environment_variable_turns_it_off():
    code = ('import torch\n'
            'from mmevo.ops import cpu_fastpath\n'
            'from mmevo.layers import Involution\n'
            'layer = Involution(16, 3)\n'
            'calls = []\n'
            'layer.conv2.conv.register_forward_hook(\n'
            '    lambda *args: calls.append(1))\n'
            'layer(torch.randn(1, 16, 4, 4))\n'
            'print(cpu_fastpath.is_on(), len(calls))\n')
    off = _python(code, MMEVO_CPU_FASTPATH='0')
    assert off.returncode == 0, off.stderr[-2000:]
    assert off.stdout.split() == ['False', '1']
    on = _python(code, MMEVO_CPU_FASTPATH='1')
    assert on.stdout.split() == ['True', '0'], on.stderr[-2000:]
    bad = _python('import mmevo.ops', MMEVO_CPU_FASTPATH='yes')
    assert bad.returncode != 0
    assert "MMEVO_CPU_FASTPATH must be '0' or '1', got 'yes'" in bad.stderr


# The matmul 1x1 convolution on its own: maps of 1 to 1280 pixels, so both
# weight-gradient branches (one matmul for small maps, one per image for
# large ones) whatever the threshold between them.
@pytest.mark.parametrize('size', [(1, 1), (7, 7), (3, 50), (13, 11), (32, 40)])
@pytest.mark.parametrize('bias', [True, False])
def test_pointwise_equals_conv2d_with_gradients(size, bias):
    gen = torch.Generator().manual_seed(size[0])
    x = torch.randn(
        3, 6, *size, generator=gen, dtype=torch.float64, requires_grad=True)
    w = torch.randn(
        5, 6, 1, 1, generator=gen, dtype=torch.float64, requires_grad=True)
    b = torch.randn(
        5, generator=gen, dtype=torch.float64,
        requires_grad=True) if bias else None
    inputs = [t for t in (x, w, b) if t is not None]
    g = torch.randn(3, 5, *size, generator=gen, dtype=torch.float64)
    ours = pointwise(x, w, b)
    ref = F.conv2d(x, w, b)
    torch.testing.assert_close(ours, ref)
    for a, r in zip(
            torch.autograd.grad(ours, inputs, g),
            torch.autograd.grad(ref, inputs, g)):
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
