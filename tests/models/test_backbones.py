"""RedNet / ACmix-ResNet: shapes, mmdet ResNet knobs, registry."""

import copy
import threading
import warnings

import pytest
import torch
import torch.nn.functional as F
from mmdet.models.backbones import ResNet
from torch.nn.modules.batchnorm import _BatchNorm

from mmevo.layers import ACmix
from mmevo.models import ACmixResNet, RedNet
from mmevo.registry import MODELS

# Reduced widths keep the dynamic layers cheap on CPU.
TINY_RED = dict(stem_channels=32, base_channels=16)
TINY_ACMIX = dict(stem_channels=16, base_channels=16)


def _ceil_half(n):
    return -(-n // 2)


def expected_shapes(
    batch, h, w, base_channels, out_indices, strides=(1, 2, 2, 2)
):
    """Stem /2 (conv) /2 (max-pool), then ceil(size / stride) per stage."""
    h, w = _ceil_half(_ceil_half(h)), _ceil_half(_ceil_half(w))
    shapes = []
    for i, s in enumerate(strides):
        h, w = -(-h // s), -(-w // s)
        if i in out_indices:
            shapes.append((batch, base_channels * 4 * 2**i, h, w))
    return shapes


@pytest.mark.parametrize('depth', [26, 38, 50, 101, 152])
def test_rednet_depths_shapes(depth):
    model = RedNet(depth).eval()
    blocks = {
        26: (1, 2, 4, 1),
        38: (2, 3, 5, 2),
        50: (3, 4, 6, 3),
        101: (3, 4, 23, 3),
        152: (3, 8, 36, 3),
    }[depth]
    assert (
        tuple(len(getattr(model, f'layer{i + 1}')) for i in range(4)) == blocks
    )
    with torch.no_grad():
        outs = model(torch.rand(1, 3, 32, 32))
    assert [tuple(o.shape) for o in outs] == expected_shapes(
        1, 32, 32, 64, (0, 1, 2, 3)
    )


@pytest.mark.parametrize('depth', [26, 38, 50])
def test_acmix_depths_shapes(depth):
    model = ACmixResNet(depth).eval()
    with torch.no_grad():
        outs = model(torch.rand(1, 3, 32, 32))
    assert [tuple(o.shape) for o in outs] == expected_shapes(
        1, 32, 32, 64, (0, 1, 2, 3)
    )
    assert all(
        isinstance(getattr(model, f'layer{i}')[0].conv2, ACmix)
        for i in range(1, 5)
    )


@pytest.mark.parametrize(
    'cls,tiny', [(RedNet, TINY_RED), (ACmixResNet, TINY_ACMIX)]
)
@pytest.mark.parametrize('out_indices', [(3,), (0, 2), (1, 2, 3)])
@pytest.mark.parametrize('size', [(97, 131), (32, 32)])
def test_out_indices_and_odd_sizes(cls, tiny, out_indices, size):
    model = cls(26, out_indices=out_indices, **tiny).eval()
    with torch.no_grad():
        outs = model(torch.rand(2, 3, *size))
    assert isinstance(outs, tuple)
    assert [tuple(o.shape) for o in outs] == expected_shapes(
        2, *size, 16, out_indices
    )


@pytest.mark.parametrize(
    'cls,tiny', [(RedNet, TINY_RED), (ACmixResNet, TINY_ACMIX)]
)
def test_batch_one_train_mode_and_fewer_stages(cls, tiny):
    model = cls(
        26,
        num_stages=3,
        strides=(1, 2, 2),
        dilations=(1, 1, 1),
        out_indices=(0, 1, 2),
        **tiny,
    ).train()
    outs = model(torch.rand(1, 3, 65, 63))
    assert [tuple(o.shape) for o in outs] == expected_shapes(
        1, 65, 63, 16, (0, 1, 2), strides=(1, 2, 2)
    )
    sum(o.mean() for o in outs).backward()
    assert all(p.grad is not None for p in model.parameters())


def _manual_forward(model, x, stem):
    """The published RedNet / torchvision forward, written out by hand."""
    if stem == 'rednet':
        s = model.stem
        x = F.relu(s[0].bn(s[0].conv(x)))
        x = F.relu(s[2](s[1](x)))
        x = F.relu(s[4].bn(s[4].conv(x)))
    else:
        x = F.relu(model.bn1(model.conv1(x)))
    x = F.max_pool2d(x, 3, 2, 1)
    outs = []
    for i in range(4):
        for b in getattr(model, f'layer{i + 1}'):
            out = F.relu(b.bn1(b.conv1(x)))
            out = F.relu(b.bn2(b.conv2(out)))
            out = b.bn3(b.conv3(out))
            x = F.relu(out + (b.downsample(x) if b.downsample else x))
        outs.append(x)
    return outs


@pytest.mark.parametrize(
    'cls,tiny,stem',
    [(RedNet, TINY_RED, 'rednet'), (ACmixResNet, TINY_ACMIX, 'tv')],
)
def test_forward_matches_published_structure(cls, tiny, stem):
    torch.manual_seed(0)
    model = cls(26, **tiny)
    for m in model.modules():  # non-trivial BNs, incl. the zero-init ones
        if isinstance(m, _BatchNorm):
            torch.nn.init.uniform_(m.weight, 0.5, 1.5)
            torch.nn.init.uniform_(m.running_var, 0.5, 1.5)
            torch.nn.init.normal_(m.running_mean, 0, 0.1)
    model.double().eval()
    # v1.5 / "pytorch" style: the stride sits on the middle layer
    for i, stride in enumerate((1, 2, 2, 2)):
        first = getattr(model, f'layer{i + 1}')[0]
        assert first.conv1.stride == (1, 1)
        assert first.conv2.stride == stride
    x = torch.rand(2, 3, 38, 34, dtype=torch.float64)
    with torch.no_grad():
        for a, b in zip(
            model(x), _manual_forward(model, x, stem), strict=True
        ):
            torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12)


def test_published_acmix_resnet_init():
    """From scratch, ACmix-ResNet is initialised as the published code:
    every conv Kaiming-normal (fan_out, ReLU gain) -- dep_conv too, so not
    the shift kernels --, conv biases at PyTorch's default, norms 1 / 0
    (no zero-init of the residual norms), rates 0.5."""
    torch.manual_seed(0)
    model = ACmixResNet(50)
    model.init_weights()
    acmix = [m for m in model.modules() if isinstance(m, ACmix)]
    dep = torch.cat([m.dep_conv.weight.flatten() for m in acmix[-3:]])
    fan_out = 512 * 3 * 3  # out_planes * kernel_conv**2 in stage 4
    assert abs(dep.std().item() / (2 / fan_out) ** 0.5 - 1) < 0.02
    assert abs(dep.mean().item()) < 0.1 * dep.std().item()
    assert (dep != 0).float().mean() > 0.99  # not one-hot shift kernels
    proj = model.layer4[0].conv2.conv1
    assert abs(proj.weight.std().item() / (2 / 512) ** 0.5 - 1) < 0.02
    bound = 1 / 512**0.5  # PyTorch's default bias init, untouched
    assert proj.bias.abs().max() <= bound
    assert proj.bias.std() > bound / 3
    stem = model.conv1.weight
    assert abs(stem.std().item() / (2 / (64 * 49)) ** 0.5 - 1) < 0.05
    assert all(m.rate1.item() == m.rate2.item() == 0.5 for m in acmix)
    for m in model.modules():
        if isinstance(m, _BatchNorm):
            assert (m.weight == 1).all() and (m.bias == 0).all()
    # The standalone layer keeps its shift initialisation.
    layer = ACmix(16, 16)
    layer.init_weights()
    assert torch.equal(layer.dep_conv.weight.sum((2, 3)), torch.ones(16, 9))


def test_acmix_resnet_init_cfg_and_zero_init_residual():
    model = ACmixResNet(26, zero_init_residual=True, **TINY_ACMIX)
    model.init_weights()
    assert all(
        (b.norm3.weight == 0).all()
        for i in range(1, 5)
        for b in getattr(model, f'layer{i}')
    )
    model = ACmixResNet(
        26,
        init_cfg=dict(type='Constant', layer='Conv2d', val=0.25),
        **TINY_ACMIX,
    )
    model.init_weights()
    assert (model.layer1[0].conv1.weight == 0.25).all()


@pytest.mark.parametrize('contract', [False, True])
def test_dilation_output_stride_8(contract):
    model = RedNet(
        26,
        strides=(1, 2, 1, 1),
        dilations=(1, 1, 2, 4),
        contract_dilation=contract,
        **TINY_RED,
    ).eval()
    for stage, d in ((3, 2), (4, 4)):
        layer = getattr(model, f'layer{stage}')
        first = d // 2 if contract else d
        assert [b.conv2.dilation for b in layer] == [first] + [d] * (
            len(layer) - 1
        )
        assert all(b.conv2.stride == 1 for b in layer)
    x = torch.rand(1, 3, 64, 80)
    with torch.no_grad():
        outs = model(x)
    assert [tuple(o.shape) for o in outs] == expected_shapes(
        1, 64, 80, 16, (0, 1, 2, 3), strides=(1, 2, 1, 1)
    )
    # the dilation is really used: the last stage differs from dilation 1
    flat = RedNet(26, strides=(1, 2, 1, 1), **TINY_RED).eval()
    flat.load_state_dict(model.state_dict())
    with torch.no_grad():
        assert not torch.allclose(flat(x)[3], outs[3])
        torch.testing.assert_close(flat(x)[1], outs[1])


def _freeze_summary(model):
    """Top-level names whose parameters are frozen / modules in eval."""
    frozen = {
        n.split('.')[0]
        for n, p in model.named_parameters()
        if not p.requires_grad
    }
    trainable = {
        n.split('.')[0] for n, p in model.named_parameters() if p.requires_grad
    }
    evals = {
        n.split('.')[0]
        for n, m in model.named_modules()
        if n and not m.training
    }
    trains = {
        n.split('.')[0] for n, m in model.named_modules() if n and m.training
    }
    assert not frozen & trainable, 'a stage is only partly frozen'
    assert not evals & trains, 'a stage is only partly in eval mode'
    return frozen, evals


@pytest.mark.parametrize('frozen_stages', [-1, 0, 1, 2, 4])
def test_frozen_stages_match_mmdet_resnet(frozen_stages):
    red = RedNet(26, frozen_stages=frozen_stages, **TINY_RED)
    acm = ACmixResNet(26, frozen_stages=frozen_stages, **TINY_ACMIX)
    ref_deep = ResNet(
        50, deep_stem=True, frozen_stages=frozen_stages, norm_eval=False
    )
    ref = ResNet(50, frozen_stages=frozen_stages, norm_eval=False)
    for model, reference in ((red, ref_deep), (acm, ref)):
        model.train()
        reference.train()
        assert _freeze_summary(model) == _freeze_summary(reference)
    expected = {-1: set(), 0: {'stem'}, 1: {'stem', 'layer1'}}.get(
        frozen_stages
    )
    if expected is not None:
        assert _freeze_summary(red)[0] == expected


@pytest.mark.parametrize(
    'cls,tiny', [(RedNet, TINY_RED), (ACmixResNet, TINY_ACMIX)]
)
def test_norm_eval(cls, tiny):
    model = cls(26, norm_eval=True, **tiny).train()
    bns = [m for m in model.modules() if isinstance(m, _BatchNorm)]
    assert bns and not any(m.training for m in bns)
    if cls is RedNet:  # the involutions' own BNs are included
        assert not model.layer1[0].conv2.conv1.bn.training
        assert not model.stem[1].conv1.bn.training
    stats = {n: b.clone() for n, b in model.named_buffers()}
    model(torch.rand(2, 3, 48, 48))
    for n, b in model.named_buffers():
        assert torch.equal(stats[n], b), n
    convs_training = [
        m.training for m in model.modules() if isinstance(m, torch.nn.Conv2d)
    ]
    assert all(convs_training)


@pytest.mark.parametrize(
    'cls,tiny', [(RedNet, TINY_RED), (ACmixResNet, TINY_ACMIX)]
)
def test_with_cp_same_step(cls, tiny):
    """One training step with and without checkpointing: the same outputs,
    gradients and BN buffers (the recomputation must not update the running
    statistics a second time)."""
    torch.manual_seed(0)
    model = cls(26, **tiny)
    model.init_weights()
    model.double()  # float64: recomputation may only change rounding
    # give the zero-initialised residual BNs weight, so gradients flow
    for m in model.modules():
        if isinstance(m, _BatchNorm):
            torch.nn.init.uniform_(m.weight, 0.5, 1.5)
    cp_model = copy.deepcopy(model)
    cp_model.with_cp = True
    for m in cp_model.modules():
        if hasattr(m, 'with_cp'):
            m.with_cp = True
    x = torch.rand(2, 3, 48, 48, dtype=torch.float64)
    steps = []
    for net in (model, cp_model):
        net.train()
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter('always')
            outs = net(x.clone().requires_grad_())
            sum((o**2).mean() for o in outs).backward()
        assert not [w for w in caught if 'use_reentrant' in str(w.message)]
        steps.append(
            dict(
                outs=outs,
                grads={n: p.grad for n, p in net.named_parameters()},
                buffers=dict(net.named_buffers()),
            )
        )
    for key in ('grads', 'buffers'):
        assert set(steps[0][key]) == set(steps[1][key])
        for n in steps[0][key]:
            torch.testing.assert_close(
                steps[0][key][n], steps[1][key][n], rtol=1e-9, atol=1e-9, msg=n
            )
    torch.testing.assert_close(
        steps[0]['outs'], steps[1]['outs'], rtol=1e-9, atol=1e-9
    )
    assert any(g.abs().sum() > 0 for g in steps[0]['grads'].values())
    tracked = [
        b
        for n, b in steps[1]['buffers'].items()
        if n.endswith('num_batches_tracked')
    ]
    assert tracked and all(b == 1 for b in tracked)


def test_with_cp_flag_reaches_blocks():
    model = RedNet(26, with_cp=True, **TINY_RED)
    assert all(
        b.with_cp for i in range(1, 5) for b in getattr(model, f'layer{i}')
    )


def test_with_cp_seen_by_other_threads_during_a_checkpointed_forward():
    """A block running inside its own checkpoint still reports
    ``with_cp=True`` to another thread (which may run the same block), and
    its checkpoint still runs: no flag flipped for everyone mid-forward."""
    model = RedNet(26, with_cp=True, **TINY_RED)
    model.train()
    block = model.layer1[0]
    seen, recomputed = [], []

    def hook(module, args):
        recomputed.append(torch.is_grad_enabled())
        other = threading.Thread(target=lambda: seen.append(block.with_cp))
        other.start()
        other.join()

    block.conv1.register_forward_pre_hook(hook)
    out = model(torch.rand(2, 3, 64, 64, requires_grad=True))
    sum(o.sum() for o in out).backward()
    # forward and checkpoint recomputation: conv1 ran twice
    assert len(recomputed) == 2
    assert seen == [True, True]
    assert block.with_cp


@pytest.mark.parametrize('zero_init', [True, False])
def test_zero_init_residual(zero_init):
    model = RedNet(26, zero_init_residual=zero_init, **TINY_RED)
    model.init_weights()
    norm3 = [
        b.norm3.weight
        for i in range(1, 5)
        for b in getattr(model, f'layer{i}')
    ]
    assert all((w == 0).all() for w in norm3) == zero_init
    # the other norms stay at 1 (mmdet's Constant init)
    assert all((b.norm1.weight == 1).all() for b in model.layer1)


def test_invalid_configs():
    with pytest.raises(ValueError, match='depth'):
        RedNet(18)
    with pytest.raises(ValueError, match='depth'):
        ACmixResNet(101)
    with pytest.raises(ValueError, match='channels'):
        RedNet(26, stem_channels=32, base_channels=24)


BAD_ARGS = [
    (dict(depth=18), r'depth must be one of \[26, 38, 50.*\], got 18'),
    (dict(num_stages=5), r'num_stages must be 1, 2, 3 or 4, got 5'),
    (dict(num_stages=0), r'num_stages must be 1, 2, 3 or 4, got 0'),
    (
        dict(strides=(1, 2, 2)),
        r'strides must be 4 ints >= 1 \(one per stage, '
        r'num_stages=4\), got \(1, 2, 2\)',
    ),
    (dict(strides=(1, 2, 0, 2)), r'strides must be 4 ints >= 1'),
    (dict(dilations=(1, 1)), r'dilations must be 4 ints >= 1'),
    (
        dict(num_stages=3, strides=(1, 2, 2), dilations=(1, 1, 1)),
        r'out_indices must be .* in \[-3, 3\) \(num_stages=3\), got '
        r'\(0, 1, 2, 3\)',
    ),
    (
        dict(out_indices=(4,)),
        r'out_indices must be a non-empty sequence of '
        r'stage indices in \[-4, 4\) \(num_stages=4\), got \(4,\)',
    ),
    (dict(out_indices=(-5,)), r'in \[-4, 4\) .* got \(-5,\)'),
    (dict(out_indices=()), r'out_indices must be a non-empty sequence'),
    (dict(out_indices=3), r'out_indices must be a non-empty sequence'),
    (
        dict(out_indices=(1, 1)),
        r'out_indices must name distinct stages in '
        r'increasing order',
    ),
    (
        dict(out_indices=(-1, 0)),
        r'distinct stages in increasing order .* got '
        r'\(-1, 0\)',
    ),
    (dict(frozen_stages=5), r'frozen_stages must be an int in \[-1, 4\]'),
    (dict(frozen_stages=-2), r'frozen_stages must be an int in \[-1, 4\]'),
    (
        dict(
            num_stages=2,
            strides=(1, 2),
            dilations=(1, 1),
            out_indices=(1,),
            frozen_stages=3,
        ),
        r'frozen_stages must be an int in \[-1, 2\]',
    ),
    (dict(norm_cfg=dict(type='GN')), r'norm_cfg of type GN needs num_groups'),
    (
        dict(norm_cfg=dict(requires_grad=True)),
        r'norm_cfg must be a dict with a "type"',
    ),
    (
        dict(norm_cfg=dict(type='Foo')),
        r"norm_cfg has type 'Foo', which is "
        r"not registered in mmengine's MODELS registry",
    ),
]


@pytest.mark.parametrize('cls', [RedNet, ACmixResNet])
@pytest.mark.parametrize('args,message', BAD_ARGS)
def test_bad_arguments_name_the_argument(cls, args, message):
    args = dict(dict(depth=26), **args)
    with pytest.raises(ValueError, match=message):
        cls(**args, **TINY_RED)


@pytest.mark.parametrize('cls', [RedNet, ACmixResNet])
@pytest.mark.parametrize('norm_cfg', ['BN', None])
def test_norm_cfg_must_be_a_dict(cls, norm_cfg):
    with pytest.raises(
        TypeError,
        match=rf"^norm_cfg must be a dict such as dict\(type='BN'\), "
        rf'got {norm_cfg!r}$',
    ):
        cls(26, norm_cfg=norm_cfg, **TINY_RED)


@pytest.mark.parametrize(
    'cls,tiny', [(RedNet, TINY_RED), (ACmixResNet, TINY_ACMIX)]
)
def test_negative_out_indices_count_from_the_last_stage(cls, tiny):
    model = cls(26, out_indices=(0, -1), **tiny).eval()
    assert model.out_indices == (0, 3)
    with torch.no_grad():
        outs = model(torch.rand(1, 3, 32, 32))
    assert [tuple(o.shape) for o in outs] == expected_shapes(
        1, 32, 32, 16, (0, 3)
    )
    fewer = cls(
        26,
        num_stages=3,
        strides=(1, 2, 2),
        dilations=(1, 1, 1),
        out_indices=(-1,),
        **tiny,
    )
    assert fewer.out_indices == (2,)


def test_gn_with_num_groups_builds():
    model = RedNet(26, norm_cfg=dict(type='GN', num_groups=4), **TINY_RED)
    assert any(isinstance(m, torch.nn.GroupNorm) for m in model.modules())


@pytest.mark.parametrize('scope', ['mmdet', 'mmseg'])
def test_registry_builds_from_downstream_scopes(scope):
    if scope == 'mmdet':
        from mmdet.registry import MODELS as DOWNSTREAM
    else:
        from mmseg.registry import MODELS as DOWNSTREAM
    model = DOWNSTREAM.build(dict(type='RedNet', depth=26, **TINY_RED))
    assert isinstance(model, RedNet)
    assert isinstance(
        DOWNSTREAM.build(dict(type='ACmixResNet', depth=26, **TINY_ACMIX)),
        ACmixResNet,
    )
    assert MODELS.get('RedNet') is RedNet
