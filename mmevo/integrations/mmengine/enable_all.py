"""Importing this module turns on every mmengine fix of mmevo.

It exists for the one place where a fix can only be asked for by an import:
a config run by mmdet's, mmseg's or mmpretrain's own tools. Naming it there
is the opt-in::

    custom_imports = dict(
        imports=['mmevo.models', 'mmevo.integrations.mmengine.enable_all'],
        allow_failed_imports=False,
    )

(with torch >= 2.6, those tools then read the runner's own checkpoints, see
:mod:`.safe_globals`). No other mmevo module imports it; mmevo's tools and
:func:`mmevo.apis.build_runner` call :func:`install_all` instead.
"""

from . import install_all

install_all()
