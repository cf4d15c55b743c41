"""Compiled evolution ops: window aggregation and local correlation.

Needs only torch (the C++ extension is loaded if built; Triton is imported
on the first CUDA call). :mod:`.cpu_fastpath` holds the CPU-only rewrites of
the layers and backbones and their switch.
"""
from . import cpu_fastpath
from .evolution import (check_int, evolution_aggregate,
                        local_attention_weights, local_correlation,
                        output_size, resolve_window)
from .torch_backend import window_softmax

__all__ = [
    'check_int', 'cpu_fastpath', 'evolution_aggregate',
    'local_attention_weights', 'local_correlation', 'output_size',
    'resolve_window', 'window_softmax'
]
