"""``torch.library`` registration of the evolution ops: dispatch, fake,
autograd.

Four operators, all taking resolved arguments (validation happens once, in
:mod:`mmevo.ops.evolution`):

* ``mmevo::evolution_aggregate(input, kernel, stride, padding, dilation,
  padding_mode)``: Y = A(X, W);
* ``mmevo::local_correlation(query, key, groups, kernel_size, stride, padding,
  dilation, padding_mode)``: Corr(Q, X);
* ``mmevo::evolution_aggregate_transpose(grad, kernel, height, width, stride,
  padding, dilation, padding_mode)``: At(G, W), the transpose of A in X;
* ``mmevo::local_attention_weights(query, key, ...)`` (the arguments of
  ``local_correlation``): softmax(Corr(Q, X)) over each window, the softmax
  fused into the C++ kernel.

Empty batches and maps without channels (B = 0, C = 0) are answered here,
before any backend runs: backends see B >= 1 and C >= 1. The backend is the
thread's (``MMEVO_OPS_BACKEND`` for every thread, :func:`use_backend` in
one), and a backward runs on its forward's.

Each one's gradients are the other ones (dX of A is At, dW of A is Corr, dQ of
Corr is A, dX of Corr is At, and At's are A and Corr; the attention weights
go through aten's softmax backward first), so derivatives of every order
exist and ``gradcheck``/``gradgradcheck`` hold. Reflect padding is made
explicit here (aten's reflection pad, or an index gather when the padding
is not smaller than the map; their transposes for At), so backends
only implement zero padding. Backends: C++ on CPU
(:mod:`mmevo.ops.cpp_backend`), Triton on CUDA
(:mod:`mmevo.ops.triton_backend`), and shift-and-accumulate in PyTorch
(:mod:`mmevo.ops.torch_backend`) elsewhere or when forced with
``MMEVO_OPS_BACKEND`` / :func:`use_backend`.
"""
import contextlib
import functools
import importlib
import os
import threading

import torch

from . import cpp_backend, torch_backend

BACKENDS = ('auto', 'cpp', 'triton', 'torch')


class _ForcedBackend(threading.local):
    """The backend of this thread: ``MMEVO_OPS_BACKEND`` (read at import)
    until :func:`use_backend` changes it, for this thread only."""
    name = os.environ.get('MMEVO_OPS_BACKEND', 'auto')


_forced = _ForcedBackend()


@contextlib.contextmanager
def use_backend(name):
    """Force a backend for the ops this thread runs inside the block.

    Other threads keep theirs. The backward of an op runs on the backend of
    its forward, wherever it runs (autograd runs CUDA backwards on threads
    of its own).

    Args:
        name (str): one of 'auto', 'cpp', 'triton', 'torch'.

    Example:
        >>> with use_backend('torch'):  # the pure PyTorch formulation
        ...     y = evolution_aggregate(x, w)
    """
    if name not in BACKENDS:
        raise ValueError(f'backend must be one of {BACKENDS}, got {name!r}')
    old, _forced.name = _forced.name, name
    try:
        yield
    finally:
        _forced.name = old


def _triton_available():
    try:
        importlib.import_module('triton')
    except ImportError:
        return False
    return True


def primitives(t):
    """The backend module (aggregate / aggregate_transpose / correlate)
    for ``t``."""
    name = _forced.name
    if name == 'auto':
        if t.device.type == 'cpu' and cpp_backend.available():
            name = 'cpp'
        elif t.device.type == 'cuda' and _triton_available():
            name = 'triton'
        else:
            name = 'torch'
    if name == 'cpp':
        return cpp_backend
    if name == 'triton':
        return importlib.import_module('mmevo.ops.triton_backend')
    return torch_backend


def reflect_index(size, padding, device):
    """Source index of each of the ``size + 2 * padding`` padded positions.

    numpy-style 'reflect' (the edge is not repeated), folded again as often as
    needed, so any padding works on any size, 1 included.
    """
    pos = torch.arange(-padding, size + padding, device=device)
    if size == 1:
        return torch.zeros_like(pos)
    period = 2 * (size - 1)
    pos = pos.remainder(period)
    return torch.where(pos >= size, period - pos, pos)


def _small_padding(padding, H, W):
    """Whether one reflection suffices, i.e. aten's reflection_pad is exact."""
    return padding < H and padding < W


def _explicit_padding(x, padding, padding_mode):
    """(x, padding) for the zero-padding kernels: reflect becomes explicit."""
    if padding_mode == 'zeros' or padding == 0:
        return x, padding
    H, W = x.shape[-2:]
    if _small_padding(padding, H, W):
        # aten's reflection pad is numpy 'reflect' here and several times
        # faster than two index_select gathers.
        return torch.nn.functional.pad(x, (padding, ) * 4, mode='reflect'), 0
    # Padding >= size reflects repeatedly, which aten rejects: gather.
    rows = reflect_index(H, padding, x.device)
    cols = reflect_index(W, padding, x.device)
    return x.index_select(2, rows).index_select(3, cols), 0


def _fold_reflect(gxp, padding, H, W):
    """Transpose of the reflect padding: add padded positions to their source.

    Summed in fp32 at least when the padding reflects repeatedly: a pixel of
    a small map then receives up to ``(1 + 2 * padding)**2`` terms.
    """
    # aten's reflection pad backward and index_add_ are sequential, so
    # deterministic, on CPU only; elsewhere they add with atomics.
    if gxp.device.type == 'cpu' and _small_padding(padding, H, W):
        # Only the shape of the second argument is read, so it stays empty.
        return torch.ops.aten.reflection_pad2d_backward(
            gxp, gxp.new_empty(*gxp.shape[:2], H, W), [padding] * 4)
    dtype = gxp.dtype
    gxp = gxp.to(torch.promote_types(dtype, torch.float32))
    rows = reflect_index(H, padding, gxp.device)
    cols = reflect_index(W, padding, gxp.device)
    if gxp.device.type == 'cpu':
        out = gxp.new_zeros(*gxp.shape[:2], H,
                            gxp.shape[3]).index_add_(2, rows, gxp)
        return gxp.new_zeros(*gxp.shape[:2], H, W).index_add_(3, cols,
                                                              out).to(dtype)
    # A one-hot matmul is deterministic.
    rh = torch.nn.functional.one_hot(rows, H).to(gxp.dtype)  # (Hp, H)
    rw = torch.nn.functional.one_hot(cols, W).to(gxp.dtype)  # (Wp, W)
    return torch.matmul(torch.matmul(rh.t(), gxp), rw).to(dtype)


def _empty(t):
    """Whether ``t`` (B, C, ...) has no batch or no channels: the result is
    then empty or zero (and the kernels would divide by C = 0)."""
    return t.shape[0] == 0 or t.shape[1] == 0


# ---------------------------------------------------------------- operators
@torch.library.custom_op(
    'mmevo::evolution_aggregate',
    mutates_args=(),
    schema='(Tensor input, Tensor kernel, int stride, int padding, '
    'int dilation, str padding_mode) -> Tensor')
def _aggregate(input, kernel, stride, padding, dilation, padding_mode):
    if _empty(input):
        return input.new_zeros(*input.shape[:2], *kernel.shape[-2:])
    x, p = _explicit_padding(input, padding, padding_mode)
    return primitives(input).aggregate(x, kernel, stride, p, dilation)


def _correlation_op(name, softmax):
    """Register ``mmevo::<name>``: Corr(query, key), with the window softmax
    if ``softmax`` (the backends fuse it)."""

    @torch.library.custom_op(
        f'mmevo::{name}',
        mutates_args=(),
        schema='(Tensor query, Tensor key, int groups, int kernel_size, '
        'int stride, int padding, int dilation, str padding_mode) -> Tensor')
    def op(query, key, groups, kernel_size, stride, padding, dilation,
           padding_mode):
        if _empty(query):  # sums over no channels: 0, a uniform softmax
            return query.new_full((query.shape[0], groups, kernel_size,
                                   kernel_size, *query.shape[-2:]),
                                  1 / kernel_size**2 if softmax else 0)
        x, p = _explicit_padding(key, padding, padding_mode)
        return primitives(query).correlate(query, x, groups, kernel_size,
                                           stride, p, dilation, softmax)

    return op


_correlation = _correlation_op('local_correlation', softmax=False)
_attention_weights = _correlation_op('local_attention_weights', softmax=True)


@torch.library.custom_op(
    'mmevo::evolution_aggregate_transpose',
    mutates_args=(),
    schema='(Tensor grad, Tensor kernel, int height, int width, int stride, '
    'int padding, int dilation, str padding_mode) -> Tensor')
def _aggregate_transpose(grad, kernel, height, width, stride, padding,
                         dilation, padding_mode):
    if _empty(grad):
        return grad.new_zeros(*grad.shape[:2], height, width)
    prims = primitives(grad)
    if padding_mode == 'zeros' or padding == 0:
        return prims.aggregate_transpose(grad, kernel, (height, width), stride,
                                         padding, dilation)
    gxp = prims.aggregate_transpose(
        grad, kernel, (height + 2 * padding, width + 2 * padding), stride, 0,
        dilation)
    return _fold_reflect(gxp, padding, height, width)


@_aggregate.register_fake
def _(input, kernel, stride, padding, dilation, padding_mode):
    return input.new_empty(*input.shape[:2], *kernel.shape[-2:])


@_correlation.register_fake
@_attention_weights.register_fake
def _(query, key, groups, kernel_size, stride, padding, dilation,
      padding_mode):
    return query.new_empty(query.shape[0], groups, kernel_size, kernel_size,
                           *query.shape[-2:])


@_aggregate_transpose.register_fake
def _(grad, kernel, height, width, stride, padding, dilation, padding_mode):
    return grad.new_empty(*grad.shape[:2], height, width)


# ----------------------------------------------------------------- autograd
def _window(ctx):
    return ctx.stride, ctx.padding, ctx.dilation, ctx.padding_mode


def _save_window(ctx, stride, padding, dilation, padding_mode):
    ctx.stride, ctx.padding = stride, padding
    ctx.dilation, ctx.padding_mode = dilation, padding_mode
    ctx.backend = _forced.name


def _on_forward_backend(backward):
    """``backward`` run on the backend its forward ran on: autograd may run
    it on another thread, whose :func:`use_backend` is not the forward's."""

    @functools.wraps(backward)
    def run(ctx, grad):
        with use_backend(ctx.backend):
            return backward(ctx, grad)

    return run


def _aggregate_setup(ctx, inputs, output):
    input, kernel = inputs[:2]
    ctx.save_for_backward(input, kernel)
    _save_window(ctx, *inputs[2:])


def _aggregate_backward(ctx, grad):
    input, kernel = ctx.saved_tensors
    grad_input = grad_kernel = None
    if ctx.needs_input_grad[0]:
        grad_input = _aggregate_transpose(grad, kernel, *input.shape[-2:],
                                          *_window(ctx))
    if ctx.needs_input_grad[1]:
        grad_kernel = _correlation(grad, input, kernel.shape[1],
                                   kernel.shape[2], *_window(ctx))
    return grad_input, grad_kernel, None, None, None, None


def _correlation_setup(ctx, inputs, output):
    query, key = inputs[:2]
    ctx.save_for_backward(query, key)
    _save_window(ctx, *inputs[4:])


def _correlation_grads(ctx, query, key, grad):
    """Gradients of query and key from that of Corr(query, key)."""
    grad_query = grad_key = None
    if ctx.needs_input_grad[0]:
        grad_query = _aggregate(key, grad, *_window(ctx))
    if ctx.needs_input_grad[1]:
        grad_key = _aggregate_transpose(query, grad, *key.shape[-2:],
                                        *_window(ctx))
    return (grad_query, grad_key) + (None, ) * 6


def _correlation_backward(ctx, grad):
    return _correlation_grads(ctx, *ctx.saved_tensors, grad)


def _attention_setup(ctx, inputs, output):
    query, key = inputs[:2]
    ctx.save_for_backward(query, key, output)
    _save_window(ctx, *inputs[4:])


def _attention_backward(ctx, grad):
    query, key, weights = ctx.saved_tensors
    logits_grad = torch.ops.aten._softmax_backward_data(
        grad.flatten(2, 3), weights.flatten(2, 3), 2,
        weights.dtype).view_as(weights)
    return _correlation_grads(ctx, query, key, logits_grad)


def _transpose_setup(ctx, inputs, output):
    grad, kernel = inputs[:2]
    ctx.save_for_backward(grad, kernel)
    _save_window(ctx, *inputs[4:])


def _transpose_backward(ctx, grad_x):
    grad, kernel = ctx.saved_tensors
    d_grad = d_kernel = None
    if ctx.needs_input_grad[0]:
        d_grad = _aggregate(grad_x, kernel, *_window(ctx))
    if ctx.needs_input_grad[1]:
        d_kernel = _correlation(grad, grad_x, kernel.shape[1], kernel.shape[2],
                                *_window(ctx))
    return (d_grad, d_kernel) + (None, ) * 6


_aggregate.register_autograd(
    _on_forward_backend(_aggregate_backward), setup_context=_aggregate_setup)
_correlation.register_autograd(
    _on_forward_backend(_correlation_backward),
    setup_context=_correlation_setup)
_aggregate_transpose.register_autograd(
    _on_forward_backend(_transpose_backward), setup_context=_transpose_setup)
_attention_weights.register_autograd(
    _on_forward_backend(_attention_backward), setup_context=_attention_setup)
