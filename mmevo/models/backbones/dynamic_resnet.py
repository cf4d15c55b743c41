"""ResNet scaffolding shared by the backbones whose middle layer is dynamic.

RedNet and ACmix-ResNet are mmdet's ResNet (v1.5, "pytorch" style) with the
3x3 convolution of every bottleneck replaced by another layer. Subclassing
mmdet's ``ResNet`` keeps everything else identical to it: stem freezing,
``frozen_stages``, ``norm_eval``, ``with_cp``, ``out_indices``, the key names
of the published checkpoints (``layer{i}.{j}.conv1/bn1/conv2/bn2/conv3/bn3``,
``downsample.0/1``) and the default initialisation.
"""
import contextlib
import inspect

import torch
import torch.nn.functional as F
from mmcv.cnn import build_conv_layer, build_norm_layer
from mmdet.models.backbones.resnet import Bottleneck, ResNet
from mmengine.model import Sequential
from torch import nn
from torch.nn.modules.batchnorm import _BatchNorm
from torch.utils.checkpoint import checkpoint

from mmevo.layers.pointwise import pointwise

# Blocks per stage of the bottleneck ResNets (and of RedNet / ACmix-ResNet).
STAGE_BLOCKS = {
    26: (1, 2, 4, 1),
    38: (2, 3, 5, 2),
    50: (3, 4, 6, 3),
    101: (3, 4, 23, 3),
    152: (3, 8, 36, 3),
}


class MiddleLayerBottleneck(Bottleneck):
    """mmdet's Bottleneck whose 3x3 ``conv2`` is built by ``middle_layer``.

    The 3x3 convolution mmdet builds is swapped in place, so the key order,
    the forward (norm2, ReLU, plugins, checkpointing) and the freezing stay
    mmdet's.

    Args:
        inplanes (int): Input channels.
        planes (int): Middle channels (output channels / 4).
        middle_layer (callable): ``middle_layer(planes, stride, dilation)``
            returns the module used as ``conv2``; it keeps the channel count.
        **kwargs: The other arguments of mmdet's ``Bottleneck``.
    """

    def __init__(self, inplanes, planes, middle_layer, **kwargs):
        if kwargs.get('dcn') is not None:
            raise ValueError(f'dcn must be None for a dynamic middle layer, '
                             f'got {kwargs["dcn"]}')
        super().__init__(inplanes, planes, **kwargs)
        self.conv2 = middle_layer(planes, self.conv2_stride, self.dilation)
        if type(self.conv1) is nn.Conv2d and self.conv1.stride == (1, 1):
            self.conv1 = _MatmulConv1x1.taking_over(self.conv1)

    def forward(self, x):
        """mmdet's forward; with ``with_cp``, its BN statistics kept once.

        mmdet's checkpoint recomputes the block in the backward with its BNs
        still in train mode, which updates their running statistics (and
        ``num_batches_tracked``) a second time per step. Here the buffers
        the recomputation updates are put back as the forward left them.
        (Turning ``track_running_stats`` off instead would change what
        batch_norm saves, which the checkpoint refuses.)
        """
        if not (self.with_cp and x.requires_grad):
            return super().forward(x)
        return checkpoint(
            self._forward_without_cp, x, use_reentrant=False,
            context_fn=lambda: (contextlib.nullcontext(),
                                _running_stats_kept(self)))

    def _forward_without_cp(self, x):
        self.with_cp = False  # mmdet's forward, minus its own checkpoint
        try:
            return super().forward(x)
        finally:
            self.with_cp = True


@contextlib.contextmanager
def _running_stats_kept(module):
    """The BN buffers of ``module`` (running statistics, batch count) are
    restored on exit to their values on entry."""
    saved = [(buf, buf.clone()) for m in module.modules()
             if isinstance(m, _BatchNorm) for buf in m.buffers()]
    try:
        yield
    finally:
        with torch.no_grad():
            for buf, value in saved:
                buf.copy_(value)


class _MatmulConv1x1(nn.Conv2d):
    """A 1x1 stride-1 convolution run as a batched matmul.

    For the bottleneck's reducing ``conv1`` (e.g. 256 -> 64 at 56x56), whose
    oneDNN CPU backward is up to 2x slower than ``bmm``'s.
    """

    @classmethod
    def taking_over(cls, conv):
        """The same layer holding ``conv``'s parameters (built on the meta
        device: no random init, so the RNG stream stays mmdet's)."""
        new = cls(conv.in_channels, conv.out_channels, 1,
                  bias=conv.bias is not None, device='meta')
        new.weight, new.bias = conv.weight, conv.bias
        return new

    def forward(self, x):
        return pointwise(x, self.weight, self.bias)


class _SubsampledConv1x1(nn.Conv2d):
    """A 1x1 stride-s convolution run on the subsampled input.

    The same numbers and parameters as ``nn.Conv2d(..., 1, stride=s)``, but
    oneDNN's CPU backward of a strided 1x1 convolution first copies its
    whole input, which makes it ~2x slower than this.
    """

    def forward(self, x):
        sh, sw = self.stride
        return F.conv2d(x[:, :, ::sh, ::sw], self.weight, self.bias)


class _ToContiguous(torch.autograd.Function):
    """``x.contiguous()`` for a channels_last ``x`` whose gradient goes back
    channels_last: max-pool's CPU backward follows the layout of its
    gradient and would otherwise copy its whole (4x larger) input to NCHW."""

    @staticmethod
    def forward(ctx, x):
        return x.clone(memory_format=torch.contiguous_format)

    @staticmethod
    def backward(ctx, grad):
        return grad.contiguous(memory_format=torch.channels_last)


def check_resnet_args(arch_settings, depth, kwargs):
    """Check a DynamicResNet's arguments; return them with ``out_indices``
    normalised.

    mmdet's ResNet raises bare AssertionErrors for some of them and accepts
    others it cannot use (``out_indices=(-1,)`` returns nothing,
    ``frozen_stages=5`` fails on the first ``train()``): here each one gets a
    ValueError naming the argument and the values it allows. Negative
    ``out_indices`` count from the last stage, as Python indices do.

    Args:
        arch_settings (dict): the supported depths (keys).
        depth (int): the depth asked for.
        kwargs (dict): mmdet ``ResNet`` arguments; the missing ones take
            mmdet's defaults.

    Returns:
        dict: ``kwargs``, ``out_indices`` as increasing stage indices >= 0.

    Example:
        >>> check_resnet_args({50: None}, 50, dict(out_indices=(-1, )))
        {'out_indices': (3,)}
    """
    if depth not in arch_settings:
        raise ValueError(f'depth must be one of {sorted(arch_settings)}, '
                         f'got {depth!r}')
    args = {
        name: param.default
        for name, param in inspect.signature(ResNet).parameters.items()
    }
    args.update(kwargs)
    n = args['num_stages']
    if not (_is_int(n) and 1 <= n <= 4):
        raise ValueError(f'num_stages must be 1, 2, 3 or 4, got {n!r}')
    for name in ('strides', 'dilations'):
        values = args[name]
        if (not isinstance(values, (tuple, list)) or len(values) != n
                or not all(_is_int(v) and v >= 1 for v in values)):
            raise ValueError(f'{name} must be {n} ints >= 1 (one per stage, '
                             f'num_stages={n}), got {values!r}')
    out = args['out_indices']
    if (not isinstance(out, (tuple, list)) or not out
            or not all(_is_int(i) and -n <= i < n for i in out)):
        raise ValueError(f'out_indices must be a non-empty sequence of stage '
                         f'indices in [{-n}, {n}) (num_stages={n}), got '
                         f'{out!r}')
    normalised = tuple(i % n for i in out)
    if list(normalised) != sorted(set(normalised)):
        raise ValueError(f'out_indices must name distinct stages in '
                         f'increasing order (the outputs come in stage '
                         f'order), got {out!r}')
    frozen = args['frozen_stages']
    if not (_is_int(frozen) and -1 <= frozen <= n):
        raise ValueError(f'frozen_stages must be an int in [-1, {n}] (-1: '
                         f'none, 0: the stem, i: the stem and stages 1..i; '
                         f'num_stages={n}), got {frozen!r}')
    norm_cfg = args['norm_cfg']
    if not isinstance(norm_cfg, dict) or 'type' not in norm_cfg:
        raise ValueError(f'norm_cfg must be a dict with a "type", got '
                         f'{norm_cfg!r}')
    if norm_cfg['type'] == 'GN' and not (_is_int(norm_cfg.get('num_groups'))
                                         and norm_cfg['num_groups'] >= 1):
        raise ValueError(f'norm_cfg of type GN needs num_groups (an int >= 1 '
                         f'dividing the channels of every norm layer), got '
                         f'{norm_cfg!r}')
    if 'out_indices' in kwargs:
        kwargs = dict(kwargs, out_indices=normalised)
    return kwargs


def _is_int(value):
    return isinstance(value, int) and not isinstance(value, bool)


class DynamicResNet(ResNet):
    """mmdet ResNet whose bottleneck middle layers come from a factory.

    Subclasses implement ``build_middle_layer(planes, stride, dilation)``
    (it runs inside ``__init__``: set what it reads before calling
    ``super().__init__``). On top of mmdet's ResNet this adds mmseg's
    ``contract_dilation`` (the first block of a dilated stage uses half the
    dilation, as mmseg's ResNetV1c configs for output stride 8 do), keeps
    ``zero_init_residual`` working for the subclassed block, and makes
    ``train()`` return ``self``.

    Args:
        depth (int): 26, 38, 50, 101 or 152.
        contract_dilation (bool): Halve the dilation of the first block of
            every stage whose dilation is > 1. Default: False.
        zero_init_residual (bool): Zero-init the last norm of every block
            when no ``init_cfg`` is given. Default: True.
        init_cfg (dict | list[dict] | None): Initialisation config; None
            gives mmdet's ResNet default (Kaiming convs, unit norms).
        **kwargs: mmdet ``ResNet`` arguments.
    """

    arch_settings = {
        depth: (MiddleLayerBottleneck, blocks)
        for depth, blocks in STAGE_BLOCKS.items()
    }

    def __init__(self,
                 depth,
                 contract_dilation=False,
                 zero_init_residual=True,
                 init_cfg=None,
                 **kwargs):
        kwargs = check_resnet_args(self.arch_settings, depth, kwargs)
        # make_res_layer runs inside ResNet.__init__: set its inputs first.
        self.contract_dilation = contract_dilation
        # mmdet only zero-inits blocks that *are* its Bottleneck class, and
        # only with the default init (a Pretrained init_cfg overwrites all).
        self._block_init_cfg = None
        if zero_init_residual and init_cfg is None:
            self._block_init_cfg = dict(
                type='Constant', val=0, override=dict(name='norm3'))
        super().__init__(
            depth,
            zero_init_residual=zero_init_residual,
            init_cfg=init_cfg,
            **kwargs)

    def forward(self, x):
        """mmdet's ResNet forward, the stem and max-pool in channels_last.

        At stride 2 with few channels oneDNN's NCHW convolution, BN and
        max-pool (forward and backward) are 1.5-3x slower than in
        channels_last on CPU (``docs/benchmarks.md``); the stages run NCHW,
        the layout of the mmevo ops, so the outputs are NCHW as before.
        Subclasses with a deep stem make its tail channels_last themselves.

        Args:
            x (Tensor): (B, in_channels, H, W).

        Returns:
            tuple[Tensor]: the outputs of the stages in ``out_indices``.
        """
        if self.deep_stem:
            x = self.stem(x)
        else:
            x = x.contiguous(memory_format=torch.channels_last)
            x = self.relu(self.norm1(self.conv1(x)))
        x = self.maxpool(x.contiguous(memory_format=torch.channels_last))
        x = _ToContiguous.apply(x)
        outs = []
        for i, layer_name in enumerate(self.res_layers):
            x = getattr(self, layer_name)(x)
            if i in self.out_indices:
                outs.append(x)
        return tuple(outs)

    def train(self, mode=True):
        """mmdet's ``train`` (freezing, norm_eval), returning ``self``."""
        super().train(mode)  # mmdet's returns None, breaking .eval() chains
        return self

    def build_middle_layer(self, planes, stride, dilation):
        """Return the layer replacing a bottleneck's 3x3 conv (subclasses)."""
        raise NotImplementedError

    def make_res_layer(self, block, inplanes, planes, num_blocks, stride=1,
                       dilation=1, avg_down=False, conv_cfg=None,
                       norm_cfg=dict(type='BN'), init_cfg=None, **kwargs):
        """Build one stage: ``num_blocks`` blocks, the first one strided.

        Returns:
            Sequential: the stage (``layer{i}``).
        """
        expansion = block.expansion
        downsample = None
        if stride != 1 or inplanes != planes * expansion:
            downsample = []
            conv_stride = stride
            if avg_down and stride != 1:
                conv_stride = 1
                downsample.append(
                    nn.AvgPool2d(stride, stride, ceil_mode=True,
                                 count_include_pad=False))
            if conv_cfg is None and conv_stride > 1:
                conv = _SubsampledConv1x1(inplanes, planes * expansion, 1,
                                          stride=conv_stride, bias=False)
            else:
                conv = build_conv_layer(conv_cfg, inplanes, planes * expansion,
                                        1, stride=conv_stride, bias=False)
            downsample += [
                conv, build_norm_layer(norm_cfg, planes * expansion)[1]
            ]
            downsample = nn.Sequential(*downsample)
        first_dilation = dilation
        if self.contract_dilation and dilation > 1:
            first_dilation = dilation // 2
        layers = []
        for i in range(num_blocks):
            layers.append(
                block(
                    inplanes=inplanes if i == 0 else planes * expansion,
                    planes=planes,
                    middle_layer=self.build_middle_layer,
                    stride=stride if i == 0 else 1,
                    dilation=first_dilation if i == 0 else dilation,
                    downsample=downsample if i == 0 else None,
                    conv_cfg=conv_cfg,
                    norm_cfg=norm_cfg,
                    init_cfg=self._block_init_cfg,
                    **kwargs))
        return Sequential(*layers)
