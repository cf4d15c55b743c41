"""What ``tools/model_converters`` do, as a function: an official
checkpoint read soundly, converted and written atomically."""

from mmevo.integrations.mmengine.atomic_backend import atomic_save

from .checkpoint import CheckpointError, read_checkpoint
from .outputs import OutputPathError, check_output


def convert_swin_checkpoint(src, dst, family):
    """Convert the official ELSA-Swin or ACmix-Swin classification
    checkpoint ``src`` into the mmpretrain ``ImageClassifier`` checkpoint
    ``dst`` (``official_to_mmpretrain`` of
    :mod:`mmevo.models.backbones.swin_convert`).

    ``dst`` is checked before ``src`` is read (not ``src`` itself, a
    writable folder, created if missing) and written atomically: a
    failing or concurrent write leaves the previous ``dst`` or a whole
    new one, never a partial file.

    Args:
        src (str | Path): The official checkpoint (a file or a URL).
        dst (str | Path): Where to write the converted one.
        family (str): 'elsa' or 'acmix'.

    Raises:
        OutputPathError: ``dst`` cannot or must not be written, or the
            write failed (a full disk).
        CheckpointError: ``src`` cannot be loaded, or is not an official
            classification checkpoint of ``family`` (one line each).

    Example:
        >>> convert_swin_checkpoint('elsa_swin_tiny.pth',
        ...                         'checkpoints/elsa_swin_t_mmpretrain.pth',
        ...                         'elsa')
    """
    from mmevo.models.backbones.swin_convert import official_to_mmpretrain

    check_output(dst, {'source checkpoint': src}, what='dst')
    checkpoint = read_checkpoint(src, 'source checkpoint')
    try:
        state = official_to_mmpretrain(checkpoint, family)
    except (TypeError, ValueError) as e:
        raise CheckpointError(
            f"source checkpoint '{src}' cannot be converted: {e}"
        ) from None
    converted = dict(state_dict=state, meta=dict(converted_from=str(src)))
    try:
        atomic_save(converted, dst)
    except OSError as e:  # a full disk, a file size limit
        raise OutputPathError(
            f"dst '{dst}' could not be written ({e.strerror or e}); the "
            'previous file, if any, is kept'
        ) from None
