"""Compiled evolution ops: window aggregation and local correlation.

Needs only torch: the C++ extension is loaded if built (else the ops run on
PyTorch on CPU), Triton is imported on the first CUDA call. Importing this
package imports nothing else and changes no global state beyond defining
the ``torch.ops.mmevo`` operators.
"""

from .backends import BACKENDS, use_backend
from .evolution import (
    check_int,
    evolution_aggregate,
    local_attention_weights,
    local_correlation,
    output_size,
    resolve_window,
)
from .fused_attention import fused_local_attention
from .fused_involution import fused_involution
from .torch_backend import window_softmax

__all__ = [
    'BACKENDS',
    'check_int',
    'evolution_aggregate',
    'fused_involution',
    'fused_local_attention',
    'local_attention_weights',
    'local_correlation',
    'output_size',
    'resolve_window',
    'use_backend',
    'window_softmax',
]
