"""The fused local attention (mmevo::fused_local_attention) in
LocalSelfAttention's and ACmix's CPU paths, against their stock graphs:
float64 values and every gradient (input, q/k/v projections, relative
embedding and bias, ACmix's pe and rates), which path runs (the fused one
saves no attention map), double backward, low precision, empty batches,
and when it steps aside: kernel and module hooks, small maps, autocast, a
forced backend, tracing."""

import copy

import pytest
import torch

from mmevo.layers import ACmix, LocalSelfAttention, set_cpu_fastpath
from mmevo.ops import cpp_backend, use_backend

from fastpath_helpers import (
    assert_float32_as_accurate,
    assert_paths_equal,
    randomised,
    saved_bytes,
)

pytestmark = pytest.mark.skipif(
    not cpp_backend.available(), reason='the fused path runs C++ kernels'
)


def heads_and_window(layer):
    if isinstance(layer, ACmix):
        return layer.head, layer.kernel_att
    return layer.num_heads, layer.kernel_size


def attention_map_saved(layer, x):
    """Whether the backward of ``layer(x)`` keeps a tensor the size of the
    attention map (B, heads, K, K, H_out, W_out)."""
    y = layer(x.detach().requires_grad_())  # shapes only
    B, _, Ho, Wo = y.shape
    heads, K = heads_and_window(layer)
    size = B * heads * K * K * Ho * Wo
    sizes = []

    def pack(t):
        sizes.append(t.numel())
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        layer(x).sum()
    return size in sizes


def sasa(**kwargs):
    layer = LocalSelfAttention(16, **kwargs)
    with torch.no_grad():  # a non-zero bias table
        if layer.rel_pos_bias is not None:
            layer.rel_pos_bias.normal_()
    return layer


# name: (layer, input shape); both take the fused op at every size
# (repeated reflection in 'tiny_map').
LAYERS = {
    'sasa_k7': (lambda: sasa(num_heads=4), (2, 16, 15, 14)),
    'sasa_s2_d2_reflect_bias': (
        lambda: sasa(
            num_heads=2,
            kernel_size=5,
            stride=2,
            dilation=2,
            padding_mode='reflect',
            rel_pos_bias=True,
        ),
        (1, 16, 29, 31),
    ),
    'sasa_bias_only': (
        lambda: sasa(
            out_channels=8,
            num_heads=2,
            kernel_size=3,
            rel_pos_embed=False,
            rel_pos_bias=True,
            qkv_bias=True,
        ),
        (2, 16, 14, 15),
    ),
    'acmix': (lambda: ACmix(8, 8, 5, 2), (2, 8, 9, 7)),
    'acmix_s2_d2_odd': (
        lambda: ACmix(8, 12, 3, 3, stride=2, dilation=2),
        (1, 8, 11, 9),
    ),
    'acmix_tiny_map': (lambda: ACmix(8, 8, 7, 2), (2, 8, 3, 2)),
    # More pixels than the projection has rows: its weight gradient is B
    # matmuls summed (one over all pixels on the smaller maps above).
    'acmix_wide_map': (lambda: ACmix(8, 8, 5, 2), (3, 8, 13, 11)),
}


@pytest.fixture(params=list(LAYERS), scope='module')
def layer_and_input(request):
    build, shape = LAYERS[request.param]
    torch.manual_seed(0)
    layer = randomised(build()).double()
    return layer, torch.randn(shape, dtype=torch.float64)


def test_fused_equals_stock_float64(layer_and_input):
    """Outputs and the gradients of x and of every parameter; only the
    stock path saves the attention map. (LocalSelfAttention's fused path
    calls its projections as modules, as the stock one does; ACmix's
    fast path folds some convs.)"""
    layer, x = layer_and_input
    assert_paths_equal(layer, x, isinstance(layer, ACmix))
    assert not attention_map_saved(layer, x)
    assert attention_map_saved(set_cpu_fastpath(layer, False), x)
    set_cpu_fastpath(layer, True)


def test_channels_last_and_double_backward(layer_and_input):
    layer, x = layer_and_input
    cl = x.to(memory_format=torch.channels_last).requires_grad_()
    y = layer(cl)
    x2 = x.clone().requires_grad_()
    set_cpu_fastpath(layer, False)
    try:
        ref = layer(x2)
        torch.testing.assert_close(y, ref, rtol=1e-10, atol=1e-10)
        # create_graph: the fused op's backward is differentiable
        (g_ref,) = torch.autograd.grad(
            ref.square().sum(), x2, create_graph=True
        )
        (gg_ref,) = torch.autograd.grad(g_ref.sum(), x2)
    finally:
        set_cpu_fastpath(layer, True)
    (g,) = torch.autograd.grad(y.square().sum(), cl, create_graph=True)
    (gg,) = torch.autograd.grad(g.sum(), cl)
    torch.testing.assert_close(g, g_ref, rtol=1e-9, atol=1e-9)
    torch.testing.assert_close(gg, gg_ref, rtol=1e-9, atol=1e-9)


@pytest.mark.parametrize(
    'dtype, tol', [(torch.bfloat16, 5e-2), (torch.float16, 1e-2)]
)
@pytest.mark.parametrize('name', ['sasa_k7', 'acmix'])
def test_low_precision_against_float64(name, dtype, tol):
    build, shape = LAYERS[name]
    torch.manual_seed(0)
    layer = randomised(build()).eval()
    x = torch.randn(shape)
    ref = set_cpu_fastpath(layer.double(), False)(x.double()).detach()
    set_cpu_fastpath(layer, True)
    low = layer.to(dtype)
    assert not attention_map_saved(low, x.to(dtype))  # the fused path ran
    out = low(x.to(dtype))
    assert out.dtype == dtype
    scale = float(ref.abs().max())
    torch.testing.assert_close(out.double(), ref, rtol=tol, atol=tol * scale)


@pytest.mark.parametrize('name', ['sasa_s2_d2_reflect_bias', 'acmix'])
def test_empty_batch(name):
    build, shape = LAYERS[name]
    layer = build()
    x = torch.zeros(0, *shape[1:], requires_grad=True)
    out = layer(x)
    ref = set_cpu_fastpath(layer, False)(x)
    assert out.shape == ref.shape and out.shape[0] == 0
    out.sum().backward()
    assert x.grad.shape == x.shape


@pytest.mark.parametrize('name', ['sasa_k7', 'acmix'])
def test_hooks_see_the_stock_graph(name):
    """A kernel hook gets the attention map, a module hook its call: the
    fused path steps aside for both and the numbers are the same."""
    build, shape = LAYERS[name]
    torch.manual_seed(0)
    layer = randomised(build()).double()
    x = torch.randn(shape, dtype=torch.float64)
    fused = layer(x)
    maps, calls = [], []
    handle = layer.register_kernel_hook(lambda m, k: maps.append(k))
    torch.testing.assert_close(layer(x), fused)
    heads, K = heads_and_window(layer)
    assert [tuple(k.shape[:4]) for k in maps] == [(shape[0], heads, K, K)]
    torch.testing.assert_close(
        maps[0].sum((2, 3)), torch.ones_like(maps[0][:, :, 0, 0])
    )
    assert attention_map_saved(layer, x)
    handle.remove()
    key = layer.key if isinstance(layer, LocalSelfAttention) else layer.conv2
    handle = key.register_forward_hook(lambda m, i, o: calls.append(m))
    torch.testing.assert_close(layer(x), fused)
    assert calls == [key]
    handle.remove()
    assert not attention_map_saved(layer, x)


@pytest.mark.parametrize('name', ['sasa_k7', 'acmix'])
def test_falls_back_where_the_fused_op_cannot_take_the_call(name):
    """Autocast (mixed dtypes) and a forced non-C++ backend run the stock
    ops, with their numbers (to bfloat16 rounding: ACmix's fast path still
    sums in another order)."""
    build, shape = LAYERS[name]
    torch.manual_seed(0)
    layer = randomised(build())
    x = torch.randn(shape)
    with torch.autocast('cpu', dtype=torch.bfloat16):
        out = layer(x)
        assert attention_map_saved(layer, x)
        ref = set_cpu_fastpath(layer, False)(x)
        set_cpu_fastpath(layer, True)
    assert out.dtype == ref.dtype
    torch.testing.assert_close(out, ref, rtol=2e-2, atol=2e-2)
    with use_backend('torch'):
        assert attention_map_saved(layer, x)


@pytest.mark.parametrize('H, W, stride', [(1, 1, 1), (7, 7, 1), (13, 15, 2)])
def test_small_maps_run_the_fused_op(H, W, stride):
    """LocalSelfAttention takes the fused op at every map size, down to one
    pixel (at 7², B8, it is 1.3x faster than the stock ops, in 0.45x the
    memory: docs/benchmarks.md), with the stock numbers."""
    torch.manual_seed(0)
    layer = randomised(sasa(num_heads=4, stride=stride)).double()
    x = torch.randn(2, 16, H, W, dtype=torch.float64)
    assert not attention_map_saved(layer, x)
    assert attention_map_saved(set_cpu_fastpath(layer, False), x)
    set_cpu_fastpath(layer, True)
    assert_paths_equal(layer, x, False)


@pytest.mark.parametrize('name', ['sasa_k7', 'acmix'])
def test_tracing_sees_the_stock_graph(name):
    build, shape = LAYERS[name]
    layer = build().eval()
    x = torch.randn(shape)
    traced = torch.jit.trace(layer, x, check_trace=False)
    ops = {n.kind() for n in traced.inlined_graph.nodes()}
    assert 'mmevo::evolution_aggregate' in ops
    assert 'mmevo::fused_local_attention' not in ops
    torch.testing.assert_close(traced(x), layer(x), rtol=1e-5, atol=1e-5)


def test_acmix_keeps_one_projection_buffer():
    """ACmix's fused path reads its heads in place from the channels-last
    projection buffer that its convolution path keeps anyway: the backward
    holds x, that (B, 3C, H, W) buffer, the attention output, its
    log-sum-exp and small tensors (weights, batch-1 terms of the positional
    encoding: small per pixel at B = 8), and no copies of q, k or v (another
    3C * H * W)."""
    layer = ACmix(16, 16, 7, 4)
    x = torch.randn(8, 16, 12, 10, requires_grad=True)
    saved = saved_bytes(layer, x)
    pixels = 8 * 12 * 10
    maps = 16 + 48 + 16 + 4  # x, the buffer, the output, lse (4 heads)
    assert saved < 4 * pixels * (maps + 16), saved


@pytest.mark.parametrize('shape', [(2, 64, 11, 10), (1, 64, 9, 7)])
def test_acmix_float32_projection_on_onednn(threads, onednn_conv1x1, shape):
    """ACmix wide enough for its projection on oneDNN (float32, 64 channels;
    a batch of B * H rows of 16 or more, or fewer): every output and
    gradient as close to the float64 stock graph as the float32 stock
    graph's, and so is the double backward."""
    torch.manual_seed(0)
    layer = randomised(ACmix(64, 64, 7, 4, stride=2)).train()
    ref = set_cpu_fastpath(copy.deepcopy(layer).double(), False)
    stock = set_cpu_fastpath(copy.deepcopy(layer), False)
    x = torch.randn(shape, dtype=torch.float64)
    assert_float32_as_accurate(layer, stock, ref, x)

    def double_backward(net, dtype):
        inp = x.to(dtype).requires_grad_()
        (g,) = torch.autograd.grad(
            net(inp).square().sum(), inp, create_graph=True
        )
        (gg,) = torch.autograd.grad(g.square().sum(), inp)
        return g.double(), gg.double()

    for got, want in zip(
        double_backward(layer, torch.float32),
        double_backward(ref, torch.float64),
        strict=True,
    ):
        assert (got - want).norm() / want.norm() < 1e-4
