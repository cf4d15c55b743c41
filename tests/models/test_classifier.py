"""RedNet and ACmix-ResNet as mmpretrain ImageNet classifiers.

The classifier is mmpretrain's ``ImageClassifier`` built by name under
``default_scope='mmpretrain'`` from the model base of the ImageNet configs.
A released mmcls RedNet checkpoint is stood in for by seeded tensors of its
keys and shapes (``data/rednet50_state_dict.json``, plus the 1000-class
``head.fc``): it loads with strict keys, and the logits are those of the
published network, computed here in float64 from the checkpoint's tensors
alone (a functional transcription of d-li14/involution's mmcls RedNet:
involution = unfold x kernel from two 1x1 convs, average-pooled input at
stride 2), then the global mean and the fc layer.
"""

import json
import os.path as osp

import pytest
import torch
import torch.nn.functional as F
from mmengine.config import Config
from mmengine.registry import DefaultScope
from mmengine.runner import load_checkpoint

import mmevo
from mmevo.models import ACmixResNet, RedNet

pytestmark = pytest.mark.slow

# Modules and fixes (the allowlist of mmengine's checkpoint types), as
# mmevo's tools have them.
mmevo.register_all_modules(install_fixes=True)

ROOT = osp.dirname(osp.dirname(osp.dirname(osp.abspath(__file__))))
DATA = osp.join(osp.dirname(__file__), 'data')
BASES = osp.join(ROOT, 'configs', '_base_', 'models')
STAGES = (3, 4, 6, 3)  # RedNet-50


@pytest.fixture(autouse=True)
def mmpretrain_scope():
    # overrides tests/models/conftest.py's mmdet scope
    with DefaultScope.overwrite_default_scope('mmpretrain'):
        yield


def build_classifier(base, **backbone):
    """The ImageClassifier of a model base config, built by mmpretrain's
    registry (the backbone found in mmengine's root registry)."""
    from mmpretrain.registry import MODELS

    cfg = Config.fromfile(osp.join(BASES, base))
    cfg.model.backbone.update(backbone)
    return MODELS.build(cfg.model)


def official_checkpoint(seed=0):
    """An mmcls RedNet-50 checkpoint state dict: the published keys and
    shapes (backbone.* and head.fc.*), seeded values of a sane scale."""
    with open(osp.join(DATA, 'rednet50_state_dict.json')) as f:
        shapes = json.load(f)['rednet50_cls']['state_dict']
    shapes = {f'backbone.{k}': v for k, v in shapes.items()}
    shapes.update({'head.fc.weight': [1000, 2048], 'head.fc.bias': [1000]})
    gen = torch.Generator().manual_seed(seed)
    state = {}
    for key, shape in shapes.items():
        if key.endswith('num_batches_tracked'):
            value = torch.tensor(1234)
        elif key.endswith('running_var'):
            value = torch.rand(shape, generator=gen) + 0.5
        elif key.endswith('running_mean') or key.endswith('bias'):
            value = torch.randn(shape, generator=gen) * 0.1
        elif len(shape) == 1:  # BN weight
            value = 1 + torch.randn(shape, generator=gen) * 0.1
        else:  # He-scaled conv / fc weight
            fan_in = torch.Size(shape[1:]).numel()
            value = torch.randn(shape, generator=gen) * (2 / fan_in) ** 0.5
        if key.endswith('bn3.weight'):
            value = value * 0.3  # the residual branches do not dominate
        if key.endswith('conv2.conv.weight'):
            # an involution is quadratic in its input: with fixed BN
            # statistics its output would square from block to block; a
            # small input-dependent part of the kernel keeps it O(input)
            value = value * 0.1 / shape[0] ** 0.5
        state[key] = value
    return state


def _bn(x, sd, p):
    return F.batch_norm(
        x,
        sd[f'{p}.running_mean'],
        sd[f'{p}.running_var'],
        sd[f'{p}.weight'],
        sd[f'{p}.bias'],
        False,
        0.0,
        1e-5,
    )


def _involution(x, sd, p, k, stride):
    """The published involution (16 channels a group, reduction 4)."""
    y = F.avg_pool2d(x, stride, stride) if stride > 1 else x
    y = F.relu(
        _bn(F.conv2d(y, sd[f'{p}.conv1.conv.weight']), sd, f'{p}.conv1.bn')
    )
    kernel = F.conv2d(
        y, sd[f'{p}.conv2.conv.weight'], sd[f'{p}.conv2.conv.bias']
    )
    b, c = x.shape[:2]
    g, (h, w) = c // 16, kernel.shape[-2:]
    kernel = kernel.view(b, g, k * k, h, w).unsqueeze(2)
    cols = F.unfold(x, k, 1, (k - 1) // 2, stride).view(b, g, 16, k * k, h, w)
    return (kernel * cols).sum(3).view(b, c, h, w)


def reference_logits(sd, x):
    """Published RedNet-50 classifier on ``x``, from the state dict."""
    sd = {k: v.double() for k, v in sd.items()}
    x = x.double()
    x = F.relu(
        _bn(
            F.conv2d(x, sd['backbone.stem.0.conv.weight'], None, 2, 1),
            sd,
            'backbone.stem.0.bn',
        )
    )
    x = F.relu(
        _bn(_involution(x, sd, 'backbone.stem.1', 3, 1), sd, 'backbone.stem.2')
    )
    x = F.relu(
        _bn(
            F.conv2d(x, sd['backbone.stem.4.conv.weight'], None, 1, 1),
            sd,
            'backbone.stem.4.bn',
        )
    )
    x = F.max_pool2d(x, 3, 2, 1)
    for i, blocks in enumerate(STAGES):
        for j in range(blocks):
            p = f'backbone.layer{i + 1}.{j}'
            stride = 2 if i > 0 and j == 0 else 1
            out = F.relu(
                _bn(F.conv2d(x, sd[f'{p}.conv1.weight']), sd, f'{p}.bn1')
            )
            out = F.relu(
                _bn(
                    _involution(out, sd, f'{p}.conv2', 7, stride),
                    sd,
                    f'{p}.bn2',
                )
            )
            out = _bn(F.conv2d(out, sd[f'{p}.conv3.weight']), sd, f'{p}.bn3')
            if j == 0:
                x = _bn(
                    F.conv2d(x, sd[f'{p}.downsample.0.weight'], None, stride),
                    sd,
                    f'{p}.downsample.1',
                )
            x = F.relu(out + x)
    feat = x.mean(dim=(2, 3))
    return feat @ sd['head.fc.weight'].t() + sd['head.fc.bias']


@pytest.mark.parametrize(
    'base,backbone_type',
    [
        ('rednet50_in1k.py', RedNet),
        ('acmix-resnet50_in1k.py', ACmixResNet),
    ],
)
def test_classifier_builds_under_mmpretrain_scope(base, backbone_type):
    from mmpretrain.models import (
        GlobalAveragePooling,
        ImageClassifier,
        LinearClsHead,
    )

    model = build_classifier(base, depth=26)
    assert type(model) is ImageClassifier
    assert type(model.backbone) is backbone_type
    assert isinstance(model.neck, GlobalAveragePooling)
    assert isinstance(model.head, LinearClsHead)
    assert model.backbone.out_indices == (3,)
    model.eval()
    with torch.no_grad():
        logits = model(torch.randn(2, 3, 64, 64), mode='tensor')
    assert logits.shape == (2, 1000) and torch.isfinite(logits).all()


def test_rednet_classifier_has_the_imagenet_stem():
    model = build_classifier('rednet50_in1k.py')
    assert model.backbone.stem[1].kernel_size == 3
    assert model.head.fc.in_features == 2048


@pytest.fixture(scope='module')
def official(tmp_path_factory):
    """(checkpoint path, state dict) of an official-format RedNet-50."""
    state = official_checkpoint()
    path = tmp_path_factory.mktemp('official') / 'rednet50_in1k.pth'
    torch.save(dict(meta=dict(mmcls_version='0.12.0'), state_dict=state), path)
    return str(path), state


def test_official_checkpoint_loads_strictly(official):
    path, state = official
    model = build_classifier('rednet50_in1k.py')
    ours = model.state_dict()
    assert set(ours) == set(state)  # nothing missing, nothing unexpected
    load_checkpoint(model, path, map_location='cpu', strict=True)
    for key, value in model.state_dict().items():
        assert torch.equal(value, state[key]), key


def test_official_checkpoint_gives_the_official_logits(official):
    path, state = official
    model = build_classifier('rednet50_in1k.py')
    load_checkpoint(model, path, map_location='cpu', strict=True)
    model.eval()
    x = torch.randn(2, 3, 64, 96, generator=torch.Generator().manual_seed(1))
    expected = reference_logits(state, x)
    assert expected.std() > 0.1  # a network that does distinguish inputs
    with torch.no_grad():
        float64 = model.double()(x.double(), mode='tensor')
        torch.testing.assert_close(float64, expected, rtol=1e-9, atol=1e-9)
        float32 = model.float()(x, mode='tensor')
    torch.testing.assert_close(
        float32.double(), expected, rtol=1e-3, atol=1e-3 * expected.abs().max()
    )


def test_official_checkpoint_scores_through_the_data_preprocessor(official):
    """test_step: BGR uint8 images -> RGB, ImageNet mean/std -> softmax of
    the official logits."""
    from mmpretrain.structures import DataSample

    path, state = official
    cfg = Config.fromfile(
        osp.join(
            ROOT, 'configs', 'rednet', 'rednet50_64xb32-warmup-coslr_in1k.py'
        )
    )
    from mmpretrain.registry import MODELS

    cfg.model.data_preprocessor = cfg.data_preprocessor
    model = MODELS.build(cfg.model)
    load_checkpoint(model, path, map_location='cpu', strict=True)
    model.eval()
    gen = torch.Generator().manual_seed(2)
    imgs = [
        torch.randint(0, 256, (3, 64, 64), generator=gen, dtype=torch.uint8)
        for _ in range(2)
    ]
    with torch.no_grad():
        out = model.test_step(
            dict(inputs=imgs, data_samples=[DataSample() for _ in imgs])
        )
    mean = torch.tensor([123.675, 116.28, 103.53]).view(3, 1, 1)
    std = torch.tensor([58.395, 57.12, 57.375]).view(3, 1, 1)
    x = torch.stack([(img.flip(0).double() - mean) / std for img in imgs])
    expected = reference_logits(state, x).softmax(-1)
    scores = torch.stack([o.pred_score for o in out]).double()
    torch.testing.assert_close(scores, expected, rtol=1e-3, atol=1e-5)
    assert [int(o.pred_label) for o in out] == expected.argmax(-1).tolist()
