"""tools/analysis/visualize_kernels.py writes a PNG of generated kernels."""

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from mmengine.config import Config
from mmengine.registry import MODELS, init_default_scope
from PIL import Image

import mmevo  # noqa: F401  (registers RedNet, InvolutionFPN)
from mmevo.apis import build_model, load_config
from mmevo.apis.kernel_capture import (
    capture_kernel,
    evolution_layers,
    preprocess,
)

from tool_utils import load_tool

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]
TOOL = REPO / 'tools' / 'analysis' / 'visualize_kernels.py'

# A tiny RetinaNet on a reduced RedNet-26 with an involution FPN.
CONFIG = """
default_scope = 'mmdet'
model = dict(
    type='RetinaNet',
    data_preprocessor=dict(
        type='DetDataPreprocessor', mean=[123.675, 116.28, 103.53],
        std=[58.395, 57.12, 57.375], bgr_to_rgb=True, pad_size_divisor=32),
    backbone=dict(type='RedNet', depth=26, stem_channels=32,
                  base_channels=16, out_indices=(1, 2, 3)),
    neck=dict(type='InvolutionFPN', in_channels=[128, 256, 512],
              out_channels=32, start_level=0, add_extra_convs='on_input',
              num_outs=5),
    bbox_head=dict(
        type='RetinaHead', num_classes=2, in_channels=32, stacked_convs=1,
        feat_channels=32,
        anchor_generator=dict(
            type='AnchorGenerator', octave_base_scale=4, scales_per_octave=3,
            ratios=[0.5, 1.0, 2.0], strides=[8, 16, 32, 64, 128]),
        bbox_coder=dict(type='DeltaXYWHBBoxCoder',
                        target_means=[.0, .0, .0, .0],
                        target_stds=[1.0, 1.0, 1.0, 1.0]),
        loss_cls=dict(type='FocalLoss', use_sigmoid=True, gamma=2.0,
                      alpha=0.25, loss_weight=1.0),
        loss_bbox=dict(type='L1Loss', loss_weight=1.0)))
"""


@pytest.fixture(scope='module')
def setup(tmp_path_factory):
    """Config, a checkpoint with random weights, an image, the layer names."""
    tmp = tmp_path_factory.mktemp('visualize')
    config = tmp / 'retinanet_rednet-tiny.py'
    config.write_text(CONFIG)
    tool = load_tool('analysis/visualize_kernels')
    torch.manual_seed(0)
    cfg = Config.fromfile(str(config))
    init_default_scope('mmdet')
    model = MODELS.build(cfg.model)
    model.init_weights()
    with torch.no_grad():  # non-trivial kernels: random generation weights
        for name, param in model.named_parameters():
            if 'conv2.conv' in name:
                param.normal_()
    checkpoint = tmp / 'random.pth'
    torch.save({'state_dict': model.state_dict(), 'meta': {}}, checkpoint)
    rng = np.random.default_rng(0)
    image = tmp / 'image.jpg'
    pixels = np.zeros((90, 130, 3), np.uint8)
    pixels[20:60, 30:100] = rng.integers(0, 255, (40, 70, 3))
    Image.fromarray(pixels).save(image)
    layers = evolution_layers(model)
    return tmp, config, checkpoint, image, layers, tool


def test_writes_png_for_a_strided_backbone_involution(setup):
    tmp, config, checkpoint, image, layers, _ = setup
    # The first stride-2 involution of the backbone (stage 2).
    name = next(
        n
        for n, m in layers.items()
        if n.startswith('backbone.') and m.stride == 2
    )
    out = tmp / 'kernels.png'
    env = dict(
        os.environ,
        PYTHONPATH=str(REPO) + os.pathsep + os.environ.get('PYTHONPATH', ''),
    )
    result = subprocess.run(
        [
            sys.executable,
            str(TOOL),
            str(config),
            str(checkpoint),
            str(image),
            '--layer',
            name,
            '--points',
            '10,10',
            '45,64',
            '89,129',
            '--out',
            str(out),
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert str(out) in result.stdout
    with Image.open(out) as png:
        assert png.format == 'PNG'
        assert 300 <= png.width <= 3000 and 200 <= png.height <= 3000
        pixels = np.asarray(png.convert('RGB'))
    assert pixels.std() > 10  # an image and kernels, not a blank canvas


def test_captured_kernel_and_point_mapping(setup):
    _, config, checkpoint, _image, layers, _tool = setup
    model = build_model(load_config(str(config)), str(checkpoint))
    name = next(n for n in evolution_layers(model) if n.startswith('neck.'))
    inputs = preprocess(model, np.zeros((90, 130, 3), np.uint8))
    assert inputs.shape == (1, 3, 96, 160)  # padded to 32
    kernel = capture_kernel(model, evolution_layers(model)[name], inputs)
    layer = layers[name]
    assert kernel.shape[:3] == (layer.groups, 7, 7)
    assert kernel.shape[-2:] in {(12, 20), (6, 10), (3, 5)}


def test_unknown_layer_lists_the_choices(setup, capsys):
    _, config, checkpoint, image, _layers, tool = setup
    with pytest.raises(SystemExit) as info:
        tool.main(
            [
                str(config),
                str(checkpoint),
                str(image),
                '--layer',
                'backbone.nope',
                '--points',
                '1,1',
            ]
        )
    assert info.value.code == 1
    err = capsys.readouterr().err
    assert err.startswith(
        "error: --layer 'backbone.nope' is not an "
        'evolution layer of this model; choose one of: '
    )
    assert 'backbone.stem.1' in err and err.count('\n') == 1


def test_checkpoint_that_does_not_fit_is_refused(setup, tmp_path, capsys):
    _, config, checkpoint, image, _layers, tool = setup
    state = torch.load(checkpoint)['state_dict']
    key = 'neck.lateral_convs.0.conv.weight'
    shape = tuple(state[key].shape)
    state[key] = torch.zeros(1)
    other = tmp_path / 'other.pth'
    torch.save({'state_dict': state}, other)
    with pytest.raises(SystemExit) as info:
        tool.main([str(config), str(other), str(image), '--list-layers'])
    assert info.value.code == 1
    err = capsys.readouterr().err
    assert err == (
        f"error: checkpoint '{other}' does not fit the model: mis-shaped "
        f'keys 1 ({key} (checkpoint (1,), model {shape})); draw the kernels '
        'of the config the checkpoint trained\n'
    )
