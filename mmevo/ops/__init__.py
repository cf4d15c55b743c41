"""Compiled evolution ops: window aggregation and local correlation."""
from .evolution import (evolution_aggregate, local_attention_weights,
                        local_correlation, output_size)

__all__ = [
    'evolution_aggregate', 'local_attention_weights', 'local_correlation',
    'output_size'
]
