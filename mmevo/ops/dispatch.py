"""The Python paths of the ``torch.ops.mmevo`` operators, and the kernel
that picks between them and the C++ one.

Every operator gets, for every device, a kernel that checks its arguments
(:mod:`mmevo.ops.checks`) and picks the backend (registered on the
``BackendSelect`` key, which every call passes before the device's kernel):
the C++ kernel (CPU), or the Python path of this module on Triton
(:mod:`mmevo.ops.triton_backend`, CUDA) or PyTorch
(:mod:`mmevo.ops.torch_backend`, elsewhere), or the backend forced with
``MMEVO_OPS_BACKEND`` (every thread) or :func:`~mmevo.ops.use_backend` (one
thread). Under ``'auto'``, a Triton kernel that fails to compile or launch
for a geometry is reported once and that geometry runs on PyTorch from then
on (:mod:`mmevo.ops.backends`).

The Python paths answer empty batches and maps without channels, and make
reflect padding explicit (aten's reflection pad, or an index gather when the
padding is not smaller than the map; their transposes for At), unless the
padded map would be much larger than the map: PyTorch then reads reflected
indices per window tap. They are the bodies of the Triton ops too
(:mod:`mmevo.ops.triton_ops`).

Example:
    >>> x, w = torch.randn(1, 4, 5, 5), torch.randn(1, 2, 3, 3, 5, 5)
    >>> aggregate(x, w, Window(3, 1, 1, 1, 'reflect')).shape
    torch.Size([1, 4, 5, 5])
"""

import torch

from . import backends, checks, cpp_backend, library, torch_backend
from .checks import Window
from .reflect import explicit_padding, fold_reflect, padded_fits


def _empty(t):
    """Whether ``t`` (B, C, ...) has no batch or no channels: the result is
    then empty or zero (and the kernels would divide by C = 0)."""
    return t.shape[0] == 0 or t.shape[1] == 0


def aggregate(input, kernel, window: Window):
    """Y = A(input, kernel) on the thread's backend, in the layout of
    :func:`~mmevo.ops.library.output_layout`."""
    out = _aggregate_any(input, kernel, window)
    return out.contiguous(memory_format=library.output_layout(input))


def _aggregate_any(input, kernel, window):
    if _empty(input):
        return input.new_zeros(*input.shape[:2], *kernel.shape[-2:])
    H, W = input.shape[-2:]
    if not window.reflects:
        return backends.run(
            input, 'aggregate', input, kernel, window.zero_padded()
        )
    if padded_fits(window.padding, H, W):
        xp = explicit_padding(input, window.padding)
        return backends.run(
            input, 'aggregate', xp, kernel, window.zero_padded(0)
        )
    return torch_backend.aggregate(input, kernel, window)


def correlation(query, key, groups, window: Window, softmax=False):
    """Corr(query, key) on the thread's backend; with ``softmax``, the
    attention weights (the softmax over each window)."""
    if _empty(query):  # sums over no channels: 0, a uniform softmax
        K = window.kernel_size
        return query.new_full(
            (query.shape[0], groups, K, K, *query.shape[-2:]),
            1 / K**2 if softmax else 0,
        )
    H, W = key.shape[-2:]
    if not window.reflects:
        return backends.run(
            query,
            'correlate',
            query,
            key,
            groups,
            window.zero_padded(),
            softmax,
        )
    if padded_fits(window.padding, H, W):
        xp = explicit_padding(key, window.padding)
        return backends.run(
            query,
            'correlate',
            query,
            xp,
            groups,
            window.zero_padded(0),
            softmax,
        )
    return torch_backend.correlate(query, key, groups, window, softmax)


def aggregate_transpose(grad, kernel, height, width, window: Window):
    """At(grad, kernel) of an input map of (height, width) on the thread's
    backend."""
    if _empty(grad):
        return grad.new_zeros(*grad.shape[:2], height, width)
    if not window.reflects:
        return backends.run(
            grad,
            'aggregate_transpose',
            grad,
            kernel,
            (height, width),
            window.zero_padded(),
        )
    padding = window.padding
    if padded_fits(padding, height, width):
        padded = (height + 2 * padding, width + 2 * padding)
        gxp = backends.run(
            grad,
            'aggregate_transpose',
            grad,
            kernel,
            padded,
            window.zero_padded(0),
        )
        return fold_reflect(gxp, padding, height, width)
    return torch_backend.aggregate_transpose(
        grad, kernel, (height, width), window
    )


# The paths on their operators' schema arguments.
def _aggregate_op(input, kernel, *window):
    return aggregate(input, kernel, Window(kernel.shape[2], *window))


def _correlation_op(softmax):
    def correlation_op(query, key, groups, kernel_size, *window):
        return correlation(
            query, key, groups, Window(kernel_size, *window), softmax
        )

    return correlation_op


def _transpose_op(grad, kernel, height, width, *window):
    return aggregate_transpose(
        grad, kernel, height, width, Window(kernel.shape[2], *window)
    )


#: each operator's Python path, called with the operator's arguments
PATHS = {
    'evolution_aggregate': _aggregate_op,
    'local_correlation': _correlation_op(False),
    'local_attention_weights': _correlation_op(True),
    'evolution_aggregate_transpose': _transpose_op,
}

#: each operator's checks of its arguments, by name
CHECKS = {
    'evolution_aggregate': checks.check_aggregate,
    'local_correlation': checks.check_correlation,
    'local_attention_weights': checks.check_correlation,
    'evolution_aggregate_transpose': checks.check_transpose,
}

_META = torch._C.DispatchKeySet(torch._C.DispatchKey.Meta)


def register(name, check, python):
    """The kernel of ``mmevo::<name>`` on every device: ``check`` the
    arguments, then run the backend (the C++ kernel through the
    dispatcher, or ``python``). Returns the operator.

    Example:
        >>> register('evolution_aggregate', CHECKS['evolution_aggregate'],
        ...          PATHS['evolution_aggregate'])
    """
    op = getattr(torch.ops.mmevo, name).default

    def kernel(keyset, *args):
        check(*args)
        t = args[0]
        if t.device.type == 'meta':
            return op.redispatch(_META, *args)
        if backends.backend_name(t) == 'cpp':
            return cpp_backend.call(op, *args)
        return python(*args)

    library.LIB.impl(name, kernel, 'BackendSelect', with_keyset=True)
    return op


for _name, _path in PATHS.items():
    register(_name, CHECKS[_name], _path)
