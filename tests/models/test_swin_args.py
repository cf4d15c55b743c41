"""The constructor of ELSASwinTransformer / ACmixSwinTransformer: the
published names and defaults, keyword plumbing, and one-line errors naming
the argument for values the models cannot use."""

import re

import pytest
import torch

from mmevo.models import ACmixSwinTransformer, ELSASwinTransformer

NARROW = dict(embed_dims=16, depths=(1, 1, 1, 2), num_heads=(1, 2, 4, 8))
CLASSES = [ELSASwinTransformer, ACmixSwinTransformer]

# The published constructors' keywords and defaults (configs pass them by
# name; arch, embed_dims, depths, num_heads, in_channels, patch_size and
# window_size also by position, in this order).
COMMON = dict(
    arch='tiny',
    embed_dims=None,
    depths=None,
    num_heads=None,
    in_channels=3,
    patch_size=4,
    window_size=7,
    mlp_ratio=4.0,
    qkv_bias=True,
    qk_scale=None,
    drop_rate=0.0,
    attn_drop_rate=0.0,
    drop_path_rate=0.1,
    pad_small_map=False,
    out_indices=(0, 1, 2, 3),
    frozen_stages=-1,
    with_cp=False,
    init_cfg=None,
)
PUBLISHED = {
    ELSASwinTransformer: dict(
        COMMON, elsa_kernel=7, group_width=None, lam=0, gamma=1
    ),
    ACmixSwinTransformer: COMMON,
}


def outputs(model, seed=0):
    torch.manual_seed(seed)
    with torch.no_grad():
        return model.eval()(torch.randn(2, 3, 45, 61))


@pytest.mark.parametrize('cls', CLASSES)
def test_every_published_keyword_keeps_its_default(cls):
    explicit = dict(PUBLISHED[cls])
    with torch.device('meta'):
        implicit_model = cls()
        explicit_model = cls(**explicit)
    assert repr(explicit_model) == repr(implicit_model)
    # the same numbers too (scales, rates, init), on a narrow model
    explicit.update(NARROW)
    torch.manual_seed(1)
    a = cls(**explicit)
    torch.manual_seed(1)
    b = cls(**NARROW)
    for x, y in zip(outputs(a), outputs(b), strict=True):
        torch.testing.assert_close(x, y, rtol=0, atol=0)


@pytest.mark.parametrize('cls', CLASSES)
def test_leading_arguments_by_position_the_rest_by_keyword(cls):
    positional = ('tiny', 16, (1, 1, 1, 2), (1, 2, 4, 8), 3, 4, 7)
    torch.manual_seed(2)
    a = cls(*positional)
    torch.manual_seed(2)
    b = cls(**NARROW)
    for x, y in zip(outputs(a), outputs(b), strict=True):
        torch.testing.assert_close(x, y, rtol=0, atol=0)
    # an 8th positional was elsa_kernel in one class, mlp_ratio in the other
    with pytest.raises(TypeError, match='positional'):
        cls(*positional, 4.0)


@pytest.mark.parametrize(
    'cls,kwargs,name',
    [
        (ACmixSwinTransformer, dict(elsa_kernel=5), 'elsa_kernel'),
        (ELSASwinTransformer, dict(window=7), 'window'),
        (ELSASwinTransformer, dict(use_checkpoint=True), 'use_checkpoint'),
    ],
)
def test_unknown_keywords_are_refused(cls, kwargs, name):
    with pytest.raises(TypeError, match=rf"unexpected keyword.*'{name}'"):
        cls(**NARROW, **kwargs)


def test_block_arguments_reach_the_blocks():
    model = ELSASwinTransformer(
        **NARROW,
        elsa_kernel=5,
        group_width=8,
        lam=1,
        gamma=0,
        qk_scale=0.3,
        attn_drop_rate=0.25,
        qkv_bias=False,
    )
    elsa = model.layers[0].blocks[0].attn
    assert elsa.ghost_head.shape[-2:] == (5, 5)  # multiplicative head only
    assert (elsa.lam, elsa.gamma) == (1, 0)
    assert elsa.attn[0].groups == elsa.dim_qk // 8
    assert elsa.pre_proj.bias is None
    last = model.layers[3].blocks[1]
    assert last.attn.scale == 0.3 and last.shift_size == 3
    assert last.attn.attn_drop.p == 0.25 and last.attn.pre_proj.bias is None
    acmix = ACmixSwinTransformer(**NARROW, qk_scale=0.3, window_size=5)
    for stage in acmix.layers:
        assert stage.blocks[0].attn.scale == 0.3
        assert stage.blocks[0].shift_size == 0
    assert acmix.layers[3].blocks[1].shift_size == 2


@pytest.mark.parametrize('cls', CLASSES)
@pytest.mark.parametrize(
    'out_indices,stages', [(3, (3,)), (-1, (3,)), ([0, -2], (0, 2))]
)
def test_out_indices_take_an_int_and_negative_indices(
    cls, out_indices, stages
):
    model = cls(**NARROW, out_indices=out_indices)
    assert model.out_indices == stages
    widths = [o.shape[1] for o in outputs(model)]
    assert widths == [16 * 2**i for i in stages]


@pytest.mark.parametrize('cls', CLASSES)
@pytest.mark.parametrize(
    'kwargs,error,message',
    [
        (dict(drop_path_rate=2.0), ValueError, 'drop_path_rate must be in'),
        (dict(drop_path_rate=1.0), ValueError, r'drop_path_rate .*\[0, 1\)'),
        (dict(drop_path_rate=-0.1), ValueError, 'drop_path_rate'),
        (dict(drop_path_rate='0.1'), TypeError, 'drop_path_rate must be a'),
        (dict(drop_rate=1.0), ValueError, 'drop_rate must be in'),
        (dict(attn_drop_rate=1.5), ValueError, 'attn_drop_rate must be in'),
        (dict(patch_size=0), ValueError, 'patch_size must be >= 1, got 0'),
        (dict(in_channels=0), ValueError, 'in_channels must be >= 1, got 0'),
        (dict(window_size=0), ValueError, 'window_size must be >= 1'),
        (dict(mlp_ratio=0), ValueError, 'mlp_ratio must be > 0'),
        (dict(qk_scale=-1.0), ValueError, 'qk_scale must be > 0'),
        (dict(depths=(1, 0, 1, 1)), ValueError, r'depths\[1\] must be >= 1'),
        (dict(out_indices=4), ValueError, 'out_indices must be a stage'),
        (dict(out_indices=(3, 1)), ValueError, 'increasing order'),
        (dict(out_indices=(1, -3)), ValueError, 'distinct stages'),
        (dict(out_indices=()), ValueError, 'non-empty'),
        (dict(out_indices=(True,)), ValueError, 'out_indices'),
        (dict(frozen_stages=True), TypeError, 'frozen_stages must be an int'),
        (dict(frozen_stages=5), ValueError, 'frozen_stages must be -1..4'),
        (dict(frozen_stages=-2), ValueError, 'frozen_stages must be >= -1'),
    ],
)
def test_bad_values_name_the_argument(cls, kwargs, error, message):
    with pytest.raises(error, match=message) as info:
        cls(**dict(NARROW, **kwargs))
    assert '\n' not in str(info.value)


@pytest.mark.parametrize('cls', CLASSES)
@pytest.mark.parametrize(
    'shape', [(3, 64, 64), (1, 1, 3, 64, 64), (2, 4, 64, 64), (2, 1, 64, 64)]
)
def test_input_must_be_bchw_with_in_channels(cls, shape):
    model = cls(**NARROW)
    expected = (
        f'x must be (B, C, H, W) with C = in_channels (3), got shape {shape}'
    )
    with pytest.raises(ValueError, match=f'^{re.escape(expected)}$'):
        model(torch.randn(shape))
    # the same model takes (B, 3, H, W), an empty batch included
    assert outputs(model)[0].shape == (2, 16, 12, 16)
    assert model(torch.randn(0, 3, 20, 20))[0].shape == (0, 16, 5, 5)
