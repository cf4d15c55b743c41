"""mmevo: dynamic-kernel ("evolution") vision operators for OpenMMLab.

``import mmevo`` (which also runs first on ``import mmevo.ops``) imports
torch and mmevo's ops, and changes no global state beyond defining the
``torch.ops.mmevo`` operators. What each subpackage needs:

* ``mmevo.ops``: torch only;
* ``mmevo.layers``: + mmengine and mmcv (``mmcv.cnn``);
* ``mmevo.models``: + mmdet (its backbones, necks and heads subclass
  mmdet's);
* ``mmevo.datasets``: OpenCV (cv2) and numpy;
* ``mmevo.integrations``: fixes of upstream libraries, each turned on by its
  ``install()``; ``mmevo.apis``: what the tools do; ``mmevo.deploy``: ONNX
  and AOTInductor.

mmevo's OpenMMLab modules are registered in mmengine's registries by
:func:`register_all_modules`. The documented entry of a config,
``custom_imports=dict(imports=['mmevo'])``, imports this package in a
process that already runs mmengine: then, and only then, the import calls
:func:`register_all_modules` itself. So a config needs nothing else, and
``import mmevo.ops`` in a plain PyTorch program imports no OpenMMLab
library.
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


def register_all_modules(install_fixes: bool = True) -> list:
    """Register mmevo's layers, models and datasets in mmengine's
    registries and turn on mmevo's mmengine fixes
    (:func:`mmevo.integrations.mmengine.install_all`); idempotent.

    A subpackage whose libraries are not installed (``mmevo.models``
    without mmdet, say) is skipped; an installed library that fails to
    import raises its error as usual.

    Args:
        install_fixes (bool): Also turn on the mmengine fixes. Default:
            True, as the tools and a config's ``custom_imports`` do.

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


# A config's custom_imports: the process already runs mmengine.
if 'mmengine' in sys.modules:
    register_all_modules()

__all__ = ['__version__', 'register_all_modules']
