"""ResNet scaffolding shared by the backbones whose middle layer is dynamic.

RedNet and ACmix-ResNet are mmdet's ResNet (v1.5, "pytorch" style) with the
3x3 convolution of every bottleneck replaced by another layer. Subclassing
mmdet's ``ResNet`` keeps everything else identical to it: stem freezing,
``frozen_stages``, ``norm_eval``, ``with_cp``, ``out_indices``, the key names
of the published checkpoints (``layer{i}.{j}.conv1/bn1/conv2/bn2/conv3/bn3``,
``downsample.0/1``) and the default initialisation.
"""

import inspect
from typing import ClassVar

import torch
import torch.nn.functional as F
from mmcv.cnn import ConvModule
from mmdet.models.backbones.resnet import ResNet
from mmdet.models.layers import ResLayer
from mmengine.model import Sequential
from torch import nn

from mmevo.layers.base import check_layer_cfg
from mmevo.layers.fastpath import (
    batch_norm,
    batch_norm_train,
    cpu_fastpath_default,
    cpu_fastpath_scope,
    takes_batch_norm_kernel,
    takes_cpu_fastpath,
)

from .bottleneck import MiddleLayerBottleneck

# Blocks per stage of the bottleneck ResNets (and of RedNet / ACmix-ResNet).
STAGE_BLOCKS = {
    26: (1, 2, 4, 1),
    38: (2, 3, 5, 2),
    50: (3, 4, 6, 3),
    101: (3, 4, 23, 3),
    152: (3, 8, 36, 3),
}


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


class _ToChannelsLast(torch.autograd.Function):
    """``x`` in channels_last, its gradient back in NCHW, so the ReLU and BN
    backward before it do not run on mixed layouts (~3x slower)."""

    @staticmethod
    def forward(ctx, x):
        return x.contiguous(memory_format=torch.channels_last)

    @staticmethod
    def backward(ctx, grad):
        return grad.contiguous()


class _Replayed(torch.autograd.Function):
    """``run(x, *params, replay=False)``, keeping only ``x`` and ``params``
    for the backward, which runs ``run(x, *params, replay=True)`` again
    and differentiates that, under the forward's autocast state (the
    stock graph's dtypes). Twice differentiable: under ``create_graph``
    the replay is recorded like any forward."""

    @staticmethod
    @torch.amp.custom_fwd(device_type='cpu')
    def forward(ctx, run, x, *params):
        ctx.run = run
        ctx.save_for_backward(x, *params)
        return run(x, *params, replay=False)

    @staticmethod
    @torch.amp.custom_bwd(device_type='cpu')
    def backward(ctx, grad):
        x, *params = ctx.saved_tensors
        create_graph = torch.is_grad_enabled()
        if not create_graph:
            x = x.detach().requires_grad_(ctx.needs_input_grad[1])
        with torch.enable_grad():
            y = ctx.run(x, *params, replay=True)
        needs = ctx.needs_input_grad[1:]
        wanted = [
            t for t, need in zip((x, *params), needs, strict=True) if need
        ]
        grads = iter(
            torch.autograd.grad(y, wanted, grad, create_graph=create_graph)
        )
        return None, *(next(grads) if need else None for need in needs)


def _conv_norm_relu(module):
    """(conv, norm, act) of an mmcv ``ConvModule`` that is a plain
    ``nn.Conv2d``, ``nn.BatchNorm2d`` and ``nn.ReLU`` in that order; None
    for anything else (which runs as it is)."""
    if not (
        isinstance(module, ConvModule)
        and module.order == ('conv', 'norm', 'act')
        and not module.with_explicit_padding
        and module.with_norm
        and module.with_activation
        and module.efficient_conv_bn_eval_forward is None
        and type(module.conv) is nn.Conv2d
    ):
        return None
    return module.conv, module.norm, module.activate


def _replayed(x, conv, norm, act, pool=None):
    """``pool(act(norm(conv(x))))`` (``conv`` and ``pool`` may be None)
    that keeps for the backward only ``x``, and recomputes the rest there.

    The stock graph keeps the BN's input, the ReLU's output and the
    max-pool's int64 indices, each as large as ``x`` or more; the backward
    reruns the conv (a stem's first, from 3 channels, is cheap), the BN
    with the statistics of the forward and the pool. The forward calls the
    modules as they are (a training BN and ReLU on :func:`batch_norm`'s
    kernel): the same numbers, and the BN's running statistics updated
    once. Taken in a train step when ``norm`` is an ``nn.BatchNorm2d`` and
    ``act`` an ``nn.ReLU``; anything else, or nothing to differentiate,
    runs the modules as the forward does.

    Args:
        x (Tensor): (B, C, H, W), the input of ``conv``, or of ``norm``
            when ``conv`` is None: then the caller's own temporary, which
            an inference BN (nothing to differentiate) overwrites.
        conv (nn.Conv2d | None): a plain ``nn.Conv2d``, or None.
        norm (nn.Module): the BN.
        act (nn.Module): the ReLU.
        pool (nn.Module | None): a stateless module after the ReLU.

    Returns:
        Tensor: what the modules return.
    """

    def stock(x, own):
        if conv is not None:
            x, own = conv(x), True
        # act(norm(x)), a training BN (and ReLU) on a kernel; an inference
        # one over x where no one else reads it
        x = batch_norm(x, norm, act, inplace=own)
        return x if pool is None else pool(x)

    # None where a module lacks one (no conv, no bias, a BN without affine).
    params = [
        getattr(m, name, None)
        for m in (conv, norm)
        for name in ('weight', 'bias')
    ]
    if not (
        type(norm) is nn.BatchNorm2d
        and type(act) is nn.ReLU
        and torch.is_grad_enabled()
        and (
            x.requires_grad
            or any(p is not None and p.requires_grad for p in params)
        )
    ):
        return stock(x, True)
    # What norm(x) normalises with, as BatchNorm's forward chooses.
    if norm.training or norm.running_mean is None:
        stats = (None, None)
    else:
        stats = (norm.running_mean.clone(), norm.running_var.clone())

    def run(x, conv_w, conv_b, norm_w, norm_b, replay):
        if not replay:
            return stock(x, False)  # x is saved for the backward
        if conv is not None:
            x = conv._conv_forward(x, conv_w, conv_b)
        if stats[0] is None and takes_batch_norm_kernel(x, norm):
            x = batch_norm_train(x, norm_w, norm_b, norm.eps, relu=True)
        else:
            x = F.batch_norm(
                x, *stats, norm_w, norm_b, stats[0] is None, 0.0, norm.eps
            )
            x = act(x)
        return x if pool is None else pool(x)

    return _Replayed.apply(run, x, *params)


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
        raise ValueError(
            f'depth must be one of {sorted(arch_settings)}, got {depth!r}'
        )
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
        if (
            not isinstance(values, (tuple, list))
            or len(values) != n
            or not all(_is_int(v) and v >= 1 for v in values)
        ):
            raise ValueError(
                f'{name} must be {n} ints >= 1 (one per stage, '
                f'num_stages={n}), got {values!r}'
            )
    out = args['out_indices']
    if (
        not isinstance(out, (tuple, list))
        or not out
        or not all(_is_int(i) and -n <= i < n for i in out)
    ):
        raise ValueError(
            f'out_indices must be a non-empty sequence of stage '
            f'indices in [{-n}, {n}) (num_stages={n}), got '
            f'{out!r}'
        )
    normalised = tuple(i % n for i in out)
    if list(normalised) != sorted(set(normalised)):
        raise ValueError(
            f'out_indices must name distinct stages in '
            f'increasing order (the outputs come in stage '
            f'order), got {out!r}'
        )
    frozen = args['frozen_stages']
    if not (_is_int(frozen) and -1 <= frozen <= n):
        raise ValueError(
            f'frozen_stages must be an int in [-1, {n}] (-1: '
            f'none, 0: the stem, i: the stem and stages 1..i; '
            f'num_stages={n}), got {frozen!r}'
        )
    norm_cfg = args['norm_cfg']
    check_layer_cfg('norm_cfg', norm_cfg, 'BN', allow_none=False)
    if norm_cfg['type'] == 'GN' and not (
        _is_int(norm_cfg.get('num_groups')) and norm_cfg['num_groups'] >= 1
    ):
        raise ValueError(
            f'norm_cfg of type GN needs num_groups (an int >= 1 '
            f'dividing the channels of every norm layer), got '
            f'{norm_cfg!r}'
        )
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
    ``train()`` return ``self``. Its stem (and every block, see
    :class:`MiddleLayerBottleneck`) has a CPU fast path, taken in eager mode
    on CPU while ``use_cpu_fastpath`` is True (:mod:`mmevo.layers.fastpath`).

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

    arch_settings: ClassVar[dict] = {
        depth: (MiddleLayerBottleneck, blocks)
        for depth, blocks in STAGE_BLOCKS.items()
    }

    def __init__(
        self,
        depth,
        contract_dilation=False,
        zero_init_residual=True,
        init_cfg=None,
        **kwargs,
    ):
        kwargs = check_resnet_args(self.arch_settings, depth, kwargs)
        # make_res_layer runs inside ResNet.__init__: set its inputs first.
        self.contract_dilation = contract_dilation
        # mmdet only zero-inits blocks that *are* its Bottleneck class, and
        # only with the default init (a Pretrained init_cfg overwrites all).
        self._block_init_cfg = None
        if zero_init_residual and init_cfg is None:
            self._block_init_cfg = dict(
                type='Constant', val=0, override=dict(name='norm3')
            )
        super().__init__(
            depth,
            zero_init_residual=zero_init_residual,
            init_cfg=init_cfg,
            **kwargs,
        )
        self.use_cpu_fastpath = cpu_fastpath_default()

    def forward(self, x: torch.Tensor) -> tuple:
        """mmdet's ResNet forward; on CPU in eager mode, while
        ``use_cpu_fastpath`` is True, the same numbers from
        :meth:`_forward_cpu`.

        Args:
            x (Tensor): (B, in_channels, H, W).

        Returns:
            tuple[Tensor]: the outputs of the stages in ``out_indices``.
        """
        if takes_cpu_fastpath(self, x):
            with cpu_fastpath_scope():
                return self._forward_cpu(x)
        return super().forward(x)

    def forward_stem(self, x: torch.Tensor) -> torch.Tensor:
        """The stem and the max pool, the input of ``layer1``: mmdet's, or
        on CPU in eager mode, while ``use_cpu_fastpath`` is True, the same
        numbers from its fast path (see :meth:`_forward_cpu`).

        Args:
            x (Tensor): (B, in_channels, H, W).

        Returns:
            Tensor: (B, stem_channels, H / 4, W / 4), NCHW.
        """
        if takes_cpu_fastpath(self, x):
            with cpu_fastpath_scope():
                return self._stem_cpu(x)
        if self.deep_stem:
            x = self.stem(x)
        else:
            x = self.relu(self.norm1(self.conv1(x)))
        return self.maxpool(x)

    def _forward_cpu(self, x):
        """mmdet's ResNet forward with the stem's fast path
        (:meth:`_stem_cpu`); the stages run NCHW, the layout of the mmevo
        ops, so the outputs are NCHW."""
        x = self._stem_cpu(x)
        outs = []
        for i, layer_name in enumerate(self.res_layers):
            x = getattr(self, layer_name)(x)
            if i in self.out_indices:
                outs.append(x)
        return tuple(outs)

    def _stem_cpu(self, x):
        """The stem's tail and the max-pool in channels_last: there
        oneDNN's NCHW conv, BN and max-pool (forward and backward) are
        1.5-3x slower on CPU. The last BN, ReLU and the max-pool keep only
        their input for the backward, and so does a deep stem's first
        conv, BN and ReLU (:func:`_replayed`): 24 MiB less at RedNet-50's
        stem (B4, 224²), 18 at ResNet-50's. A deep stem must be a
        Sequential."""
        if self.deep_stem:
            first, *head, tail = self.stem
            # The copy goes before a trailing ReLU: the in-place ReLU then
            # saves the channels_last copy the conv saves too, not a second
            # NCHW map (6 MiB at RedNet-50's 112² stem, B4).
            relu = (
                head.pop() if head and isinstance(head[-1], nn.ReLU) else None
            )
            parts = _conv_norm_relu(first)
            x = first(x) if parts is None else _replayed(x, *parts)
            for layer in head:
                # layer(x), a BN on a kernel, over x (the stem's own) in
                # inference
                x = batch_norm(x, layer, inplace=True)
            # A map already in channels_last (a channels_last model) goes
            # on as it is: the Function would return it as a view, which
            # the in-place ReLU may not modify.
            if not x.is_contiguous(memory_format=torch.channels_last):
                x = _ToChannelsLast.apply(x)
            x = relu(x) if relu is not None else x
            parts = _conv_norm_relu(tail)
            if parts is None:
                return _ToContiguous.apply(self.maxpool(tail(x)))
            conv, norm, act = parts
            x = conv(x)
        else:
            x = self.conv1(x.contiguous(memory_format=torch.channels_last))
            norm, act = self.norm1, self.relu
        return _ToContiguous.apply(_replayed(x, None, norm, act, self.maxpool))

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
            middle_layer=self.build_middle_layer, init_cfg=self._block_init_cfg
        )
        dilation, num_blocks = kwargs['dilation'], kwargs['num_blocks']
        if not (self.contract_dilation and dilation > 1):
            return ResLayer(**kwargs)
        blocks = list(
            ResLayer(**{**kwargs, 'num_blocks': 1, 'dilation': dilation // 2})
        )
        if num_blocks > 1:
            width = kwargs['planes'] * kwargs['block'].expansion
            blocks += ResLayer(
                **{
                    **kwargs,
                    'num_blocks': num_blocks - 1,
                    'inplanes': width,
                    'stride': 1,
                }
            )
        return Sequential(*blocks)
