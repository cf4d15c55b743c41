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
import threading

import torch
from mmdet.models.backbones.resnet import Bottleneck, ResNet
from mmdet.models.layers import ResLayer
from mmengine.model import Sequential
from torch.nn.modules.batchnorm import _BatchNorm
from torch.utils.checkpoint import checkpoint

from mmevo.ops import cpu_fastpath

# The blocks whose forward this thread runs inside their own checkpoint.
_RECOMPUTING = threading.local()

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
    mmdet's; only the CPU fast path (:mod:`mmevo.ops.cpu_fastpath`) runs
    the same block differently.

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

    @property
    def with_cp(self):
        # False for mmdet's forward inside the block's own checkpoint, in
        # that thread only: other threads running the same block still see
        # the setting.
        inside = getattr(_RECOMPUTING, 'blocks', ())
        return self._with_cp and not any(b is self for b in inside)

    @with_cp.setter
    def with_cp(self, value):
        self._with_cp = value

    def forward(self, x):
        """mmdet's forward; with ``with_cp``, its BN statistics kept once;
        on CPU, without plugins or checkpointing, the same block with its 1x1
        convs sped up (:func:`mmevo.ops.cpu_fastpath.bottleneck_forward`).

        mmdet's checkpoint recomputes the block in the backward with its BNs
        still in train mode, which updates their running statistics (and
        ``num_batches_tracked``) a second time per step. Here the buffers
        the recomputation updates are put back as the forward left them.
        (Turning ``track_running_stats`` off instead would change what
        batch_norm saves, which the checkpoint refuses.)
        """
        if self.with_cp and x.requires_grad:
            return checkpoint(
                self._forward_without_cp,
                x,
                use_reentrant=False,
                context_fn=lambda:
                (contextlib.nullcontext(), _running_stats_kept(self)))
        if cpu_fastpath.enabled(x) and not self.with_plugins:
            return cpu_fastpath.bottleneck_forward(self, x)
        return super().forward(x)

    def _forward_without_cp(self, x):
        # mmdet's forward, minus its own checkpoint
        blocks = getattr(_RECOMPUTING, 'blocks', ())
        _RECOMPUTING.blocks = blocks + (self, )
        try:
            return super().forward(x)
        finally:
            _RECOMPUTING.blocks = blocks


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
        """mmdet's ResNet forward; on CPU with the stem in channels_last
        (:func:`mmevo.ops.cpu_fastpath.resnet_forward`).

        Args:
            x (Tensor): (B, in_channels, H, W).

        Returns:
            tuple[Tensor]: the outputs of the stages in ``out_indices``.
        """
        if cpu_fastpath.enabled(x):
            return cpu_fastpath.resnet_forward(self, x)
        return super().forward(x)

    def train(self, mode=True):
        """mmdet's ``train`` (freezing, norm_eval), returning ``self``."""
        super().train(mode)  # mmdet's returns None, breaking .eval() chains
        return self

    def build_middle_layer(self, planes, stride, dilation):
        """Return the layer replacing a bottleneck's 3x3 conv (subclasses)."""
        raise NotImplementedError

    def make_res_layer(self, **kwargs):
        """mmdet's ``ResLayer`` of middle-layer bottlenecks.

        mmdet's ``ResLayer`` gives every block the stage's dilation; for
        ``contract_dilation`` (an mmseg ``ResLayer`` option) the first block
        is built as a stage of its own with half of it. Construction order,
        and so the keys and the random stream, are ResLayer's either way.

        Returns:
            Sequential: the stage (``layer{i}``).
        """
        kwargs.update(
            middle_layer=self.build_middle_layer,
            init_cfg=self._block_init_cfg)
        dilation, num_blocks = kwargs['dilation'], kwargs['num_blocks']
        if not (self.contract_dilation and dilation > 1):
            return ResLayer(**kwargs)
        blocks = list(
            ResLayer(**{
                **kwargs, 'num_blocks': 1,
                'dilation': dilation // 2
            }))
        if num_blocks > 1:
            width = kwargs['planes'] * kwargs['block'].expansion
            blocks += ResLayer(
                **{
                    **kwargs, 'num_blocks': num_blocks - 1,
                    'inplanes': width,
                    'stride': 1
                })
        return Sequential(*blocks)
