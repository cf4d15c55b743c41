"""ELSASwinTransformer against the official ELSA-Swin formulas (float64
derivations in ``swin_reference.py``), the official parameter counts and
key list (``data/swin_family_state_dict.json``), and its mmdet-style
behaviour (any size, outputs, freezing, checkpointing, empty batches,
autocast, loading official checkpoints)."""

import json
import os.path as osp

import pytest
import torch

from mmevo.layers import ELSA
from mmevo.models import ELSASwinTransformer
from mmevo.models.backbones.swin_convert import official_state_dict

import swin_reference as ref

pytestmark = pytest.mark.slow

DATA = osp.join(osp.dirname(__file__), 'data', 'swin_family_state_dict.json')
TINY = dict(embed_dims=16, depths=(1, 2, 1, 2), num_heads=(2, 2, 4, 4))


def official(name):
    with open(DATA) as f:
        return json.load(f)[name]


def n_params(module):
    return sum(p.numel() for p in module.parameters())


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
    model = ELSASwinTransformer(
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
        'elsa',
        pad_small_map=pad_small_map,
    )
    for out, exp in zip(outs, expected, strict=True):
        assert out.shape == exp.shape
        torch.testing.assert_close(out, exp, rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize(
    'dim,heads,group_width,size',
    [
        (24, 3, 4, (5, 9)),
        (16, 2, 8, (7, 3)),
        (32, 4, 8, (1, 1)),
        (40, 5, 4, (6, 6)),
    ],
)
def test_elsa_block_matches_formula(dim, heads, group_width, size):
    torch.manual_seed(1)
    model = ELSASwinTransformer(
        embed_dims=dim,
        depths=(1, 1, 1, 1),
        num_heads=(heads, heads, heads, heads),
        group_width=group_width,
        drop_path_rate=0.0,
    )
    block = model.layers[0].blocks[0]
    # dim_qk = dim // 3 * 2 rounded up to the group width
    dim_qk = -(-(dim // 3 * 2) // group_width) * group_width
    assert block.attn.pre_proj.weight.shape[0] == 2 * dim_qk + dim
    assert block.attn.attn[0].groups == dim_qk // group_width
    p = ref.randomised(block)
    block = block.double()
    x = torch.randn(2, *size, dim, dtype=torch.float64)
    torch.testing.assert_close(
        block(x),
        ref.elsa_block(x, p, heads, group_width),
        rtol=1e-10,
        atol=1e-10,
    )


@pytest.mark.parametrize('pad_small_map', [False, True])
@pytest.mark.parametrize('size', [(9, 13), (3, 5), (14, 14), (7, 7)])
def test_last_stage_blocks_match_formula(size, pad_small_map):
    torch.manual_seed(2)
    model = ELSASwinTransformer(
        **TINY, qk_scale=0.3, drop_path_rate=0.0, pad_small_map=pad_small_map
    )
    x = torch.randn(2, *size, 128, dtype=torch.float64)
    for index in (0, 1):  # unshifted, shifted
        block = model.layers[3].blocks[index]
        p = ref.randomised(block, seed=index)
        block = block.double()
        expected = ref.window_block(
            x, p, 4, 7, index, pad_small_map, 'elsa', qk_scale=0.3
        )
        torch.testing.assert_close(block(x), expected, rtol=1e-10, atol=1e-10)


def test_gradients_match_formulas():
    torch.manual_seed(3)
    model = ELSASwinTransformer(**TINY, drop_path_rate=0.0, pad_small_map=True)
    p = {k: v.requires_grad_() for k, v in ref.randomised(model).items()}
    model = model.double()
    x = torch.randn(1, 3, 23, 29, dtype=torch.float64, requires_grad=True)
    w = [torch.randn_like(o) for o in model(x)]
    sum((o * wi).sum() for o, wi in zip(model(x), w, strict=True)).backward()
    x_ref = x.detach().clone().requires_grad_()
    outs = ref.swin_model(
        x_ref, p, TINY['depths'], TINY['num_heads'], 'elsa', pad_small_map=True
    )
    sum((o * wi).sum() for o, wi in zip(outs, w, strict=True)).backward()
    torch.testing.assert_close(x.grad, x_ref.grad, rtol=1e-9, atol=1e-12)
    for name, param in model.named_parameters():
        torch.testing.assert_close(
            param.grad, p[name].grad, rtol=1e-9, atol=1e-12, msg=name
        )


@pytest.mark.parametrize(
    'arch,count', [('tiny', 29140978), ('small', 52874626), ('base', 92682464)]
)
def test_classifier_parameters_equal_official(arch, count):
    from mmpretrain.models import ImageClassifier

    assert official('params')[f'elsa_swin_{arch}_cls'] == count
    from mmengine.registry import DefaultScope

    with (
        torch.device('meta'),
        DefaultScope.overwrite_default_scope('mmpretrain'),
    ):
        model = ImageClassifier(
            backbone=dict(
                type='ELSASwinTransformer', arch=arch, out_indices=(3,)
            ),
            neck=dict(type='GlobalAveragePooling'),
            head=dict(
                type='LinearClsHead',
                num_classes=1000,
                in_channels=1024 if arch == 'base' else 768,
            ),
        )
    assert n_params(model) == count


def _shapes(state):
    return {k: list(v.shape) for k, v in state.items()}


def test_keys_are_the_official_ones():
    cls = official('elsa_swin_tiny_cls')
    with torch.device('meta'):
        model = ELSASwinTransformer(out_indices=(3,))
        det = ELSASwinTransformer(pad_small_map=True)
    expected = official_state_dict({'model': cls})
    assert _shapes(model.state_dict()) == expected
    assert 'layers.3.blocks.0.attn.relative_id' in cls  # dropped buffer
    det_keys = official('elsa_swin_tiny_det')
    assert _shapes(det.state_dict()) == official_state_dict(det_keys)
    assert {f'norm{i}.weight' for i in range(4)} <= set(det_keys)
    assert n_params(det) == official('params')['elsa_swin_tiny_det']


def _fake_checkpoint(shapes, seed=0):
    g = torch.Generator().manual_seed(seed)
    return {
        k: torch.randn(s, generator=g)
        if 'relative' not in k
        else torch.randint(0, 169, s, generator=g)
        for k, s in shapes.items()
    }


@pytest.mark.parametrize('kind', ['cls', 'det'])
def test_init_cfg_loads_official_checkpoints(tmp_path, kind):
    state = _fake_checkpoint(official(f'elsa_swin_tiny_{kind}'))
    if kind == 'cls':
        ckpt, prefix, kwargs = dict(model=state), '', dict(out_indices=(3,))
    else:
        ckpt = dict(state_dict={f'backbone.{k}': v for k, v in state.items()})
        ckpt['state_dict']['neck.conv.weight'] = torch.zeros(1)
        prefix, kwargs = 'backbone.', dict(pad_small_map=True)
    path = str(tmp_path / 'official.pth')
    torch.save(ckpt, path)
    model = ELSASwinTransformer(
        init_cfg=dict(type='Pretrained', checkpoint=path, prefix=prefix),
        **kwargs,
    )
    model.init_weights()
    loaded = model.state_dict()
    expected = official_state_dict(ckpt, prefix)
    assert loaded.keys() == expected.keys()
    for name, value in expected.items():
        assert torch.equal(loaded[name], value), name


def test_presets_and_overrides():
    small = ELSASwinTransformer(arch='small', depths=(1, 1, 1, 1))
    assert small.block_cfg['group_width'] == 8 and small.embed_dims == 96
    assert small.layers[2].blocks[0].attn.attn[0].groups == 256 // 8
    base = ELSASwinTransformer(arch='base', embed_dims=64, depths=(1, 1, 1, 1))
    assert base.num_heads == (4, 8, 16, 32)
    assert base.layers[0].blocks[0].attn.dim_qk == 48  # 64 // 3 * 2 -> 48
    tiny = ELSASwinTransformer(depths=(1, 1, 1, 1), group_width=8)
    assert tiny.block_cfg['group_width'] == 8
    # The ELSA stages multiply q * k by 1, the last stage by head_dim**-0.5.
    assert tiny.layers[0].blocks[0].attn.scale == 1
    assert tiny.layers[3].blocks[0].attn.scale == 32**-0.5
    rates = [
        getattr(b.drop_path, 'drop_prob', 0.0)
        for s in ELSASwinTransformer(drop_path_rate=0.3).layers
        for b in s.blocks
    ]
    torch.testing.assert_close(torch.tensor(rates), torch.linspace(0, 0.3, 12))


@pytest.mark.parametrize(
    'kwargs,message',
    [
        (dict(arch='huge'), 'arch must be one of'),
        (dict(depths=(2, 2, 2)), 'depths and num_heads must have 4'),
        (dict(out_indices=(4,)), 'out_indices'),
        (dict(frozen_stages=5), 'frozen_stages'),
        (dict(num_heads=(5, 6, 12, 24)), 'divisible by num_heads'),
    ],
)
def test_bad_arguments(kwargs, message):
    with pytest.raises(ValueError, match=message):
        ELSASwinTransformer(**kwargs)


def test_outputs_and_frozen_stages():
    model = ELSASwinTransformer(
        **TINY, out_indices=(1, 3), frozen_stages=2
    ).train()
    outs = model(torch.randn(1, 3, 33, 70))
    assert [tuple(o.shape) for o in outs] == [(1, 32, 5, 9), (1, 128, 2, 3)]
    assert not hasattr(model, 'norm0')
    for name, param in model.named_parameters():
        frozen = name.startswith(
            ('patch_embed', 'layers.0', 'layers.1', 'norm1')
        )
        assert param.requires_grad is not frozen, name
    assert not model.layers[1].training and model.layers[2].training
    assert model.train() is model


def test_with_cp_gives_the_same_values_and_gradients():
    torch.manual_seed(4)
    plain = ELSASwinTransformer(**TINY, drop_path_rate=0.0)
    cp = ELSASwinTransformer(**TINY, drop_path_rate=0.0, with_cp=True)
    cp.load_state_dict(plain.state_dict())
    x = torch.randn(2, 3, 40, 40)
    grads = []
    for model in (plain, cp):
        sum(o.sum() for o in model(x)).backward()
        grads.append([p.grad for p in model.parameters()])
    for a, b in zip(*grads, strict=True):
        torch.testing.assert_close(a, b)


def test_empty_batch():
    model = ELSASwinTransformer(**TINY)
    x = torch.randn(0, 3, 50, 30, requires_grad=True)
    outs = model(x)
    assert [tuple(o.shape) for o in outs] == [
        (0, 16, 13, 8),
        (0, 32, 7, 4),
        (0, 64, 4, 2),
        (0, 128, 2, 1),
    ]
    sum(o.sum() for o in outs).backward()
    assert x.grad.shape == x.shape


@pytest.mark.parametrize('dtype', [torch.bfloat16, torch.float16])
def test_autocast_runs_in_low_precision(dtype):
    torch.manual_seed(5)
    model = ELSASwinTransformer(**TINY, pad_small_map=True).eval()
    x = torch.randn(1, 3, 45, 60)
    with torch.no_grad():
        full = model(x)
        with torch.autocast('cpu', dtype=dtype):
            low = model(x)
    for a, b in zip(low, full, strict=True):
        assert torch.isfinite(a).all()
        err = (a.float() - b).abs().max() / b.abs().max()
        assert err < 0.05, err


@pytest.mark.parametrize('scope', ['mmdet', 'mmseg', 'mmpretrain'])
def test_builds_under_each_scope(scope):
    import importlib

    registry = importlib.import_module(f'{scope}.registry').MODELS
    model = registry.build(
        dict(
            type='ELSASwinTransformer',
            depths=(1, 1, 1, 1),
            embed_dims=16,
            num_heads=(1, 2, 4, 8),
        )
    )
    assert isinstance(model, ELSASwinTransformer)


@pytest.mark.parametrize('dtype', [torch.bfloat16, torch.float16])
@pytest.mark.parametrize('how', ['autocast', 'cast'])
def test_elsa_path_stays_in_low_precision(dtype, how):
    # The official layer makes float32 ones/zeros (elsa.py:131,133): its CPU
    # path promotes to float32 and post_proj raises on a cast model.
    torch.manual_seed(6)
    model = ELSASwinTransformer(**TINY, pad_small_map=True).eval()
    x = torch.randn(1, 3, 45, 60)
    with torch.no_grad():
        full = model(x)
    seen = []
    for layer in model.modules():
        if isinstance(layer, ELSA):
            layer.register_forward_hook(
                lambda m, i, o: seen.append((i[0].dtype, o.dtype))
            )
    with torch.no_grad():
        if how == 'autocast':
            with torch.autocast('cpu', dtype=dtype):
                low = model(x)
        else:
            low = model.to(dtype)(x.to(dtype))
    assert set(seen) == {(dtype, dtype)}
    for a, b in zip(low, full, strict=True):
        assert a.dtype == dtype
        assert (a.float() - b).abs().max() / b.abs().max() < 0.05


def onnx_parity(model, path, sizes):
    from mmevo.deploy import OnnxModel

    session = OnnxModel(str(path))
    for size in sizes:
        x = torch.randn(1, 3, *size)
        with torch.no_grad():
            expected = model(x)
        outputs = session(x)
        assert len(outputs) == len(expected)
        for out, exp in zip(outputs, expected, strict=True):
            assert out.shape == exp.shape, size
            err = (out - exp).abs().max() / exp.abs().max()
            assert err <= 1e-4, (size, float(err))


# exported at 224 (no padding anywhere), checked at sizes that pad each
# stage and the last stage's windows (and at 224)
OTHER_SIZES = [(224, 224), (70, 90), (33, 250), (300, 170)]
NARROW = dict(embed_dims=16, depths=(1, 1, 1, 2), num_heads=(1, 2, 4, 8))


@pytest.mark.slow
@pytest.mark.parametrize(
    'dynamo',
    [
        False,
        # the dynamo exporter needs ~5-10 min on 2 busy cores for this model
        True,
    ],
)
def test_onnx_export_with_dynamic_hw(tmp_path, dynamo):
    from mmevo.deploy import TensorOutputs, export_onnx

    torch.manual_seed(7)
    backbone = ELSASwinTransformer(**NARROW, pad_small_map=True).eval()
    model = TensorOutputs(backbone, lambda m, x: m(x))
    path = tmp_path / 'elsa_swin.onnx'
    export_onnx(model, torch.randn(1, 3, 224, 224), str(path), dynamo=dynamo)
    onnx_parity(model, path, OTHER_SIZES)


@pytest.mark.slow
def test_classification_geometry_refuses_traced_sizes(tmp_path):
    # pad_small_map=False picks window and shift from each map's size (at
    # 224 the last stage is one unshifted 7x7 window; at 256 it is padded
    # and shifted): no single graph holds both
    from mmevo.deploy import TensorOutputs, export_onnx

    backbone = ELSASwinTransformer(**NARROW).eval()
    model = TensorOutputs(backbone, lambda m, x: m(x))
    with pytest.raises(RuntimeError, match='pad_small_map=False'):
        export_onnx(
            model,
            torch.randn(1, 3, 224, 224),
            str(tmp_path / 'm.onnx'),
            dynamo=False,
        )
    block = backbone.layers[3].blocks[1]
    dim = torch.export.Dim.DYNAMIC
    with pytest.raises(Exception, match='pad_small_map=False'):
        torch.export.export(
            block,
            (torch.randn(1, 9, 11, 128),),
            dynamic_shapes=({1: dim, 2: dim},),
        )


@pytest.mark.slow
def test_window_block_exports_with_dynamic_shapes():
    # torch.export (the dynamo exporter's front end) of a shifted block of
    # the detection geometry: one program for every size, padding included
    torch.manual_seed(8)
    block = ELSASwinTransformer(**NARROW, pad_small_map=True).layers[3]
    block = block.blocks[1].eval()
    dim = torch.export.Dim.DYNAMIC
    program = torch.export.export(
        block,
        (torch.randn(1, 9, 11, 128),),
        dynamic_shapes=({1: dim, 2: dim},),
    )
    # (torch.export's program keeps a guard of two or more windows per side,
    # 0/1 specialisation; the ONNX graphs above have no such guard and are
    # checked on one-window maps, e.g. (70, 90))
    for size in [(9, 11), (13, 20), (8, 30), (15, 8)]:
        x = torch.randn(1, *size, 128)  # B stays that of the export
        with torch.no_grad():
            torch.testing.assert_close(program.module()(x), block(x))
