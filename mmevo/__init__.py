"""mmevo: dynamic-kernel ("evolution") vision operators for OpenMMLab."""
from .version import __version__
from . import ops  # noqa: F401
from . import layers  # noqa: F401
from . import models  # noqa: F401
from . import datasets, engine  # noqa: F401

__all__ = ['__version__']
