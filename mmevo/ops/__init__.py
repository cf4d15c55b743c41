"""Compiled evolution ops: window aggregation and local correlation.

Needs only torch (the C++ extension is loaded if built; Triton is imported
on the first CUDA call).
"""
from .evolution import (check_int, evolution_aggregate,
                        local_attention_weights, local_correlation,
                        output_size, resolve_window)
from .torch_backend import window_softmax

__all__ = [
    'check_int', 'evolution_aggregate',
    'local_attention_weights', 'local_correlation', 'output_size',
    'resolve_window', 'window_softmax'
]
