"""The export tools' parity check: NaN or infinite outputs where PyTorch
has finite ones fail it, whatever else agrees."""

import math

import pytest
import torch

from mmevo.deploy import check_outputs, max_difference


def test_max_difference_is_relative_to_the_largest_value():
    expected = (torch.tensor([1.0, -4.0]), torch.tensor([2.0]))
    outputs = (torch.tensor([1.0, -3.0]), torch.tensor([2.0]))
    assert max_difference(outputs, expected) == (0.25, 0)


@pytest.mark.parametrize('bad', [math.nan, math.inf, -math.inf])
def test_non_finite_output_is_an_infinite_difference(bad):
    expected = (torch.ones(3), torch.ones(2, 2))
    outputs = (torch.ones(3), torch.tensor([[1.0, bad], [1.0, 1.0]]))
    assert max_difference(outputs, expected) == (math.inf, 1)


def test_values_pytorch_also_gives_are_no_difference():
    nan, inf = math.nan, math.inf
    expected = (torch.tensor([nan, inf, -inf, 2.0]),)
    outputs = (torch.tensor([nan, inf, -inf, 1.5]),)
    assert max_difference(outputs, expected) == (0.25, 0)


def test_check_outputs_refuses_nan_at_one_input():
    model = torch.nn.Sequential(torch.nn.Conv2d(3, 2, 3)).eval()

    def runtime(x):
        y = model(x)
        return (y.fill_(math.nan) if x.shape[-1] == 9 else y,)

    def tupled(x):
        return (model(x),)

    inputs = [torch.randn(1, 3, 8, 8), torch.randn(1, 3, 7, 9)]
    with torch.no_grad():
        assert check_outputs(tupled, runtime, inputs[:1], 'det') == [0.0]
        with pytest.raises(ValueError, match=r'by inf at input \(1, 3, 7, 9'):
            check_outputs(tupled, runtime, inputs, 'det')
