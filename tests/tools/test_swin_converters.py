"""tools/model_converters/{elsa,acmix}_swin_to_mmpretrain.py: an official
classification checkpoint (the official key list of
``tests/models/data/swin_family_state_dict.json``, with or without its
buffers) becomes an mmpretrain ``ImageClassifier`` checkpoint that loads
strictly and gives the logits of the official formulas (float64)."""

import json
import os.path as osp
import sys

import pytest
import torch

from tool_utils import REPO, load_tool

pytestmark = pytest.mark.slow

sys.path.insert(0, osp.join(REPO, 'tests', 'models'))
import swin_reference as ref  # noqa: E402

DATA = osp.join(REPO, 'tests', 'models', 'data', 'swin_family_state_dict.json')
BUFFERS = ('relative_id', 'relative_position_index', 'attn_mask')


def official_checkpoint(family, with_buffers, seed=0):
    with open(DATA) as f:
        shapes = json.load(f)[f'{family}_swin_tiny_cls']
    g = torch.Generator().manual_seed(seed)
    state = {}
    for name, shape in shapes.items():
        if name.rsplit('.', 1)[-1] in BUFFERS:
            if with_buffers:  # values irrelevant: the model rebuilds them
                state[name] = torch.zeros(shape, dtype=torch.long)
        else:
            state[name] = torch.randn(shape, generator=g) * 0.5
    return dict(model=state, epoch=300)


def classifier(family):
    from mmengine.registry import DefaultScope
    from mmpretrain.models import ImageClassifier

    with DefaultScope.overwrite_default_scope('mmpretrain'):
        return ImageClassifier(
            backbone=dict(
                type=f'{"ELSA" if family == "elsa" else "ACmix"}'
                'SwinTransformer',
                arch='tiny',
                out_indices=(3,),
            ),
            neck=dict(type='GlobalAveragePooling'),
            head=dict(type='LinearClsHead', num_classes=1000, in_channels=768),
        )


@pytest.mark.parametrize('with_buffers', [True, False])
@pytest.mark.parametrize('family', ['elsa', 'acmix'])
def test_converted_checkpoint_loads_strictly(tmp_path, family, with_buffers):
    src, dst = str(tmp_path / 'official.pth'), str(tmp_path / 'out' / 'c.pth')
    ckpt = official_checkpoint(family, with_buffers)
    torch.save(ckpt, src)
    load_tool(f'model_converters/{family}_swin_to_mmpretrain').main([src, dst])
    state = torch.load(dst, map_location='cpu')['state_dict']
    model = classifier(family)
    model.load_state_dict(state, strict=True)
    official = ckpt['model']
    assert torch.equal(state['backbone.norm3.weight'], official['norm.weight'])
    assert torch.equal(state['head.fc.weight'], official['head.weight'])
    n_official = sum(
        v.numel()
        for k, v in official.items()
        if k.rsplit('.', 1)[-1] not in BUFFERS
    )
    assert sum(v.numel() for v in state.values()) == n_official


@pytest.mark.parametrize('family', ['elsa', 'acmix'])
def test_converted_classifier_gives_the_official_logits(tmp_path, family):
    src, dst = str(tmp_path / 'official.pth'), str(tmp_path / 'c.pth')
    ckpt = official_checkpoint(family, with_buffers=True, seed=1)
    torch.save(ckpt, src)
    load_tool(f'model_converters/{family}_swin_to_mmpretrain').main([src, dst])
    model = classifier(family)
    model.load_state_dict(torch.load(dst)['state_dict'], strict=True)
    model = model.double().eval()
    x = torch.randn(1, 3, 224, 224, dtype=torch.float64)
    with torch.no_grad():
        logits = model(x, mode='tensor')
    p = {k: v.double() for k, v in ckpt['model'].items()}
    p.update({f'norm3.{k}': p[f'norm.{k}'] for k in ('weight', 'bias')})
    (feat,) = ref.swin_model(
        x, p, (2, 2, 6, 2), (3, 6, 12, 24), family, out_indices=(3,)
    )
    expected = feat.mean((2, 3)) @ p['head.weight'].T + p['head.bias']
    torch.testing.assert_close(logits, expected, rtol=1e-9, atol=1e-9)


def test_wrong_family_or_kind_is_refused(tmp_path):
    from mmevo.models.backbones.swin_convert import official_to_mmpretrain

    ckpt = official_checkpoint('acmix', with_buffers=False)
    with pytest.raises(ValueError, match='not an official elsa-Swin'):
        official_to_mmpretrain(ckpt, 'elsa')
    with pytest.raises(ValueError, match='family must be one of'):
        official_to_mmpretrain(ckpt, 'swin')
    del ckpt['model']['head.weight']
    with pytest.raises(ValueError, match='not a classification checkpoint'):
        official_to_mmpretrain(ckpt, 'acmix')
    with pytest.raises(TypeError, match='checkpoint must be a dict'):
        official_to_mmpretrain([], 'acmix')
