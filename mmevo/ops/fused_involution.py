"""Fused involution: the span convolution and the aggregation in one op.

Involution generates its kernel with a 1x1 "span" convolution of the reduced
map z, ``W = S z + b`` of shape (B, G*K*K, H_out, W_out), and aggregates
with it. The kernel map is K*K*G / C times the input's size (3x at RedNet-50
stage 1), saved for the backward, and its gradient is as large.
``mmevo::fused_involution`` computes, per tile of pixels, the tile's kernel
from z in cache and aggregates with it; its backward recomputes it and
contracts each tile's kernel gradient ``dW = Corr(grad_y, x)`` into
grad_S (``+= dW z^T``), grad_b (``+= sum dW``) and grad_z (``+= S^T dW``) at
once, so neither W nor its gradient is ever written, and only x and z (and
the span parameters) are saved.

Two operators, registered like the other ``torch.ops.mmevo`` ones (schema
and CPU kernel in C++, ``csrc/fused_involution.cpp``, when the extension is
built; Python checks the arguments on every device, picks the backend, and
adds the fake kernels and autograd):

* ``mmevo::fused_involution(input, z, span_weight, span_bias, kernel_size,
  stride, dilation, groups) -> Tensor``;
* ``mmevo::fused_involution_backward(grad, <the same>) -> (grad_input,
  grad_z, grad_span_weight, grad_span_bias)``.

Backends: the C++ kernel (CPU); on the Triton backend, with
``MMEVO_FUSED_TRITON=1``, the fused Triton kernels (:mod:`.triton_fused`;
off by default until a GPU run of ``make gpu-check`` measures a win);
elsewhere the unfused composition on the backend's window primitives,
which writes the kernel map.
A backward with ``create_graph=True`` runs that unfused composition's
differentiable ops, so derivatives of every order exist.
"""

import os

import torch

from . import backends, cpp_backend, dispatch, library
from .checks import (
    INT64_MAX,
    Window,
    check_int,
    check_pair,
    check_span,
    check_tensor,
    map_size,
    size_of,
)
from .evolution import _autocast
from .reference import span_kernel

SCHEMAS = {
    'fused_involution': (
        '(Tensor input, Tensor z, Tensor span_weight, Tensor? span_bias, '
        'int kernel_size, int stride, int dilation, int groups) -> Tensor'
    ),
    'fused_involution_backward': (
        '(Tensor grad, Tensor input, Tensor z, Tensor span_weight, '
        'Tensor? span_bias, int kernel_size, int stride, int dilation, '
        'int groups) -> (Tensor, Tensor, Tensor, Tensor)'
    ),
}

if not cpp_backend.available():  # else the extension defined them
    for _name, _schema in SCHEMAS.items():
        # as the C++ schema: Inductor may pass x and z channels-last
        _tags = (
            (torch.Tag.flexible_layout,) if _name == 'fused_involution' else ()
        )
        library.LIB.define(_name + _schema, tags=_tags)


def check_fused_involution(
    input: torch.Tensor,
    z: torch.Tensor,
    span_weight: torch.Tensor,
    span_bias: torch.Tensor | None,
    kernel_size: int,
    stride: int,
    dilation: int,
    groups: int,
) -> tuple[int, int]:
    """Every relation of the fused involution's arguments; returns
    (H_out, W_out).

    Raises a TypeError (a wrong type or dtype) or ValueError (a wrong value
    or shape) naming the argument. The padding is ``dilation *
    (kernel_size - 1) // 2`` ("same"), so ``kernel_size`` must be odd.

    Example:
        >>> x, z = torch.randn(2, 32, 9, 9), torch.randn(2, 8, 5, 5)
        >>> s = torch.randn(2 * 9, 8, 1, 1)
        >>> check_fused_involution(x, z, s, None, 3, 2, 1, 2)
        (5, 5)
    """
    check_tensor('input', input, 4, '(B, C, H, W)')
    check_tensor('z', z, 4, '(B, C_r, H_out, W_out)')
    check_tensor('span_weight', span_weight, 4, '(G*K*K, C_r, 1, 1)')
    check_pair('input', input, 'z', z)
    check_pair('input', input, 'span_weight', span_weight)
    if span_bias is not None:
        check_tensor('span_bias', span_bias, 1, '(G*K*K,)')
        check_pair('input', input, 'span_bias', span_bias)
    check_int('kernel_size', kernel_size, 1)
    if kernel_size % 2 == 0:
        raise ValueError(
            f'kernel_size must be odd (the padding is dilation * '
            f'(kernel_size - 1) // 2, "same"), got {kernel_size}'
        )
    check_int('stride', stride, 1)
    check_int('dilation', dilation, 1)
    check_int('groups', groups, 1)
    check_span(kernel_size, dilation)
    B, C = size_of(input.shape[0]), size_of(input.shape[1])
    if C % groups:
        raise ValueError(
            f'input channels ({C}) must be divisible by groups={groups}'
        )
    rows, Cr = groups * kernel_size**2, size_of(z.shape[1])
    expected = (rows, Cr, 1, 1)
    if tuple(span_weight.shape) != expected:
        raise ValueError(
            f'span_weight must be (G*K*K, C_r, 1, 1) = {expected} for '
            f'groups={groups}, kernel_size={kernel_size} and z with '
            f'C_r={Cr} channels, got {tuple(span_weight.shape)}'
        )
    if span_bias is not None and tuple(span_bias.shape) != (rows,):
        raise ValueError(
            f'span_bias must be (G*K*K,) = ({rows},), got '
            f'{tuple(span_bias.shape)}'
        )
    window = same_window(kernel_size, stride, dilation)
    H, W = size_of(input.shape[2]), size_of(input.shape[3])
    if max(H, W) > INT64_MAX - 2 * window.padding:
        # the padding is no argument here: name what it comes from
        raise ValueError(
            f'dilation={dilation} with kernel_size={kernel_size} pads the '
            f'input by {window.padding} ("same"), and input {H} x {W} plus '
            f'twice that does not fit in int64'
        )
    Ho, Wo = (
        map_size(name, size_of(n), window)
        for name, n in zip(
            ('input height', 'input width'), input.shape[2:], strict=True
        )
    )
    if tuple(z.shape) != (B, Cr, Ho, Wo):
        raise ValueError(
            f'z must be (B, C_r, H_out, W_out) = {(B, Cr, Ho, Wo)} for input '
            f'{tuple(input.shape)}, kernel_size={kernel_size}, '
            f'stride={stride}, dilation={dilation}, got {tuple(z.shape)}'
        )
    return Ho, Wo


def _check_backward(grad, input, *args):
    Ho, Wo = check_fused_involution(input, *args)
    check_tensor('grad', grad, 4, '(B, C, H_out, W_out)')
    check_pair('input', input, 'grad', grad)
    expected = (*input.shape[:2], Ho, Wo)
    if tuple(grad.shape) != tuple(expected):
        raise ValueError(
            f'grad must be (B, C, H_out, W_out) = {tuple(expected)}, got '
            f'{tuple(grad.shape)}'
        )
    return Ho, Wo


# ------------------------------------------------ the unfused composition
def same_window(kernel_size, stride, dilation):
    """The fused involution's window: zero "same" padding."""
    return Window(
        kernel_size, stride, dilation * (kernel_size - 1) // 2, dilation
    )


def fused_involution_reference(
    input, z, span_weight, span_bias, kernel_size, stride, dilation, groups
):
    """The fused involution as its two unfused steps, differentiable to any
    order: the span convolution, then :func:`mmevo.ops.evolution_aggregate`
    (its registered autograd)."""
    w = span_kernel(z, span_weight, span_bias, kernel_size, groups)
    window = same_window(kernel_size, stride, dilation)
    return library.OPS['evolution_aggregate'](input, w, *window.scalars())


def _unfused_forward(input, z, span_weight, span_bias, K, s, d, G):
    w = span_kernel(z, span_weight, span_bias, K, G)
    return backends.run(input, 'aggregate', input, w, same_window(K, s, d))


def _unfused_backward(grad, input, z, span_weight, span_bias, K, s, d, G):
    w = span_kernel(z, span_weight, span_bias, K, G)
    window = same_window(K, s, d)
    B, Cr, Ho, Wo = z.shape
    grad_x = backends.run(
        input, 'aggregate_transpose', grad, w, tuple(input.shape[-2:]), window
    )
    acc = torch.promote_types(grad.dtype, torch.float32)
    dw = backends.run(input, 'correlate', grad, input, G, window)
    dw = dw.reshape(B, -1, Ho * Wo).to(acc)
    z3 = z.reshape(B, Cr, Ho * Wo).to(acc)
    grad_w = torch.einsum('bkp,brp->kr', dw, z3)
    grad_z = torch.einsum('kr,bkp->brp', span_weight.flatten(1).to(acc), dw)
    return (
        grad_x,
        grad_z.reshape(z.shape).to(z.dtype),
        grad_w.reshape(span_weight.shape).to(z.dtype),
        dw.sum((0, 2)).to(z.dtype),
    )


def _fused_triton(input):
    return (
        os.environ.get('MMEVO_FUSED_TRITON') == '1'
        and backends.backend_name(input) == 'triton'
    )


def _empty(input):
    return input.shape[0] == 0 or input.shape[1] == 0


def _python_forward(input, z, span_weight, span_bias, K, s, d, G):
    if _empty(input):
        Ho, Wo = z.shape[-2:]
        return input.new_zeros(*input.shape[:2], Ho, Wo).contiguous(
            memory_format=library.output_layout(input)
        )
    if _fused_triton(input):
        from . import triton_fused

        y = triton_fused.fused_involution_forward(
            input, z, span_weight, span_bias, K, s, d, G
        )
    else:
        y = _unfused_forward(input, z, span_weight, span_bias, K, s, d, G)
    return y.contiguous(memory_format=library.output_layout(input))


def _python_backward(grad, input, z, span_weight, span_bias, K, s, d, G):
    if _empty(input):
        return (
            torch.zeros_like(input, memory_format=torch.contiguous_format),
            torch.zeros_like(z, memory_format=torch.contiguous_format),
            span_weight.new_zeros(span_weight.shape),
            span_weight.new_zeros(span_weight.shape[0]),
        )
    if _fused_triton(input):
        from . import triton_fused

        backward = triton_fused.fused_involution_backward
    else:
        backward = _unfused_backward
    return backward(grad, input, z, span_weight, span_bias, K, s, d, G)


_fused = dispatch.register(
    'fused_involution', check_fused_involution, _python_forward
)
_fused_backward = dispatch.register(
    'fused_involution_backward', _check_backward, _python_backward
)


@torch.library.register_fake('mmevo::fused_involution')
def _(input, z, span_weight, span_bias, kernel_size, stride, dilation, groups):
    Ho, Wo = check_fused_involution(
        input,
        z,
        span_weight,
        span_bias,
        kernel_size,
        stride,
        dilation,
        groups,
    )
    return input.new_empty(*input.shape[:2], Ho, Wo).contiguous(
        memory_format=library.output_layout(input)
    )


@torch.library.register_fake('mmevo::fused_involution_backward')
def _(grad, input, z, span_weight, span_bias, *window):
    _check_backward(grad, input, z, span_weight, span_bias, *window)
    return (
        input.new_empty(input.shape),
        z.new_empty(z.shape),
        span_weight.new_empty(span_weight.shape),
        span_weight.new_empty(span_weight.shape[0]),
    )


def _setup(ctx, inputs, output):
    input, z, span_weight, span_bias = inputs[:4]
    ctx.save_for_backward(input, z, span_weight, span_bias)
    ctx.window = inputs[4:]
    ctx.backend = backends.forced()


def _backward(ctx, grad):
    input, z, span_weight, span_bias = ctx.saved_tensors
    if torch.is_grad_enabled():  # create_graph: a double backward follows
        return _differentiable_backward(ctx, grad)
    with backends.use_backend(ctx.backend):
        grads = _fused_backward(
            grad, input, z, span_weight, span_bias, *ctx.window
        )
    grads = [
        g if need else None
        for g, need in zip(grads, ctx.needs_input_grad, strict=False)
    ]
    if span_bias is None:
        grads[3] = None
    return (*grads, None, None, None, None)


def _differentiable_backward(ctx, grad):
    """The gradients as a graph (``create_graph=True``), made of the
    unfused composition's differentiable ops (the span convolution writes
    the kernel map): functions of ``grad`` and the saved tensors alone, so
    a path from ``z`` back to ``input`` is not counted twice."""
    input, z, span_weight, span_bias = ctx.saved_tensors
    K, s, d, G = ctx.window
    window = same_window(K, s, d).scalars()
    B, Cr, Ho, Wo = z.shape
    with backends.use_backend(ctx.backend):
        w = span_kernel(z, span_weight, span_bias, K, G)
        grad_x = library.OPS['evolution_aggregate_transpose'](
            grad, w, *input.shape[-2:], *window
        )
        dw = library.OPS['local_correlation'](grad, input, G, K, *window)
    dw = dw.reshape(B, G * K * K, Ho * Wo)
    grad_s = torch.einsum('bkp,brp->kr', dw, z.reshape(B, Cr, Ho * Wo))
    grad_z = torch.einsum('kr,bkp->brp', span_weight.flatten(1), dw)
    grads = [
        grad_x,
        grad_z.reshape(z.shape),
        grad_s.reshape(span_weight.shape),
        dw.sum((0, 2)) if span_bias is not None else None,
    ]
    grads = [
        g if need else None
        for g, need in zip(grads, ctx.needs_input_grad, strict=False)
    ]
    return (*grads, None, None, None, None)


torch.library.register_autograd(
    _fused, _backward, setup_context=_setup, lib=library.LIB
)


def fused_involution(
    input: torch.Tensor,
    z: torch.Tensor,
    span_weight: torch.Tensor,
    span_bias: torch.Tensor | None,
    kernel_size: int,
    stride: int = 1,
    dilation: int = 1,
    groups: int = 1,
) -> torch.Tensor:
    """Involution with the kernel generated from ``z`` on the fly.

    ``Y[b, c, i, j] = sum_{u, v} W[b, g(c), u, v, i, j] *
    X[b, c, i*s - p + u*d, j*s - p + v*d]`` with ``W = S z + b`` reshaped
    (B, G, K, K, H_out, W_out), group-major then row-major taps (as
    :class:`~mmevo.layers.Involution` views its span convolution's output),
    zero "same" padding ``p = d * (K - 1) // 2`` and ``g(c) = c // (C /
    G)``. Equal to ``evolution_aggregate(input, conv2d(z, span_weight,
    span_bias).view(B, G, K, K, H_out, W_out), stride, p, dilation)``, but
    the kernel map and its gradient are never written, and the backward
    saves only ``input`` and ``z`` (besides the span parameters).

    Args:
        input (Tensor): X (B, C, H, W); B and C may be 0.
        z (Tensor): the reduced map (B, C_r, H_out, W_out), after the
            reduction's norm and activation.
        span_weight (Tensor): S, (G*K*K, C_r, 1, 1) as the span
            ``nn.Conv2d`` holds it.
        span_bias (Tensor | None): b, (G*K*K,).
        kernel_size (int): K, odd.
        stride (int): window step. Default: 1.
        dilation (int): spacing of the window taps. Default: 1.
        groups (int): G, dividing C. Default: 1.

    Returns:
        Tensor: (B, C, H_out, W_out), the dtype of ``input`` (under
        autocast, the autocast dtype, to which every tensor is cast);
        channels-last when ``input`` is (and is not also contiguous).

    Example:
        >>> x, z = torch.randn(2, 32, 9, 9), torch.randn(2, 8, 5, 5)
        >>> span = torch.nn.Conv2d(8, 2 * 3 * 3, 1)
        >>> y = fused_involution(x, z, span.weight, span.bias, 3, 2,
        ...                      groups=2)
        >>> y.shape
        torch.Size([2, 32, 5, 5])
    """
    check_tensor('input', input, 4, '(B, C, H, W)')
    check_tensor('z', z, 4, '(B, C_r, H_out, W_out)')
    check_tensor('span_weight', span_weight, 4, '(G*K*K, C_r, 1, 1)')
    ints = dict(kernel_size=kernel_size, stride=stride, dilation=dilation)
    ints['groups'] = groups
    for name, value in ints.items():
        check_int(name, value, 1)  # before the schema's int64 cast
    input, z = _autocast(input, z)
    input, span_weight = _autocast(input, span_weight)
    if span_bias is not None:
        check_tensor('span_bias', span_bias, 1, '(G*K*K,)')
        input, span_bias = _autocast(input, span_bias)
    return _fused(input, z, span_weight, span_bias, *ints.values())
