"""mmevo: dynamic-kernel ("evolution") vision operators for OpenMMLab.

``import mmevo`` (which also runs first on ``import mmevo.ops``) imports
torch and mmevo's ops, and changes no global state beyond defining the
``torch.ops.mmevo`` operators. What each subpackage needs:

* ``mmevo.ops``: torch only;
* ``mmevo.layers``: + mmengine and mmcv (``mmcv.cnn``);
* ``mmevo.models``: + mmdet (its backbones, necks and heads subclass
  mmdet's);
* ``mmevo.datasets`` (the data-root checks) and ``mmevo.demo`` (the
  synthetic demo sets): OpenCV (cv2) and numpy;
* ``mmevo.integrations``: fixes of upstream libraries, each turned on by its
  ``install()``; ``mmevo.apis``: what the tools do; ``mmevo.cli``: their
  argparse options (imported by the tools only); ``mmevo.deploy``: ONNX
  and AOTInductor.

mmevo's OpenMMLab modules register themselves in mmengine's registries
when their module is first imported (``@MODELS.register_module()``), as
mmdet's do. A config names them in
``custom_imports=dict(imports=['mmevo.models'])``: importing
``mmevo.models`` registers every layer and model whether or not ``mmevo``
was imported before, so mmdet's, mmseg's and mmpretrain's own entry points
build mmevo's configs in any import order. :func:`register_all_modules` does
the same from a program. ``import mmevo`` (and ``import mmevo.ops``) on its
own imports no OpenMMLab library and turns on none of
:mod:`mmevo.integrations`; in a process that already runs mmengine it also
registers the modules, which keeps configs that name ``'mmevo'`` working as
they did.
"""

import importlib
import importlib.util
import sys

from . import ops  # noqa: F401
from .version import __version__

_REQUIRES = {
    'layers': ('mmengine', 'mmcv'),
    'models': ('mmengine', 'mmcv', 'mmdet'),
    'datasets': ('cv2', 'numpy'),
}


def _found(name):
    try:
        return importlib.util.find_spec(name) is not None
    except ModuleNotFoundError:  # a finder that says it is not there
        return False


def register_all_modules(install_fixes: bool = False) -> list:
    """Register mmevo's layers, models and datasets in mmengine's
    registries (import them); idempotent.

    A subpackage whose libraries are not installed (``mmevo.models``
    without mmdet, say) is skipped; an installed library that fails to
    import raises its error as usual.

    Args:
        install_fixes (bool): Also turn on mmevo's mmengine fixes
            (:func:`mmevo.integrations.mmengine.install_all`), as mmevo's
            tools and :func:`mmevo.apis.build_runner` do. Default: False.

    Returns:
        list[str]: the subpackages registered.

    Example:
        >>> import mmevo
        >>> mmevo.register_all_modules()
        ['layers', 'models', 'datasets']
        >>> from mmengine.registry import MODELS
        >>> backbone = MODELS.build(dict(type='RedNet', depth=26))
    """
    done = [
        name
        for name, packages in _REQUIRES.items()
        if all(_found(package) for package in packages)
    ]
    for name in done:
        importlib.import_module(f'{__name__}.{name}')
    if install_fixes and _found('mmengine'):
        from .integrations.mmengine import install_all

        install_all()
    return done


# A config that names 'mmevo' in its custom_imports (written before
# 'mmevo.models' was the documented entry): the process runs mmengine.
if 'mmengine' in sys.modules:
    register_all_modules()

__all__ = ['__version__', 'register_all_modules']
