"""The synthetic demo sets moved to mmevo.demo: their names under
mmevo.datasets (0.1.0's) still work for one release, with a warning."""

import pytest

import mmevo.datasets
import mmevo.demo


@pytest.mark.parametrize('name', mmevo.demo.__all__)
def test_old_name_warns_and_is_the_new_object(name):
    with pytest.warns(DeprecationWarning, match=f'mmevo.demo.{name}'):
        old = getattr(mmevo.datasets, name)
    assert old is getattr(mmevo.demo, name)


def test_other_names_are_still_missing():
    with pytest.raises(AttributeError, match='make_synthetic_voc'):
        _ = mmevo.datasets.make_synthetic_voc
