"""``mmevo.ops.export``, renamed :mod:`mmevo.ops.decompositions`, stays
importable for one release, with a DeprecationWarning."""

import importlib
import sys

import pytest

from mmevo.ops import decompositions


def test_old_module_warns_and_is_the_decompositions(monkeypatch):
    monkeypatch.delitem(sys.modules, 'mmevo.ops.export', raising=False)
    with pytest.warns(DeprecationWarning, match='mmevo.ops.decompositions'):
        export = importlib.import_module('mmevo.ops.export')
    assert export.aggregate is decompositions.aggregate
    assert export.correlation is decompositions.correlation
    assert export.DECOMPOSITIONS is decompositions.DECOMPOSITIONS
