"""The common shape of every evolution layer: generate a kernel, aggregate.

``Y[b, c, i, j] = sum_{u, v} W[b, g(c), u, v, i, j] *
X[b, c, i*s - p + u*d, j*s - p + v*d]`` -- the layers differ only in how they
produce ``W`` (the *generation function*) and in what they feed to, and do
after, the aggregation. :class:`EvolutionLayer` holds the window geometry,
validates it once at build time, and routes every generated kernel through
:meth:`EvolutionLayer.aggregate`, where kernel hooks (used by
``tools/analysis/visualize_kernels.py``) can observe it.
"""

import inspect
import math
import weakref
from collections import OrderedDict
from collections.abc import Callable

import torch
from mmengine.model import BaseModule
from mmengine.registry import MODELS
from torch.utils.hooks import RemovableHandle

from mmevo.ops import evolution_aggregate, output_size, resolve_window
from mmevo.ops.checks import INT64_MAX

InitCfg = dict | list[dict] | None
KernelHook = Callable[['EvolutionLayer', torch.Tensor], None]


class _KernelHookHandle(RemovableHandle):
    """Removes its hook from the layer's kernel hooks as they are when
    ``remove`` is called: ``torch.export`` (non-strict) puts a copy of each
    module attribute back after tracing, and a handle holding the dict it
    was made for would leave the hook on the layer after an export."""

    def __init__(self, layer: 'EvolutionLayer') -> None:
        super().__init__(layer._kernel_hooks)
        self._layer = weakref.ref(layer)

    def remove(self) -> None:
        layer = self._layer()
        if layer is not None:
            layer._kernel_hooks.pop(self.id, None)
        super().remove()


def check_divisible(name, value, divisor_name, divisor):
    """Raise a clear build-time error unless ``divisor`` divides ``value``."""
    if value % divisor:
        raise ValueError(
            f'{name} ({value}) must be divisible by {divisor_name} ({divisor})'
        )


def check_weight_size(name: str, value: int, shape: tuple) -> None:
    """Raise a ValueError naming ``name`` unless a float64 weight of
    ``shape``, which its ``value`` sizes, fits in PyTorch's int64 byte
    count (PyTorch would fail in its allocator, naming no argument).

    Example:
        >>> check_weight_size('kernel_size', 7, (16 * 7**2, 4))
        >>> check_weight_size('kernel_size', 2**31, (2**62, 4))
        Traceback (most recent call last):
        ...
        ValueError: kernel_size=2147483648 gives a weight of shape ...
    """
    if math.prod(shape) * 8 > INT64_MAX:
        raise ValueError(
            f'{name}={value} gives a weight of shape {shape}: too large for '
            f'a tensor'
        )


def check_layer_cfg(
    name: str, cfg: dict | None, example: str, allow_none: bool = True
) -> None:
    """Raise a one-line error unless ``cfg`` can build a layer.

    mmcv's builders answer a string with a bare ``AssertionError`` and an
    unknown type with "Cannot find None in registry"; this names the
    argument, what it must be and the type it could not find.

    Args:
        name (str): the argument, e.g. ``'norm_cfg'``.
        cfg (dict | None): its value: ``dict(type=...)`` with a type
            registered in mmengine's ``MODELS`` (or a class).
        example (str): a valid type for the message, e.g. ``'BN'``.
        allow_none (bool): None (no layer) is allowed. Default: True.

    Example:
        >>> check_layer_cfg('norm_cfg', dict(type='GN', num_groups=4), 'BN')
        >>> try:
        ...     check_layer_cfg('norm_cfg', 'BN', 'BN')
        ... except TypeError as error:
        ...     print(error)
        norm_cfg must be a dict such as dict(type='BN') or None, got 'BN'
    """
    expected = f"a dict such as dict(type='{example}')"
    if cfg is None and allow_none:
        return
    if not isinstance(cfg, dict):
        none = ' or None' if allow_none else ''
        raise TypeError(f'{name} must be {expected}{none}, got {cfg!r}')
    if 'type' not in cfg:
        raise ValueError(
            f'{name} must be a dict with a "type" ({expected}), got {cfg!r}'
        )
    layer_type = cfg['type']
    if inspect.isclass(layer_type):
        return
    if not isinstance(layer_type, str):
        raise TypeError(
            f'{name} type must be a str or a class, got {layer_type!r}'
        )
    # The lookup mmcv's build_norm_layer / build_activation_layer make.
    with MODELS.switch_scope_and_registry(None) as registry:
        found = registry.get(layer_type)
    if found is None:
        raise ValueError(
            f'{name} has type {layer_type!r}, which is not '
            f"registered in mmengine's MODELS registry (e.g. "
            f"'{example}')"
        )


class EvolutionLayer(BaseModule):
    """Base of the evolution layers: ``forward = aggregate(*generate(x))``.

    Subclasses implement :meth:`generate`, returning the features to
    aggregate (the input itself, or a value projection) and the kernel
    (B, G, K, K, H_out, W_out). Layers with a post-processing step (an output
    projection, a parallel path) override :meth:`forward` but still call
    :meth:`aggregate`, so kernel hooks see every kernel.

    Args:
        kernel_size (int): K, the window size.
        stride (int): window step. Default: 1.
        padding (int | None): None is "same", ``dilation * (K - 1) // 2``,
            which needs an odd K. Default: None.
        dilation (int): spacing of the window taps. Default: 1.
        padding_mode (str): 'zeros' or 'reflect'. Default: 'zeros'.
        init_cfg (dict | list[dict], optional): mmengine initialisation.

    Example:
        >>> import torch
        >>> from mmevo.registry import MODELS
        >>> layer = MODELS.build(dict(type='Involution', channels=32))
        >>> kernels = []
        >>> handle = layer.register_kernel_hook(
        ...     lambda module, kernel: kernels.append(kernel))
        >>> _ = layer(torch.randn(1, 32, 8, 8))
        >>> kernels[0].shape          # (B, G, K, K, H_out, W_out)
        torch.Size([1, 2, 7, 7, 8, 8])
        >>> handle.remove()
    """

    def __init__(
        self,
        kernel_size: int,
        stride: int = 1,
        padding: int | None = None,
        dilation: int = 1,
        padding_mode: str = 'zeros',
        init_cfg: InitCfg = None,
    ) -> None:
        super().__init__(init_cfg=init_cfg)
        # Validate the geometry now so a bad config fails at build time,
        # not on the first batch.
        self.padding = resolve_window(
            kernel_size, stride, padding, dilation, padding_mode
        )
        self.kernel_size = kernel_size
        self.stride = stride
        self.dilation = dilation
        self.padding_mode = padding_mode
        self._kernel_hooks = OrderedDict()

    def generate(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Return ``(features, kernel)`` for :meth:`aggregate`.

        Args:
            x (Tensor): the layer input, (B, C_in, H, W).

        Returns:
            tuple[Tensor, Tensor]: features (B, C, H, W) and kernel
            (B, G, K, K, H_out, W_out).
        """
        raise NotImplementedError

    def generate_kernel(self, x: torch.Tensor) -> torch.Tensor:
        """The evolution kernel (B, G, K, K, H_out, W_out) for input ``x``."""
        return self.generate(x)[1]

    def window_input(
        self, features: torch.Tensor
    ) -> tuple[torch.Tensor, int, str]:
        """``(features, padding, padding_mode)`` for the window ops.

        The layer's own padding; a layer that pads a map once for several
        ops (ACmix) returns the padded map and padding 0 instead.
        """
        return features, self.padding, self.padding_mode

    def aggregate(
        self, features: torch.Tensor, kernel: torch.Tensor
    ) -> torch.Tensor:
        """Apply ``kernel`` to the windows of ``features`` (the shared op)."""
        for hook in self._kernel_hooks.values():
            hook(self, kernel)
        features, padding, mode = self.window_input(features)
        return evolution_aggregate(
            features, kernel, self.stride, padding, self.dilation, mode
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Generate the kernel from ``x``, then aggregate.

        Args:
            x (Tensor): (B, C_in, H, W).

        Returns:
            Tensor: (B, C_out, H_out, W_out).
        """
        return self.aggregate(*self.generate(x))

    def register_kernel_hook(self, hook: KernelHook) -> RemovableHandle:
        """Call ``hook(layer, kernel)`` on every kernel this layer generates.

        Args:
            hook (callable): receives the layer and the kernel
                (B, G, K, K, H_out, W_out); its return value is ignored.

        Returns:
            torch.utils.hooks.RemovableHandle: ``handle.remove()`` detaches it.
        """
        handle = _KernelHookHandle(self)
        self._kernel_hooks[handle.id] = hook
        return handle

    def output_size(self, size: int) -> int:
        """Output length of the window for an input length ``size``."""
        return output_size(
            size, self.kernel_size, self.stride, self.padding, self.dilation
        )

    def check_input(self, x: torch.Tensor, channels: int) -> None:
        """Raise a clear error unless ``x`` is (B, channels, H, W)."""
        if not isinstance(x, torch.Tensor):
            raise TypeError(
                f'{type(self).__name__} input must be a Tensor, '
                f'got {type(x).__name__}'
            )
        if x.dim() != 4 or x.shape[1] != channels:
            raise ValueError(
                f'{type(self).__name__} input must be '
                f'(B, {channels}, H, W), got {tuple(x.shape)}'
            )
