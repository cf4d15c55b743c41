"""Compiled evolution ops: window aggregation and local correlation.

Needs only torch (the C++ extension is loaded if built; Triton is imported
on the first CUDA call). :mod:`.cpu_fastpath` holds the CPU-only rewrites of
the layers and backbones and their switch.
"""
from . import cpu_fastpath
from .evolution import (evolution_aggregate, local_attention_weights,
                        local_correlation, output_size)

__all__ = [
    'cpu_fastpath', 'evolution_aggregate', 'local_attention_weights',
    'local_correlation', 'output_size'
]
