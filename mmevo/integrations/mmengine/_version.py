"""The upstream version each fix was written for, checked when installed."""

import warnings

import mmengine

#: The mmengine release every fix of this package was written and tested
#: against. A fix whose bug upstream has fixed is deleted, not kept.
WRITTEN_FOR = '0.10.7'


class UpstreamVersionWarning(UserWarning):
    """A fix is installed on an mmengine it was not written for."""


def check_mmengine(fix, needs=()):
    """Warn when mmengine is not :data:`WRITTEN_FOR`; refuse when it lacks
    what the fix relies on.

    Args:
        fix (str): The fix's name, for the messages.
        needs (Iterable[tuple[object, str]]): ``(owner, attribute)`` pairs
            the fix relies on; a missing one raises.

    Raises:
        RuntimeError: An attribute in ``needs`` is missing: this mmengine
            changed what the fix was written for.

    Example:
        >>> from mmengine.hooks import CheckpointHook
        >>> check_mmengine('checkpoint hook',
        ...                [(CheckpointHook, '_save_checkpoint_with_step')])
    """
    for owner, name in needs:
        if not hasattr(owner, name):
            raise RuntimeError(
                f"mmevo's {fix} fix was written for mmengine {WRITTEN_FOR}, "
                f'whose {owner.__name__}.{name} this mmengine '
                f'{mmengine.__version__} lacks; do not install it'
            )
    if mmengine.__version__ != WRITTEN_FOR:
        warnings.warn(
            f"mmevo's {fix} fix was written for mmengine {WRITTEN_FOR}, "
            f'found {mmengine.__version__}: check whether this release '
            'fixed the bug upstream',
            UpstreamVersionWarning,
            stacklevel=3,
        )
