"""Involution's fused CPU path (mmevo::fused_involution) against its stock
graph: float64 values and every gradient (input, reduce and span conv
weights, BN parameters), which path runs (the fused one saves no kernel
map), and when it steps aside: kernel and module hooks, small maps,
autocast, a forced backend."""

import pytest
import torch

from mmevo.layers import Involution, set_cpu_fastpath
from mmevo.ops import cpp_backend, use_backend

from fastpath_helpers import assert_paths_equal, randomised

pytestmark = pytest.mark.skipif(
    not cpp_backend.available(), reason='the fused path runs C++ kernels'
)


def kernel_map_saved(layer, x):
    """Whether the backward of ``layer(x)`` keeps a tensor the size of the
    kernel map (B, G*K*K, H_out, W_out)."""
    y = layer(x.detach().requires_grad_())  # shapes only
    B, _, Ho, Wo = y.shape
    size = B * layer.groups * layer.kernel_size**2 * Ho * Wo
    sizes = []

    def pack(t):
        sizes.append(t.numel())
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        layer(x).sum()
    return size in sizes


# name: (layer, input shape); maps of >= 14² output pixels take the fused op.
LAYERS = {
    'k7': (lambda: Involution(16, 7), (2, 16, 28, 29)),
    'groups': (
        lambda: Involution(16, 5, group_channels=4, reduction_ratio=2),
        (1, 16, 29, 28),
    ),
    's2_d2_odd': (
        lambda: Involution(8, 3, stride=2, dilation=2, group_channels=4),
        (1, 8, 57, 55),
    ),
}


@pytest.fixture(params=list(LAYERS), scope='module')
def layer_and_input(request):
    build, shape = LAYERS[request.param]
    torch.manual_seed(0)
    layer = randomised(build()).double()
    return layer, torch.randn(shape, dtype=torch.float64)


def test_fused_equals_stock_float64(layer_and_input):
    """Outputs and the gradients of x and of every parameter (reduce and
    span convs, BN); fewer conv module calls on the fused path."""
    layer, x = layer_and_input
    assert_paths_equal(layer, x)
    assert not kernel_map_saved(layer, x)
    assert kernel_map_saved(set_cpu_fastpath(layer, False), x)
    set_cpu_fastpath(layer, True)


def test_eval_mode_channels_last_and_double_backward(layer_and_input):
    layer, x = layer_and_input
    layer.eval()
    try:
        cl = x.to(memory_format=torch.channels_last).requires_grad_()
        y = layer(cl)
        ref = set_cpu_fastpath(layer, False)(x)
        set_cpu_fastpath(layer, True)
        torch.testing.assert_close(y, ref, rtol=1e-10, atol=1e-10)
        # create_graph: the fused op's backward is differentiable
        (g,) = torch.autograd.grad(y.square().sum(), cl, create_graph=True)
        (gg,) = torch.autograd.grad(g.sum(), cl)
        x2 = x.clone().requires_grad_()
        set_cpu_fastpath(layer, False)
        (g_ref,) = torch.autograd.grad(
            layer(x2).square().sum(), x2, create_graph=True
        )
        (gg_ref,) = torch.autograd.grad(g_ref.sum(), x2)
        torch.testing.assert_close(g, g_ref, rtol=1e-9, atol=1e-9)
        torch.testing.assert_close(gg, gg_ref, rtol=1e-9, atol=1e-9)
    finally:
        set_cpu_fastpath(layer, True)
        layer.train()


@pytest.mark.parametrize(
    'dtype, tol', [(torch.bfloat16, 5e-2), (torch.float16, 1e-2)]
)
def test_low_precision_against_float64(dtype, tol):
    torch.manual_seed(0)
    layer = randomised(Involution(16, 7)).eval()
    x = torch.randn(1, 16, 56, 56)
    ref = set_cpu_fastpath(layer.double(), False)(x.double())
    set_cpu_fastpath(layer, True)
    low = layer.to(dtype)
    assert not kernel_map_saved(low, x.to(dtype))  # the fused path ran
    out = low(x.to(dtype))
    with torch.no_grad():  # the C++ kernel called directly
        direct = low(x.to(dtype))
    assert out.dtype == direct.dtype == dtype
    torch.testing.assert_close(direct, out.detach(), rtol=0, atol=0)
    scale = float(ref.abs().max())
    torch.testing.assert_close(out.double(), ref, rtol=tol, atol=tol * scale)


def test_empty_batch():
    layer = Involution(16, 7).eval()
    x = torch.zeros(0, 16, 56, 56, requires_grad=True)
    out = layer(x)
    assert out.shape == (0, 16, 56, 56)
    out.sum().backward()
    assert x.grad.shape == x.shape


def test_hooks_see_the_stock_graph():
    """A kernel hook gets the kernel, a module hook its call: the fused
    path steps aside for both and the numbers are the same."""
    torch.manual_seed(0)
    layer = randomised(Involution(16, 7)).double()
    x = torch.randn(1, 16, 56, 56, dtype=torch.float64)
    fused = layer(x)
    kernels, calls = [], []
    handle = layer.register_kernel_hook(lambda m, k: kernels.append(k))
    torch.testing.assert_close(layer(x), fused)
    assert [tuple(k.shape) for k in kernels] == [(1, 1, 7, 7, 56, 56)]
    assert kernel_map_saved(layer, x)
    handle.remove()
    handle = layer.conv2.conv.register_forward_hook(
        lambda m, i, o: calls.append(m)
    )
    torch.testing.assert_close(layer(x), fused)
    assert calls == [layer.conv2.conv]
    handle.remove()
    assert not kernel_map_saved(layer, x)


def test_falls_back_where_the_fused_op_cannot_or_does_not_win():
    """Autocast (mixed dtypes), a forced non-C++ backend and maps below
    14² output pixels run the unfused path, with its numbers."""
    torch.manual_seed(0)
    layer = randomised(Involution(16, 7))
    x = torch.randn(1, 16, 28, 28)
    with torch.autocast('cpu', dtype=torch.bfloat16):
        out = layer(x)
        assert kernel_map_saved(layer, x)
        ref = set_cpu_fastpath(layer, False)(x)
        set_cpu_fastpath(layer, True)
    torch.testing.assert_close(out, ref)
    with use_backend('torch'):
        assert kernel_map_saved(layer, x)
    small = torch.randn(1, 16, 13, 15)
    assert kernel_map_saved(layer, small)
    assert not kernel_map_saved(layer, torch.randn(1, 16, 14, 14))
    stride2 = randomised(Involution(16, 3, stride=2))
    assert kernel_map_saved(stride2, torch.randn(1, 16, 25, 28))
    assert not kernel_map_saved(stride2, torch.randn(1, 16, 28, 27))


def test_compile_and_tracing_see_the_stock_graph():
    layer = Involution(16, 7).eval()
    x = torch.randn(1, 16, 56, 56)
    traced = torch.jit.trace(layer, x, check_trace=False)
    ops = {n.kind() for n in traced.inlined_graph.nodes()}
    assert 'mmevo::evolution_aggregate' in ops
    assert 'mmevo::fused_involution' not in ops
    torch.testing.assert_close(traced(x), layer(x), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize('mode', ['no_grad', 'inference_mode'])
def test_inference_equals_stock_float64(layer_and_input, mode):
    """Without autograd the fused op runs on its C++ kernel directly
    (``call_cpu_kernel``): the stock numbers, NCHW and channels-last, and
    for an empty batch."""
    layer, x = layer_and_input
    context = getattr(torch, mode)
    layer.eval()
    try:
        with context():
            ref = set_cpu_fastpath(layer, False)(x)
            set_cpu_fastpath(layer, True)
            for inp in (x, x.to(memory_format=torch.channels_last)):
                torch.testing.assert_close(
                    layer(inp), ref, rtol=1e-10, atol=1e-10
                )
            empty = layer(x[:0])
        assert empty.shape == (0, *ref.shape[1:])
    finally:
        set_cpu_fastpath(layer, True)
        layer.train()


def test_inference_call_steps_aside_for_profilers_modes_and_vmap():
    """The direct kernel call steps aside where someone watches the ops: a
    profiler, a dispatch mode and a torch-function mode see
    ``mmevo::fused_involution``, and ``vmap`` maps it."""
    from torch.overrides import TorchFunctionMode
    from torch.profiler import profile
    from torch.utils._python_dispatch import TorchDispatchMode

    class Recording:  # the ops a mode sees
        def __init__(self):
            super().__init__()
            self.ops = []

        def record(self, func, types, args=(), kwargs=None):
            self.ops.append(str(func))
            return func(*args, **(kwargs or {}))

    class Recorder(Recording, TorchDispatchMode):
        __torch_dispatch__ = Recording.record

    class FunctionRecorder(Recording, TorchFunctionMode):
        __torch_function__ = Recording.record

    layer = Involution(16, 7).eval()
    x = torch.randn(1, 16, 28, 28)
    with torch.no_grad():
        expected = layer(x)
        with profile() as prof:
            torch.testing.assert_close(layer(x), expected)
        with Recorder() as recorder:
            torch.testing.assert_close(layer(x), expected)
        with FunctionRecorder() as function_recorder:
            torch.testing.assert_close(layer(x), expected)
    names = {event.key for event in prof.key_averages()}
    assert 'mmevo::fused_involution' in names
    assert 'mmevo.fused_involution.default' in recorder.ops
    assert 'mmevo.fused_involution.default' in function_recorder.ops
    # a functorch transform gets the operator (its batching fallback)
    batch = torch.randn(2, 1, 16, 28, 28)
    with torch.no_grad():
        mapped = torch.func.vmap(layer)(batch)
        torch.testing.assert_close(
            mapped, torch.stack([layer(b) for b in batch])
        )
