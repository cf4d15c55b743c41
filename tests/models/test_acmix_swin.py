"""ACmixSwinTransformer against the official ACmix-Swin formulas (float64
derivations in ``swin_reference.py``), its initialisation, the official
parameter counts and key list, and its backbone behaviour."""

import json
import os.path as osp

import pytest
import torch

from mmevo.models import ACmixSwinTransformer
from mmevo.models.backbones.swin_convert import official_state_dict

import swin_reference as ref

pytestmark = pytest.mark.slow

DATA = osp.join(osp.dirname(__file__), 'data', 'swin_family_state_dict.json')
TINY = dict(embed_dims=16, depths=(1, 2, 1, 2), num_heads=(2, 2, 4, 4))


def official(name):
    with open(DATA) as f:
        return json.load(f)[name]


@pytest.mark.parametrize(
    'pad_small_map,size',
    [
        (False, (61, 45)),
        (True, (61, 45)),
        (False, (224, 224)),
        (True, (100, 36)),
    ],
)
def test_whole_model_matches_formulas(pad_small_map, size):
    torch.manual_seed(0)
    model = ACmixSwinTransformer(
        **TINY, drop_path_rate=0.0, pad_small_map=pad_small_map
    )
    p = ref.randomised(model)
    model = model.double().eval()
    x = torch.randn(2, 3, *size, dtype=torch.float64)
    with torch.no_grad():
        outs = model(x)
    expected = ref.swin_model(
        x,
        p,
        TINY['depths'],
        TINY['num_heads'],
        'acmix',
        pad_small_map=pad_small_map,
    )
    for out, exp in zip(outs, expected, strict=True):
        assert out.shape == exp.shape
        torch.testing.assert_close(out, exp, rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize('pad_small_map', [False, True])
@pytest.mark.parametrize(
    'dim,heads,size',
    [(24, 3, (9, 13)), (8, 1, (3, 5)), (32, 4, (14, 14)), (20, 5, (7, 8))],
)
def test_window_blocks_match_formula(dim, heads, size, pad_small_map):
    torch.manual_seed(1)
    model = ACmixSwinTransformer(
        embed_dims=dim,
        depths=(2, 1, 1, 1),
        num_heads=(heads, 1, 1, 1),
        qk_scale=0.4,
        drop_path_rate=0.0,
        pad_small_map=pad_small_map,
    )
    x = torch.randn(2, *size, dim, dtype=torch.float64)
    for index in (0, 1):
        block = model.layers[0].blocks[index]
        p = ref.randomised(block, seed=index)
        block = block.double()
        expected = ref.window_block(
            x, p, heads, 7, index, pad_small_map, 'acmix', qk_scale=0.4
        )
        torch.testing.assert_close(block(x), expected, rtol=1e-10, atol=1e-10)


def test_published_initialisation():
    model = ACmixSwinTransformer(**TINY)
    model.init_weights()
    attn = model.layers[1].blocks[0].attn
    assert attn.rate1.item() == attn.rate2.item() == 0.5
    # no dep_conv bias (the published code sets it to None)
    assert attn.dep_conv.bias is None
    assert 'layers.1.blocks.0.attn.dep_conv.bias' not in model.state_dict()
    weight = attn.dep_conv.weight  # (dim, 9, 3, 3): tap i reads channel i
    assert weight.shape == (32, 9, 3, 3)
    for i in range(9):
        one_hot = torch.zeros(3, 3)
        one_hot[i // 3, i % 3] = 1
        assert torch.equal(weight[:, i], one_hot.expand(32, 3, 3))
    assert attn.fc.weight.shape == (9, 3 * 2, 1, 1)
    assert attn.relative_position_bias_table.shape == (169, 2)


@pytest.mark.parametrize(
    'arch,count', [('tiny', 28649908), ('small', 50345080)]
)
def test_classifier_parameters_equal_official(arch, count):
    from mmpretrain.models import ImageClassifier

    assert official('params')[f'acmix_swin_{arch}_cls'] == count
    from mmengine.registry import DefaultScope

    with (
        torch.device('meta'),
        DefaultScope.overwrite_default_scope('mmpretrain'),
    ):
        model = ImageClassifier(
            backbone=dict(
                type='ACmixSwinTransformer', arch=arch, out_indices=(3,)
            ),
            neck=dict(type='GlobalAveragePooling'),
            head=dict(type='LinearClsHead', num_classes=1000, in_channels=768),
        )
    assert sum(p.numel() for p in model.parameters()) == count


def test_keys_are_the_official_ones():
    keys = official('acmix_swin_tiny_cls')
    with torch.device('meta'):
        model = ACmixSwinTransformer(out_indices=(3,))
    shapes = {k: list(v.shape) for k, v in model.state_dict().items()}
    assert shapes == official_state_dict({'model': keys})
    # the published attn_mask buffers are dropped, not expected
    assert 'layers.0.blocks.1.attn_mask' in keys


def test_init_cfg_loads_the_official_classifier(tmp_path):
    g = torch.Generator().manual_seed(0)
    state = {
        k: torch.randn(s, generator=g)
        for k, s in official('acmix_swin_tiny_cls').items()
    }
    path = str(tmp_path / 'acmix_swin_tiny.pth')
    torch.save(dict(model=state), path)
    model = ACmixSwinTransformer(
        out_indices=(3,), init_cfg=dict(type='Pretrained', checkpoint=path)
    )
    model.init_weights()
    loaded = model.state_dict()
    expected = official_state_dict(dict(model=state))
    assert loaded.keys() == expected.keys()
    for name, value in expected.items():
        assert torch.equal(loaded[name], value), name


def test_any_size_and_empty_batch():
    model = ACmixSwinTransformer(**TINY, pad_small_map=True)
    outs = model(torch.randn(1, 3, 29, 83))
    assert [tuple(o.shape) for o in outs] == [
        (1, 16, 8, 21),
        (1, 32, 4, 11),
        (1, 64, 2, 6),
        (1, 128, 1, 3),
    ]
    x = torch.randn(0, 3, 64, 64, requires_grad=True)
    outs = model(x)
    assert [o.shape[0] for o in outs] == [0] * 4
    sum(o.sum() for o in outs).backward()
    assert x.grad.shape == x.shape


@pytest.mark.parametrize('dtype', [torch.bfloat16, torch.float16])
def test_autocast_runs_in_low_precision(dtype):
    torch.manual_seed(5)
    model = ACmixSwinTransformer(**TINY, pad_small_map=True).eval()
    x = torch.randn(1, 3, 45, 60)
    with torch.no_grad():
        full = model(x)
        with torch.autocast('cpu', dtype=dtype):
            low = model(x)
    for a, b in zip(low, full, strict=True):
        assert torch.isfinite(a).all()
        assert (a.float() - b).abs().max() / b.abs().max() < 0.05


def test_frozen_stages_and_train_mode():
    model = ACmixSwinTransformer(**TINY, frozen_stages=1).train()
    frozen = {n for n, p in model.named_parameters() if not p.requires_grad}
    assert frozen == {
        n
        for n, _ in model.named_parameters()
        if n.startswith(('patch_embed.', 'layers.0.', 'norm0.'))
    }
    assert not model.layers[0].training and model.layers[1].training


@pytest.mark.slow
def test_onnx_export_with_dynamic_hw(tmp_path):
    # TorchScript exporter (the dynamo one is tested on ELSA-Swin, whose
    # window blocks these are): exported at 224, checked at sizes that pad
    from mmevo.deploy import OnnxModel, TensorOutputs, export_onnx

    torch.manual_seed(9)
    backbone = ACmixSwinTransformer(
        embed_dims=16,
        depths=(1, 1, 1, 2),
        num_heads=(1, 2, 4, 8),
        pad_small_map=True,
    ).eval()
    model = TensorOutputs(backbone, lambda m, x: m(x))
    path = str(tmp_path / 'acmix_swin.onnx')
    export_onnx(model, torch.randn(1, 3, 224, 224), path, dynamo=False)
    session = OnnxModel(path)
    for size in [(224, 224), (70, 90), (33, 250)]:
        x = torch.randn(1, 3, *size)
        with torch.no_grad():
            expected = model(x)
        for out, exp in zip(session(x), expected, strict=True):
            assert out.shape == exp.shape, size
            assert (out - exp).abs().max() / exp.abs().max() <= 1e-4, size
