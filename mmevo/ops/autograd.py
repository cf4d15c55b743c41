"""The gradients of the ``torch.ops.mmevo`` operators.

Each one's gradients are the other ones (dX of A is At, dW of A is Corr, dQ
of Corr is A, dX of Corr is At, and At's are A and Corr; the attention
weights go through aten's softmax backward first), so derivatives of every
order exist and ``gradcheck``/``gradgradcheck`` hold. A backward runs on
its forward's backend, whichever thread autograd runs it on.
"""

import functools

import torch

from . import backends, library
from .checks import Window

_aggregate = library.OPS['evolution_aggregate']
_correlation = library.OPS['local_correlation']
_attention_weights = library.OPS['local_attention_weights']
_aggregate_transpose = library.OPS['evolution_aggregate_transpose']


def _save_window(ctx, kernel_size, window):
    ctx.window = Window(kernel_size, *window)
    ctx.backend = backends.forced()


def _on_forward_backend(backward):
    """``backward`` run on the backend its forward ran on: autograd may run
    it on another thread, whose :func:`use_backend` is not the forward's."""

    @functools.wraps(backward)
    def run(ctx, grad):
        with backends.use_backend(ctx.backend):
            return backward(ctx, grad)

    return run


def _aggregate_setup(ctx, inputs, output):
    input, kernel = inputs[:2]
    ctx.save_for_backward(input, kernel)
    _save_window(ctx, kernel.shape[2], inputs[2:])


def _aggregate_backward(ctx, grad):
    input, kernel = ctx.saved_tensors
    window = ctx.window.scalars()
    grad_input = grad_kernel = None
    if ctx.needs_input_grad[0]:
        grad_input = _aggregate_transpose(
            grad, kernel, *input.shape[-2:], *window
        )
    if ctx.needs_input_grad[1]:
        grad_kernel = _correlation(
            grad, input, kernel.shape[1], kernel.shape[2], *window
        )
    return grad_input, grad_kernel, None, None, None, None


def _correlation_setup(ctx, inputs, output):
    query, key = inputs[:2]
    ctx.save_for_backward(query, key)
    _save_window(ctx, inputs[3], inputs[4:])


def _correlation_grads(ctx, query, key, grad):
    """Gradients of query and key from that of Corr(query, key)."""
    window = ctx.window.scalars()
    grad_query = grad_key = None
    if ctx.needs_input_grad[0]:
        grad_query = _aggregate(key, grad, *window)
    if ctx.needs_input_grad[1]:
        grad_key = _aggregate_transpose(query, grad, *key.shape[-2:], *window)
    return (grad_query, grad_key) + (None,) * 6


def _correlation_backward(ctx, grad):
    return _correlation_grads(ctx, *ctx.saved_tensors, grad)


def _attention_setup(ctx, inputs, output):
    query, key = inputs[:2]
    ctx.save_for_backward(query, key, output)
    _save_window(ctx, inputs[3], inputs[4:])


def _attention_backward(ctx, grad):
    query, key, weights = ctx.saved_tensors
    logits_grad = torch.ops.aten._softmax_backward_data(
        grad.flatten(2, 3), weights.flatten(2, 3), 2, weights.dtype
    ).view_as(weights)
    return _correlation_grads(ctx, query, key, logits_grad)


def _transpose_setup(ctx, inputs, output):
    grad, kernel = inputs[:2]
    ctx.save_for_backward(grad, kernel)
    _save_window(ctx, kernel.shape[2], inputs[4:])


def _transpose_backward(ctx, grad_x):
    grad, kernel = ctx.saved_tensors
    window = ctx.window.scalars()
    d_grad = d_kernel = None
    if ctx.needs_input_grad[0]:
        d_grad = _aggregate(grad_x, kernel, *window)
    if ctx.needs_input_grad[1]:
        d_kernel = _correlation(
            grad, grad_x, kernel.shape[1], kernel.shape[2], *window
        )
    return (d_grad, d_kernel) + (None,) * 6


for _op, _backward, _setup in (
    (_aggregate, _aggregate_backward, _aggregate_setup),
    (_correlation, _correlation_backward, _correlation_setup),
    (_aggregate_transpose, _transpose_backward, _transpose_setup),
    (_attention_weights, _attention_backward, _attention_setup),
):
    torch.library.register_autograd(
        _op,
        _on_forward_backend(_backward),
        setup_context=_setup,
        lib=library.LIB,
    )
