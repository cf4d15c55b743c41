"""The ``torch.ops.mmevo`` operators: their definitions and fake kernels.

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
without it they are defined here. The fake kernels (FakeTensor and meta
tensors: ``torch.compile``, ``torch.export``) check as the real ones do.
The kernel that picks a backend is :mod:`mmevo.ops.dispatch`'s, the
gradients :mod:`mmevo.ops.autograd`'s.
"""

import torch

from . import checks, cpp_backend

# Used as mmevo.ops.library's too (tests).
from .backends import BACKENDS, primitives, use_backend  # noqa: F401

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

#: the library fragment the Python kernels of mmevo's operators go into
LIB = torch.library.Library('mmevo', 'FRAGMENT')
if not cpp_backend.available():  # else the extension defined them
    for _name, _schema in SCHEMAS.items():
        _tags = (
            (torch.Tag.flexible_layout,) if _name in FLEXIBLE_LAYOUT else ()
        )
        LIB.define(_name + _schema, tags=_tags)

#: the operators, by name
OPS = {name: getattr(torch.ops.mmevo, name).default for name in SCHEMAS}


def output_layout(input):
    """The memory format of the aggregation's output: channels-last when
    ``input`` is channels-last and not also contiguous (every backend and
    the fake kernel agree, as compiled graphs assume)."""
    if input.is_contiguous(memory_format=torch.channels_last) and not (
        input.is_contiguous()
    ):
        return torch.channels_last
    return torch.contiguous_format


@torch.library.register_fake('mmevo::evolution_aggregate')
def _(input, kernel, *window):
    Ho, Wo = checks.check_aggregate(input, kernel, *window)
    return input.new_empty(*input.shape[:2], Ho, Wo).contiguous(
        memory_format=output_layout(input)
    )


def _correlation_fake(query, key, groups, kernel_size, *window):
    Ho, Wo = checks.check_correlation(query, key, groups, kernel_size, *window)
    return query.new_empty(
        query.shape[0], groups, kernel_size, kernel_size, Ho, Wo
    )


torch.library.register_fake('mmevo::local_correlation', _correlation_fake)
torch.library.register_fake(
    'mmevo::local_attention_weights', _correlation_fake
)


@torch.library.register_fake('mmevo::evolution_aggregate_transpose')
def _(grad, kernel, height, width, *window):
    checks.check_transpose(grad, kernel, height, width, *window)
    return grad.new_empty(*grad.shape[:2], height, width)
