"""``mmevo.layers.fastpath.batch_norm`` (on ``mmevo::batch_norm_train``,
and in inference on ``mmevo::batch_norm_eval``) equals the
``nn.BatchNorm2d`` module it runs, and the ``nn.ReLU`` after it where it
takes one: outputs, gradients, running statistics and batch counts, and
steps aside where the kernel cannot take the call."""

import copy

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from mmevo.layers.fastpath import (
    batch_norm,
    takes_batch_norm_eval_kernel,
    takes_batch_norm_kernel,
)


def _bn(channels, affine=True, momentum=0.1, dtype=torch.float64, seed=0):
    gen = torch.Generator().manual_seed(seed)
    bn = nn.BatchNorm2d(channels, affine=affine, momentum=momentum)
    bn = bn.to(dtype)
    with torch.no_grad():
        bn.running_mean.normal_(0, 0.5, generator=gen)
        bn.running_var.uniform_(0.5, 2, generator=gen)
        if affine:
            bn.weight.normal_(1, 0.5, generator=gen)
            bn.bias.normal_(0, 0.5, generator=gen)
    return bn


def _step(fn, bn, x, g):
    """Output, input and parameter gradients of ``fn(x, bn)``."""
    x = x.clone().requires_grad_()
    y = fn(x, bn)
    params = [p for p in (bn.weight, bn.bias) if p is not None]
    grads = torch.autograd.grad(y, [x, *params], g)
    return y, grads


@pytest.mark.parametrize(
    'shape', [(3, 5, 7, 1), (2, 16, 9, 11), (1, 8, 1, 2), (4, 3, 40, 33)]
)
@pytest.mark.parametrize('affine', [True, False])
@pytest.mark.parametrize('momentum', [0.1, None, 0.0])
def test_equals_the_module_in_float64(threads, shape, affine, momentum):
    """Two train steps (a cumulative momentum changes between them):
    outputs, gradients of x, weight and bias, running statistics and the
    batch count; ``(4, 3, 40, 33)`` sums a channel over more than one
    chunk of the kernel's partial sums."""
    ours = _bn(shape[1], affine, momentum)
    ref = copy.deepcopy(ours)
    assert takes_batch_norm_kernel(
        torch.zeros(shape, dtype=torch.float64), ours
    )
    gen = torch.Generator().manual_seed(sum(shape))
    for _ in range(2):
        x = torch.randn(shape, generator=gen, dtype=torch.float64) * 3 + 1
        g = torch.randn(shape, generator=gen, dtype=torch.float64)
        y, grads = _step(batch_norm, ours, x, g)
        y_ref, grads_ref = _step(lambda t, m: m(t), ref, x, g)
        torch.testing.assert_close(y, y_ref, rtol=1e-12, atol=1e-12)
        for a, r in zip(grads, grads_ref, strict=True):
            torch.testing.assert_close(a, r, rtol=1e-11, atol=1e-11)
        for name, buf in ref.named_buffers():
            torch.testing.assert_close(
                getattr(ours, name), buf, rtol=1e-12, atol=1e-12, msg=name
            )


def test_float32_as_accurate_as_the_module():
    """float32 against the float64 module, on a map whose mean is 1e3 times
    its spread (a one-pass variance would lose it): no further from it
    than the float32 module."""
    shape = (4, 24, 28, 28)
    gen = torch.Generator().manual_seed(3)
    x64 = torch.randn(shape, generator=gen, dtype=torch.float64) * 0.1 + 100
    g64 = torch.randn(shape, generator=gen, dtype=torch.float64)
    ref = _bn(24)
    y_ref, grads_ref = _step(lambda t, m: m(t), ref, x64, g64)
    results = {}
    for name, fn in (('ours', batch_norm), ('module', lambda t, m: m(t))):
        bn = copy.deepcopy(ref).float()
        bn.load_state_dict(_bn(24).state_dict())  # the start's statistics
        y, grads = _step(fn, bn, x64.float(), g64.float())
        errors = [(y.double() - y_ref).abs().max()]
        errors += [
            (a.double() - r).abs().max()
            for a, r in zip(grads, grads_ref, strict=True)
        ]
        errors += [
            (getattr(bn, n).double() - getattr(ref, n)).abs().max()
            for n in ('running_mean', 'running_var')
        ]
        results[name] = torch.stack(errors)
    assert (results['ours'] <= 2 * results['module'] + 1e-6).all(), results


def _zero_if_none(grads, wrt):
    """``grads`` with a None (no path: a zero derivative) as zeros."""
    return [
        torch.zeros_like(t) if g is None else g
        for g, t in zip(grads, wrt, strict=True)
    ]


# (batch_norm's call, the stock graph it stands for), of (x, bn, r).
_FUSED = {
    'bn': (lambda t, m, r: batch_norm(t, m), lambda t, m, r: m(t)),
    'relu': (
        lambda t, m, r: batch_norm(t, m, nn.ReLU(inplace=True)),
        lambda t, m, r: F.relu(m(t)),
    ),
    'residual': (
        lambda t, m, r: batch_norm(t, m, None, r),
        lambda t, m, r: m(t) + r,
    ),
    'residual_relu': (
        lambda t, m, r: batch_norm(t, m, nn.ReLU(inplace=True), r),
        lambda t, m, r: F.relu(m(t) + r),
    ),
}


def _grads(fn, bn, x, r, g, create_graph=False):
    """``fn(x, bn, r)`` and its gradients of x, weight, bias (and r, where
    ``fn`` takes it), at copies of x and r."""
    x, r = x.clone().requires_grad_(), r.clone().requires_grad_()
    y = fn(x, bn, r)
    wrt = [t for t in (x, bn.weight, bn.bias, r) if t is not None]
    grads = torch.autograd.grad(
        y, wrt, g, create_graph=create_graph, allow_unused=True
    )
    return y, wrt, _zero_if_none(grads, wrt)


@pytest.mark.parametrize(
    'shape', [(3, 5, 7, 1), (2, 16, 9, 11), (4, 3, 40, 33)]
)
@pytest.mark.parametrize('affine', [True, False])
@pytest.mark.parametrize('variant', ['relu', 'residual', 'residual_relu'])
def test_with_relu_or_residual_equals_the_stock_graph_in_float64(
    threads, shape, affine, variant
):
    """``batch_norm(x, bn, relu, r)`` (the ReLU and a shortcut's addition in
    the kernel's pass, their backward in the BN's) against ``relu(bn(x) +
    r)``, and each part alone: output, gradients of x, weight, bias and r,
    buffers, two train steps."""
    ours = _bn(shape[1], affine)
    ref = copy.deepcopy(ours)
    fused, stock = _FUSED[variant]
    gen = torch.Generator().manual_seed(sum(shape) + 1)
    for _ in range(2):
        x, r, g = (
            torch.randn(shape, generator=gen, dtype=torch.float64) * 3 + 1
            for _ in range(3)
        )
        y, _, grads = _grads(fused, ours, x, r, g)
        y_ref, _, grads_ref = _grads(stock, ref, x, r, g)
        if 'relu' in variant:
            assert (y == 0).any() and (y > 0).any()
        for a, b in zip((y, *grads), (y_ref, *grads_ref), strict=True):
            torch.testing.assert_close(a, b, rtol=1e-11, atol=1e-11)
        for name, buf in ref.named_buffers():
            torch.testing.assert_close(
                getattr(ours, name), buf, rtol=1e-12, atol=1e-12, msg=name
            )


@pytest.mark.parametrize('variant', list(_FUSED))
def test_double_backward_equals_the_stock_graph(variant):
    """The gradients as a graph, and the gradients of their squares."""
    shape = (2, 6, 5, 4)
    gen = torch.Generator().manual_seed(5)
    x, r, g = (
        torch.randn(shape, generator=gen, dtype=torch.float64)
        for _ in range(3)
    )
    found = []
    for fn in _FUSED[variant]:
        _, wrt, grads = _grads(fn, _bn(6), x, r, g, create_graph=True)
        again = torch.autograd.grad(
            sum((t * t).sum() for t in grads if t.requires_grad),
            wrt,
            allow_unused=True,  # the bias's: its gradient is linear in g
        )
        found.append((*grads, *_zero_if_none(again, wrt)))
    for a, b in zip(*found, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize('layout', ['channels_last', 'broadcast'])
def test_a_residual_the_kernel_cannot_read_is_added_after_it(layout):
    x = torch.randn(2, 4, 5, 3, dtype=torch.float64)
    r = torch.randn(2, 4, 5, 3, dtype=torch.float64)
    if layout == 'channels_last':
        r = r.contiguous(memory_format=torch.channels_last)
    else:
        r = r[:1, :, :1, :1]
    ours, ref = _bn(4), _bn(4)
    xo, ro = x.clone().requires_grad_(), r.clone().requires_grad_()
    xr, rr = x.clone().requires_grad_(), r.clone().requires_grad_()
    y = batch_norm(xo, ours, nn.ReLU(), ro)
    y_ref = F.relu(ref(xr) + rr)
    torch.testing.assert_close(y, y_ref, rtol=1e-12, atol=1e-12)
    grads = torch.autograd.grad(y.sum(), (xo, ro))
    grads_ref = torch.autograd.grad(y_ref.sum(), (xr, rr))
    for a, b in zip(grads, grads_ref, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-11, atol=1e-11)


class _MyReLU(nn.ReLU):
    def forward(self, x):
        return super().forward(x) * 2


@pytest.mark.parametrize(
    'act',
    [nn.ReLU6(), nn.GELU(), _MyReLU()],
    ids=['relu6', 'gelu', 'subclass'],
)
def test_other_activations_run_as_they_are(act):
    """Only a plain ``nn.ReLU`` joins the kernel's pass; another module is
    called on its output."""
    x = torch.randn(2, 4, 5, 3, dtype=torch.float64) * 3
    ours, ref = _bn(4), _bn(4)
    y, grads = _step(lambda t, m: batch_norm(t, m, act), ours, x, x)
    y_ref, grads_ref = _step(lambda t, m: act(m(t)), ref, x, x)
    torch.testing.assert_close(y, y_ref, rtol=1e-12, atol=1e-12)
    for a, r in zip(grads, grads_ref, strict=True):
        torch.testing.assert_close(a, r, rtol=1e-11, atol=1e-11)


def _variants():
    x = torch.randn(2, 4, 3, 3)
    yield 'eval', x, _bn(4, dtype=torch.float32).eval()
    yield (
        'channels_last',
        x.contiguous(memory_format=torch.channels_last),
        _bn(4, dtype=torch.float32),
    )
    yield 'bfloat16', x.bfloat16(), _bn(4, dtype=torch.bfloat16)
    yield 'no running stats', x, nn.BatchNorm2d(4, track_running_stats=False)

    class MyNorm(nn.BatchNorm2d):
        pass

    yield 'subclass', x, MyNorm(4)


@pytest.mark.parametrize(
    'name, x, bn', list(_variants()), ids=[v[0] for v in _variants()]
)
def test_steps_aside_where_the_kernel_cannot_take_it(name, x, bn):
    """Another layout, dtype, mode or class: the module itself, the same
    numbers and buffers."""
    assert not takes_batch_norm_kernel(x, bn)
    ref = copy.deepcopy(bn)
    torch.testing.assert_close(batch_norm(x, bn), ref(x))
    for (n, a), b in zip(bn.named_buffers(), ref.buffers(), strict=True):
        torch.testing.assert_close(a, b, msg=n)


def test_steps_aside_under_autocast_and_for_one_value_per_channel():
    bn = _bn(4, dtype=torch.float32)
    x = torch.randn(2, 4, 3, 3)
    with torch.autocast('cpu', dtype=torch.bfloat16):
        assert not takes_batch_norm_kernel(x, bn)
    one = torch.randn(1, 4, 1, 1)
    assert not takes_batch_norm_kernel(one, bn)
    with pytest.raises(ValueError, match='more than 1 value per channel'):
        batch_norm(one, bn)  # the module's own error
    assert not takes_batch_norm_kernel(x, bn.double())
    with pytest.raises(RuntimeError, match='mixed dtype'):
        batch_norm(x, bn)  # the module's own error


def test_kernel_rejects_bad_input_naming_the_argument():
    op = torch.ops.mmevo.batch_norm_train
    x, w = torch.randn(2, 4, 3, 3), torch.randn(4)
    with pytest.raises(ValueError, match='input must be a contiguous'):
        op(x.transpose(2, 3), w, w, None, None, 0.1, 1e-5)
    with pytest.raises(TypeError, match='input must be float32 or float64'):
        op(x.half(), None, None, None, None, 0.1, 1e-5)
    with pytest.raises(TypeError, match="weight must have input's dtype"):
        op(x, w.double(), None, None, None, 0.1, 1e-5)
    with pytest.raises(ValueError, match=r'running_var must be a contiguous'):
        op(x, w, w, w.clone(), torch.ones(5), 0.1, 1e-5)
    with pytest.raises(ValueError, match='more than one value per channel'):
        op(x[:1, :, :1, :1].contiguous(), None, None, None, None, 0.1, 1e-5)
    with pytest.raises(ValueError, match='eps must be > 0'):
        op(x, None, None, None, None, 0.1, 0.0)
    with pytest.raises(ValueError, match='residual must be a contiguous'):
        op(x, None, None, None, None, 0.1, 1e-5, False, x[:1])
    with pytest.raises(TypeError, match="residual must have input's dtype"):
        op(x, None, None, None, None, 0.1, 1e-5, False, x.double())
    y, mean, invstd = op(x, None, None, None, None, 0.1, 1e-5)
    ref = F.batch_norm(x, None, None, training=True)
    torch.testing.assert_close(y, ref)
    torch.testing.assert_close(
        op(x, None, None, None, None, 0.1, 1e-5, True)[0], F.relu(ref)
    )
    torch.testing.assert_close(mean, x.mean((0, 2, 3)))
    var = x.var((0, 2, 3), unbiased=False)
    torch.testing.assert_close(invstd, (var + 1e-5).rsqrt())


def test_backward_kernel_rejects_bad_input_naming_the_argument():
    op = torch.ops.mmevo.batch_norm_train_backward
    x, w = torch.randn(2, 4, 3, 3), torch.randn(4)
    _, mean, invstd = torch.ops.mmevo.batch_norm_train(
        x, w, None, None, None, 0.1, 1e-5
    )
    mask = [True, True, True]
    with pytest.raises(ValueError, match='grad must be a contiguous'):
        op(x[:, :, :2], x, w, mean, invstd, mask)
    with pytest.raises(TypeError, match="grad must have input's dtype"):
        op(x.double(), x, w, mean, invstd, mask)
    with pytest.raises(ValueError, match=r'invstd must be a contiguous'):
        op(x, x, w, mean, invstd[:3], mask)
    with pytest.raises(ValueError, match="weight's gradient wanted"):
        op(x, x, None, mean, invstd, mask)
    with pytest.raises(ValueError, match='relu_output must be a contiguous'):
        op(x, x, w, mean, invstd, mask, x[:1])
    with pytest.raises(TypeError, match="relu_output must have input's"):
        op(x, x, w, mean, invstd, mask, x.double())
    with pytest.raises(ValueError, match='masked_grad wanted without'):
        op(x, x, w, mean, invstd, mask, None, True)
    gx, gw, gb, gr = op(x, x, None, mean, invstd, [True, False, True])
    assert gw is None and gr is None and gx.shape == x.shape
    torch.testing.assert_close(gb, x.sum((0, 2, 3)))
    # The gradient where relu_output > 0 only: here, where x > 0.
    _, _, gb, gr = op(x, x, None, mean, invstd, [False, False, True], x, True)
    torch.testing.assert_close(gr, x * (x > 0))
    torch.testing.assert_close(gb, gr.sum((0, 2, 3)))


@pytest.mark.parametrize(
    'shape', [(3, 5, 7, 1), (2, 16, 9, 11), (1, 8, 1, 1), (0, 4, 3, 3)]
)
@pytest.mark.parametrize('affine', [True, False])
@pytest.mark.parametrize('variant', list(_FUSED))
@pytest.mark.parametrize('layout', ['nchw', 'channels_last'])
def test_inference_equals_the_stock_graph_in_float64(
    threads, shape, affine, variant, layout
):
    """Eval mode, nothing to differentiate: the norm by the running
    statistics, the residual and the ReLU in one pass against the module
    graph, an empty batch and a single pixel included, NCHW and
    channels-last (the output in the input's layout, as the module's);
    the input, the residual and the buffers untouched."""
    ours = _bn(shape[1], affine).eval()
    ref = copy.deepcopy(ours)
    fused, stock = _FUSED[variant]
    gen = torch.Generator().manual_seed(sum(shape) + 2)
    fmt = getattr(torch, layout, torch.contiguous_format)
    x, r = (
        (
            torch.randn(shape, generator=gen, dtype=torch.float64) * 3 + 1
        ).contiguous(memory_format=fmt)
        for _ in range(2)
    )
    x0, r0 = x.clone(), r.clone()
    with torch.no_grad():
        assert takes_batch_norm_eval_kernel(x, ours, r)
        y = fused(x, ours, r)
        y_ref = stock(x.clone(), ref, r)
    if 'relu' in variant and x.numel():
        assert (y == 0).any() and (y > 0).any()
    torch.testing.assert_close(y, y_ref, rtol=1e-13, atol=1e-13)
    if x.numel():  # (an empty map's strides differ between ATen's ops)
        assert y.stride() == y_ref.stride()
    assert torch.equal(x, x0) and torch.equal(r, r0)
    for name, buf in ref.named_buffers():
        assert torch.equal(getattr(ours, name), buf), name


@pytest.mark.parametrize('layout', ['nchw', 'channels_last'])
@pytest.mark.parametrize('variant', list(_FUSED))
def test_inference_in_place_writes_the_same_values_over_its_input(
    threads, variant, layout
):
    """``inplace=True`` in inference: the result of the kernel that
    allocates, bit for bit, written over ``x`` (the same tensor comes
    back); the residual untouched."""
    fmt = getattr(torch, layout, torch.contiguous_format)
    gen = torch.Generator().manual_seed(11)
    x, r = (
        torch.randn(3, 6, 9, 7, generator=gen).contiguous(memory_format=fmt)
        for _ in range(2)
    )
    r0 = r.clone()
    bn = _bn(6, dtype=torch.float32).eval()
    fused, _ = _FUSED[variant]
    relu = nn.ReLU() if 'relu' in variant else None
    res = r if 'residual' in variant else None
    with torch.no_grad():
        expected = fused(x, bn, r)
        y = batch_norm(x, bn, relu, res, inplace=True)
    assert y is x
    assert torch.equal(y, expected) and torch.equal(r, r0)


def test_in_place_kernel_is_refused_by_autograd():
    """``mmevo::batch_norm_eval_`` has no derivative: a backward through it
    fails, and it bumps its input's version, so that a backward through a
    tensor it overwrote fails instead of using the new values."""
    op = torch.ops.mmevo.batch_norm_eval_
    w = torch.rand(4) + 0.5
    x = torch.randn(2, 4, 3, 3, requires_grad=True)
    with pytest.raises(RuntimeError, match='not implemented'):
        op(x.clone(), w, w, w, w, 1e-5).sum().backward()
    saved = x * 2
    y = saved * saved  # saves ``saved`` for the backward
    op(saved.detach(), w, w, w, w, 1e-5)
    with pytest.raises(RuntimeError, match='modified by an inplace'):
        y.sum().backward()


def test_in_place_leaves_its_input_alone_off_the_inference_kernel():
    """Where the inference kernel does not take the call (training, or a
    gradient to take), ``inplace`` changes nothing: the module's result,
    its gradient, the input untouched."""
    gen = torch.Generator().manual_seed(12)
    x = torch.randn(2, 4, 5, 5, generator=gen, dtype=torch.float64)
    x0 = x.clone()
    for bn in (_bn(4), _bn(4).eval()):
        ref = copy.deepcopy(bn)
        y = batch_norm(x, bn, nn.ReLU(), inplace=True)
        torch.testing.assert_close(y, F.relu(ref(x0)), rtol=0, atol=1e-13)
        assert torch.equal(x, x0)
        (g,) = torch.autograd.grad(y.sum(), bn.weight)
        (g_ref,) = torch.autograd.grad(F.relu(ref(x0)).sum(), ref.weight)
        torch.testing.assert_close(g, g_ref, rtol=1e-12, atol=1e-12)


def test_inference_in_float32_as_accurate_as_the_module():
    """float32 against the float64 module, channels of large running means
    and small variances: no further from it than the float32 module."""
    shape = (2, 24, 9, 13)
    gen = torch.Generator().manual_seed(4)
    ref = _bn(24).eval()
    with torch.no_grad():
        ref.running_mean.mul_(200)
        ref.running_var.mul_(1e-3)
    x = ref.running_mean.view(1, -1, 1, 1) + torch.randn(
        shape, generator=gen, dtype=torch.float64
    )
    r = torch.randn(shape, generator=gen, dtype=torch.float64)
    with torch.no_grad():
        y_ref = F.relu(ref(x) + r)
        bn = copy.deepcopy(ref).float()
        ours = batch_norm(x.float(), bn, nn.ReLU(), r.float())
        module = F.relu(bn(x.float()) + r.float())
        assert takes_batch_norm_eval_kernel(x.float(), bn)
    error = (ours.double() - y_ref).abs().max()
    assert error <= 2 * (module.double() - y_ref).abs().max() + 1e-6


@pytest.mark.parametrize('variant', list(_FUSED))
def test_inference_kernel_steps_aside_for_gradients(variant):
    """Eval mode with something to differentiate (an input, a residual or
    a parameter that requires grad, grad mode on: fine-tuning with
    ``norm_eval``): the module graph, its gradients; frozen parameters and
    inputs take the kernel, with nothing to differentiate."""
    shape = (2, 6, 5, 4)
    gen = torch.Generator().manual_seed(6)
    x, r, g = (
        torch.randn(shape, generator=gen, dtype=torch.float64)
        for _ in range(3)
    )
    fused, stock = _FUSED[variant]
    ours, ref = _bn(6).eval(), _bn(6).eval()
    assert not takes_batch_norm_eval_kernel(x.requires_grad_(), ours)
    x.requires_grad_(False)
    assert not takes_batch_norm_eval_kernel(x, ours)  # the weight's
    y, _, grads = _grads(fused, ours, x, r, g)
    y_ref, _, grads_ref = _grads(stock, ref, x, r, g)
    for a, b in zip((y, *grads), (y_ref, *grads_ref), strict=True):
        torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12)
    ours.requires_grad_(False)
    assert takes_batch_norm_eval_kernel(x, ours, r)
    assert not takes_batch_norm_eval_kernel(x, ours, r.requires_grad_())
    y = fused(x, ours, r.detach())
    assert not y.requires_grad
    torch.testing.assert_close(y, stock(x, ref, r.detach()).detach())


@pytest.mark.parametrize(
    'layout', ['channels_last', 'nchw_to_channels_last', 'broadcast']
)
def test_inference_adds_a_residual_the_kernel_cannot_read_after_it(layout):
    """A residual in another layout than x's, or broadcast."""
    x = torch.randn(2, 4, 5, 3, dtype=torch.float64)
    r = torch.randn(2, 4, 5, 3, dtype=torch.float64)
    if layout == 'channels_last':
        r = r.contiguous(memory_format=torch.channels_last)
    elif layout == 'nchw_to_channels_last':
        x = x.contiguous(memory_format=torch.channels_last)
    else:
        r = r[:1, :, :1, :1]
    bn = _bn(4).eval()
    with torch.no_grad():
        y = batch_norm(x, bn, nn.ReLU(), r)
        torch.testing.assert_close(y, F.relu(bn(x) + r), rtol=0, atol=1e-13)


def test_inference_steps_aside_where_the_kernel_cannot_take_it():
    """A strided input, bfloat16, a training BN or one without running
    statistics, a subclass, autocast: the module's numbers."""
    x = torch.randn(2, 4, 3, 3)
    bn = _bn(4, dtype=torch.float32).eval()
    cases = [
        (x.transpose(2, 3), bn),
        (x.bfloat16(), _bn(4, dtype=torch.bfloat16).eval()),
        (x, _bn(4, dtype=torch.float32)),
        (x, nn.BatchNorm2d(4, track_running_stats=False).eval()),
        (x, type('MyNorm', (nn.BatchNorm2d,), {})(4).eval()),
    ]
    with torch.no_grad():
        for t, m in cases:
            assert not takes_batch_norm_eval_kernel(t, m)
            ref = copy.deepcopy(m)
            torch.testing.assert_close(batch_norm(t, m), ref(t))
        with torch.autocast('cpu', dtype=torch.bfloat16):
            assert not takes_batch_norm_eval_kernel(x, bn)


def test_inference_reads_a_weight_moved_out_of_the_parameters():
    """A pruned BN's weight is a plain attribute (the masked tensor), its
    parameter ``weight_orig``: the kernel normalises by that weight, as
    the module does, before and after ``prune.remove``."""
    from torch.nn.utils import prune

    x = torch.randn(2, 6, 5, 4, dtype=torch.float64)
    bn = _bn(6).eval()
    prune.l1_unstructured(bn, 'weight', amount=0.5)
    assert 'weight' not in dict(bn.named_parameters())
    with torch.no_grad():
        assert takes_batch_norm_eval_kernel(x, bn)
        want = bn(x)  # its pre-hook masks the weight again
        assert (bn.weight == 0).sum() == 3
        torch.testing.assert_close(batch_norm(x, bn), want, rtol=0, atol=1e-13)
        prune.remove(bn, 'weight')
        torch.testing.assert_close(batch_norm(x, bn), want, rtol=0, atol=1e-13)


@pytest.mark.parametrize('name', ['batch_norm_eval', 'batch_norm_eval_'])
def test_eval_kernel_rejects_bad_input_naming_the_argument(name):
    """Both kernels, the one that allocates and the in-place one."""
    op = getattr(torch.ops.mmevo, name)
    x, w = torch.randn(2, 4, 3, 3), torch.rand(4) + 0.5
    with pytest.raises(ValueError, match='input must be a contiguous'):
        op(x.transpose(2, 3), w, w, w, w, 1e-5)
    with pytest.raises(TypeError, match='input must be float32 or float64'):
        op(x.half(), None, None, w.half(), w.half(), 1e-5)
    nhwc = x.contiguous(memory_format=torch.channels_last)
    with pytest.raises(ValueError, match='residual must be a channels-last'):
        op(nhwc, None, None, w, w, 1e-5, False, x)
    with pytest.raises(TypeError, match="running_mean must have input's"):
        op(x, None, None, w.double(), w, 1e-5)
    with pytest.raises(ValueError, match=r'running_var must be a contiguous'):
        op(x, None, None, w, torch.ones(5), 1e-5)
    with pytest.raises(ValueError, match=r'bias must be a contiguous'):
        op(x, w, torch.ones(4, 1), w, w, 1e-5)
    with pytest.raises(ValueError, match='eps must be > 0'):
        op(x, None, None, w, w, -1.0)
    with pytest.raises(ValueError, match='residual must be a contiguous'):
        op(x, None, None, w, w, 1e-5, False, x[:1])
    with pytest.raises(TypeError, match="residual must have input's dtype"):
        op(x, None, None, w, w, 1e-5, True, x.double())
    ref = F.batch_norm(x, w, w, w, w, False, 0.0, 1e-5)
    torch.testing.assert_close(op(x.clone(), w, w, w, w, 1e-5), ref)
    torch.testing.assert_close(
        op(x.clone(), w, w, w, w, 1e-5, True, x), F.relu(ref + x)
    )
