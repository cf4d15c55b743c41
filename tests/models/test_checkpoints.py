"""Published checkpoints load unchanged into RedNet and ACmix-ResNet.

Synthetic checkpoints are written from the key/shape lists of the published
reference implementations (``data/*.json``, copies of the project's reference
files): random tensors of every listed shape.
"""

import json
import os.path as osp

import pytest
import torch
from mmengine.runner.checkpoint import load_state_dict as mm_load_state_dict

from mmevo.models import ACmixResNet, RedNet

from mmlogs import MMLogs

pytestmark = pytest.mark.slow

DATA = osp.join(osp.dirname(__file__), 'data')


def _reference(name):
    with open(osp.join(DATA, name)) as f:
        return json.load(f)


def synthetic_state_dict(shapes, seed=0):
    """Random tensors with the published keys and shapes (valid BN stats)."""
    gen = torch.Generator().manual_seed(seed)
    sd = {}
    for key, shape in shapes.items():
        if key.endswith('num_batches_tracked'):
            sd[key] = torch.randint(1, 1000, (), generator=gen)
        elif key.endswith('running_var'):
            sd[key] = torch.rand(shape, generator=gen) + 0.5
        else:
            sd[key] = torch.randn(shape, generator=gen) * 0.1
    return sd


def _mismatch_messages(messages):
    return [
        m
        for m in messages
        if 'do not match' in m or 'missing' in m or 'unexpected' in m
    ]


def assert_loaded(model, expected):
    """Every model tensor equals the checkpoint tensor of the same key."""
    sd = model.state_dict()
    assert set(sd) == set(expected), set(sd) ^ set(expected)
    for key, value in expected.items():
        assert torch.equal(sd[key], value), key


@pytest.mark.parametrize(
    'stem_kernel_size,variant', [(3, 'rednet50_cls'), (7, 'rednet50_det')]
)
def test_rednet_keys_shapes_and_params(stem_kernel_size, variant):
    ref = _reference('rednet50_state_dict.json')[variant]
    model = RedNet(50, stem_kernel_size=stem_kernel_size)
    shapes = {k: list(v.shape) for k, v in model.state_dict().items()}
    assert shapes == ref['state_dict']
    assert sum(p.numel() for p in model.parameters()) == ref['params']


def test_acmix_keys_shapes_and_params():
    ref = _reference('acmix_resnet50_state_dict.json')['acmix_resnet50']
    model = ACmixResNet(50)
    shapes = {k: list(v.shape) for k, v in model.state_dict().items()}
    head = {'fc.weight': [1000, 2048], 'fc.bias': [1000]}
    assert {**shapes, **head} == ref['state_dict']
    fc = torch.nn.Linear(2048, 1000)
    n_params = sum(p.numel() for p in model.parameters()) + sum(
        p.numel() for p in fc.parameters()
    )
    assert n_params == ref['params'] == 18_333_976


def test_rednet_mmcls_checkpoint_via_init_cfg(tmp_path):
    """mmcls format + prefix 'backbone.', through init_cfg, as configs do."""
    shapes = _reference('rednet50_state_dict.json')['rednet50_cls'][
        'state_dict'
    ]
    sd = synthetic_state_dict(shapes)
    ckpt = tmp_path / 'rednet50_mmcls.pth'
    torch.save(
        {
            'state_dict': {f'backbone.{k}': v for k, v in sd.items()},
            'meta': {},
        },
        ckpt,
    )
    model = RedNet(
        50,
        stem_kernel_size=3,
        init_cfg=dict(
            type='Pretrained', checkpoint=str(ckpt), prefix='backbone.'
        ),
    )
    with MMLogs() as log:
        model.init_weights()
    assert not _mismatch_messages(log.messages), log.messages
    assert_loaded(model, sd)

    plain = RedNet(50, stem_kernel_size=3)
    plain.load_state_dict(sd, strict=True)
    x = torch.randn(1, 3, 64, 64)
    model.eval(), plain.eval()
    with torch.no_grad():
        for a, b in zip(model(x), plain(x), strict=True):
            assert torch.isfinite(a).all()
            torch.testing.assert_close(a, b, rtol=0, atol=0)


def test_imagenet_checkpoint_into_stem7_warns(tmp_path):
    """Published detection runs: stem-3 ImageNet weights, stem-7 model."""
    shapes = _reference('rednet50_state_dict.json')['rednet50_cls'][
        'state_dict'
    ]
    sd = synthetic_state_dict(shapes, seed=1)
    ckpt = tmp_path / 'rednet50_mmcls.pth'
    torch.save(
        {'state_dict': {f'backbone.{k}': v for k, v in sd.items()}}, ckpt
    )
    model = RedNet(
        50,
        stem_kernel_size=7,
        init_cfg=dict(
            type='Pretrained', checkpoint=str(ckpt), prefix='backbone.'
        ),
    )
    before = {
        k: v.clone()
        for k, v in model.state_dict().items()
        if k.startswith('stem.1.conv2.')
    }
    with MMLogs() as log:
        model.init_weights()
    text = '\n'.join(log.messages)
    mismatched = {'stem.1.conv2.conv.weight', 'stem.1.conv2.conv.bias'}
    for key in mismatched:
        assert f'size mismatch for {key}' in text
    assert 'missing' not in text and 'unexpected' not in text
    after = model.state_dict()
    for key, value in sd.items():
        if key in mismatched:
            assert torch.equal(after[key], before[key]), key
        else:
            assert torch.equal(after[key], value), key


@pytest.mark.parametrize('wrapped', [False, True])
def test_acmix_torchvision_checkpoint(tmp_path, wrapped):
    shapes = _reference('acmix_resnet50_state_dict.json')['acmix_resnet50'][
        'state_dict'
    ]
    sd = synthetic_state_dict(shapes, seed=2)
    ckpt = tmp_path / 'acmix_resnet50.pth'
    torch.save({'state_dict': sd} if wrapped else sd, ckpt)
    model = ACmixResNet(
        50, init_cfg=dict(type='Pretrained', checkpoint=str(ckpt))
    )
    with MMLogs() as log:
        model.init_weights()
    assert not _mismatch_messages(log.messages), log.messages
    backbone_sd = {k: v for k, v in sd.items() if not k.startswith('fc.')}
    assert_loaded(model, backbone_sd)

    # strict loaders (torch, or mmengine's when wrapped) accept the whole
    # classifier too
    plain = ACmixResNet(50)
    if wrapped:
        mm_load_state_dict(plain, sd, strict=True)
    else:
        plain.load_state_dict(sd, strict=True)
    assert_loaded(plain, backbone_sd)
    x = torch.randn(1, 3, 32, 32)
    model.eval(), plain.eval()
    with torch.no_grad():
        for a, b in zip(model(x), plain(x), strict=True):
            assert torch.isfinite(a).all()
            torch.testing.assert_close(a, b, rtol=0, atol=0)


def test_acmix_only_drops_fc():
    """A key the backbone really lacks is still reported."""
    sd = ACmixResNet(26, stem_channels=16, base_channels=16).state_dict()
    sd['layer9.weight'] = torch.zeros(1)
    with pytest.raises(RuntimeError, match=r'layer9\.weight'):
        ACmixResNet(26, stem_channels=16, base_channels=16).load_state_dict(
            sd, strict=True
        )
