"""The bottleneck of RedNet and ACmix-ResNet: mmdet's, with its own forward.

mmevo's block is mmdet's ``Bottleneck`` (its construction, key names and
attributes) with the 3x3 ``conv2`` swapped for a dynamic layer. Its forward
is written here rather than inherited: it checkpoints its own residual
function (so the recomputation can keep the BN statistics, see
:meth:`MiddleLayerBottleneck.forward`) and holds its CPU rewrite next to the
stock graph. ``tests/models/test_bottleneck.py`` checks it against mmdet's
``Bottleneck.forward``.
"""

import contextlib
from collections.abc import Callable

import torch
from mmdet.models.backbones.resnet import Bottleneck
from torch import nn
from torch.nn.modules.batchnorm import _BatchNorm
from torch.utils.checkpoint import checkpoint

from mmevo.layers.fastpath import (
    batch_norm,
    conv1x1,
    cpu_fastpath_default,
    cpu_fastpath_scope,
    is_plain_conv1x1,
    takes_cpu_fastpath,
)


class MiddleLayerBottleneck(Bottleneck):
    """mmdet's Bottleneck whose 3x3 ``conv2`` is built by ``middle_layer``.

    The 3x3 convolution mmdet builds is swapped in place, so the key order,
    the attributes and the freezing stay mmdet's. The forward is mmdet's
    graph without plugins (conv1, norm1, ReLU, conv2, norm2, ReLU, conv3,
    norm3, + shortcut, ReLU); with ``with_cp`` the BN statistics are updated
    once per step, not twice. On CPU in eager mode, while
    ``use_cpu_fastpath`` is True (see :mod:`mmevo.layers.fastpath`), the
    1x1 convolutions run on the faster of oneDNN and a matmul (``conv1x1``:
    PyTorch takes its slower native kernel on one thread), a strided 1x1
    downsample on the subsampled input: the same numbers.

    Args:
        inplanes (int): Input channels.
        planes (int): Middle channels (output channels / 4).
        middle_layer (callable): ``middle_layer(planes, stride, dilation)``
            returns the module used as ``conv2``; it keeps the channel count.
        **kwargs: The other arguments of mmdet's ``Bottleneck`` (``dcn`` and
            ``plugins`` must be None).

    Example:
        >>> import torch
        >>> block = MiddleLayerBottleneck(
        ...     64, 16, lambda c, s, d: torch.nn.Conv2d(c, c, 3, s, d, d))
        >>> block(torch.randn(1, 64, 8, 8)).shape
        torch.Size([1, 64, 8, 8])
    """

    def __init__(
        self,
        inplanes: int,
        planes: int,
        middle_layer: Callable[[int, int, int], nn.Module],
        **kwargs,
    ) -> None:
        for name in ('dcn', 'plugins'):
            if kwargs.get(name) is not None:
                raise ValueError(
                    f'{name} must be None for a dynamic middle '
                    f'layer, got {kwargs[name]}'
                )
        super().__init__(inplanes, planes, **kwargs)
        self.conv2 = middle_layer(planes, self.conv2_stride, self.dilation)
        self.use_cpu_fastpath = cpu_fastpath_default()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """ReLU of the residual branch plus the shortcut.

        With ``with_cp`` (and an input that needs a gradient) the residual
        function is checkpointed: its backward recomputes it with the BNs
        still in train mode, which in mmdet's block updates their running
        statistics (and ``num_batches_tracked``) a second time per step.
        Here the buffers the recomputation updates are put back as the
        forward left them. (Turning ``track_running_stats`` off instead
        would change what batch_norm saves, which the checkpoint refuses.)

        Args:
            x (Tensor): (B, inplanes, H, W).

        Returns:
            Tensor: (B, planes * 4, H_out, W_out).
        """
        if self.with_cp and x.requires_grad:
            # The stock block inside the checkpoint (its middle layer may
            # still take its own fast path), as before the redesign.
            out = checkpoint(
                self._residual,
                x,
                False,
                use_reentrant=False,
                context_fn=lambda: (
                    contextlib.nullcontext(),
                    _running_stats_kept(self),
                ),
            )
            return self.relu(out)
        if takes_cpu_fastpath(self, x):
            with cpu_fastpath_scope():
                return self._residual(x, True, self.relu)
        return self._residual(x, False, self.relu)

    def _residual(self, x, fast, act=None):
        """The block: ``act(branch + shortcut)``, or before its last ReLU
        without ``act``; ``fast`` takes the CPU fast path (its BNs on
        :func:`batch_norm`, with the ReLUs and the shortcut's addition in
        their passes)."""
        if fast:
            # The 1x1 convolutions' outputs are this block's own: the
            # inference BNs write over them. (Not conv2's: any module, whose
            # output may be held elsewhere.)
            out = self._conv1_cpu(x)
            out = batch_norm(out, self.norm1, self.relu, inplace=True)
            out = batch_norm(self.conv2(out), self.norm2, self.relu)
            out = self._conv3_cpu(out)
            if self.downsample is not None:
                x = self._downsample_cpu(x)
            return batch_norm(out, self.norm3, act, x, inplace=True)
        out = _norm_act(self.conv1(x), self.norm1, self.relu)
        out = _norm_act(self.conv2(out), self.norm2, self.relu)
        out = self.norm3(self.conv3(out))
        if self.downsample is not None:
            x = self.downsample(x)
        out += x
        return out if act is None else act(out)

    def _conv1_cpu(self, x):
        """``conv1(x)``: the faster of oneDNN and a matmul
        (:func:`conv1x1`), where PyTorch's 1x1 kernel or oneDNN's backward
        is slower."""
        return self._conv1x1_cpu(self.conv1, x)

    def _conv3_cpu(self, x):
        """``conv3(x)``, as :meth:`_conv1_cpu`."""
        return self._conv1x1_cpu(self.conv3, x)

    @staticmethod
    def _conv1x1_cpu(conv, x):
        if is_plain_conv1x1(conv) and conv.stride == (1, 1):
            return conv1x1(x, conv.weight, conv.bias)
        return conv(x)

    def _downsample_cpu(self, x):
        """``downsample(x)``, a (1x1 conv, norm) shortcut on :func:`conv1x1`
        and :func:`batch_norm` as the block's own; a strided conv run on
        ``x[::s, ::s]``: oneDNN's CPU backward of a strided 1x1 conv first
        copies its whole input (~2x slower)."""
        downsample = self.downsample
        if isinstance(downsample, nn.Sequential) and len(downsample) == 2:
            conv, norm = downsample
            if is_plain_conv1x1(conv):
                sh, sw = conv.stride
                if (sh, sw) != (1, 1):
                    x = x[:, :, ::sh, ::sw]
                return batch_norm(
                    conv1x1(x, conv.weight, conv.bias), norm, inplace=True
                )
        return downsample(x)


def _norm_act(x, norm, act=None):
    x = norm(x)
    return x if act is None else act(x)


@contextlib.contextmanager
def _running_stats_kept(module):
    """The BN buffers of ``module`` (running statistics, batch count) are
    restored on exit to their values on entry."""
    saved = [
        (buf, buf.clone())
        for m in module.modules()
        if isinstance(m, _BatchNorm)
        for buf in m.buffers()
    ]
    try:
        yield
    finally:
        with torch.no_grad():
            for buf, value in saved:
                buf.copy_(value)
