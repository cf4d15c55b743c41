"""RedNet's channel arguments: the involutions take groups of 16 channels,
so a width they cannot split names the argument that gave it."""

import pytest
import torch

from mmevo.models import RedNet


@pytest.mark.parametrize(
    'kwargs,error,message',
    [
        (
            dict(stem_channels=16),
            ValueError,
            r'^stem_channels must be a multiple of 32 \(an involution runs '
            r'on stem_channels // 2 channels, in groups of 16\), got 16$',
        ),
        (dict(stem_channels=48), ValueError, 'stem_channels .* got 48'),
        (dict(stem_channels=0), ValueError, 'stem_channels must be >= 1'),
        (dict(stem_channels=True), TypeError, 'stem_channels must be an int'),
        (
            dict(base_channels=8),
            ValueError,
            r'^base_channels must be a multiple of 16 \(an involution runs '
            r'on base_channels \* 2\*\*i channels, in groups of 16\), got 8$',
        ),
        (dict(base_channels=64.0), TypeError, 'base_channels must be an int'),
    ],
)
def test_channels_the_involutions_cannot_group(kwargs, error, message):
    args = dict(dict(stem_channels=32, base_channels=16), **kwargs)
    with pytest.raises(error, match=message):
        RedNet(26, **args)


def test_smallest_widths_build_and_run():
    model = RedNet(26, stem_channels=32, base_channels=16).eval()
    assert model.stem[1].channels == 16  # the stem involution: half
    with torch.no_grad():
        outs = model(torch.randn(1, 3, 32, 32))
    assert [o.shape[1] for o in outs] == [64, 128, 256, 512]
