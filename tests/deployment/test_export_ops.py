"""The ONNX formulation of the evolution ops (mmevo/ops/decompositions.py):
equal to the float64 reference, and exported with H and W dynamic by both
exporters."""

import itertools

import pytest
import torch

from mmevo.deploy import OnnxModel, export_onnx
from mmevo.ops import (
    decompositions,
    evolution_aggregate,
    local_attention_weights,
    local_correlation,
    output_size,
)
from mmevo.ops.checks import Window
from mmevo.ops.reference import (
    aggregate_reference,
    attention_weights_reference,
    correlation_reference,
)

pytestmark = pytest.mark.slow

# (H, W, K, stride, padding, dilation): odd sizes, maps smaller than the
# padding (repeated reflection), 1-pixel maps
GEOMETRIES = [
    (9, 11, 3, 1, 1, 1),
    (7, 6, 5, 2, 2, 1),
    (5, 8, 3, 2, 2, 2),
    (2, 3, 3, 1, 2, 1),
    (1, 4, 3, 1, 1, 1),
    (6, 5, 7, 3, 3, 1),
]


@pytest.mark.parametrize(
    'geometry,mode', itertools.product(GEOMETRIES, ['zeros', 'reflect'])
)
def test_equal_to_reference(geometry, mode):
    H, W, K, s, p, d = geometry
    torch.manual_seed(0)
    Ho, Wo = (output_size(n, K, s, p, d) for n in (H, W))
    x = torch.randn(2, 6, H, W, dtype=torch.float64)
    w = torch.randn(2, 3, K, K, Ho, Wo, dtype=torch.float64)
    q = torch.randn(2, 6, Ho, Wo, dtype=torch.float64)
    torch.testing.assert_close(
        decompositions.aggregate(x, w, Window(K, s, p, d, mode)),
        aggregate_reference(x, w, Window(K, s, p, d, mode)),
    )
    for softmax, ref in (
        (False, correlation_reference),
        (True, attention_weights_reference),
    ):
        torch.testing.assert_close(
            decompositions.correlation(
                q, x, 3, Window(K, s, p, d, mode), softmax
            ),
            ref(q, x, 3, Window(K, s, p, d, mode)),
        )


class Attention(torch.nn.Module):
    """value, key from one map, query at the output pixels: all three ops."""

    def __init__(self, stride, mode):
        super().__init__()
        self.stride, self.mode = stride, mode

    def forward(self, x):
        s = self.stride
        q = x[:, :, ::s, ::s]
        logits = local_correlation(q, x, 2, 3, s, None, 1, self.mode)
        weights = local_attention_weights(q, x, 2, 3, s, None, 1, self.mode)
        return evolution_aggregate(x, weights + logits, s, None, 1, self.mode)


@pytest.mark.parametrize(
    'stride,mode,dynamo',
    [(1, 'reflect', True), (2, 'zeros', True), (2, 'reflect', False)],
)
def test_ops_export_dynamic(stride, mode, dynamo, tmp_path):
    torch.manual_seed(0)
    model = Attention(stride, mode).eval()
    path = str(tmp_path / 'ops.onnx')
    export_onnx(model, torch.randn(1, 4, 9, 8), path, dynamo=dynamo)
    session = OnnxModel(path)
    for hw in ((9, 8), (5, 13), (1, 2), (2, 2)):
        x = torch.randn(1, 4, *hw)
        torch.testing.assert_close(
            session(x)[0], model(x), rtol=1e-4, atol=1e-4
        )
