"""One answer to "what kind of model is this" (``model_kind``), shared by the
export and the FLOP count (``task_of``), and one flattening of outputs."""

import pytest
import torch
from torch import nn

from mmevo.apis.complexity import task_of
from mmevo.deploy import TensorOutputs, flatten_outputs, model_kind


def _model(*heads, base=True):
    """A module with the named heads (and mmengine's data_preprocessor
    when ``base``), as mmdet's / mmseg's / mmpretrain's models have."""
    model = nn.Module()
    for name in heads + (('data_preprocessor',) if base else ()):
        setattr(model, name, nn.Identity())
    return model


@pytest.mark.parametrize(
    'heads, base, kind, task',
    [
        (('rpn_head', 'roi_head'), True, 'two-stage', 'det'),
        (('bbox_head',), True, 'det', 'det'),
        # a RoI head without an RPN is no two-stage graph
        (('roi_head', 'bbox_head'), True, 'det', 'det'),
        (('decode_head', 'auxiliary_head'), True, 'seg', 'seg'),
        (('head',), True, 'tensor', 'cls'),
        ((), False, 'module', 'cls'),
    ],
)
def test_model_kind_and_task(heads, base, kind, task):
    model = _model(*heads, base=base)
    assert model_kind(model) == kind
    assert task_of(model) == task


def test_flatten_outputs_keeps_the_order_of_nested_outputs():
    a, b, c, d = (torch.full((1,), float(i)) for i in range(4))
    flat = flatten_outputs(([a, b], (c, [d])))
    assert isinstance(flat, tuple)
    assert [t.item() for t in flat] == [0.0, 1.0, 2.0, 3.0]
    assert flatten_outputs(a)[0] is a


def test_tensor_outputs_flattens_what_forward_returns():
    model = TensorOutputs(nn.Identity(), lambda m, x: [[x, 2 * x], (3 * x,)])
    x = torch.ones(1, 2)
    out = model(x)
    assert len(out) == 3
    torch.testing.assert_close(out[2], 3 * x)
