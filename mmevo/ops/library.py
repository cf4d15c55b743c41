"""The ``torch.ops.mmevo`` operators: backend selection, fake kernels,
autograd.

Four operators, all taking resolved arguments:

* ``mmevo::evolution_aggregate(input, kernel, stride, padding, dilation,
  padding_mode)``: Y = A(X, W);
* ``mmevo::local_correlation(query, key, groups, kernel_size, stride, padding,
  dilation, padding_mode)``: Corr(Q, X);
* ``mmevo::evolution_aggregate_transpose(grad, kernel, height, width, stride,
  padding, dilation, padding_mode)``: At(G, W), the transpose of A in X;
* ``mmevo::local_attention_weights(query, key, ...)`` (the arguments of
  ``local_correlation``): softmax(Corr(Q, X)) over each window, the softmax
  fused into the C++ kernel.

Their schemas and CPU kernels come from the C++ extension
(:mod:`mmevo.ops.cpp_backend`), which C++ programs load without Python;
without it they are defined here. Python adds, for every device, a kernel
that checks the arguments (:mod:`mmevo.ops.checks`) and picks the backend
(registered on the ``BackendSelect`` key, which every call passes before
the device's kernel): the C++ kernel (CPU), Triton
(:mod:`mmevo.ops.triton_backend`, CUDA) or PyTorch
(:mod:`mmevo.ops.torch_backend`, elsewhere), or the one forced with
``MMEVO_OPS_BACKEND`` (every thread) or :func:`use_backend` (one thread). A
backward runs on its forward's backend. Under ``'auto'``, a Triton kernel
that fails to compile or launch for a geometry is reported once and that
geometry runs on PyTorch from then on.

Each one's gradients are the other ones (dX of A is At, dW of A is Corr, dQ of
Corr is A, dX of Corr is At, and At's are A and Corr; the attention weights
go through aten's softmax backward first), so derivatives of every order
exist and ``gradcheck``/``gradgradcheck`` hold. For the Triton and PyTorch
backends, empty batches and maps without channels are answered here, and
reflect padding is made explicit (aten's reflection pad, or an index gather
when the padding is not smaller than the map; their transposes for At),
unless the padded map would be much larger than the map: PyTorch then reads
reflected indices per window tap.
"""

import functools

import torch

from . import backends, checks, cpp_backend, torch_backend

# Used as mmevo.ops.library's too (tools, tests).
from .backends import BACKENDS, primitives, use_backend  # noqa: F401
from .reflect import (
    explicit_padding,
    fold_reflect,
    padded_fits,
)


def _empty(t):
    """Whether ``t`` (B, C, ...) has no batch or no channels: the result is
    then empty or zero (and the kernels would divide by C = 0)."""
    return t.shape[0] == 0 or t.shape[1] == 0


def _reflects(padding, padding_mode):
    return padding_mode == 'reflect' and padding > 0


# ---------------------------------------------------------------- operators
SCHEMAS = {
    'evolution_aggregate': (
        '(Tensor input, Tensor kernel, int stride, int padding, '
        'int dilation, str padding_mode) -> Tensor'
    ),
    'local_correlation': (
        '(Tensor query, Tensor key, int groups, int kernel_size, '
        'int stride, int padding, int dilation, str padding_mode) -> Tensor'
    ),
    'local_attention_weights': (
        '(Tensor query, Tensor key, int groups, int kernel_size, '
        'int stride, int padding, int dilation, str padding_mode) -> Tensor'
    ),
    'evolution_aggregate_transpose': (
        '(Tensor grad, Tensor kernel, int height, int width, int stride, '
        'int padding, int dilation, str padding_mode) -> Tensor'
    ),
}

#: operators whose inputs Inductor may pass in any layout it chose (as the
#: C++ schema's tags say): channels-last after its convolutions
FLEXIBLE_LAYOUT = ('evolution_aggregate',)

_lib = torch.library.Library('mmevo', 'FRAGMENT')  # noqa: TOR901
if not cpp_backend.available():  # else the extension defined them
    for _name, _schema in SCHEMAS.items():
        _tags = (
            (torch.Tag.flexible_layout,) if _name in FLEXIBLE_LAYOUT else ()
        )
        _lib.define(_name + _schema, tags=_tags)


def output_layout(input):
    """The memory format of the aggregation's output: channels-last when
    ``input`` is channels-last and not also contiguous (every backend and
    the fake kernel agree, as compiled graphs assume)."""
    if input.is_contiguous(memory_format=torch.channels_last) and not (
        input.is_contiguous()
    ):
        return torch.channels_last
    return torch.contiguous_format


def _aggregate_python(input, kernel, stride, padding, dilation, padding_mode):
    out = _aggregate_any(
        input, kernel, stride, padding, dilation, padding_mode
    )
    return out.contiguous(memory_format=output_layout(input))


def _aggregate_any(input, kernel, stride, padding, dilation, padding_mode):
    if _empty(input):
        return input.new_zeros(*input.shape[:2], *kernel.shape[-2:])
    H, W = input.shape[-2:]
    if not _reflects(padding, padding_mode):
        return backends.run(
            input, 'aggregate', input, kernel, stride, padding, dilation
        )
    if padded_fits(padding, H, W):
        xp = explicit_padding(input, padding)
        return backends.run(
            input, 'aggregate', xp, kernel, stride, 0, dilation
        )
    return torch_backend.aggregate(
        input, kernel, stride, padding, dilation, reflect=True
    )


def _correlation_python(softmax):

    def correlation(
        query,
        key,
        groups,
        kernel_size,
        stride,
        padding,
        dilation,
        padding_mode,
    ):
        if _empty(query):  # sums over no channels: 0, a uniform softmax
            return query.new_full(
                (
                    query.shape[0],
                    groups,
                    kernel_size,
                    kernel_size,
                    *query.shape[-2:],
                ),
                1 / kernel_size**2 if softmax else 0,
            )
        H, W = key.shape[-2:]
        window = (groups, kernel_size, stride)
        if not _reflects(padding, padding_mode):
            return backends.run(
                query,
                'correlate',
                query,
                key,
                *window,
                padding,
                dilation,
                softmax,
            )
        if padded_fits(padding, H, W):
            xp = explicit_padding(key, padding)
            return backends.run(
                query, 'correlate', query, xp, *window, 0, dilation, softmax
            )
        return torch_backend.correlate(
            query, key, *window, padding, dilation, softmax, reflect=True
        )

    return correlation


def _transpose_python(
    grad, kernel, height, width, stride, padding, dilation, padding_mode
):
    if _empty(grad):
        return grad.new_zeros(*grad.shape[:2], height, width)
    if not _reflects(padding, padding_mode):
        return backends.run(
            grad,
            'aggregate_transpose',
            grad,
            kernel,
            (height, width),
            stride,
            padding,
            dilation,
        )
    if padded_fits(padding, height, width):
        padded = (height + 2 * padding, width + 2 * padding)
        gxp = backends.run(
            grad,
            'aggregate_transpose',
            grad,
            kernel,
            padded,
            stride,
            0,
            dilation,
        )
        return fold_reflect(gxp, padding, height, width)
    return torch_backend.aggregate_transpose(
        grad, kernel, (height, width), stride, padding, dilation, reflect=True
    )


_META = torch._C.DispatchKeySet(torch._C.DispatchKey.Meta)


def _register(name, check, python):
    """The kernel of ``mmevo::<name>`` on every device: ``check`` the
    arguments, then run the backend (the C++ kernel through the
    dispatcher, or ``python``)."""
    op = getattr(torch.ops.mmevo, name).default

    def kernel(keyset, *args):
        check(*args)
        t = args[0]
        if t.device.type == 'meta':
            return op.redispatch(_META, *args)
        if backends.backend_name(t) == 'cpp':
            return cpp_backend.call(op, *args)
        return python(*args)

    _lib.impl(name, kernel, 'BackendSelect', with_keyset=True)
    return op


_aggregate = _register(
    'evolution_aggregate', checks.check_aggregate, _aggregate_python
)
_correlation = _register(
    'local_correlation', checks.check_correlation, _correlation_python(False)
)
_attention_weights = _register(
    'local_attention_weights',
    checks.check_correlation,
    _correlation_python(True),
)
_aggregate_transpose = _register(
    'evolution_aggregate_transpose', checks.check_transpose, _transpose_python
)


# Fake kernels (FakeTensor and meta tensors: torch.compile, torch.export)
# check as the real ones do.
@torch.library.register_fake('mmevo::evolution_aggregate')
def _(input, kernel, stride, padding, dilation, padding_mode):
    Ho, Wo = checks.check_aggregate(
        input, kernel, stride, padding, dilation, padding_mode
    )
    return input.new_empty(*input.shape[:2], Ho, Wo).contiguous(
        memory_format=output_layout(input)
    )


def _correlation_fake(
    query, key, groups, kernel_size, stride, padding, dilation, padding_mode
):
    Ho, Wo = checks.check_correlation(
        query,
        key,
        groups,
        kernel_size,
        stride,
        padding,
        dilation,
        padding_mode,
    )
    return query.new_empty(
        query.shape[0], groups, kernel_size, kernel_size, Ho, Wo
    )


torch.library.register_fake('mmevo::local_correlation', _correlation_fake)
torch.library.register_fake(
    'mmevo::local_attention_weights', _correlation_fake
)


@torch.library.register_fake('mmevo::evolution_aggregate_transpose')
def _(grad, kernel, height, width, stride, padding, dilation, padding_mode):
    checks.check_transpose(
        grad, kernel, height, width, stride, padding, dilation, padding_mode
    )
    return grad.new_empty(*grad.shape[:2], height, width)


# ----------------------------------------------------------------- autograd
def _window(ctx):
    return ctx.stride, ctx.padding, ctx.dilation, ctx.padding_mode


def _save_window(ctx, stride, padding, dilation, padding_mode):
    ctx.stride, ctx.padding = stride, padding
    ctx.dilation, ctx.padding_mode = dilation, padding_mode
    ctx.backend = backends.forced()


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
        grad_input = _aggregate_transpose(
            grad, kernel, *input.shape[-2:], *_window(ctx)
        )
    if ctx.needs_input_grad[1]:
        grad_kernel = _correlation(
            grad, input, kernel.shape[1], kernel.shape[2], *_window(ctx)
        )
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
        grad_key = _aggregate_transpose(
            query, grad, *key.shape[-2:], *_window(ctx)
        )
    return (grad_query, grad_key) + (None,) * 6


def _correlation_backward(ctx, grad):
    return _correlation_grads(ctx, *ctx.saved_tensors, grad)


def _attention_setup(ctx, inputs, output):
    query, key = inputs[:2]
    ctx.save_for_backward(query, key, output)
    _save_window(ctx, *inputs[4:])


def _attention_backward(ctx, grad):
    query, key, weights = ctx.saved_tensors
    logits_grad = torch.ops.aten._softmax_backward_data(
        grad.flatten(2, 3), weights.flatten(2, 3), 2, weights.dtype
    ).view_as(weights)
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
        d_kernel = _correlation(
            grad, grad_x, kernel.shape[1], kernel.shape[2], *_window(ctx)
        )
    return (d_grad, d_kernel) + (None,) * 6


for _op, _backward, _setup in (
    (_aggregate, _aggregate_backward, _aggregate_setup),
    (_correlation, _correlation_backward, _correlation_setup),
    (_aggregate_transpose, _transpose_backward, _transpose_setup),
    (_attention_weights, _attention_backward, _attention_setup),
):
    torch.library.register_autograd(
        _op, _on_forward_backend(_backward), setup_context=_setup, lib=_lib
    )
