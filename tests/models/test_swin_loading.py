"""Pretrained loading of ELSASwinTransformer / ACmixSwinTransformer:
official checkpoints load through mmengine's own ``PretrainedInit`` and
torch's ``load_state_dict``; a checkpoint that does not fit raises (nothing
fits, the other family's file) or warns with counts (a partial fit), and
what it does not fill gets the published init.

The checkpoints are written here from narrow models, in the layouts the
official code saves (a ``model`` dict with ``norm.*``, ``head.*`` and the
rebuilt buffers; a detector's ``state_dict`` under ``backbone.``), an
mmpretrain ``ImageClassifier``'s (the converter's output) and mmcls's
RedNet classifier's."""

import logging

import pytest
import torch
from mmengine.model.weight_init import PretrainedInit

from mmevo.models import ACmixSwinTransformer, ELSASwinTransformer, RedNet
from mmevo.models.backbones.swin_convert import official_to_mmpretrain

from mmlogs import MMLogs

NARROW = dict(embed_dims=16, depths=(1, 2, 1, 2), num_heads=(1, 2, 4, 4))
WIDTH = 128  # the last stage's


def ours(logs):
    """Our fit warnings (mmengine's own mismatch report aside)."""
    return [r for r in logs.records if 'tensors loaded from' in r.msg]


def official_classifier(cls, seed):
    """An official classification checkpoint of a narrow ``cls``: random
    tensors in the official names, the head, the buffers the models
    rebuild, and the training state the official code saves with them."""
    torch.manual_seed(seed)
    state = {}
    for name, value in cls(**NARROW, out_indices=(3,)).state_dict().items():
        name = name.replace('norm3.', 'norm.')
        state[name] = torch.randn_like(value)
    state['head.weight'] = torch.randn(10, WIDTH)
    state['head.bias'] = torch.randn(10)
    state['layers.3.blocks.0.attn.relative_id'] = torch.arange(169)
    state['layers.0.blocks.1.attn_mask'] = torch.zeros(4, 49, 49)
    optimizer = {'state': {}, 'param_groups': [{'lr': 1e-3}]}
    return dict(model=state, optimizer=optimizer, epoch=300)


@pytest.fixture(scope='module')
def files(tmp_path_factory):
    root = tmp_path_factory.mktemp('swin_checkpoints')
    elsa = official_classifier(ELSASwinTransformer, seed=0)
    acmix = official_classifier(ACmixSwinTransformer, seed=1)
    torch.manual_seed(2)
    det = {
        f'backbone.{k}': torch.randn_like(v)
        for k, v in ELSASwinTransformer(**NARROW).state_dict().items()
    }
    det['neck.lateral_convs.0.conv.weight'] = torch.zeros(1)
    rednet = RedNet(26, stem_channels=32, base_channels=16).state_dict()
    contents = dict(
        elsa=elsa,
        acmix=acmix,
        elsa_det=dict(state_dict=det, meta={}),
        elsa_mmpretrain=dict(
            state_dict=official_to_mmpretrain(elsa, 'elsa'), meta={}
        ),
        rednet=dict(
            state_dict={f'backbone.{k}': v for k, v in rednet.items()}
        ),
    )
    paths = {}
    for name, checkpoint in contents.items():
        paths[name] = str(root / f'{name}.pth')
        torch.save(checkpoint, paths[name])
    return paths, contents


def pretrained(cls, path, prefix=None, **kwargs):
    init_cfg = dict(type='Pretrained', checkpoint=path)
    if prefix is not None:
        init_cfg['prefix'] = prefix
    return cls(**NARROW, init_cfg=init_cfg, **kwargs)


def backbone_state(classifier):
    """The official classifier's backbone in the backbone's names."""
    return {
        'norm3.' + k[len('norm.') :] if k.startswith('norm.') else k: v
        for k, v in classifier['model'].items()
        if not k.startswith('head.')
        and not k.endswith(('relative_id', 'attn_mask'))
    }


def assert_holds(model, expected):
    state = model.state_dict()
    for name, value in expected.items():
        assert torch.equal(state[name], value), name


@pytest.mark.parametrize(
    'cls,name',
    [(ELSASwinTransformer, 'elsa'), (ACmixSwinTransformer, 'acmix')],
)
def test_mmengine_pretrained_init_loads_the_official_file(files, cls, name):
    paths, contents = files
    model = cls(**NARROW, out_indices=(3,))
    PretrainedInit(checkpoint=paths[name])(model)
    expected = backbone_state(contents[name])
    assert model.state_dict().keys() == expected.keys()
    assert_holds(model, expected)


def test_torch_load_state_dict_takes_the_official_file_strictly(files):
    paths, contents = files
    model = ELSASwinTransformer(**NARROW, out_indices=(3,))
    model.load_state_dict(torch.load(paths['elsa']), strict=True)
    assert_holds(model, backbone_state(contents['elsa']))
    # the backbone's own state dict loads unchanged through the same hook
    again = ELSASwinTransformer(**NARROW, out_indices=(3,))
    again.load_state_dict(model.state_dict(), strict=True)
    assert_holds(again, model.state_dict())


def test_full_fit_loads_everything_without_a_warning(files):
    paths, contents = files
    model = pretrained(ELSASwinTransformer, paths['elsa'], out_indices=(3,))
    with MMLogs() as logs:
        model.init_weights()
    assert not ours(logs)
    assert not [r for r in logs.records if r.levelno >= logging.WARNING]
    assert_holds(model, backbone_state(contents['elsa']))
    assert model.is_init


def test_detector_checkpoint_with_prefix(files):
    paths, contents = files
    model = pretrained(ELSASwinTransformer, paths['elsa_det'], 'backbone.')
    with MMLogs() as logs:
        model.init_weights()
    assert not ours(logs)
    det = contents['elsa_det']['state_dict']
    assert_holds(
        model,
        {k[len('backbone.') :]: v for k, v in det.items() if 'neck' not in k},
    )


def test_mmpretrain_checkpoint_needs_its_prefix(files):
    paths, contents = files
    model = pretrained(ELSASwinTransformer, paths['elsa_mmpretrain'])
    with pytest.raises(ValueError) as info:
        model.init_weights()
    message = str(info.value)
    assert '\n' not in message
    assert paths['elsa_mmpretrain'] in message
    assert "prefix ('backbone.'" in message
    assert '0 of ' in message and 'backbone.patch_embed' in message
    # with it, everything fits
    model = pretrained(
        ELSASwinTransformer,
        paths['elsa_mmpretrain'],
        'backbone.',
        out_indices=(3,),
    )
    with MMLogs() as logs:
        model.init_weights()
    assert not ours(logs)
    assert_holds(model, backbone_state(contents['elsa']))


@pytest.mark.parametrize(
    'cls,name,family',
    [
        (ELSASwinTransformer, 'acmix', 'acmix'),
        (ACmixSwinTransformer, 'elsa', 'elsa'),
    ],
)
def test_the_other_familys_checkpoint_is_refused(files, cls, name, family):
    # norms, MLPs and patch merging have the same names and shapes in both
    # families: a majority of the tensors would load
    paths, _ = files
    model = pretrained(cls, paths[name], out_indices=(3,))
    with pytest.raises(ValueError, match=rf'is an {family}-Swin checkpoint'):
        model.init_weights()


def test_rednet_classifier_checkpoint_is_refused(files):
    paths, _ = files
    for prefix in (None, 'backbone.'):
        model = pretrained(ACmixSwinTransformer, paths['rednet'], prefix)
        with pytest.raises(ValueError, match='no tensor of checkpoint'):
            model.init_weights()


def test_partial_fit_warns_and_the_rest_gets_the_published_init(files):
    """A detector backbone from an ImageNet checkpoint (the det configs):
    norm0-norm2 are not in it; one MLP weight dropped too."""
    paths, contents = files
    classifier = dict(contents['elsa'])
    classifier['model'] = dict(classifier['model'])
    del classifier['model']['layers.2.blocks.0.mlp.fc1.weight']
    path = paths['elsa'].replace('elsa.pth', 'elsa_partial.pth')
    torch.save(classifier, path)
    model = pretrained(ELSASwinTransformer, path, pad_small_map=True)
    fc1 = model.layers[2].blocks[0].mlp.fc1.weight
    with torch.no_grad():  # not what any init gives
        fc1.fill_(7.0)
        model.norm1.weight.fill_(7.0)
    with MMLogs() as logs:
        model.init_weights()
    (warning,) = ours(logs)
    assert warning.levelno == logging.WARNING
    total = len(model.state_dict())
    message = warning.getMessage()
    assert f'{total - 7} of {total} tensors loaded from {path!r}' in message
    assert 'norm0.weight, norm0.bias, norm1.weight' in message
    assert '(2 more)' in message  # 7 missing, 5 named
    # the published init for what the checkpoint does not hold
    assert 0.015 < fc1.std().item() < 0.025 and fc1.abs().max() < 0.5
    assert torch.equal(model.norm1.weight, torch.ones(32))
    expected = backbone_state(classifier)
    assert_holds(model, expected)


def test_a_second_init_weights_keeps_the_loaded_weights(files):
    paths, contents = files
    model = pretrained(ACmixSwinTransformer, paths['acmix'], out_indices=(3,))
    model.init_weights()
    model.init_weights()  # mmengine: "called more than once", no re-init
    assert_holds(model, backbone_state(contents['acmix']))


def test_empty_prefix_means_none(files):
    paths, contents = files
    model = pretrained(ELSASwinTransformer, paths['elsa'], '', out_indices=3)
    model.init_weights()
    assert_holds(model, backbone_state(contents['elsa']))
