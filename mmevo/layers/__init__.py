"""Evolution layers: one generation function per file.

Every layer generates a kernel (B, G, K, K, H_out, W_out) and applies it with
:func:`mmevo.ops.evolution_aggregate`; see ``docs/operators.md``. The CPU
fast paths of some of them, and their switch, are described in
:mod:`mmevo.layers.fastpath`.
"""

from .acmix import ACmix
from .base import EvolutionLayer
from .dynamic_filter import DynamicFilter
from .elsa import ELSA
from .evolution_conv import EvolutionConv
from .fastpath import set_cpu_fastpath
from .involution import Involution
from .local_self_attention import LocalSelfAttention

__all__ = [
    'ELSA',
    'ACmix',
    'DynamicFilter',
    'EvolutionConv',
    'EvolutionLayer',
    'Involution',
    'LocalSelfAttention',
    'set_cpu_fastpath',
]
