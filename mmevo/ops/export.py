"""Deprecated: :mod:`mmevo.ops.decompositions` (renamed; this alias goes
in the next release)."""

import warnings

from .decompositions import (  # noqa: F401
    DECOMPOSITIONS,
    aggregate,
    correlation,
    pad,
    row_windows,
    symbolic_reflect_index,
    window_sums,
)

warnings.warn(
    'mmevo.ops.export is renamed mmevo.ops.decompositions; the alias goes '
    'in the next release',
    DeprecationWarning,
    stacklevel=2,
)
