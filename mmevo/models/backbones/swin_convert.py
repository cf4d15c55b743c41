"""Official ELSA-Swin / ACmix-Swin checkpoints in mmevo's and mmpretrain's
names.

The backbones keep the authors' module names, so converting is: take the
state dict out of its checkpoint, drop the buffers the models rebuild
(``relative_id``, ``relative_position_index``, ``attn_mask``), rename the
classifier's final ``norm`` to the backbone's ``norm3`` and, for mmpretrain,
put the backbone under ``backbone.`` and ``head`` under ``head.fc``.
"""

import os.path as osp

import torch
from mmengine.runner.checkpoint import CheckpointLoader
from mmengine.utils import mkdir_or_exist

OFFICIAL_BUFFERS = ('relative_id', 'relative_position_index', 'attn_mask')
# A key found only in each family's checkpoints.
FAMILY_MARK = dict(elsa='ghost_head', acmix='dep_conv')


def _state_of(checkpoint):
    if not isinstance(checkpoint, dict):
        raise TypeError(
            f'checkpoint must be a dict, got {type(checkpoint).__name__}'
        )
    for key in ('state_dict', 'model'):
        if key in checkpoint:
            return checkpoint[key]
    return checkpoint


def official_state_dict(checkpoint, prefix='', keep_head=False):
    """The backbone part of an official checkpoint, in the backbone's names.

    Args:
        checkpoint (dict): a loaded checkpoint: classification (``model``:
            ``patch_embed.*``, ``layers.*``, ``norm.*``, ``head.*``),
            detection (``state_dict`` with ``backbone.*``; pass
            ``prefix='backbone.'``) or a bare state dict.
        prefix (str): keep only the keys under it, without it.
        keep_head (bool): keep ``head.*``. Default: False.

    Returns:
        dict: ``{name: tensor}`` for ``ELSASwinTransformer`` /
        ``ACmixSwinTransformer`` (plus ``head.*`` with ``keep_head``).

    Example:
        >>> import torch
        >>> official_state_dict({'model': {
        ...     'norm.weight': torch.ones(2), 'head.bias': torch.zeros(3),
        ...     'layers.3.blocks.0.attn.relative_id': torch.zeros(4)}})
        {'norm3.weight': tensor([1., 1.])}
    """
    out = {}
    for name, value in _state_of(checkpoint).items():
        if name.startswith('module.'):
            name = name[len('module.') :]
        if prefix:
            if not name.startswith(prefix):
                continue
            name = name[len(prefix) :]
        if name.rsplit('.', 1)[-1] in OFFICIAL_BUFFERS:
            continue
        if name.startswith('head.') and not keep_head:
            continue
        if name.startswith('norm.'):
            name = 'norm3.' + name[len('norm.') :]
        out[name] = value
    return out


def official_to_mmpretrain(checkpoint, family):
    """An official classification checkpoint as an ``ImageClassifier``'s
    state dict (backbone ``out_indices=(3,)``, ``GlobalAveragePooling``,
    ``LinearClsHead``).

    Args:
        checkpoint (dict): the loaded official checkpoint (``model`` dict).
        family (str): 'elsa' or 'acmix'; a checkpoint of the other family
            is refused.

    Returns:
        dict: ``backbone.*`` and ``head.fc.*`` tensors.
    """
    if family not in FAMILY_MARK:
        raise ValueError(
            f'family must be one of {sorted(FAMILY_MARK)}, got {family!r}'
        )
    state = official_state_dict(checkpoint, keep_head=True)
    if not any(FAMILY_MARK[family] in k for k in state):
        raise ValueError(
            f'not an official {family}-Swin checkpoint: no '
            f'"{FAMILY_MARK[family]}" key'
        )
    if 'head.weight' not in state:
        raise ValueError('not a classification checkpoint: no head.weight')
    out = {}
    for k, v in state.items():
        if k.startswith('head.'):
            out['head.fc.' + k[len('head.') :]] = v
        else:
            out['backbone.' + k] = v
    return out


def convert_checkpoint_file(src, dst, family):
    """Read an official checkpoint (path or URL), write the mmpretrain one.

    Args:
        src (str): official checkpoint.
        dst (str): output path; its folder is created.
        family (str): 'elsa' or 'acmix'.
    """
    checkpoint = CheckpointLoader.load_checkpoint(src, map_location='cpu')
    state = official_to_mmpretrain(checkpoint, family)
    mkdir_or_exist(osp.dirname(osp.abspath(dst)))
    torch.save(dict(state_dict=state, meta=dict(converted_from=src)), dst)
