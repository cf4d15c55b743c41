"""The Triton ops of CUDA packages (mmevo/ops/triton_ops.py) called
eagerly: interpreted on CPU (``tests/conftest.py`` sets
``TRITON_INTERPRET=1``), compiled on CUDA; equal to the float64
reference with zeros and reflect padding, strides, dilations and an empty
batch, and checked like the library's ops."""

import pytest
import torch

from mmevo.ops import output_size, triton_ops  # noqa: F401 (defines them)
from mmevo.ops.checks import Window
from mmevo.ops.reference import (
    aggregate_reference,
    attention_weights_reference,
    correlation_reference,
)

DEVICE = 'cuda' if torch.cuda.is_available() else 'cpu'
pytestmark = pytest.mark.cuda
OPS = torch.ops.mmevo

# (B, C, G, H, W, K, stride, padding, dilation, padding_mode)
GEOMETRIES = [
    (1, 8, 2, 7, 9, 3, 1, 1, 1, 'zeros'),
    (2, 6, 3, 6, 5, 3, 2, 2, 2, 'reflect'),
    (1, 4, 1, 3, 4, 5, 1, 2, 1, 'reflect'),
    (0, 4, 2, 5, 5, 3, 1, 1, 1, 'zeros'),
]


def inputs(geom):
    B, C, G, H, W, K, s, p, d, _ = geom
    Ho, Wo = output_size(H, K, s, p, d), output_size(W, K, s, p, d)
    gen = torch.Generator().manual_seed(sum(geom[:-1]))

    def rand(*shape):
        return torch.randn(*shape, generator=gen, dtype=torch.float64).to(
            DEVICE
        )

    return rand(B, C, H, W), rand(B, G, K, K, Ho, Wo), rand(B, C, Ho, Wo)


@pytest.mark.parametrize('geom', GEOMETRIES)
def test_triton_ops_match_reference(geom):
    _, _, G, _, _, K, s, p, d, mode = geom
    x, w, q = inputs(geom)
    window = (s, p, d, mode)
    torch.testing.assert_close(
        OPS.triton_aggregate(x, w, *window),
        aggregate_reference(x, w, Window(K, *window)),
    )
    torch.testing.assert_close(
        OPS.triton_correlation(q, x, G, K, *window),
        correlation_reference(q, x, G, Window(K, *window)),
    )
    torch.testing.assert_close(
        OPS.triton_attention_weights(q, x, G, K, *window),
        attention_weights_reference(q, x, G, Window(K, *window)),
    )


def test_triton_ops_check_arguments():
    x, w, _ = inputs(GEOMETRIES[0])
    with pytest.raises(ValueError, match='kernel must be'):
        OPS.triton_aggregate(x, w[..., :-1], 1, 1, 1, 'zeros')
    with pytest.raises(ValueError, match='padding_mode'):
        OPS.triton_aggregate(x, w, 1, 1, 1, 'circular')
