"""mmevo: dynamic-kernel ("evolution") vision operators for OpenMMLab.

What each subpackage needs, and so when ``import mmevo`` (which also runs
first on ``import mmevo.ops``) imports it:

* ``mmevo.ops``: torch only; always imported.
* ``mmevo.layers``: + mmengine and mmcv (``mmcv.cnn``).
* ``mmevo.models``: + mmdet (its backbones, necks and heads subclass
  mmdet's).
* ``mmevo.datasets``: OpenCV (cv2) and numpy.

``mmevo.integrations`` (fixes of upstream libraries, each turned on by its
``install()``) and ``mmevo.apis`` (what the tools do) are not imported here.

A subpackage is imported when ``importlib.util.find_spec`` finds every
package it needs, without importing them; so mmevo's modules are registered
whenever OpenMMLab is installed, and ``import mmevo.ops`` works with torch
alone. Only a package that is *not found* is skipped: an installed one that
fails to import (a broken mmdet) raises its error here as usual.
"""
import importlib.util

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


for _name, _packages in _REQUIRES.items():
    if all(_found(package) for package in _packages):
        importlib.import_module(f'{__name__}.{_name}')

__all__ = ['__version__']
