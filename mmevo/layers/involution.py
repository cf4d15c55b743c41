"""Involution (Li et al., CVPR 2021): a kernel generated per pixel from it."""

import torch
import torch.nn as nn
from mmcv.cnn import ConvModule

from mmevo.ops import check_int
from mmevo.registry import MODELS

from .base import (
    EvolutionLayer,
    InitCfg,
    check_divisible,
    check_layer_cfg,
    check_weight_size,
)
from .fastpath import (
    avg_pool,
    batch_norm,
    call_cpu_kernel,
    conv1x1,
    cpu_fastpath_default,
    takes_cpu_fastpath,
    takes_fused_cpu,
)

#: The smallest output map (pixels per image) where the fused op runs. From
#: 28² it is faster than the unfused path; at 14² (RedNet-50's stage 3) the
#: layer is within 4% and the RedNet-50 train step even, for half the layer
#: memory (RedNet-50: 418 against 432 MiB); at 7² the per-group kernel
#: recomputation on short rows takes 1.8-2x the unfused time
#: (``docs/benchmarks.md``).
FUSED_MIN_PIXELS = 14 * 14


@MODELS.register_module()
class Involution(EvolutionLayer):
    """Involution: per-pixel K x K kernels shared by groups of channels.

    Generation function: (average-pool by the stride) -> 1x1 conv C -> C/r,
    BN, ReLU (``conv1``) -> 1x1 conv C/r -> K*K*G with bias (``conv2``),
    reshaped to (G, K, K) group-major then row-major. Aggregation: zero
    "same" padding, G = C / group_channels. Parameter names match the
    published code, so its checkpoints load unchanged.

    Unlike the published code, pooling uses ``ceil_mode`` so that odd sizes
    with stride > 1 work: the kernel map and the output are both
    ceil(H / s) x ceil(W / s). On sizes divisible by the stride the numbers
    are the published ones.

    On CPU in eager mode the 1x1 convolutions of the generation function run
    on the faster of oneDNN and a matmul (:meth:`_kernel_weights_cpu`, the
    same modules and numbers), and a strided layer's average pool over whole
    windows as a depthwise convolution
    (:func:`~mmevo.layers.fastpath.avg_pool`, the same sums), while
    ``use_cpu_fastpath`` is True (see :mod:`mmevo.layers.fastpath`).
    Under the same switch, maps of at least :data:`FUSED_MIN_PIXELS` output
    pixels run the span convolution and the aggregation as one op,
    :func:`mmevo.ops.fused_involution.fused_involution` (C++), which never
    writes the (B, G*K*K, H, W) kernel map: there it is faster and needs
    less memory (``docs/benchmarks.md``); with nothing to differentiate, its
    C++ kernel is called directly
    (:func:`~mmevo.layers.fastpath.call_cpu_kernel`). It steps aside for a
    kernel hook (which must see the kernel) and where its C++ kernel cannot
    take the call (autocast, an input dtype other than the layer's, another
    backend forced). A CPU AOTInductor package computes the layer with the
    same op, on the channels-last maps of its convolutions
    (:func:`mmevo.deploy.export_aoti`'s ``fused_involution``).

    Args:
        channels (int): input = output channels C.
        kernel_size (int): K, odd. Default: 7.
        stride (int): window step. Default: 1.
        reduction_ratio (int): r of the bottleneck C -> C/r. Default: 4.
        group_channels (int): channels per kernel group; C must be divisible
            by it. Default: 16.
        dilation (int): spacing of the window taps. Default: 1.
        norm_cfg (dict | None): norm of ``conv1``. Default: BN.
        act_cfg (dict | None): activation of ``conv1``. Default: ReLU.
        init_cfg (dict | list[dict], optional): mmengine initialisation.

    Example:
        >>> import torch
        >>> from mmevo.registry import MODELS
        >>> layer = MODELS.build(dict(type='Involution', channels=64,
        ...                           kernel_size=7, stride=2))
        >>> layer(torch.randn(2, 64, 15, 16)).shape
        torch.Size([2, 64, 8, 8])
    """

    def __init__(
        self,
        channels: int,
        kernel_size: int = 7,
        stride: int = 1,
        reduction_ratio: int = 4,
        group_channels: int = 16,
        dilation: int = 1,
        norm_cfg: dict | None = dict(type='BN'),
        act_cfg: dict | None = dict(type='ReLU'),
        init_cfg: InitCfg = None,
    ) -> None:
        super().__init__(
            kernel_size, stride, None, dilation, 'zeros', init_cfg
        )
        check_layer_cfg('norm_cfg', norm_cfg, 'BN')
        check_layer_cfg('act_cfg', act_cfg, 'ReLU')
        check_int('channels', channels)
        check_int('reduction_ratio', reduction_ratio)
        check_int('group_channels', group_channels)
        check_divisible('channels', channels, 'group_channels', group_channels)
        if channels // reduction_ratio < 1:
            raise ValueError(
                f'channels // reduction_ratio must be >= 1, got '
                f'{channels} // {reduction_ratio}'
            )
        if stride > 1:
            # ceil_mode: the last, partial window averages its valid pixels,
            # so the kernel map has exactly the output's ceil(H/s) rows.
            self.avgpool = nn.AvgPool2d(stride, stride, ceil_mode=True)
        self.channels = channels
        self.reduction_ratio = reduction_ratio
        self.group_channels = group_channels
        self.groups = channels // group_channels
        check_weight_size(
            'kernel_size',
            kernel_size,
            (kernel_size**2 * self.groups, channels // reduction_ratio),
        )
        self.conv1 = ConvModule(
            channels,
            channels // reduction_ratio,
            1,
            norm_cfg=norm_cfg,
            act_cfg=act_cfg,
        )
        self.conv2 = ConvModule(
            channels // reduction_ratio,
            kernel_size**2 * self.groups,
            1,
            norm_cfg=None,
            act_cfg=None,
        )
        self.use_cpu_fastpath = cpu_fastpath_default()

    def _reduce_cpu(self, x: torch.Tensor) -> torch.Tensor:
        """``conv1(x)``, its 1x1 convolution on the faster of oneDNN and a
        matmul (:func:`~mmevo.layers.fastpath.conv1x1`), a training BN on
        :func:`~mmevo.layers.fastpath.batch_norm` (with a ReLU after it,
        in its pass)."""
        conv1 = self.conv1
        out = conv1x1(x, conv1.conv.weight, conv1.conv.bias)
        act = conv1.activate if conv1.with_activation else None
        if conv1.with_norm:
            return batch_norm(out, conv1.norm, act, inplace=True)
        return out if act is None else act(out)

    def _kernel_weights_cpu(self, x: torch.Tensor) -> torch.Tensor:
        """``conv2(conv1(x))``, both 1x1 convolutions as in
        :meth:`_reduce_cpu`."""
        conv2 = self.conv2.conv
        return conv1x1(self._reduce_cpu(x), conv2.weight, conv2.bias)

    def _takes_fused(self, x: torch.Tensor) -> bool:
        """Whether the fused op runs this call: the CPU fast path is taken,
        no kernel hook waits for the kernel, the C++ kernel can take ``x``
        and the map is as large as where it was measured to win."""
        if x.dim() != 4 or not takes_fused_cpu(
            self, x, self.conv2.conv.weight.dtype
        ):
            return False
        # only after the capture test: under torch.export the size test
        # would be a guard, and the program would refuse other sizes
        s = self.stride
        pixels = -(-x.shape[-2] // s) * -(-x.shape[-1] // s)
        return pixels >= FUSED_MIN_PIXELS

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Generate the kernel from ``x`` and aggregate (fused on CPU).

        Args:
            x (Tensor): (B, C, H, W).

        Returns:
            Tensor: (B, C, H_out, W_out).
        """
        if not (isinstance(x, torch.Tensor) and self._takes_fused(x)):
            return super().forward(x)
        self.check_input(x, self.channels)
        z = self._reduce_cpu(
            avg_pool(x, self.avgpool) if self.stride > 1 else x
        )
        conv2 = self.conv2.conv
        return call_cpu_kernel(
            torch.ops.mmevo.fused_involution.default,
            x,
            z,
            conv2.weight,
            conv2.bias,
            self.kernel_size,
            self.stride,
            self.dilation,
            self.groups,
        )

    def generate(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Return ``(x, kernel)``, kernel (B, G, K, K, H_out, W_out)."""
        self.check_input(x, self.channels)
        fast = takes_cpu_fastpath(self, x)
        if self.stride == 1:
            x_gen = x
        else:
            x_gen = avg_pool(x, self.avgpool) if fast else self.avgpool(x)
        if fast:
            weight = self._kernel_weights_cpu(x_gen)
        else:
            weight = self.conv2(self.conv1(x_gen))
        B, _, H, W = weight.shape
        K = self.kernel_size
        return x, weight.view(B, self.groups, K, K, H, W)
