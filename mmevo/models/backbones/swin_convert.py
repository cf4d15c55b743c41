"""Official ELSA-Swin / ACmix-Swin checkpoints in mmevo's and mmpretrain's
names, and how well a checkpoint fits a backbone.

The backbones keep the authors' module names, so converting is: take the
state dict out of its checkpoint, drop the buffers the models rebuild
(``relative_id``, ``relative_position_index``, ``attn_mask``), rename the
classifier's final ``norm`` to the backbone's ``norm3`` and, for mmpretrain,
put the backbone under ``backbone.`` and ``head`` under ``head.fc``. The
backbones do the first steps on every load (:func:`official_load_hook`), so
torch's ``load_state_dict`` and mmengine's ``Pretrained`` init take the
official files as they are.
"""

from collections.abc import Mapping

import torch

OFFICIAL_BUFFERS = ('relative_id', 'relative_position_index', 'attn_mask')
# A key found only in each family's checkpoints.
FAMILY_MARK = dict(elsa='ghost_head', acmix='dep_conv')
# Keys named in a message about a misfit.
MAX_KEYS = 5


def _state_of(checkpoint):
    if not isinstance(checkpoint, dict):
        raise TypeError(
            f'checkpoint must be a dict, got {type(checkpoint).__name__}'
        )
    for key in ('state_dict', 'model'):
        if key in checkpoint:
            return checkpoint[key]
    return checkpoint


def official_name(name, keep_head=False):
    """The backbone's name for a key of an official checkpoint.

    Args:
        name (str): the official key (``module.`` allowed).
        keep_head (bool): keep ``head.*`` rather than drop it.

    Returns:
        str | None: the name, or None for an entry the backbone does not
        load (a rebuilt buffer, the classifier's head).

    Example:
        >>> official_name('norm.weight'), official_name('head.bias')
        ('norm3.weight', None)
    """
    name = name.removeprefix('module.')
    if name.rsplit('.', 1)[-1] in OFFICIAL_BUFFERS:
        return None
    if name.startswith('head.') and not keep_head:
        return None
    if name.startswith('norm.'):
        return 'norm3.' + name[len('norm.') :]
    return name


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
        name = name.removeprefix('module.')
        if prefix:
            if not name.startswith(prefix):
                continue
            name = name[len(prefix) :]
        name = official_name(name, keep_head)
        if name is not None:
            out[name] = value
    return out


def official_load_hook(module, state_dict, prefix, *args):
    """Load-state-dict pre-hook: official entries in the backbone's names.

    Edits ``state_dict`` (torch's and mmengine's loaders pass a copy) under
    ``prefix``: a whole training checkpoint (``state_dict`` or ``model``
    dict, as the official code saves it) is replaced by its state dict,
    then :func:`official_name` renames or drops every key. A state dict in
    the backbone's own names passes unchanged.

    Example:
        >>> backbone.register_load_state_dict_pre_hook(official_load_hook)
    """
    for wrapper in ('state_dict', 'model'):
        inner = state_dict.get(prefix + wrapper)
        if isinstance(inner, Mapping):
            # the rest (optimizer, epoch, config) is training state
            for key in [k for k in state_dict if k.startswith(prefix)]:
                del state_dict[key]
            state_dict.update((prefix + k, v) for k, v in inner.items())
            break
    for key in [k for k in state_dict if k.startswith(prefix)]:
        name = official_name(key[len(prefix) :])
        if name is None:
            del state_dict[key]
        elif name != key[len(prefix) :]:
            state_dict[prefix + name] = state_dict.pop(key)


def state_fit(module, state_dict, prefix=''):
    """Which of ``module``'s tensors a state dict being loaded fills.

    Returns:
        tuple[list[str], list[str], list[str]]: the module's keys found with
        their shape (loaded), the others (missing or mis-shaped), and the
        state dict's keys the module does not have (unused).
    """
    theirs = {
        k[len(prefix) :]: v
        for k, v in state_dict.items()
        if k.startswith(prefix)
    }
    loaded, missing = [], []
    for name, value in module.state_dict().items():
        other = theirs.get(name)
        fits = isinstance(other, torch.Tensor) and other.shape == value.shape
        (loaded if fits else missing).append(name)
    own = set(loaded) | set(missing)
    return loaded, missing, [k for k in theirs if k not in own]


def _first(keys):
    more = (
        f', ... ({len(keys) - MAX_KEYS} more)' if len(keys) > MAX_KEYS else ''
    )
    return ', '.join(keys[:MAX_KEYS]) + more


def fit_problem(name, path, loaded, missing, unused):
    """What is wrong with loading ``path`` into the backbone ``name``.

    Args:
        name (str): the backbone's class name, for the message.
        path (str): the checkpoint, for the message.
        loaded, missing, unused (list[str]): as :func:`state_fit` gives
            them.

    Returns:
        tuple: ``('error', message)`` when nothing of the backbone was
        loaded or the checkpoint is of the other Swin family (its mark key,
        :data:`FAMILY_MARK`, without the backbone's); ``('warning',
        message)`` when some tensors were not loaded; ``(None, None)`` when
        every tensor was.
    """

    def families(keys):
        return {
            f
            for f, mark in FAMILY_MARK.items()
            if any(mark in k for k in keys)
        }

    ours, theirs = families(loaded + missing), families(unused)
    total = len(loaded) + len(missing)
    if not loaded:
        seen = (
            f'its keys look like {_first(unused)}'
            if unused
            else 'its names match, no shape does'
        )
        return 'error', (
            f'{name}: no tensor of checkpoint {path!r} fits it (0 of '
            f"{total} by name and shape; {seen}): check init_cfg's prefix "
            f"('backbone.' for mmpretrain, mmdet and mmseg checkpoints) and "
            f'that it is a checkpoint of this backbone and arch'
        )
    if theirs and not theirs & ours:
        other = '/'.join(sorted(theirs))
        return 'error', (
            f'{name}: checkpoint {path!r} is an {other}-Swin checkpoint (its '
            f'{FAMILY_MARK[min(theirs)]!r} keys), which would fill only '
            f'{len(loaded)} of the {total} tensors'
        )
    if missing:
        unused = f'; {len(unused)} of its entries unused' if unused else ''
        return 'warning', (
            f'{name}: {len(loaded)} of {total} tensors loaded from '
            f'{path!r}; the {len(missing)} not in it (or mis-shaped) keep '
            f'the published init: {_first(missing)}{unused}'
        )
    return None, None


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
