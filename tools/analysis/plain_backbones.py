"""ResNet-50 and RedNet-50 in plain PyTorch, for machines without mmdet.

The same architectures (layers, parameters, output shapes) as mmdet's
``ResNet(50)`` and :class:`mmevo.models.RedNet` ``(depth=50)``: v1.5
bottlenecks (stride on the middle layer), a 3x3 conv (ResNet) or an
``Involution(planes, 7, stride)`` (RedNet) as the middle layer. Only
``mmevo.layers`` is needed (mmengine + mmcv.cnn), so the GPU check can time
a training step of both on a bare CUDA machine. Layouts and initialisation
are torch's defaults, which do not change the speed of a step.

Example:
    >>> import torch
    >>> model = PlainResNet(depth=50, involution=True)  # RedNet-50
    >>> [tuple(o.shape) for o in model(torch.rand(1, 3, 64, 64))]
    [(1, 256, 16, 16), (1, 512, 8, 8), (1, 1024, 4, 4), (1, 2048, 2, 2)]
"""
from torch import nn

from mmevo.layers import Involution

STAGE_BLOCKS = {26: (1, 2, 4, 1), 50: (3, 4, 6, 3), 101: (3, 4, 23, 3)}


def _conv_bn_relu(cin, cout, kernel_size, stride=1):
    return nn.Sequential(
        nn.Conv2d(
            cin, cout, kernel_size, stride, kernel_size // 2, bias=False),
        nn.BatchNorm2d(cout), nn.ReLU(inplace=True))


class Bottleneck(nn.Module):
    """1x1 -> middle layer (stride) -> 1x1 (x4 channels), plus shortcut."""

    def __init__(self, inplanes, planes, stride, involution):
        super().__init__()
        self.conv1 = nn.Conv2d(inplanes, planes, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(planes)
        if involution:
            self.conv2 = Involution(planes, 7, stride)
        else:
            self.conv2 = nn.Conv2d(planes, planes, 3, stride, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(planes)
        self.conv3 = nn.Conv2d(planes, planes * 4, 1, bias=False)
        self.bn3 = nn.BatchNorm2d(planes * 4)
        self.relu = nn.ReLU(inplace=True)
        self.downsample = None
        if stride != 1 or inplanes != planes * 4:
            self.downsample = nn.Sequential(
                nn.Conv2d(inplanes, planes * 4, 1, stride, bias=False),
                nn.BatchNorm2d(planes * 4))

    def forward(self, x):
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.relu(self.bn2(self.conv2(out)))
        out = self.bn3(self.conv3(out))
        identity = x if self.downsample is None else self.downsample(x)
        return self.relu(out + identity)


class PlainResNet(nn.Module):
    """ResNet (``involution=False``) or RedNet (``involution=True``).

    Args:
        depth (int): 26, 50 or 101.
        involution (bool): RedNet: involution middle layers and the RedNet
            stem (3x3 conv s2, Involution 7x7, BN, ReLU, 3x3 conv); else the
            ResNet stem (7x7 conv s2). Both end with a 3x3 max-pool s2.

    ``forward(x)`` returns the outputs of the four stages (a tuple).
    """

    def __init__(self, depth=50, involution=False):
        super().__init__()
        if depth not in STAGE_BLOCKS:
            raise ValueError(f'depth must be one of {sorted(STAGE_BLOCKS)}, '
                             f'got {depth}')
        if involution:
            self.stem = nn.Sequential(
                _conv_bn_relu(3, 32, 3, 2), Involution(32, 7, 1),
                nn.BatchNorm2d(32), nn.ReLU(inplace=True),
                _conv_bn_relu(32, 64, 3))
        else:
            self.stem = _conv_bn_relu(3, 64, 7, 2)
        self.maxpool = nn.MaxPool2d(3, 2, 1)
        inplanes, stages = 64, []
        for i, blocks in enumerate(STAGE_BLOCKS[depth]):
            planes = 64 * 2**i
            layers = []
            for j in range(blocks):
                stride = 2 if i > 0 and j == 0 else 1
                layers.append(Bottleneck(inplanes, planes, stride, involution))
                inplanes = planes * 4
            stages.append(nn.Sequential(*layers))
        self.stages = nn.ModuleList(stages)

    def forward(self, x):
        x = self.maxpool(self.stem(x))
        outs = []
        for stage in self.stages:
            x = stage(x)
            outs.append(x)
        return tuple(outs)
