"""The evolution layers the export tests run, one of each: odd channel
groups, reflect padding, dilation and relative position bias among them;
``LAYERS[name](stride)`` builds one."""

from mmevo.layers import (
    ELSA,
    ACmix,
    DynamicFilter,
    EvolutionConv,
    Involution,
    LocalSelfAttention,
)

LAYERS = {
    'EvolutionConv': lambda s: EvolutionConv(
        16, 3, groups=4, stride=s, dilation=2, padding_mode='reflect'
    ),
    'Involution': lambda s: Involution(16, 7, stride=s, group_channels=8),
    'DynamicFilter': lambda s: DynamicFilter(16, 3, stride=s),
    'LocalSelfAttention': lambda s: LocalSelfAttention(
        16,
        kernel_size=5,
        num_heads=4,
        stride=s,
        padding_mode='reflect',
        rel_pos_bias=True,
    ),
    'ELSA': lambda s: ELSA(16, num_heads=2, stride=s),
    'ACmix': lambda s: ACmix(16, 16, stride=s),
}
