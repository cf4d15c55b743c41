"""Helpers of the fast-path tests: run a model with ``use_cpu_fastpath`` on
and off and compare.

Both runs take the same float64 input: the outputs and the gradients of the
input and of every parameter must agree. Counted calls of the ``nn.Conv2d``
modules tell which path ran (the fast paths call some convs' weights
directly), so a comparison of the stock path with itself fails. They are
counted by wrapping each conv's ``forward``, not by hooks: a registered hook
makes the fast paths step aside.
"""

import torch
from torch import nn
from torch.nn.modules.batchnorm import _BatchNorm

from mmevo.layers import ACmix, set_cpu_fastpath


def count_conv_calls(model):
    """Wrap the forward of every nn.Conv2d of ``model`` (on the instance);
    return the list each module call appends the conv to.
    :func:`uncount_conv_calls` unwraps them."""
    calls = []
    for m in model.modules():
        if isinstance(m, nn.Conv2d):

            def forward(*args, _conv=m, **kwargs):
                calls.append(_conv)
                return type(_conv).forward(_conv, *args, **kwargs)

            m.forward = forward
    return calls


def uncount_conv_calls(model):
    """Undo :func:`count_conv_calls`."""
    for m in model.modules():
        m.__dict__.pop('forward', None)


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
    """Outputs, input gradient, parameter gradients and the number of conv
    module calls with the switch ``on``."""
    x = x.clone().requires_grad_()
    calls = count_conv_calls(model)
    model.zero_grad(set_to_none=True)
    # Until after the backward: a checkpointed block recomputes there.
    set_cpu_fastpath(model, on)
    try:
        outs = model(x)
        outs = outs if isinstance(outs, tuple) else (outs,)
        gen = torch.Generator().manual_seed(1)
        loss = sum(
            (o * torch.randn(o.shape, generator=gen, dtype=o.dtype)).sum()
            for o in outs
        )
        loss.backward()
    finally:
        set_cpu_fastpath(model, True)
    grads = {n: p.grad for n, p in model.named_parameters()}
    uncount_conv_calls(model)
    return outs, x.grad, grads, len(calls)


def assert_paths_equal(model, x, has_fast_path=True):
    """Fast and stock path: same outputs and gradients (float64); the fast
    path calls fewer conv modules, or as many if the model has none."""
    fast = run(model, x, True)
    stock = run(model, x, False)
    for a, b in zip(fast[0], stock[0], strict=True):
        assert a.shape == b.shape
        torch.testing.assert_close(a, b, rtol=1e-9, atol=1e-10)
    # float64 sums in another order (matmul against conv, one thread or
    # two): relative to the gradient's scale, as for the parameters below
    scale = max(1.0, float(stock[1].abs().max()))
    torch.testing.assert_close(
        fast[1], stock[1], rtol=1e-9, atol=1e-10 * scale
    )
    assert set(fast[2]) == set(stock[2])
    for name, g in stock[2].items():
        assert g is not None, name
        # float64 rounding of sums of thousands of terms, relative to the
        # gradient's scale (a backbone's reach 1e3): ~1e-13 of it
        scale = max(1.0, float(g.abs().max()))
        torch.testing.assert_close(
            fast[2][name], g, rtol=1e-9, atol=1e-10 * scale, msg=name
        )
    if has_fast_path:
        assert fast[3] < stock[3]
    else:
        assert fast[3] == stock[3]


def saved_bytes(model, x):
    """Bytes of the distinct storages autograd saves in one forward, the
    parameters' left out."""
    params = {p.untyped_storage().data_ptr() for p in model.parameters()}
    storages = {}

    def pack(t):
        storages[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        model(x)
    return sum(n for ptr, n in storages.items() if ptr not in params)


def float32_errors(model, ref, x):
    """Relative L2 errors of ``model``'s float32 train step (the outputs,
    the input gradient and each parameter gradient) against ``ref``'s in
    float64, on the same input and output gradients."""

    def step(net, dtype):
        inp = x.detach().to(dtype).requires_grad_()
        net.zero_grad(set_to_none=True)
        outs = net(inp)
        outs = outs if isinstance(outs, tuple) else (outs,)
        gen = torch.Generator().manual_seed(1)
        loss = sum(
            (o * torch.randn(o.shape, generator=gen).to(dtype)).sum()
            for o in outs
        )
        loss.backward()
        grads = {n: p.grad for n, p in net.named_parameters()}
        return [*outs, inp.grad], grads

    (vals, grads), (vals_ref, grads_ref) = (
        step(model, torch.float32),
        step(ref, torch.float64),
    )

    def rel(a, b):
        return ((a.double() - b).norm() / b.norm().clamp_min(1e-30)).item()

    errors = {
        f'value {i}': rel(a, b)
        for i, (a, b) in enumerate(zip(vals, vals_ref, strict=True))
    }
    errors.update({n: rel(g, grads_ref[n]) for n, g in grads.items()})
    return errors


def assert_float32_as_accurate(model, stock, ref, x):
    """``model``'s float32 train step (its fast path) is as close to
    ``ref``'s in float64 as ``stock``'s (the same model on its stock
    graph) in float32: every output and gradient within 3x the stock
    error (float32 BatchNorm over a small batch amplifies rounding), or
    within 1e-5, float32 rounding of a sum of ~10^4 terms (sqrt(N) units:
    a scalar gradient such as ACmix's ``rate1``, one dot product, lands
    anywhere from 1e-8 to 4e-6 with the summation order, which the CPU's
    vector width and the thread count set)."""
    fast_err = float32_errors(model, ref, x)
    stock_err = float32_errors(stock, ref, x)
    for name, err in fast_err.items():
        assert err <= 3 * stock_err[name] + 1e-5, (name, err, stock_err[name])
        # Rounding, not a wrong formula; except where the float64 value is
        # ~0 (ACmix's conv_p.bias: its gradients cancel exactly), so that
        # both float32 paths give noise.
        assert err < 1e-2 or stock_err[name] > 1e-3, (name, err)
